"""Generator of the Full Model page's fragments: the forward's symbols, shapes, tiny example and traces,
where the softmax of the logits happens, the cache, and the parameter keys and their count. The backward's
fragments come from site_scripts/pages/_model_backward.py."""

import ast
import importlib
import inspect
import re

import numpy as np

from transformer.block import BLOCK_KEYS
from transformer.config import PRESETS, ModelConfig
from transformer.generate import sample_rows
from transformer.model import forward, init_params, loss_and_grads, param_count, param_shapes
from transformer.optim import clip_grads, global_norm, is_decayed
from transformer.softmax import cross_entropy_backward, cross_entropy_forward, softmax_forward
from transformer.step import finite_loss_and_grads, train_step
from transformer.train_config import TrainConfig

from .. import code_facts, depends, sections
from ..cache_inventory import inventory_md
from ..common import md_table, verdict_text
from ..examples import SEED, TINY_IDS, TINY_TARGETS, default_note, default_run, illustrative, sizes, tiny
from ..tiny_backward import tiny_backward
from . import _model_backward as model_backward
from ._model_backward import PAGE, calls_md, here

# Distinct primes for each size: a shape computed with them reads back as symbols.
SYMBOLIC = {101: "n_V", 103: r"T_{\max}", 107: "d", 109: "F"}
ROLES = {  # what each parameter is for (prose); a key missing here stops the build
    "tok_emb": r"\(E_{\mathrm{tok}}\), the token embedding table",
    "pos_emb": r"\(E_{\mathrm{pos}}\), the position embedding table",
    "ln1_g": r"\(\gamma_{\mathrm{LN}_1}\), the first LayerNorm's gain",
    "ln1_b": r"\(\beta_{\mathrm{LN}_1}\), the first LayerNorm's shift",
    "wq": r"\(W_q\), the query projection", "bq": r"\(b_q\), the query bias",
    "wk": r"\(W_k\), the key projection", "bk": r"\(b_k\), the key bias",
    "wv": r"\(W_v\), the value projection", "bv": r"\(b_v\), the value bias",
    "wo": r"\(W_o\), the output projection of the heads", "bo": r"\(b_o\), the output bias",
    "ln2_g": r"\(\gamma_{\mathrm{LN}_2}\), the second LayerNorm's gain",
    "ln2_b": r"\(\beta_{\mathrm{LN}_2}\), the second LayerNorm's shift",
    "ff1_w": r"\(W_1\), the feed-forward network's first weights", "ff1_b": r"\(b_1\), its first bias",
    "ff2_w": r"\(W_2\), the feed-forward network's second weights", "ff2_b": r"\(b_2\), its second bias",
    "lnf_g": r"\(\gamma_{\mathrm{LN}_f}\), the final LayerNorm's gain",
    "lnf_b": r"\(\beta_{\mathrm{LN}_f}\), the final LayerNorm's shift",
    "head_w": r"\(W_h\), the head: width \(d\) to \(n_V\) logits", "head_b": r"\(b_h\), the head's bias",
}


def forward_md():
    trace, p = tiny().trace, tiny().params
    out = [illustrative(f"ids `{TINY_IDS}`; the tensors are `forward(..., trace=...)`'s intermediates."), "",
           "The calls `forward` makes, in source order (the block call runs once per layer):\n", calls_md("forward"),
           "The tensors at each step, in the order they are computed:\n"]
    for key, value in trace.items():
        v = value[0]
        label = f"{key} {sections.shape_text(value.shape)}" + (", head 0" if v.ndim > 2 else "")
        out.append(f"**{label}**\n\n" + sections.array_md(key, v if v.ndim <= 2 else v[0], row_label="position"))
    out.append("The head's parameters, which the last step multiplies by:\n")
    out += [weight_md("head_w", p["head_w"]), sections.array_md("head_b", p["head_b"])]
    return "\n".join(out)


def weight_md(name, w):
    """A weight matrix as a table whose header says which index is the input unit and which the output unit."""
    table = sections.array_md(name, w, row_label="row")
    return table.replace(" (row \\ column)", r" (row \(i\), input unit \ column \(i'\), output unit)", 1)


