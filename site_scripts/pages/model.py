"""Generator of the Full Model page: the values its prose shows (docs/model/full-model.md binds them) and its
tables, diagrams and written-out arithmetic. This file holds the forward's story (the tiny example's tensors,
where the logits become probabilities), the parameters and the way to the update; the backward's story and its
checks are in site_scripts/pages/_model_backward.py, the cache in _model_cache.py, the diagrams in _model_flow.py."""

import ast
import inspect

import numpy as np

from transformer.block import BLOCK_KEYS
from transformer.config import PRESETS, ModelConfig
from transformer.generate import sample_rows
from transformer.model import head_weights, init_params, loss_and_grads, param_count, param_shapes
from transformer.optim import clip_grads, global_norm, is_decayed
from transformer.softmax import cross_entropy_backward, cross_entropy_forward, softmax_forward
from transformer.step import finite_loss_and_grads, train_step
from transformer.train_config import TrainConfig

from .. import code_facts, depends, sections
from ..common import md_table, verdict_text
from ..examples import SEED, TINY_IDS, TINY_TARGETS, default_note, tiny
from ..tiny_backward import tiny_backward
from . import _model_backward as model_backward
from . import _model_cache as model_cache
from . import _model_flow as model_flow
from ._model_backward import PAGE, calls_md, tiny_sizes

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


# ---------------------------------------------------------------- the tiny example, forward

def trace_name(key):
    """The fragment of a traced tensor: `b0.ln1` -> fwd_b0_ln1."""
    return "fwd_" + key.replace(".", "_")


def forward_tables():
    """The calls `forward` makes, and every tensor of the tiny example's trace (an attention trace: head 0's
    weights), with the head's parameters."""
    ex = tiny()
    tables = {"forward_calls": calls_md("forward")}
    for key, value in ex.trace.items():
        v = value[0]
        tables[trace_name(key)] = sections.array_md(key, v if v.ndim <= 2 else v[0], row_label="position")
    tables["head_w"] = weight_md("head_w", ex.params["head_w"])
    tables["head_b"] = sections.array_md("head_b", ex.params["head_b"])
    return tables


def forward_values():
    ex = tiny()
    return {"ids": TINY_IDS, "sizes": tiny_sizes(), "shapes": {k.replace(".", "_"): v.shape for k, v in ex.trace.items()}}


def weight_md(name, w):
    """A weight matrix as a table whose header says which index is the input unit and which the output unit."""
    table = sections.array_md(name, w, row_label="row")
    return table.replace(" (row \\ column)", r" (row \(i\), input unit \ column \(i'\), output unit)", 1)


def follow_forward():
    """Z[0, 0] = Σ_i X_f[0, i] W_h[i, 0] + b_h[0], written out with the tiny example's numbers: the display maths,
    and what the printed factors and the unrounded arrays give."""
    ex = tiny()
    xf, w, b, z = ex.trace["lnf"][0][0], ex.params["head_w"][:, 0], ex.params["head_b"][0], ex.trace["logits"][0, 0, 0]
    terms, printed = model_backward.products(zip(xf, w))
    math = ("$$\n\\begin{aligned}\nZ_{00} &= \\sum_i X_f[0,i]\\, W_h[i,0] + b_h[0] \\\\\n"
            f"&= {terms} + ({sections.fixed(b)}) \\\\\n&= {sections.fixed(z)}\n\\end{{aligned}}\n$$\n")
    return math, {"printed": printed + round(float(b), 4), "unrounded": float(xf @ w + b), "logit": float(z)}


def softmax_values():
    """Row 0 of the tiny example's logits: scores, not a distribution; and where the code turns logits into
    probabilities (a link to each line)."""
    z = tiny().trace["logits"][0]
    p, _ = softmax_forward(z.copy())
    shift = 3.0
    shifted, _ = softmax_forward(z + shift)
    others = [c for c in code_facts.called_by("softmax:softmax_forward") if c.function != sample_rows.__name__]
    return {"low": z[0].min(), "high": z[0].max(), "total": z[0].sum(), "p_sum": p[0].sum(), "shift": shift,
            "change": float(np.abs(shifted - p).max()),
            "lse": code_link(cross_entropy_forward, line_with(cross_entropy_forward, "log_sum_exp = ")),
            "probs": code_link(cross_entropy_backward, line_with(cross_entropy_backward, "probs = np.exp(")),
            "sampler": code_link(sample_rows, line_with(sample_rows, "softmax_forward(")),
            "others": [f"`{c.function}`, `{c.path}:{c.line}`" for c in others]}


def other_softmax_callers():
    """The functions other than the sampler that call softmax_forward (the page says they are attention's)."""
    return {c.function for c in code_facts.called_by("softmax:softmax_forward") if c.function != sample_rows.__name__}


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


