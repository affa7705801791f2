"""The Full Model page's backward fragments (site_scripts/pages/model.py adds the forward's): the tiny
example's gradients in the order the backward makes them, the chain of upstream gradients against
central differences, the gradient-flow diagrams, the key-naming rules, and the way to the update."""

import ast
import re
import sys

import numpy as np

from transformer.block import block_forward, block_params
from transformer.gradcheck import ABS_FLOOR, REL_TOL, check_passes, gradcheck_model, numerical_grad, relative_gap
from transformer.layernorm import layer_norm_forward
from transformer.linear import linear_forward
from transformer.model import backward, forward, loss_fn
from transformer.softmax import cross_entropy_backward, cross_entropy_forward

from .. import depends, sections
from ..common import md_table, verdict_text
from ..examples import H_STEP, SEED, TINY_IDS, TINY_TARGETS, collapsed, default_note, default_run, illustrative, tiny
from ..tiny_backward import tiny_backward

PAGE = "model"
MODEL_PY = "transformer/model.py"
def here(function, line):
    """A link to a line of a model.py function's listing on this page."""
    return sections.page_link(PAGE, PAGE, sections.line_anchor(MODEL_PY, function, line))


def calls_md(function):
    """Line | Function | Call: each call of a transformer function in a model.py function, in source order; the
    line links to the function's listing on this page, the callee to its own listing."""
    source, text = depends.module_source("model"), (sections.ROOT / MODEL_PY).read_text()
    found = []
    for call in ast.walk(source.defs[function]):
        if isinstance(call, ast.Call) and isinstance(call.func, ast.Name):
            name = call.func.id
            target = source.names.get(name) or (("model", name) if name in source.defs else None)
            if target:
                found.append((call.lineno, target[0], target[1], ast.get_source_segment(text, call)))
    rows = [[f"[{line}]({here(function, line)})",
             f"[`{name}`]({sections.function_link(PAGE, f'transformer/{module}.py', name)})", f"`{code}`"]
            for line, module, name, code in sorted(found)]
    return sections.md_table(["Line", "Function", "Call"], rows)


def url(md_link):
    """mermaid links are followed by the browser, so they need the built URL, not the .md path."""
    path, _, anchor = md_link.partition("#")
    if path:
        path = "../" + path.replace(".md", "/")  # pages are served as folders: model/x.md -> model/x/
    return path + ("#" + anchor if anchor else "")


def small(v):
    return sections.fixed(v) if abs(v) >= 5e-5 or v == 0 else f"{v:.1e}"


# ---------------------------------------------------------------- the tiny example, backward

INSIDE = {"dhidden": r"\(\partial\ell/\partial\, \phi(G)\), from \(W_2\)", "dpre": r"\(\partial\ell/\partial G\), "
          "through the activation", "dln2": r"\(\partial\ell/\partial U_2\), from \(W_1\)",
          "dmid": r"\(\partial\ell/\partial M\): the residual's share plus LN2's", "dln1":
          r"\(\partial\ell/\partial U_1\), from attention"}


def stream_labels(L):
    """The gradients the backward hands from call to call (tiny_backward's names), in order, with their symbols."""
    shown = [("dlogits", r"\(\partial\ell/\partial Z\)", "from `cross_entropy_backward`"),
             ("dlnf", r"\(\partial\ell/\partial X_f\)", "after the head")]
    shown += [(f"b{l}.dout", rf"\(\partial\ell/\partial X^{{({l + 1})}}\)",
               "after the final LayerNorm" if l == L - 1 else f"after block {l + 1}") for l in reversed(range(L))]
    return shown + [("dembedding", r"\(\partial\ell/\partial X^{(0)}\)", "after block 0, what `embedding_backward` "
                     "scatters")]