def follow_forward_md():
    """Z[0, 0] = Σ_i X_f[0, i] W_h[i, 0] + b_h[0], with the tiny example's numbers."""
    ex = tiny()
    xf, w, b, z = ex.trace["lnf"][0][0], ex.params["head_w"][:, 0], ex.params["head_b"][0], ex.trace["logits"][0, 0, 0]
    terms, printed = model_backward.products(zip(xf, w))
    return ("One entry of [the head](#eq-head), by hand: row 0 of the `lnf` table against column 0 of `head_w`, "
            "plus entry 0 of `head_b`:\n\n"
            "$$\n\\begin{aligned}\nZ_{00} &= \\sum_i X_f[0,i]\\, W_h[i,0] + b_h[0] \\\\\n"
            f"&= {terms} + ({sections.fixed(b)}) \\\\\n&= {sections.fixed(z)}\n\\end{{aligned}}\n$$\n\n"
            f"{model_backward.by_hand(printed + round(float(b), 4), float(xf @ w + b))}, and entry (0, 0) of the "
            f"`logits` table is that number: {sections.fixed(z, 5)}.\n")


def forward_symbols_md():
    ex = default_run()
    cfg, trace, p, L = ex.cfg, ex.trace, ex.params, ex.cfg.num_layers
    rows = [
        (r"\mathrm{id}", "ids", ex.ids.shape),
        (r"T", "ids.shape[-1]", f"{ex.ids.shape[1]}"),
        (r"T_{\max}", "cfg.context_len", f"{cfg.context_len}"),
        (r"E_{\mathrm{tok}}", 'params["tok_emb"]', p["tok_emb"].shape),
        (r"E_{\mathrm{pos}}", 'params["pos_emb"]', p["pos_emb"].shape),
        (r"X^{(0)}", "x, from embedding_forward", trace["embedding"].shape),
        (r"\operatorname{Block}_l", "block_forward(x, block_params(params, layer), cfg)", "(B, T, d) → (B, T, d)"),
        (r"X^{(l)}", "x, in the loop over layers", trace["b0.out"].shape),
        (r"L", "cfg.num_layers", f"{L}"),
        (r"X^{(L)}", "x, into the final layer_norm_forward", trace[f"b{L - 1}.out"].shape),
        (r"X_f", "x, from the final layer_norm_forward", trace["lnf"].shape),
        (r"W_h", 'params["head_w"]', p["head_w"].shape),
        (r"b_h", 'params["head_b"]', p["head_b"].shape),
        (r"Z", "logits", trace["logits"].shape),
        (r"n_V", "cfg.vocab_size", f"{cfg.vocab_size}"),
        (r"d", "cfg.emb_dim", f"{cfg.emb_dim}"),
    ]
    return sections.symbols_md(rows, default_note())


TRACE_SYMBOLS = {"embedding": "X^{(0)}", "ln1": "U_1", "attention": r"\alpha^{(h)}", "ln2": "U_2",
                 "out": "X^{(l+1)}", "lnf": "X_f", "logits": "Z"}


def forward_shapes_md():
    """Every intermediate of a forward at the default config, its symbol and shape."""
    ex, table = default_run(), sections.notation()
    rows = []
    for key, value in ex.trace.items():
        symbol = TRACE_SYMBOLS[key.split(".")[-1]]
        if key.endswith(".out"):
            symbol = f"X^{{({int(key[1:key.index('.')]) + 1})}}"
        rows.append([f"`{key}`", f"\\({symbol}\\)", table.get(symbol, table[TRACE_SYMBOLS["out"]])[1],
                     sections.shape_text(value.shape)])
    return ("Every tensor `forward` computes, in order, at " + default_note() + ":\n\n"
            + md_table(["Traced as", "Symbol", "Shape", "At the default config"], rows))


def symbolic_shape(shape):
    return r"\((" + ", ".join(SYMBOLIC[n] for n in shape) + ("," if len(shape) == 1 else "") + r")\)"