# ---------------------------------------------------------------- the parameters

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


def kinds_table():
    """One row per kind of parameter (a block's keys once, as b{l}.*): symbolic and default shapes, role,
    initialisation, weight decay."""
    sym = ModelConfig(vocab_size=101, context_len=103, emb_dim=107, num_heads=1, num_layers=1, ff_dim=109)
    shapes, params = param_shapes(PRESETS["default"]), init_params(PRESETS["default"], seed=SEED)
    rows = []
    for name, shape in param_shapes(sym).items():
        short = name.split(".", 1)[-1]
        key = short if "." not in name else "b{l}." + short
        real = key.replace("{l}", "0")
        rows.append([f"`{key}`", symbolic_shape(shape), sections.shape_text(shapes[real]), int(np.prod(shapes[real])),
                     ROLES[short], init_rule(real, params[real], shapes[real]), "yes" if is_decayed(real) else "no"])
    return md_table(["Key", "Shape", "Default config", "Scalars", "Role", "Initialisation", "Decay"], rows)


def params():
    shapes = param_shapes(PRESETS["default"])
    every = [[f"`{k}`", sections.shape_text(s), int(np.prod(s)), "yes" if is_decayed(k) else "no"]
             for k, s in shapes.items()]
    counts = []
    for name, c in PRESETS.items():
        real = sum(v.size for v in init_params(c, seed=SEED, dtype=np.float32).values())  # float32: gpt2 is 124M
        head = ("tied to `tok_emb`" if c.tied_head else "`head_w`") + (", `head_b`" if c.head_bias else ", no bias")
        counts.append([name, c.vocab_size, c.context_len, c.emb_dim, c.num_layers, c.ff_dim, head, param_count(c),
                       real, "equal" if param_count(c) == real else "**DIFFER**"])
    gpt2 = PRESETS["gpt2"]
    tables = {"param_kinds": kinds_table(),
              "param_every": md_table(["Key", "Shape", "Scalars", "Weight decay"], every),
              "param_count": md_table(["Preset", r"\(n_V\)", r"\(T_{\max}\)", r"\(d\)", r"\(L\)", r"\(F\)",
                                       "Head", "`param_count`", "Scalars `init_params` made", "Check"], counts)}
    return tables, {"keys": len(shapes), "total": sum(int(np.prod(s)) for s in shapes.values()),
                    "xavier": sections.page_link(PAGE, "linear", "eq-xavier"),
                    "gpt2_table": gpt2.vocab_size * gpt2.emb_dim / param_count(gpt2)}


# ---------------------------------------------------------------- the keys and the update

def keys():
    """Where the block keys' prefix is written in the code, what is outside the blocks, and head_w against
    tok_emb: two arrays, each with its own gradient."""
    ex, bw = tiny(), tiny_backward()
    places = []
    for module, function in (("model", "param_shapes"), ("block", "block_params"), ("model", "backward")):
        fn = depends.module_source(module).defs[function]
        for node in ast.walk(fn):
            if isinstance(node, ast.JoinedStr) and ast.unparse(node).startswith("f'b{"):
                link = sections.function_link(PAGE, f"transformer/{module}.py", function, node.lineno)
                places.append(f"[`{function}`, line {node.lineno}]({link}) (`{ast.unparse(node)}`)")
    head, tok = ex.params["head_w"], ex.params["tok_emb"]
    return {"places": places, "count": len(places), "block_keys": [f"`{k}`" for k in BLOCK_KEYS],
            "n_block_keys": len(BLOCK_KEYS), "outside": [f"`{k}`" for k in ex.params if "." not in k],
            "head_shape": head.shape, "tok_shape": tok.shape, "shares": str(np.shares_memory(head, tok)),
            "differ": float(np.abs(head - tok.T).max()),
            "grads_differ": float(np.abs(bw.grads["head_w"] - bw.grads["tok_emb"].T).max()), **tied_head()}


def tied_head():
    """GPT-2's layout on gpt2-tiny: the head's weight is tok_emb's memory, and tok_emb's gradient is the
    embedding's share (the gradient of the same model with its own head, set to the same values) plus the
    head's share transposed."""
    cfg = PRESETS["gpt2-tiny"]
    params = init_params(cfg, seed=SEED)
    ids, targets = np.array(TINY_IDS), np.array(TINY_TARGETS)
    _, grads = loss_and_grads(params, ids, targets, cfg)
    untied = cfg.with_(tied_head=False)
    _, apart = loss_and_grads({**params, "head_w": params["tok_emb"].T.copy()}, ids, targets, untied)
    unread = np.setdiff1d(np.arange(cfg.vocab_size), ids)
    return {"tied_shares": str(np.shares_memory(head_weights(params, cfg)[0], params["tok_emb"])),
            "tied_gap": float(np.abs(grads["tok_emb"] - (apart["tok_emb"] + apart["head_w"].T)).max()),
            "tied_unread": len(unread), "unread_gap": float(np.abs(grads["tok_emb"] - apart["head_w"].T)[unread].max())}