def backward_md():
    ex, bw = tiny(), tiny_backward()
    steps = bw.steps
    out = [illustrative(f"ids `{TINY_IDS}`, targets `{TINY_TARGETS}`, loss {bw.loss:.4f}. The arrays are "
                        "`tiny_backward()`'s (`site_scripts/tiny_backward.py`): the real backward replayed call by "
                        "call."), "",
           "The calls `backward` makes, in source order (the block call runs once per layer, last layer first):\n",
           calls_md("backward"), "The gradient each call hands to the next, in the order they are made:\n"]
    out.append(loss_md(ex, bw))
    out += [f"**{symbol}**, {where}, {sections.shape_text(steps[key].shape)}\n\n"
            + sections.array_md(key, steps[key][0], row_label="position") for key, symbol, where in stream_labels(
                ex.cfg.num_layers)]
    inside = "\n".join(f"**{INSIDE[k.split('.')[-1]]}**, block {k[1:k.index('.')]}\n\n"
                       + sections.array_md(k, v[0], row_label="position") for k, v in steps.items()
                       if k.split(".")[-1] in INSIDE)
    out.append(collapsed("Inside each block: the gradients between its calls, last block first", inside))
    out.append(scatter_md(ex, bw))
    return "\n".join(out)


D_X0, D_TOK, D_POS = (r"\(\partial\ell/\partial X^{(0)}\)", r"\(\partial\ell/\partial E_{\mathrm{tok}}\)",
                      r"\(\partial\ell/\partial E_{\mathrm{pos}}\)")


def loss_md(ex, bw):
    """What the tiny example's loss says, from the targets' probabilities the backward used."""
    N, V = len(TINY_TARGETS), ex.cfg.vocab_size
    target_p = N * bw.steps["dlogits"][0][np.arange(N), TINY_TARGETS] + 1  # (P - e_y)/N at the targets
    return (f"The loss \\(\\mathcal{{L}}\\) = {bw.loss:.4f} is above \\(\\log n_V\\) = {np.log(V):.4f}, the loss of a "
            f"uniform guess over the \\(n_V\\) tokens. The softmax of these random logits gives the targets the "
            f"probabilities {listed(f'{q:.4f}' for q in target_p)}, whose geometric mean \\(e^{{-\\mathcal{{L}}}}\\) = "
            f"{np.exp(-bw.loss):.4f} is below the uniform \\(1/n_V\\) = {1 / V:.4f}: the untrained model happens to "
            "favour other tokens.\n")


def scatter_md(ex, bw):
    """The embedding backward on the tiny example: each token row sums the positions that read it."""
    ids, dx = ex.ids[0], bw.steps["dembedding"][0]
    parts = []
    for j in sorted(set(ids.tolist())):
        where = np.flatnonzero(ids == j)
        gap = np.abs(bw.grads["tok_emb"][j] - dx[where].sum(axis=0)).max()
        same = "exactly" if gap == 0 else f"to within {gap:.1e}"
        parts.append(f"row {j} is " + (f"row {where[0]}" if len(where) == 1 else f"the sum of rows {listed(where)}")
                     + f" of {D_X0} ({same})")
    unused = [j for j in range(ex.cfg.vocab_size) if j not in ids]
    return (sections.array_md("grads['tok_emb']", bw.grads["tok_emb"], row_label="token id") + "\n"
            + sections.array_md("grads['pos_emb']", bw.grads["pos_emb"], row_label="position")
            + f"\nThe scatter-add ([its equation](#eq-model-embed-grad)): in {D_TOK}, {'; '.join(parts)}: each id "
              f"collects every position that holds it. Rows {listed(unused)} were read by no position and stay exactly "
              f"0. Row \\(t\\) of {D_POS} is row \\(t\\) of {D_X0} for \\(t < T = {len(ids)}\\), and exactly 0 "
              "beyond.\n")