def init_rule(name, value, shape):
    if len(shape) == 2:
        return f"Xavier, \\(a\\) = {np.sqrt(6 / sum(shape)):.4f}"
    if np.all(value == 1):
        return "ones"
    if np.all(value == 0):
        return "zeros"
    raise RuntimeError(f"{name}: an initialisation this table does not know")


def params_md():
    sym = ModelConfig(vocab_size=101, context_len=103, emb_dim=107, num_heads=1, num_layers=1, ff_dim=109)
    cfg = PRESETS["default"]
    shapes, params = param_shapes(cfg), init_params(cfg, seed=SEED)
    kinds = {}
    for name, shape in param_shapes(sym).items():
        short = name.split(".", 1)[-1]
        kinds[short if "." not in name else "b{l}." + short] = (short, symbolic_shape(shape))
    rows = []
    for key, (short, symbolic) in kinds.items():
        real = key.replace("{l}", "0")
        shape = shapes[real]
        rows.append([f"`{key}`", symbolic, sections.shape_text(shape), int(np.prod(shape)), ROLES[short],
                     init_rule(real, params[real], shape), "yes" if is_decayed(real) else "no"])
    every = [[f"`{k}`", sections.shape_text(s), int(np.prod(s)), "yes" if is_decayed(k) else "no"]
             for k, s in shapes.items()]
    total = sum(int(np.prod(s)) for s in shapes.values())
    counts = []
    for name, c in PRESETS.items():
        real = sum(v.size for v in init_params(c, seed=SEED).values())
        counts.append([name, c.vocab_size, c.context_len, c.emb_dim, c.num_layers, c.ff_dim, param_count(c), real,
                       "equal" if param_count(c) == real else "**DIFFER**"])
    return {
        "param-kinds": sections.md_table(["Key", "Shape", "Default config", "Scalars", "Role", "Initialisation",
                                          "Decay"], rows)
        + "\nThe symbolic shapes were read back from `param_shapes` called with distinct primes for \\(n_V\\), "
          "\\(T_{\\max}\\), \\(d\\) and \\(F\\); `b{l}.` keys repeat for each block \\(l = 0, \\dots, L - 1\\). Xavier "
          "means \\(U(-a, a)\\) with \\(a = \\sqrt{6 / (\\text{rows} + \\text{columns})}\\) ([the equation]("
          + sections.page_link(PAGE, "linear", "eq-xavier") + ")). Weight decay is `is_decayed(key)`.\n",
        "param-every": f"All {len(shapes)} keys at {default_note(batch=False)}, in the order of `param_shapes`:\n\n"
        + sections.md_table(["Key", "Shape", "Scalars", "Weight decay"], every)
        + f"\nTotal: **{total}** scalars.\n",
        "param-count": sections.md_table(["Preset", r"\(n_V\)", r"\(T_{\max}\)", r"\(d\)", r"\(L\)", r"\(F\)",
                                          "`param_count`",
                                          "Scalars `init_params` made", "Check"], counts),
    }




# ---------------------------------------------------------------- the logits and the cache

def line_with(function, text):
    """The file's line number of the first line of `function` holding `text` (a line the page points at)."""
    lines, start = inspect.getsourcelines(function)
    found = next((start + i for i, line in enumerate(lines) if text in line), None)
    if found is None:
        raise LookupError(f"{function.__name__} has no line with {text!r}: the page's sentence about it is stale")
    return found


def code_link(function, line):
    path = inspect.getsourcefile(function).split("/transformer/")[-1]
    return f"[`{path}:{line}`]({sections.function_link(PAGE, f'transformer/{path}', function.__name__, line)})"