def update():
    """How the gradients of one batch become one parameter update, read from train_step, with the tiny
    example's batch average and clipping."""
    tc, cfg = TrainConfig(), PRESETS["default"]
    steps = (train_step.__name__, finite_loss_and_grads.__name__)  # the second refuses what is not finite
    calls = {name: next(p for p in code_facts.calls_named(name) if p.function in steps)
             for name in ("loss_and_grads", "clip_grads", "adamw_update")}
    link = {n: f"[`{p.path.rsplit('/', 1)[-1]}:{p.line}`]({sections.function_link(PAGE, p.path, p.function, p.line)})"
            for n, p in calls.items()}
    seq_len = tc.seq_len or cfg.context_len
    grads = tiny_backward().grads
    norm = global_norm(grads)
    return {"checked_by": steps[1], "batch": tc.batch_size, "t": seq_len, "n": tc.batch_size * seq_len,
            "rho": tc.grad_clip, "links": link, "average": batch_average(), "norm": norm,
            "factor": global_norm(clip_grads(grads, tc.grad_clip)[0]) / norm,
            "optim": sections.page_link(PAGE, "optim")}


AVERAGE_TOL = 1e-12  # the batch's gradients equal the windows' mean when the gap is below this times the largest


def batch_average():
    """The gradients of a batch of two windows against the mean of each window's own."""
    ex, bw = tiny(), tiny_backward()
    other = np.random.default_rng(SEED).integers(0, ex.cfg.vocab_size, (2, len(TINY_IDS)))
    ids, targets = np.stack([ex.ids[0], other[0]]), np.stack([np.array(TINY_TARGETS), other[1]])
    _, second = loss_and_grads(ex.params, other[0], other[1], ex.cfg)
    _, both = loss_and_grads(ex.params, ids, targets, ex.cfg)
    gap = max(np.abs(both[k] - (bw.grads[k] + second[k]) / 2).max() for k in both)
    scale = max(np.abs(g).max() for g in both.values())
    return {"ids": str(ids.tolist()), "gap": gap, "scale": scale, "tol": AVERAGE_TOL,
            "verdict": verdict_text(gap <= AVERAGE_TOL * scale, False, "")}


# ---------------------------------------------------------------- the evidence: symbols and shapes

def symbols_md():
    """The forward's and the backward's symbols in one table, then every tensor `forward` computes."""
    ex, targets, d, grads = model_backward.default_backward()
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
        *model_backward.backward_symbol_rows(ex, targets, d, grads),
    ]
    return (sections.symbols_md(rows, default_note() + " and random targets") + "\n" + shapes_table(ex))


TRACE_SYMBOLS = {"embedding": "X^{(0)}", "ln1": "U_1", "attention": r"\alpha^{(h)}", "ln2": "U_2",
                 "out": "X^{(l+1)}", "lnf": "X_f", "logits": "Z"}


def shapes_table(ex):
    """Every intermediate of a forward at the default config, its symbol and shape."""
    table, rows = sections.notation(), []
    for key, value in ex.trace.items():
        symbol = TRACE_SYMBOLS[key.split(".")[-1]]
        if key.endswith(".out"):
            symbol = f"X^{{({int(key[1:key.index('.')]) + 1})}}"
        rows.append([f"`{key}`", f"\\({symbol}\\)", table.get(symbol, table[TRACE_SYMBOLS["out"]])[1],
                     sections.shape_text(value.shape)])
    return md_table(["Traced as", "Symbol", "Shape", "At the default config"], rows)


def default_sizes():
    cfg = PRESETS["default"]
    return {"n_v": cfg.vocab_size, "t_max": cfg.context_len, "d": cfg.emb_dim, "h": cfg.num_heads,
            "l": cfg.num_layers, "f": cfg.ff_dim}


def generate(context):
    follow_math, follow = follow_forward()
    param_tables, param_values = params()
    field_tables, field_values = model_cache.fields()
    inventory_tables, inventory_values = model_cache.inventory(context["repo_url"])
    backward_tables, backward_values = model_backward.fragments()
    diagrams, filled = model_flow.fragments()
    values = {"default": default_sizes(), "forward": forward_values(), "follow": follow, "logits": softmax_values(),
              "cache": {**field_values, **inventory_values}, "params": param_values, "keys": keys(),
              "update": update(), **backward_values, **filled}
    return {"values": values, **forward_tables(), "follow_forward": follow_math, **field_tables, **inventory_tables,
            **param_tables, **backward_tables, **diagrams, "symbols": symbols_md()}