def listed(items):
    items = [str(i) for i in items]
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def silent_units(ex):
    """{block: feed-forward hidden units that are 0 after the activation at every position of the tiny example}."""
    _, cache = forward(ex.params, ex.ids, ex.cfg)
    return {l: np.flatnonzero(~c.ff2_cache.x.reshape(-1, ex.cfg.ff_dim).any(axis=0)).tolist()
            for l, c in enumerate(cache.block_caches)}


def dictionary_md():
    """The gradient dictionary of the tiny example, with its exact zeros counted and explained."""
    ex, bw = tiny(), tiny_backward()
    rows = [[f"`{k}`", sections.shape_text(bw.grads[k].shape), small(np.linalg.norm(bw.grads[k])),
             small(np.abs(bw.grads[k]).max()), int(np.sum(bw.grads[k] == 0))] for k in ex.params]
    T, unused = ex.ids.shape[1], [j for j in range(ex.cfg.vocab_size) if j not in ex.ids]
    zero = {k: [i for i, row in enumerate(np.atleast_2d(g.T if k.endswith("ff1_w") else g)) if not row.any()]
            for k, g in bw.grads.items()}
    silent = silent_units(ex)
    expected = {"tok_emb": unused, "pos_emb": list(range(T, ex.cfg.context_len))}
    expected.update({f"b{l}.{n}": units for l, units in silent.items() for n in ("ff1_w", "ff2_w")})
    if any(zero[k] != v for k, v in expected.items()) or any(bw.grads[f"b{l}.ff1_b"][u].any()
                                                             for l, us in silent.items() for u in us):
        raise RuntimeError(f"the zero rows {zero} are not the unread ones {expected}: the sentences below are wrong")
    bk = {k: np.abs(bw.grads[k]).max() for k in ex.params if k.endswith(".bk")}
    ffn = "; ".join(f"unit{'s' if len(u) > 1 else ''} {listed(u)} in block {l}" for l, u in silent.items() if u)
    ffn = (f"In the feed-forward layers, some hidden units (of \\(F = {ex.cfg.ff_dim}\\)) are 0 after "
           f"`{ex.cfg.activation}` at every position: {ffn}. Their pre-activation is not positive at any of the {T} "
           f"positions, so `{ex.cfg.activation}` passes them no gradient: their entries of `ff1_b`, their columns "
           "of `ff1_w` and their rows of `ff2_w` are exactly 0. " if ffn else "")
    return ("The gradient dictionary `loss_and_grads` returns for the tiny example: one entry per parameter, in "
            "the order of `params`.\n\n"
            + md_table(["Key", "Shape", "‖grad‖", "max |grad|", "Entries exactly 0"], rows)
            + f"\nEvery exact zero has a reason. Rows {listed(unused)} of `tok_emb`: no id of `{TINY_IDS}` reads "
              f"them. Row{'s' if len(expected['pos_emb']) > 1 else ''} {listed(expected['pos_emb'])} of `pos_emb`: "
              f"the sequence has \\(T = {T}\\) positions and the table \\(T_{{\\max}} = {ex.cfg.context_len}\\) "
              f"rows, and positions beyond \\(T\\) are never read. {ffn}" + key_bias_text(bk))


def key_bias_text(largest):
    """Why the key biases' gradients are rounding noise; largest: {key: largest |entry| of its gradient}."""
    return ("The key biases, " + ", ".join(f"`{k}` (largest entry {v:.1e})" for k, v in largest.items())
            + ", are 0 in exact arithmetic and rounding noise in floats: head \\(h\\)'s slice \\(b_k^{(h)}\\) of "
              "the key bias adds the same number \\(Q^{(h)}_{w,t} \\cdot b_k^{(h)} / \\sqrt{d_h}\\) to every score "
              "of query row \\(t\\) of window \\(w\\), a softmax ignores a constant added to its row, so no loss "
              "depends on \\(b_k\\) ([Attention](attention.md#eq-attn-grad-key-bias) derives it). "
              "[Below](#backward-checks), their central differences.\n")