def softmax_where_md():
    z = tiny().trace["logits"][0]
    p, _ = softmax_forward(z.copy())
    shift = 3.0
    shifted, _ = softmax_forward(z + shift)
    lse = line_with(cross_entropy_forward, "log_sum_exp = ")
    probs = line_with(cross_entropy_backward, "probs = np.exp(")
    sampler = line_with(sample_rows, "softmax_forward(")
    others = [c for c in code_facts.called_by("softmax:softmax_forward") if c.function != sample_rows.__name__]
    if {c.function for c in others} != {"attention_forward", "decode_block"}:
        raise RuntimeError(f"softmax_forward is called by {others}: say what each call turns into probabilities")
    low, high, total = (sections.fixed(v) for v in (z[0].min(), z[0].max(), z[0].sum()))
    return (f"Row 0 of the tiny example's logits runs from {low} to {high} and sums to {total}: scores, not a "
            f"distribution. Its softmax sums to {p[0].sum():.4f}, and adding "
            f"{shift:g} to every logit of a row changes no probability (largest change "
            f"{np.abs(shifted - p).max():.1e}).\n\n"
            f"- **In the loss.** `cross_entropy_forward` never forms \\(P\\): it takes the log-probability of the "
            f"target from the logits, as the target's logit minus a log-sum-exp "
            f"({code_link(cross_entropy_forward, lse)}), which stays finite where the log of a softmax would give "
            f"log(0). `cross_entropy_backward` forms \\(P\\) itself, as exp(logit − log-sum-exp) "
            f"({code_link(cross_entropy_backward, probs)}), to return \\((P - e_y)/N\\).\n"
            f"- **In the sampler.** `sample_rows` (which `sample_next` calls with one row) divides each row of logits by "
            f"the temperature and calls `softmax_forward` on them ({code_link(sample_rows, sampler)}) before drawing "
            "a token from each.\n\n"
            "The other calls of `softmax_forward` ("
            + ", ".join(f"`{c.function}`, `{c.path}:{c.line}`" for c in others) + ") "
            "turn attention scores into attention weights; none is applied to the logits.\n")


