"""The Full Model page's backward (site_scripts/pages/model.py adds the forward's): the tiny example's gradients in
the order the backward makes them, the gradient dictionary and its exact zeros, the chain of upstream gradients
against central differences and the symbols of the backward (the diagrams are in _model_flow.py). Values and tables only;
the words are in docs/model/full-model.md."""

import ast

import numpy as np

from transformer.block import block_forward, block_params
from transformer.config import PRESETS
from transformer.gradcheck import ABS_FLOOR, REL_TOL, check_passes, gradcheck_model, numerical_grad, relative_gap
from transformer.layernorm import layer_norm_forward
from transformer.linear import linear_forward
from transformer.model import backward, forward, loss_fn
from transformer.softmax import cross_entropy_backward, cross_entropy_forward

from .. import depends, sections
from ..common import md_table, verdict_text
from ..examples import H_STEP, MOVE, SEED, TINY_IDS, TINY_TARGETS, default_run, tiny
from ..tiny_backward import tiny_backward

PAGE = "model"
MODEL_PY = "transformer/model.py"


def here(function, line):
    """A link to a line of a model.py function's listing on this page."""
    return sections.page_link(PAGE, PAGE, sections.line_anchor(MODEL_PY, function, line))


def calls_md(function):
    """Line | Function | Call: each call of a transformer function in a model.py function, in source order; the
    line links to the function's listing on this page, the callee to its own listing. A class (the cache's
    named tuple) is not a call of a function."""
    source, text = depends.module_source("model"), (sections.ROOT / MODEL_PY).read_text()
    found = []
    for call in ast.walk(source.defs[function]):
        if isinstance(call, ast.Call) and isinstance(call.func, ast.Name):
            name = call.func.id
            target = source.names.get(name) or (("model", name) if name in source.defs else None)
            if target and not (target[0] == "model" and isinstance(source.defs.get(name), ast.ClassDef)):
                found.append((call.lineno, target[0], target[1], ast.get_source_segment(text, call)))
    rows = [[f"[{line}]({here(function, line)})",
             f"[`{name}`]({sections.function_link(PAGE, f'transformer/{module}.py', name)})", f"`{code}`"]
            for line, module, name, code in sorted(found)]
    return md_table(["Line", "Function", "Call"], rows)


def small(v):
    return sections.fixed(v) if abs(v) >= 5e-5 or v == 0 else f"{v:.1e}"


def tiny_sizes():
    cfg = PRESETS["tiny"]
    return {"n_v": cfg.vocab_size, "t_max": cfg.context_len, "d": cfg.emb_dim, "h": cfg.num_heads,
            "l": cfg.num_layers, "f": cfg.ff_dim}


def listed(items):
    items = [str(i) for i in items]
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


# ---------------------------------------------------------------- the tiny example, backward

INSIDE = ("dhidden", "dpre", "dln2", "dmid", "dln1")  # the gradients between a block's calls, in its backward's order


def stream_labels(L):
    """The gradients the backward hands from call to call (tiny_backward's names), in order, with their symbols."""
    shown = [("dlogits", r"\(\partial\ell/\partial Z\)", "from `cross_entropy_backward`"),
             ("dlnf", r"\(\partial\ell/\partial X_f\)", "after the head")]
    shown += [(f"b{l}.dout", rf"\(\partial\ell/\partial X^{{({l + 1})}}\)",
               "after the final LayerNorm" if l == L - 1 else f"after block {l + 1}") for l in reversed(range(L))]
    return shown + [("dembedding", r"\(\partial\ell/\partial X^{(0)}\)", "after block 0, what `embedding_backward` "
                     "scatters")]


def step_name(key):
    """The fragment of a gradient the backward hands on: `b0.dout` -> bwd_b0_dout."""
    return "bwd_" + key.replace(".", "_")