def products(pairs):
    """(a)(b) + (c)(d) + ...: a sum of products written out, each factor as the page's tables print it, and the
    sum a reader gets from those printed factors."""
    pairs = [(round(float(a), 4), round(float(b), 4)) for a, b in pairs]
    return " + ".join(f"({sections.fixed(a)})({sections.fixed(b)})" for a, b in pairs), sum(a * b for a, b in pairs)


def by_hand(printed, value):
    return (f"Summed from the factors as printed, the products give {sections.fixed(printed, 5)}; the arrays "
            f"themselves, unrounded, give {sections.fixed(value, 5)}")


def follow_backward_md():
    """dW_h[0, 0] = Σ_t X_f[t, 0] ∂ℓ/∂Z[t, 0], with the tiny example's numbers."""
    ex, bw = tiny(), tiny_backward()
    xf, dz, value = ex.trace["lnf"][0][:, 0], bw.steps["dlogits"][0][:, 0], bw.grads["head_w"][0, 0]
    optim, (terms, printed) = sections.page_link(PAGE, "optim", "tiny-numerical-example"), products(zip(xf, dz))
    return ("One entry of [the head's weights gradient](#eq-head-grads), by hand: column 0 of \\(X_f\\) (the "
            "`lnf` table of the forward example) against column 0 of \\(\\partial\\ell/\\partial Z\\) (the `dlogits` "
            "table above), one product per position:\n\n"
            "$$\n\\begin{aligned}\n\\frac{\\partial \\ell}{\\partial W_h[0,0]} &= \\sum_t X_f[t,0]\\, "
            "\\frac{\\partial \\ell}{\\partial Z_{t0}} \\\\\n"
            f"&= {terms} \\\\\n&= {sections.fixed(value)}\n\\end{{aligned}}\n$$\n\n"
            f"{by_hand(printed, float(xf @ dz))}, and `grads['head_w'][0, 0]` is that number: "
            f"{sections.fixed(value, 5)}. The "
            f"[AdamW page]({optim}) takes this same gradient for its first step: its `g of head_w` table starts with "
            f"{sections.fixed(value)} (a site test checks that the two agree).\n")


# ---------------------------------------------------------------- the chain rule, checked

def chain_losses(ex, targets):
    """ℓ as a function of each tensor the backward hands on: {name: (function of it, its value)}."""
    cfg, p, trace = ex.cfg, ex.params, ex.trace
    L = cfg.num_layers

    def from_logits(z):
        return cross_entropy_forward(z, targets)[0]

    def from_lnf(x):
        return from_logits(linear_forward(x, p["head_w"], p["head_b"])[0])

    def from_stream(x, first):
        for l in range(first, L):
            x = block_forward(x, block_params(p, l), cfg)[0]
        return from_lnf(layer_norm_forward(x, p["lnf_g"], p["lnf_b"], cfg.ln_eps)[0])

    found = {"dlogits": (from_logits, trace["logits"]), "dlnf": (from_lnf, trace["lnf"])}
    for l in reversed(range(L)):
        found[f"b{l}.dout"] = (lambda x, l=l: from_stream(x, l + 1), trace[f"b{l}.out"])
    found["dembedding"] = (lambda x: from_stream(x, 0), trace["embedding"])
    return found


def grad_rows(checks):
    """checks: (label, analytic, loss of the array, the array). One GradRow each, the array moved in place."""
    rows = []
    for label, analytic, loss, wrt in checks:
        numeric = numerical_grad(lambda: loss(wrt), wrt, H_STEP)
        rows.append(sections.GradRow(label, wrt.shape, float(np.abs(analytic - numeric).max()),
                                     relative_gap(analytic, numeric), "float64", H_STEP))
    return rows