def cache_fields():
    """The names of forward's cache tuple, as `forward` builds it, and each one's description from its docstring."""
    fn = depends.module_source("model").defs["forward"]
    built = next(n for n in ast.walk(fn) if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", "") == "cache")
    described = dict(re.findall(r"^\s*- (\w+): (.+?);?\.?$", inspect.getdoc(forward), flags=re.M))
    return built.lineno, [(e.id, described[e.id]) for e in built.value.elts]


def made_at(fn, name):
    """Lines of fn where `name` gets its value from a call, and that call's name (through `.append(x)` to x)."""
    found = []
    for node in ast.walk(fn):
        assigned = node.targets[0] if isinstance(node, ast.Assign) else None
        if assigned and name in {t.id for t in ast.walk(assigned) if isinstance(t, ast.Name)}:
            value = node.value.elts[0] if isinstance(node.value, ast.Tuple) else node.value
            if isinstance(value, ast.Call) and isinstance(value.func, ast.Name):
                found.append((node.lineno, value.func.id))
            elif isinstance(value, ast.Compare):
                found.append((node.lineno, None))
        if isinstance(node, ast.Call) and ast.unparse(node.func) == f"{name}.append":
            found += made_at(fn, node.args[0].id)
    return sorted(found)


def read_at(fn, name):
    """(line, the smallest call holding it, else the line) for each place fn reads `name`, but the line that
    unpacks the cache into it."""
    text = (sections.ROOT / "transformer/model.py").read_text()
    unpack = next(n.lineno for n in ast.walk(fn) if isinstance(n, ast.Assign) and ast.unparse(n.value) == "cache")
    found = {}
    for call in [fn, *(n for n in ast.walk(fn) if isinstance(n, ast.Call))]:
        for n in ast.walk(call):
            if isinstance(n, ast.Name) and n.id == name and n.lineno != unpack:
                small = call is not fn and (n.lineno not in found or len(found[n.lineno]) > len(ast.unparse(call)))
                found[n.lineno] = ast.get_source_segment(text, call) if small else found.get(
                    n.lineno, text.splitlines()[n.lineno - 1].split("  #")[0].strip())
    return sorted(found.items())


def cache_md():
    ex = tiny()
    _, cache = forward(ex.params, ex.ids, ex.cfg)
    source, (line, fields) = depends.module_source("model"), cache_fields()
    fwd, bwd = source.defs["forward"], source.defs["backward"]
    rows = []
    for (name, holds), value in zip(fields, cache, strict=True):
        made = made_at(fwd, name)
        built = "; ".join(f"[{n}]({here('forward', n)})" + (f" `{c}`" if c else "") for n, c in made)
        read = "; ".join(f"[{n}]({here('backward', n)}) `{code}`" for n, code in read_at(bwd, name))
        rows.append([f"`{name}`", holds, built, contents(value, source, made[-1][1]), read])
    calls = code_facts.called_by("model:forward")
    backward_callers = {(c.path, c.function) for c in code_facts.called_by("model:backward")}
    return (f"`forward` returns its cache as one tuple ([line {line}]({here('forward', line)})); `backward` unpacks "
            "it in the same order. The fields are read from that line, what each holds from `forward`'s docstring, "
            "and the contents from the tiny example, named as the function that built them names its cache:\n\n"
            + md_table(["Field", "Holds", "Built at", "On the tiny example", "Read by backward at"], rows)
            + "\nEach function's page says what its own cache holds and why. Of the "
              f"{len(calls)} calls of `forward` in `transformer/`, "
            + "; ".join(f"`{c.function}` (`{c.path}:{c.line}`) {kept(c, backward_callers)}" for c in calls) + ".\n")


def contents(value, source, builder):
    """A cache field of the tiny example, by the names its builder's docstring gives the parts of its cache."""
    if builder is None:
        return f"`{value}`"
    if isinstance(value, list):  # built by run_block, a local name for block_forward or its checkpointed twin
        return f"{len(value)} × `{type(value[0]).__name__}`: " + ", ".join(f"`{f}`" for f in value[0]._fields)
    module, name = source.names[builder]
    doc = inspect.getdoc(getattr(importlib.import_module(f"transformer.{module}"), name))
    names = re.search(r"^cache : \((.+)\)$", doc, flags=re.M).group(1).split(", ")
    return "; ".join(f"`{n}` " + (f"array {sections.shape_text(v.shape)}" if isinstance(v, np.ndarray) else f"`{v}`")
                     for n, v in zip(names, value, strict=True))


def kept(call, backward_callers):
    """What a call of forward does with the cache: read from its line, and from whether the function that makes
    the call also calls `backward` (backward_callers: (path, function) of each call of model.backward)."""
    line = (sections.ROOT / call.path).read_text().splitlines()[call.line - 1]
    if re.search(r", _ = \w*forward\(", line) or re.search(r"\w*forward\(.*\)\[0\]", line):  # hand_forward too
        return "throws it away"
    if (call.path, call.function) in backward_callers:
        return "keeps it for `backward`"
    return "keeps it, and calls no `backward`"


# ---------------------------------------------------------------- the keys and the update

def key_pattern_md():
    """Where the block keys' prefix is written in the code, and what is outside the blocks."""
    ex, bw = tiny(), tiny_backward()
    places = []
    for module, function in (("model", "param_shapes"), ("block", "block_params"), ("model", "backward")):
        fn = depends.module_source(module).defs[function]
        for node in ast.walk(fn):
            if isinstance(node, ast.JoinedStr) and ast.unparse(node).startswith("f'b{"):
                link = sections.function_link(PAGE, f"transformer/{module}.py", function, node.lineno)
                places.append(f"[`{function}`, line {node.lineno}]({link}) (`{ast.unparse(node)}`)")
    outside = [k for k in ex.params if "." not in k]
    head, tok = ex.params["head_w"], ex.params["tok_emb"]
    return (f"The prefix is written in {len(places)} places: {'; '.join(places)}. Inside the prefix, the "
            f"{len(BLOCK_KEYS)} names of `BLOCK_KEYS`: {', '.join(f'`{k}`' for k in BLOCK_KEYS)}. Outside the "
            f"blocks: {', '.join(f'`{k}`' for k in outside)}.\n\n"
            f"In the tiny model `head_w` {sections.shape_text(head.shape)} and `tok_emb` "
            f"{sections.shape_text(tok.shape)} are two arrays: they share no memory "
            f"(`np.shares_memory`: {np.shares_memory(head, tok)}), `head_w` differs from `tok_emb` transposed by up "
            f"to {np.abs(head - tok.T).max():.4f}, and each receives only its own gradient (those differ by up to "
            f"{np.abs(bw.grads['head_w'] - bw.grads['tok_emb'].T).max():.4f}).\n")



def update_md():
    """How the gradients of one batch become one parameter update, read from train_step."""
    tc, cfg = TrainConfig(), PRESETS["default"]
    steps = (train_step.__name__, finite_loss_and_grads.__name__)  # the second refuses what is not finite
    calls = {name: next(p for p in code_facts.calls_named(name) if p.function in steps)
             for name in ("loss_and_grads", "clip_grads", "adamw_update")}
    link = {n: f"[`{p.path.rsplit('/', 1)[-1]}:{p.line}`]({sections.function_link(PAGE, p.path, p.function, p.line)})"
            for n, p in calls.items()}
    seq_len = tc.seq_len or cfg.context_len
    return (f"`train_step` calls `loss_and_grads` (through `{steps[1]}`, which refuses a loss or a gradient that is "
            f"not finite) on a batch of \\(B = {tc.batch_size}\\) windows of "
            f"\\(T = {seq_len}\\) tokens ({link['loss_and_grads']}): one forward and one backward for the whole "
            f"batch, so every gradient is already the average over the \\(N = BT = {tc.batch_size * seq_len}\\) "
            f"positions (the \\(1/N\\) of [the gradient on the logits](#eq-model-dlogits)). It then clips the "
            f"gradients by their global norm to \\(\\rho = {tc.grad_clip}\\) "
            f"({link['clip_grads']}) and hands them to `adamw_update` ({link['adamw_update']}).\n\n"
            + batch_average_md() + clip_example_md(tc.grad_clip))



def batch_average_md():
    ex, bw = tiny(), tiny_backward()
    rng = np.random.default_rng(SEED)
    other = rng.integers(0, ex.cfg.vocab_size, (2, len(TINY_IDS)))
    ids, targets = np.stack([ex.ids[0], other[0]]), np.stack([np.array(TINY_TARGETS), other[1]])
    _, second = loss_and_grads(ex.params, other[0], other[1], ex.cfg)
    _, both = loss_and_grads(ex.params, ids, targets, ex.cfg)
    gap = max(np.abs(both[k] - (bw.grads[k] + second[k]) / 2).max() for k in both)
    scale = max(np.abs(g).max() for g in both.values())
    verdict = verdict_text(gap <= 1e-12 * scale, False, "")
    return (f"On the tiny model: the gradients of the batch of two windows, ids `{ids.tolist()}`, equal the mean of "
            f"each window's own gradients to within {gap:.1e}, against a largest entry of {scale:.4f} (the check: "
            f"a gap below 1e-12 times that entry; result: {verdict}).\n\n")



def clip_example_md(rho):
    grads = tiny_backward().grads
    norm = global_norm(grads)
    clipped, _ = clip_grads(grads, rho)
    scale = global_norm(clipped) / norm
    what = f"scales every gradient by the same {scale:.4f}" if norm > rho else "leaves them as they are"
    return (f"The tiny example's gradients have global norm {norm:.4f}; at \\(\\rho = {rho}\\), `clip_grads` {what}. "
            f"What AdamW then does with each gradient, and the clipping rule, are on the "
            f"[AdamW / Learning rate / Clipping]({sections.page_link(PAGE, 'optim')}) page.\n")




def generate(context):
    return {
        "forward": forward_md(), "follow-forward": follow_forward_md(), "forward-symbols": forward_symbols_md(),
        "forward-shapes": forward_shapes_md(), "logits": softmax_where_md(), "cache": cache_md(), **params_md(),
        "keys": key_pattern_md(), "update": update_md(),
        "cache-inventory": inventory_md(PAGE, context["repo_url"]),
        "sizes": f"At the default config: {sizes(PRESETS['default'])}.\n", **model_backward.fragments(),
    }