def backward_tables():
    """The calls `backward` makes, every gradient it hands on, the gradients inside each block, and the scatter."""
    ex, bw = tiny(), tiny_backward()
    tables = {"backward_calls": calls_md("backward")}
    for key, _, _ in stream_labels(ex.cfg.num_layers):
        tables[step_name(key)] = sections.array_md(key, bw.steps[key][0], row_label="position")
    for l in range(ex.cfg.num_layers):
        for name in INSIDE:
            tables[step_name(f"b{l}.{name}")] = sections.array_md(f"b{l}.{name}", bw.steps[f"b{l}.{name}"][0],
                                                                  row_label="position")
    return {**tables, **scatter_tables(ex, bw)}


def backward_values():
    ex, bw = tiny(), tiny_backward()
    N, V = len(TINY_TARGETS), ex.cfg.vocab_size
    target_p = N * bw.steps["dlogits"][0][np.arange(N), TINY_TARGETS] + 1  # (P - e_y)/N at the targets
    return {"seed": SEED, "ids": TINY_IDS, "targets": TINY_TARGETS, "loss": bw.loss, "log_v": float(np.log(V)),
            "target_p": target_p.tolist(), "geo": float(np.exp(-bw.loss)), "uniform": 1 / V,
            "shapes": {step_name(k): bw.steps[k].shape for k, _, _ in stream_labels(ex.cfg.num_layers)},
            "unused": [j for j in range(V) if j not in ex.ids], "t": ex.ids.shape[1]}


def scatter_tables(ex, bw):
    """The embedding's gradients, and for each id the positions that read it and how closely its row of
    ∂ℓ/∂E_tok is the sum of those rows of ∂ℓ/∂X^(0)."""
    ids, dx = ex.ids[0], bw.steps["dembedding"][0]
    rows = []
    for j in sorted(set(ids.tolist())):
        where = np.flatnonzero(ids == j)
        gap = float(np.abs(bw.grads["tok_emb"][j] - dx[where].sum(axis=0)).max())
        rows.append([j, ", ".join(map(str, where)), sections.gap_text(gap) if gap else "0 (exactly)"])
    return {"tok_grad": sections.array_md("grads['tok_emb']", bw.grads["tok_emb"], row_label="token id"),
            "pos_grad": sections.array_md("grads['pos_emb']", bw.grads["pos_emb"], row_label="position"),
            "scatter": md_table(["token id \\(j\\)", "positions \\(t\\) that read it",
                                 "largest gap to the sum of those rows of \\(\\partial\\ell/\\partial X^{(0)}\\)"], rows)}


# ---------------------------------------------------------------- the gradient dictionary and its zeros

def silent_units(ex):
    """{block: feed-forward hidden units that are 0 after the activation at every position of the tiny example}."""
    _, cache = forward(ex.params, ex.ids, ex.cfg)
    return {l: np.flatnonzero(~c.ff2_cache.x.reshape(-1, ex.cfg.ff_dim).any(axis=0)).tolist()
            for l, c in enumerate(cache.block_caches)}


def zero_rows(grads):
    """{key: the rows of its gradient that are exactly 0} (for ff1_w, its columns: one per hidden unit)."""
    return {k: [i for i, r in enumerate(np.atleast_2d(g.T if k.endswith("ff1_w") else g)) if not r.any()]
            for k, g in grads.items()}


def unexplained_zeros(ex, grads):
    """The exact zero rows of the gradient that the page's three reasons do not explain (an empty list when
    they all are): a table row no position reads, a hidden unit ReLU closes at every position."""
    zero, silent, T = zero_rows(grads), silent_units(ex), ex.ids.shape[1]
    expected = {"tok_emb": [j for j in range(ex.cfg.vocab_size) if j not in ex.ids],
                "pos_emb": list(range(T, ex.cfg.context_len))}
    expected.update({f"b{l}.{n}": units for l, units in silent.items() for n in ("ff1_w", "ff2_w")})
    wrong = [k for k, v in expected.items() if zero[k] != v]
    return wrong + [f"b{l}.ff1_b[{u}]" for l, us in silent.items() for u in us if grads[f"b{l}.ff1_b"][u].any()]