def chain_check_md(steps=None):
    """Each upstream gradient of the tiny example's backward against central differences of ℓ in that tensor."""
    ex, bw = tiny(), tiny_backward()
    steps = steps or bw.steps
    losses = chain_losses(ex, np.array([TINY_TARGETS]))
    checks = [(f"{symbol} (`{key}`)", steps[key], losses[key][0], losses[key][1].copy())
              for key, symbol, _ in stream_labels(ex.cfg.num_layers)]
    rows = grad_rows(checks)
    return ("Each gradient the backward hands on, against central differences of the loss in that tensor (the "
            "rest of the forward rerun from it): this checks every [step of the chain rule](#eq-model-vjp), "
            "call by call.\n\n" + sections.gradcheck_table(rows, "the loss itself"))


def entry_text(v):
    return sections.fixed(v, 10) if abs(v) >= 1e-6 or v == 0 else f"{v:.2e}"


SIDE_BY_SIDE = (("head_w", (0, 0)), ("lnf_g", (0,)), ("b1.wv", (0, 1)), ("b0.ff1_w", (1, 2)), ("tok_emb", (2, 0)),
                ("tok_emb", (1, 0)), ("pos_emb", (3, 0)), ("b0.bk", (0,)), ("b1.bk", (0,)))


def side_by_side_md():
    """A few entries of the tiny example's gradients from the backward and from central differences of the
    loss, then what the key bias's relative gap of 1 means."""
    ex, bw = tiny(), tiny_backward()
    targets, numeric = np.array([TINY_TARGETS]), {}
    for key in dict.fromkeys(k for k, _ in SIDE_BY_SIDE):
        numeric[key] = numerical_grad(lambda: loss_fn(ex.params, ex.ids, targets, ex.cfg), ex.params[key], H_STEP)
    rows = [[f"`{k}{list(i)}`", entry_text(bw.grads[k][i]), entry_text(numeric[k][i]),
             f"{abs(bw.grads[k][i] - numeric[k][i]):.1e}"] for k, i in SIDE_BY_SIDE]
    return (f"A few entries of the tiny example's gradients (no parameter moved: these are the arrays above), "
            f"from the backward and from central differences of `loss_fn` with step \\(\\Delta\\) = {H_STEP:g}:\n\n"
            + md_table(["Entry", "From the backward", "From central differences", "Gap"], rows) + "\n"
            + floor_text({k: (bw.grads[k], numeric[k]) for k in numeric if k.endswith(".bk")}))


def floor_text(checked):
    """What a check of gradients that are zero in exact arithmetic shows, read from their arrays.
    checked: {key: (analytic, numeric)}."""
    keys = listed(f"`{k}`" for k in checked)
    gaps = {k: (float(np.abs(a - n).max()), relative_gap(a, n)) for k, (a, n) in checked.items()}
    verdicts = {verdict_text(check_passes(g, r), r >= REL_TOL, "on the absolute floor") for g, r in gaps.values()}
    noise = listed(f"{np.abs(a).max():.1e}" for a, _ in checked.values())
    if not any(np.any(n) for _, n in checked.values()):
        sides = (f"For {keys} the central differences are exactly 0 in every entry: moving a key bias by "
                 f"\\(\\pm\\Delta\\) leaves the loss unchanged to the last bit. The backward leaves rounding "
                 f"noise of at most {noise}. With one side exactly 0, the gap is the other side's largest entry, "
                 f"and the relative gap is that entry divided by itself: "
                 f"{listed(f'{r:.1f}' for _, r in gaps.values())}, whatever the noise's size")
    else:
        sides = (f"For {keys} both sides are rounding noise (the backward's at most {noise}), and the relative gaps "
                 f"{listed(f'{r:.2g}' for _, r in gaps.values())} compare one noise with another")
    return (f"{sides}. A relative gap means nothing when both sides sit at the floor of rounding, so the verdict "
            f"comes from the largest gap, {listed(f'{g:.1e}' for g, _ in gaps.values())} against the floor "
            f"{ABS_FLOOR:g}: {listed(sorted(verdicts))}.\n")


def gradcheck_md():
    ex = tiny()
    report = gradcheck_model(ex.cfg, ex.ids, np.array([TINY_TARGETS]), seed=SEED, h=H_STEP, perturb=0.1)
    shapes = tiny().params
    rows = [sections.GradRow(name, shapes[name].shape, gap, rel, "float64", H_STEP)
            for name, (gap, rel) in report.items()]
    floor = [r for r in rows if r.rel >= REL_TOL]
    return (f"`gradcheck_model` on the tiny model: every one of the {len(rows)} gradients of the loss, from "
            f"`loss_and_grads`, against central differences of `loss_fn` (ids `{TINY_IDS}`, targets "
            f"`{TINY_TARGETS}`, seeds {SEED} and {SEED + 1}). Every 1-D parameter is first moved off its initial "
            "value by 0.1 times a standard normal draw: the gains start at exactly 1 and the biases at exactly 0, "
            "and a term multiplied by a gain of 1 or added as a bias of 0 could hide a mistake that the moved "
            "values expose.\n\n"
            + sections.gradcheck_table(rows, "the loss itself (the tiny example's mean cross-entropy), not a "
                                             "[fake loss](../reference/notation.md#fake-loss)") + "\n"
            + (f"The rows {', '.join(f'`{r.label}`' for r in floor)} have a relative gap of "
               f"{', '.join(f'{r.rel:.2g}' for r in floor)} and pass on the absolute floor: their gradient is 0 "
               "in exact arithmetic, so both sides are rounding noise ([why](#zeros)); "
               f"their largest gaps, {', '.join(f'{r.gap:.1e}' for r in floor)}, are far below {ABS_FLOOR:g}.\n"
               if floor else ""))


# ---------------------------------------------------------------- the diagrams

def flow_md():
    """A mermaid diagram of loss_and_grads: one box per call, arrows for the values passed."""
    source = depends.module_source("model")
    fn = source.defs["loss_and_grads"]
    made_by, nodes, edges, clicks = {}, [], [], []
    for arg in fn.args.args:
        nodes.append(f'  {arg.arg}(["{arg.arg}"])')
        made_by[arg.arg] = arg.arg
    for i, stmt in enumerate(fn.body):
        call = stmt.value if isinstance(stmt, (ast.Assign, ast.Return)) else None
        if isinstance(call, ast.Tuple):
            call = call.elts[0] if isinstance(call.elts[0], ast.Call) else None
        if not isinstance(call, ast.Call):
            continue
        name = call.func.id
        module = source.names.get(name, ("model", name))[0]
        node, doc = f"c{i}", f"d{i}"
        nodes += [f'  {node}["{name}<br/>line {stmt.lineno}"]', f'  {doc}>"{name} explained"]']
        clicks.append(f'  click {node} href "{url(here("loss_and_grads", stmt.lineno))}" '
                      f'"line {stmt.lineno} of transformer/model.py"')
        edges.append(f"  {node} -.- {doc}")
        clicks.append(f'  click {doc} href "{url(sections.function_link(PAGE, f"transformer/{module}.py", name))}"')
        used = [n.id for n in ast.walk(call) if isinstance(n, ast.Name) and n.id in made_by and n.id != name]
        edges += [f"  {made_by[var]} -->|{var}| {node}" for var in dict.fromkeys(used)]
        if isinstance(stmt, ast.Assign):
            made_by.update({t.id: node for t in ast.walk(stmt.targets[0]) if isinstance(t, ast.Name)})
        else:
            nodes.append('  out(["loss, grads"])')
            edges.append(f"  {node} --> out")
    return ("```mermaid\nflowchart TD\n" + "\n".join(nodes + edges + clicks) + "\n```\n\n"
            "Generated from the source of `loss_and_grads`: a box per call (click it for its line), the "
            "arrows carry the variables passed on, and each flag opens the page that explains the function. "
            "The gradient starts at `cross_entropy_backward` (dlogits) and flows through `backward`, which uses "
            "the cache `forward` left.\n")