def dictionary():
    """The gradient dictionary of the tiny example, its exact zeros, and the hidden units that cause some."""
    ex, bw = tiny(), tiny_backward()
    rows = [[f"`{k}`", sections.shape_text(bw.grads[k].shape), small(np.linalg.norm(bw.grads[k])),
             small(np.abs(bw.grads[k]).max()), int(np.sum(bw.grads[k] == 0))] for k in ex.params]
    silent = silent_units(ex)
    tables = {"dictionary": md_table(["Key", "Shape", "‖grad‖", "max |grad|", "Entries exactly 0"], rows),
              "silent": md_table(["Block", f"hidden units 0 after `{ex.cfg.activation}` at every position"],
                                 [[l, ", ".join(map(str, u))] for l, u in silent.items() if u])}
    T = ex.ids.shape[1]
    return tables, {"pos_rows": list(range(T, ex.cfg.context_len)), "t_max": ex.cfg.context_len,
                    "f": ex.cfg.ff_dim, "activation": ex.cfg.activation,
                    "bk": [f"`{k}` (largest entry {np.abs(bw.grads[k]).max():.1e})" for k in ex.params
                           if k.endswith(".bk")]}


def products(pairs):
    """(a)(b) + (c)(d) + ...: a sum of products written out, each factor as the page's tables print it, and the
    sum a reader gets from those printed factors."""
    pairs = [(round(float(a), 4), round(float(b), 4)) for a, b in pairs]
    return " + ".join(f"({sections.fixed(a)})({sections.fixed(b)})" for a, b in pairs), sum(a * b for a, b in pairs)


def follow_backward():
    """dW_h[0, 0] = Σ_t X_f[t, 0] ∂ℓ/∂Z[t, 0], written out with the tiny example's numbers: the display maths, and
    what the printed factors and the unrounded arrays give."""
    ex, bw = tiny(), tiny_backward()
    xf, dz, value = ex.trace["lnf"][0][:, 0], bw.steps["dlogits"][0][:, 0], bw.grads["head_w"][0, 0]
    terms, printed = products(zip(xf, dz))
    math = ("$$\n\\begin{aligned}\n\\frac{\\partial \\ell}{\\partial W_h[0,0]} &= \\sum_t X_f[t,0]\\, "
            "\\frac{\\partial \\ell}{\\partial Z_{t0}} \\\\\n"
            f"&= {terms} \\\\\n&= {sections.fixed(value)}\n\\end{{aligned}}\n$$\n")
    return math, {"printed": printed, "unrounded": float(xf @ dz), "value": float(value),
                  "optim": sections.page_link(PAGE, "optim", "tiny-numerical-example")}


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


def chain_rows(steps=None):
    """Each upstream gradient of the tiny example's backward against central differences of ℓ in that tensor
    (the rest of the forward rerun from it), as GradRows; `steps` replaces the replay's gradients."""
    ex, bw = tiny(), tiny_backward()
    steps = steps or bw.steps
    losses = chain_losses(ex, np.array([TINY_TARGETS]))
    rows = []
    for key, symbol, _ in stream_labels(ex.cfg.num_layers):
        loss, wrt = losses[key][0], losses[key][1].copy()
        numeric = numerical_grad(lambda: loss(wrt), wrt, H_STEP)
        rows.append(sections.GradRow(f"{symbol} (`{key}`)", wrt.shape, float(np.abs(steps[key] - numeric).max()),
                                     relative_gap(steps[key], numeric), "float64", H_STEP))
    return rows


def entry_text(v):
    return sections.fixed(v, 10) if abs(v) >= 1e-6 or v == 0 else f"{v:.2e}"