def filled_keys():
    """Run `backward` on the tiny example line by line (sys.settrace) and record, in the order it runs, each
    call of a backward function: (line, callee, name and shape of the gradient passed in, keys of `grads`
    filled until the next such call, the lines that stored them)."""
    ex = tiny()
    logits, cache = forward(ex.params, ex.ids, ex.cfg)
    dlogits = cross_entropy_backward(1.0, cross_entropy_forward(logits, np.array([TINY_TARGETS]))[1])
    fn = depends.module_source("model").defs["backward"]
    callees = {c.lineno: (c.func.id, c.args[0].id) for c in ast.walk(fn)
               if isinstance(c, ast.Call) and isinstance(c.func, ast.Name) and c.func.id.endswith("_backward")}
    events = []

    def local(frame, event, arg):
        grads, names = frame.f_locals.get("grads", {}), frame.f_locals
        events.append((frame.f_lineno, list(grads), {a: np.shape(names[a]) for _, a in callees.values() if a in names}))
        return local

    previous = sys.gettrace()
    sys.settrace(lambda frame, event, arg: local if frame.f_code is backward.__code__ else None)
    try:
        backward(dlogits, cache)
    finally:
        sys.settrace(previous)
    calls = []
    for (line, before, shapes), (_, after, _) in zip(events, events[1:]):
        if line in callees:
            name, arg = callees[line]
            calls.append([line, name, arg, shapes.get(arg), [], []])
        new = [k for k in after if k not in before]
        if new:
            calls[-1][4] += new
            calls[-1][5].append(line)
    return calls


SYMBOL_TEXT = {r"\partial": "∂", r"\ell": "ℓ"}  # the stream's symbols as text: mermaid does not run MathJax
SUPERSCRIPT = str.maketrans("0123456789()", "⁰¹²³⁴⁵⁶⁷⁸⁹⁽⁾")


def plain_symbol(latex):
    """A symbol of stream_labels as mermaid can show it (mermaid runs no MathJax): ∂ℓ/∂X⁽⁰⁾ for the LaTeX
    \\partial\\ell/\\partial X^{(0)}."""
    text = re.sub(r"\\\(|\\\)|\\partial ?|\\ell", lambda m: SYMBOL_TEXT.get(m[0].strip(), ""), latex)
    return re.sub(r"\^\{(.*?)\}", lambda m: m[1].translate(SUPERSCRIPT), text)


def grad_flow_md():
    """Mermaid: each backward call, the gradient it receives and the keys of `grads` it fills."""
    calls, ex = filled_keys(), tiny()
    symbols = [plain_symbol(s) for _, s, _ in stream_labels(ex.cfg.num_layers)]
    lines, clicks = ["```mermaid", "flowchart TD", '  start(["cross_entropy_backward"])'], []
    previous = "start"
    for i, (line, name, arg, shape, keys, stored) in enumerate(calls):
        prefix = keys[0].split(".")[0] + "." if "." in keys[0] else ""
        short = [k[len(prefix):] for k in keys]
        rows = [", ".join(short[j:j + 4]) for j in range(0, len(short), 4)]
        lines += [f'  c{i}["{name}<br/>line {line}"]',
                  f'  k{i}[("grads{" " + prefix + "*" if prefix else ""}: {"<br/>".join(rows)}<br/>({len(keys)} '
                  f'keys, stored at line {", ".join(map(str, sorted(set(stored))))})")]',
                  f'  {previous} -->|"{arg} = {symbols[i]} {tuple(shape)}"| c{i}', f"  c{i} -.-> k{i}"]
        clicks.append(f'  click c{i} href "{url(here("backward", line))}" "line {line} of transformer/model.py"')
        previous = f"c{i}"
    filled = [k for call in calls for k in call[4]]
    keys = list(ex.params)
    if sorted(filled) != sorted(keys) or len(set(filled)) != len(filled):
        raise RuntimeError(f"backward filled {filled}, not each of the parameters' keys once: {keys}")
    return ("\n".join(lines + clicks + ["```"]) + f"\n\nRecorded by running `backward` on the tiny example line by "
            f"line: each box is one call of a backward function (click it for its line), the arrow into it the "
            f"gradient it receives with its shape, and the store beside it the keys of `grads` filled before the "
            f"next call. Every one of the {len(keys)} keys is filled exactly once; the blocks run last to first.\n")


# ---------------------------------------------------------------- the symbols

def default_backward():
    """The default config's forward on default_run's batch, and its backward: the gradient each step hands on
    (`backward`'s trace) and every parameter's gradient (for the shapes of the symbol table)."""
    ex = default_run()
    targets = np.random.default_rng(SEED).integers(0, ex.cfg.vocab_size, ex.ids.shape)
    logits, cache = forward(ex.params, ex.ids, ex.cfg)
    dz = cross_entropy_backward(1.0, cross_entropy_forward(logits, targets)[1])
    steps = {}
    grads = backward(dz, cache, trace=steps)
    last = f"b{ex.cfg.num_layers - 1}.dout"
    return ex, targets, {"dz": dz, "dxf": steps["dlnf"], "dx_last": steps[last], "dx0": steps["dembedding"]}, grads


def backward_symbols_md():
    ex, targets, d, grads = default_backward()
    B, T = ex.ids.shape
    rows = [
        (r"\partial\ell/\partial Z", "dlogits", d["dz"].shape),
        (r"P", "probs in cross_entropy_backward, before the -= 1.0", d["dz"].shape),
        (r"e_y", "the -= 1.0 at each target in cross_entropy_backward", d["dz"].shape),
        (r"y", "targets", targets.shape),
        (r"N", "n = t.size in cross_entropy_backward", f"{B * T}"),
        (r"\partial\ell/\partial X_f", "dx, from linear_backward", d["dxf"].shape),
        (r"\partial\ell/\partial W_h", 'grads["head_w"]', grads["head_w"].shape),
        (r"\partial\ell/\partial b_h", 'grads["head_b"]', grads["head_b"].shape),
        (r"\partial\ell/\partial X^{(L)}", "dx, from the final layer_norm_backward", d["dx_last"].shape),
        (r"\partial\ell/\partial \gamma", 'grads["lnf_g"]', grads["lnf_g"].shape,
         r"the final LayerNorm's, \(\gamma_{\mathrm{LN}_f}\) (`lnf_g`)"),
        (r"\partial\ell/\partial \beta", 'grads["lnf_b"]', grads["lnf_b"].shape,
         r"the final LayerNorm's, \(\beta_{\mathrm{LN}_f}\) (`lnf_b`)"),
        (r"\partial\ell/\partial X^{(l)}", "dx, from block_backward", d["dx0"].shape),
        (r"\partial\ell/\partial X^{(0)}", "dx, into embedding_backward", d["dx0"].shape),
        (r"\partial\ell/\partial E_{\mathrm{tok}}", 'grads["tok_emb"]', grads["tok_emb"].shape),
        (r"\partial\ell/\partial E_{\mathrm{pos}}", 'grads["pos_emb"]', grads["pos_emb"].shape),
        (r"g", "grads[name]", "one per key", "every entry of `grads`, the optimizer's input"),
    ]
    return sections.symbols_md(rows, default_note() + " and random targets")


def fragments():
    return {"backward": backward_md(), "dictionary": dictionary_md(), "follow-backward": follow_backward_md(),
            "chain-check": chain_check_md(), "side-by-side": side_by_side_md(), "gradcheck": gradcheck_md(),
            "flow": flow_md(), "grad-flow": grad_flow_md(), "backward-symbols": backward_symbols_md()}