SIDE_BY_SIDE = (("head_w", (0, 0)), ("lnf_g", (0,)), ("b1.wv", (0, 1)), ("b0.ff1_w", (1, 2)), ("tok_emb", (2, 0)),
                ("tok_emb", (1, 0)), ("pos_emb", (3, 0)), ("b0.bk", (0,)), ("b1.bk", (0,)))


def side_by_side():
    """A few entries of the tiny example's gradients from the backward and from central differences of the loss;
    and, for the key biases (zero in exact arithmetic), what their check reads from the arrays."""
    ex, bw = tiny(), tiny_backward()
    targets, numeric = np.array([TINY_TARGETS]), {}
    for key in dict.fromkeys(k for k, _ in SIDE_BY_SIDE):
        numeric[key] = numerical_grad(lambda: loss_fn(ex.params, ex.ids, targets, ex.cfg), ex.params[key], H_STEP)
    rows = [[f"`{k}{list(i)}`", entry_text(bw.grads[k][i]), entry_text(numeric[k][i]),
             f"{abs(bw.grads[k][i] - numeric[k][i]):.1e}"] for k, i in SIDE_BY_SIDE]
    table = md_table(["Entry", "From the backward", "From central differences", "Gap"], rows)
    return table, floor_values({k: (bw.grads[k], numeric[k]) for k in numeric if k.endswith(".bk")})


def floor_values(checked):
    """What a check of gradients that are zero in exact arithmetic shows, read from their arrays.
    checked: {key: (analytic, numeric)}."""
    gaps = [(float(np.abs(a - n).max()), relative_gap(a, n)) for a, n in checked.values()]
    return {"keys": [f"`{k}`" for k in checked], "numeric_zero": not any(np.any(n) for _, n in checked.values()),
            "noise": [float(np.abs(a).max()) for a, _ in checked.values()], "gaps": [g for g, _ in gaps],
            "rels": [r for _, r in gaps], "floor": ABS_FLOOR, "h": H_STEP,
            "verdicts": sorted({verdict_text(check_passes(g, r), r >= REL_TOL, "on the absolute floor")
                                for g, r in gaps})}


PERTURB = MOVE  # gradcheck_model moves every 1-D parameter by this times a standard normal draw


def gradcheck():
    ex = tiny()
    report = gradcheck_model(ex.cfg, ex.ids, np.array([TINY_TARGETS]), seed=SEED, h=H_STEP, perturb=PERTURB)
    rows = [sections.GradRow(name, ex.params[name].shape, gap, rel, "float64", H_STEP)
            for name, (gap, rel) in report.items()]
    floor = [r for r in rows if r.rel >= REL_TOL]
    table = sections.gradcheck_table(rows, "the loss itself (the tiny example's mean cross-entropy), not a "
                                           "[fake loss](../reference/notation.md#fake-loss)")
    return table, {"rows": len(rows), "seeds": [SEED, SEED + 1], "perturb": PERTURB,
                   "floor_rows": [f"`{r.label}`" for r in floor], "floor_rels": [r.rel for r in floor],
                   "floor_gaps": [r.gap for r in floor], "abs_floor": ABS_FLOOR}


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


def backward_symbol_rows(ex, targets, d, grads):
    """The backward's rows of the page's symbol table (model.symbols_md adds the forward's)."""
    B, T = ex.ids.shape
    return [
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


def fragments():
    """The backward's tables and values: ({name: table or diagram}, {value name: value})."""
    follow_math, follow = follow_backward()
    dictionary_tables, zeros = dictionary()
    side_table, floor = side_by_side()
    gradcheck_table, checked = gradcheck()
    tables = {**backward_tables(), **dictionary_tables, "follow_backward": follow_math,
              "chain_check": sections.gradcheck_table(chain_rows(), "the loss itself"), "side_by_side": side_table,
              "gradcheck": gradcheck_table}
    values = {"backward": backward_values(), "zeros": zeros, "follow_back": follow, "floor": floor,
              "checked": checked}
    return tables, values
