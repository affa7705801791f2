"""Generator of the Transformer Block page: the values its prose shows (docs/model/block.md binds them), its tables,
its written-out arithmetic (display maths only) and its picture.

The tiny example is block 0 of the tiny model, forward and driven backward by the model's real loss gradient (from
tiny_backward()). The checks of the derivation (`central_rows`, `planted_rows`) return their rows, so that
tests/site/test_pages_attn.py can show that each passes and that the planted mistakes are caught.
"""

from dataclasses import dataclass

import numpy as np

from transformer.activations import ACTIVATION_FUNCTIONS
from transformer.attention import attention_forward
from transformer.block import BLOCK_KEYS, block_backward, block_forward, block_params
from transformer.config import PRESETS
from transformer.gradcheck import numerical_grad
from transformer.layernorm import layer_norm_forward
from transformer.linear import linear_forward
from transformer.model import backward, forward
from transformer.softmax import cross_entropy_backward, cross_entropy_forward

from .. import sections
from ..common import md_table
from ..examples import H_STEP, SEED, TINY_IDS, default_note, default_run, tiny
from ..figures import new_figure, png
from ..tiny_backward import tiny_backward
from .attention import (BACK, aligned, bias_table, caught, gap_cells, grad, latex_table, number, products, tex, verdict,
                        weight_table)

ROW = 0  # the position whose numbers the example follows by hand


@dataclass(frozen=True)
class Forward:
    """Block 0 of the tiny example, one array per equation of the page (one window)."""
    cfg: object
    p: dict
    x: np.ndarray  # X, (T, d)
    u1: np.ndarray  # U_1 = LN_1(X)
    attn: np.ndarray  # Attn(U_1)
    m: np.ndarray  # M
    u2: np.ndarray  # U_2 = LN_2(M)
    g: np.ndarray  # G, (T, F)
    hidden: np.ndarray  # φ(G), (T, F)
    ffn: np.ndarray  # FFN(U_2), (T, d)
    out: np.ndarray  # X^(l+1)
    slope: np.ndarray  # φ'(G), (T, F), from the activation's own backward


def ffn(u2, p, activation):
    """G, φ(G) and FFN(U_2), with the model's functions."""
    g, _ = linear_forward(u2, p["ff1_w"], p["ff1_b"])
    hidden, _ = ACTIVATION_FUNCTIONS[activation][0](g)
    return g, hidden, linear_forward(hidden, p["ff2_w"], p["ff2_b"])[0]


def after_mid(m, p, cfg):
    """X^(l+1) from M: the feed-forward sub-layer with its residual."""
    return m + ffn(layer_norm_forward(m, p["ln2_g"], p["ln2_b"], cfg.ln_eps)[0], p, cfg.activation)[2]


def forward_steps():
    ex = tiny()
    cfg, p, x = ex.cfg, block_params(ex.params, 0), ex.trace["embedding"][0]
    u1 = layer_norm_forward(x, p["ln1_g"], p["ln1_b"], cfg.ln_eps)[0]
    attn = attention_forward(u1[None], p, cfg.num_heads)[0][0]
    m = x + attn
    u2 = layer_norm_forward(m, p["ln2_g"], p["ln2_b"], cfg.ln_eps)[0]
    g, hidden, out = ffn(u2, p, cfg.activation)
    forward_, backward_ = ACTIVATION_FUNCTIONS[cfg.activation]
    slope = backward_(np.ones_like(g), forward_(g)[1])  # the backward multiplies by φ'(G): times 1, φ'(G) itself
    return Forward(cfg, p, x, u1, attn, m, u2, g, hidden, out, m + out, slope)


def rms(a):
    """Each row's root mean square."""
    return np.sqrt((a ** 2).mean(-1))


# ---------------------------------------------------------------- the tiny example, forward

def forward_tables(fw):
    return {"x": latex_table("X", fw.x), "u1": latex_table("U_1 = \\operatorname{LN}_1(X)", fw.u1),
            "attn": latex_table("\\operatorname{Attn}(U_1)", fw.attn),
            "m": latex_table("M = X + \\operatorname{Attn}(U_1)", fw.m),
            "u2": latex_table("U_2 = \\operatorname{LN}_2(M)", fw.u2),
            "w1": weight_table("W_1", fw.p["ff1_w"]), "b1": bias_table("1", fw.p["ff1_b"]),
            "w2": weight_table("W_2", fw.p["ff2_w"]), "b2": bias_table("2", fw.p["ff2_b"]),
            "g": latex_table("G = U_2 W_1 + b_1", fw.g), "hidden": latex_table("\\phi(G)", fw.hidden),
            "ffn": latex_table("\\operatorname{FFN}(U_2) = \\phi(G) W_2 + b_2", fw.ffn),
            "out": latex_table("X^{(l+1)} = M + \\operatorname{FFN}(U_2)", fw.out),
            "follow_forward": follow_forward_md(fw)}


def follow_forward_md(fw):
    """X^(l+1)[ROW, 0] = M + FFN, with FFN's entry written out from φ(G) and W_2: display maths only."""
    t, w2, b2 = ROW, fw.p["ff2_w"], fw.p["ff2_b"]
    terms = products([(tex(fw.hidden[t, i]), tex(w2[i, 0])) for i in range(len(w2))])  # i: a hidden unit
    return aligned([f"\\operatorname{{FFN}}(U_2)_{{{t}0}} &= \\textstyle\\sum_i \\phi(G)_{{{t}i}} W_{{2,i0}} + "
                    f"b_{{2,0}} \\\\ &= {terms} + {tex(b2[0])} = {number(fw.ffn[t, 0])}",
                    f"X^{{(l+1)}}_{{{t}0}} &= M_{{{t}0}} + \\operatorname{{FFN}}(U_2)_{{{t}0}} = {tex(fw.m[t, 0])} + "
                    f"{tex(fw.ffn[t, 0])} = {number(fw.out[t, 0])}"])


def forward_values(fw):
    cfg, sub = PRESETS["tiny"], np.concatenate([rms(fw.u1), rms(fw.u2)])
    ratio = np.linalg.norm(fw.out - fw.x) / np.linalg.norm(fw.x)
    return {"activation": fw.cfg.activation, "row": ROW,
            "sizes": {"n_v": cfg.vocab_size, "t_max": cfg.context_len, "d": cfg.emb_dim, "h": cfg.num_heads,
                      "l": cfg.num_layers, "f": cfg.ff_dim},
            "trace_gap": float(np.abs(tiny().trace["b0.out"][0] - fw.out).max()),
            "growth": {"ratio": ratio, "x_lo": rms(fw.x).min(), "x_hi": rms(fw.x).max(),
                       "sub_dev": float(np.abs(sub - 1).max()), "out_lo": rms(fw.out).min(),
                       "out_hi": rms(fw.out).max()}}


# ---------------------------------------------------------------- the tiny example, backward

STEPS = (  # (fragment, symbol, the replay's step), in block_backward's order
    ("dout", "X^{(l+1)}", "b0.dout"), ("dhidden", "\\phi(G)", "b0.dhidden"), ("dpre", "G", "b0.dpre"),
    ("dln2", "U_2", "b0.dln2"), ("dmid", "M", "b0.dmid"), ("dln1", "U_1", "b0.dln1"), ("din", "X", "b0.din"),
)


def branch_terms(steps):
    """The branches' terms of ∂ℓ/∂X, one window: ∂ℓ/∂M − ∂ℓ/∂X^(l+1) (FFN) and ∂ℓ/∂X − ∂ℓ/∂M (attention)."""
    return (steps["b0.dmid"] - steps["b0.dout"])[0], (steps["b0.din"] - steps["b0.dmid"])[0]


def backward_tables(fw, steps):
    ffn_part, attn_part = branch_terms(steps)
    tables = {name: latex_table(grad(symbol), steps[key][0], decimals=BACK) for name, symbol, key in STEPS}
    tables["ffn_term"] = latex_table(f"{grad('M')} - {grad('X^{(l+1)}')}", ffn_part, decimals=BACK)
    tables["attn_term"] = latex_table(f"{grad('X')} - {grad('M')}", attn_part, decimals=BACK)
    return {**tables, **follow_backward(fw, steps)}


def hidden_unit(fw):
    """A hidden unit of row ROW that the activation passes (its slope is not 0), else 0."""
    open_units = fw.slope[ROW] > 0
    return int(np.argmax(open_units)) if open_units.any() else 0


def follow_backward(fw, steps):
    """One entry of ∂ℓ/∂φ(G) and ∂ℓ/∂G, and one of ∂ℓ/∂X split into its three terms: display maths only."""
    t, u, w2 = ROW, hidden_unit(fw), fw.p["ff2_w"]
    dout, dhid, dpre = steps["b0.dout"][0], steps["b0.dhidden"][0], steps["b0.dpre"][0]
    ffn_part, attn_part = branch_terms(steps)
    terms = products([(tex(dout[t, i], BACK), tex(w2[u, i], BACK)) for i in range(w2.shape[1])], per_line=2)
    hidden = aligned([f"\\frac{{\\partial\\ell}}{{\\partial \\phi(G)_{{{t}{u}}}}} &= \\textstyle\\sum_{{i'}} "
                      f"\\frac{{\\partial\\ell}}{{\\partial X^{{(l+1)}}_{{{t}i'}}}} W_{{2,{u}i'}} \\\\ &= {terms} = "
                      f"{number(dhid[t, u], BACK)}",
                      f"\\frac{{\\partial\\ell}}{{\\partial G_{{{t}{u}}}}} &= \\frac{{\\partial\\ell}}{{\\partial "
                      f"\\phi(G)_{{{t}{u}}}}}\\, \\phi'(G_{{{t}{u}}}) = {tex(dhid[t, u], BACK)} \\cdot "
                      f"{tex(fw.slope[t, u], BACK)} = {number(dpre[t, u], BACK)}"])
    split = aligned([f"\\frac{{\\partial\\ell}}{{\\partial X_{{{t}0}}}} &= \\underbrace{{{tex(dout[t, 0], BACK)}}}_"
                     f"{{\\text{{identity}}}} + \\underbrace{{{tex(ffn_part[t, 0], BACK)}}}_{{\\text{{FFN branch}}}} + "
                     f"\\underbrace{{{tex(attn_part[t, 0], BACK)}}}_{{\\text{{attention branch}}}} = "
                     f"{number(steps['b0.din'][0][t, 0], BACK)}"])
    return {"follow_hidden": hidden, "follow_input": split}


def backward_values(fw, steps, loss):
    _, cache = block_forward(fw.x[None], fw.p, fw.cfg)
    dx, _ = block_backward(steps["b0.dout"], cache)
    dout, din = steps["b0.dout"][0], steps["b0.din"][0]
    (ffn_part, attn_part), both, norm = branch_terms(steps), din - dout, np.linalg.norm
    u = hidden_unit(fw)
    return {"loss": loss, "block_gap": float(np.abs(dx - steps["b0.din"]).max()),
            "follow": {"unit": u, "g": fw.g[ROW, u], "slope": fw.slope[ROW, u]},
            "shares": {"both_lo": both.min(), "both_hi": both.max(), "dout_lo": dout.min(), "dout_hi": dout.max(),
                       "identity": norm(dout), "ffn": norm(ffn_part), "attn": norm(attn_part),
                       "attn_ratio": norm(attn_part) / norm(dout)},
            "ln1": {"dmid": norm(steps["b0.dmid"]), "dln1": norm(steps["b0.dln1"]),
                    "r_lo": (1 / np.sqrt(fw.x.var(-1) + fw.cfg.ln_eps)).min(),
                    "r_hi": (1 / np.sqrt(fw.x.var(-1) + fw.cfg.ln_eps)).max()}}


# ---------------------------------------------------------------- the derivation, checked

def central_rows(fw, steps):
    """The replay's gradients against central differences of f = Σ X^(l+1) ⊙ ∂ℓ/∂X^(l+1), from four places."""
    p, cfg, r = fw.p, fw.cfg, steps["b0.dout"][0]
    g, u2, m, x = fw.g.copy(), fw.u2.copy(), fw.m.copy(), fw.x[None].copy()
    act = ACTIVATION_FUNCTIONS[cfg.activation][0]
    f = lambda out: lambda: float(np.sum(out() * r))  # noqa: E731
    rows = sections.gradcheck_rows(f(lambda: fw.m + linear_forward(act(g)[0], p["ff2_w"], p["ff2_b"])[0]),
                                   [("b0.dpre", steps["b0.dpre"][0], g)], H_STEP)
    rows += sections.gradcheck_rows(f(lambda: fw.m + ffn(u2, p, cfg.activation)[2]),
                                    [("b0.dln2", steps["b0.dln2"][0], u2)], H_STEP)
    rows += sections.gradcheck_rows(f(lambda: after_mid(m, p, cfg)), [("b0.dmid", steps["b0.dmid"][0], m)], H_STEP)
    rows += sections.gradcheck_rows(f(lambda: block_forward(x, p, cfg)[0][0]), [("b0.din", steps["b0.din"], x)],
                                    H_STEP)
    return rows


PLANTED = (("all three terms (`b0.din`)", (1, 1, 1)),
           ("without the identity path \\(\\partial\\ell/\\partial X^{(l+1)}\\) (a planted mistake)", (0, 1, 1)),
           ("without the feed-forward branch (a planted mistake)", (1, 0, 1)),
           ("without the attention branch (a planted mistake)", (1, 1, 0)))


def planted_rows(fw, steps):
    """∂ℓ/∂X with one of its three terms left out, against the same central differences: each must be caught."""
    r, x = steps["b0.dout"], fw.x[None].copy()
    numeric = numerical_grad(lambda: float(np.sum(block_forward(x, fw.p, fw.cfg)[0] * r)), x, H_STEP)
    terms = (r, steps["b0.dmid"] - r, steps["b0.din"] - steps["b0.dmid"])
    rows = []
    for n, (name, keep) in enumerate(PLANTED):
        gap, rel = gap_cells(sum(k * term for k, term in zip(keep, terms, strict=True)), numeric)
        rows.append([name, f"{gap:.1e}", f"{rel:.1e}", verdict(gap, rel) if n == 0 else caught(gap, rel)])
    return rows


def check_tables(fw, steps):
    return {"central": sections.gradcheck_table(central_rows(fw, steps)),
            "planted": md_table(["\\(\\partial\\ell/\\partial X\\) from", "Largest gap", "Relative gap", "Result"],
                                planted_rows(fw, steps))}


# ---------------------------------------------------------------- the picture, and what it costs

def default_block():
    """Block 0 of the default run: its input X, M and output X^(l+1), and the gradients its real backward (mean
    cross-entropy against random targets) hands on."""
    ex = default_run()
    targets = np.random.default_rng(SEED).integers(0, ex.cfg.vocab_size, ex.ids.shape)
    logits, cache = forward(ex.params, ex.ids, ex.cfg)
    steps = {}
    backward(cross_entropy_backward(1.0, cross_entropy_forward(logits, targets)[1]), cache, trace=steps)
    x = ex.trace["embedding"]
    mid = x + attention_forward(ex.trace["b0.ln1"], block_params(ex.params, 0), ex.cfg.num_heads)[0]
    return (x, mid, ex.trace["b0.out"]), steps


def flow_png():
    """Per position of the default run's first window: the rows' size in the stream and in what each branch
    adds (forward), and the size of each term of ∂ℓ/∂X (backward)."""
    (x, mid, out), steps = default_block()
    x, mid, out = x[0], mid[0], out[0]
    dout, dmid, din = steps["b0.dout"][0], steps["b0.dmid"][0], steps["b0.din"][0]
    t = np.arange(len(x))
    fig, (left, right) = new_figure(1, 2, figsize=(10, 3.4))
    for a, label in ((x, "X (the stream in)"), (mid - x, "Attn(U₁), added"), (out - mid, "FFN(U₂), added"),
                     (out, "X⁽ˡ⁺¹⁾ (the stream out)")):
        left.plot(t, rms(a), marker=".", label=label)
    for a, label in ((dout, "identity: ∂ℓ/∂X⁽ˡ⁺¹⁾"), (dmid - dout, "feed-forward branch's term"),
                     (din - dmid, "attention branch's term")):
        right.plot(t, np.linalg.norm(a, axis=-1), marker=".", label=label)
    left.set_title("forward: root mean square of each row")
    right.set_title("backward: norm of each row of a term of ∂ℓ/∂X")
    from matplotlib.ticker import MaxNLocator

    for ax, y in ((left, "row RMS"), (right, "row norm")):
        ax.set_xlabel("position t")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_ylabel(y)
        ax.legend(fontsize="small")
    return png(fig)


def flow_values():
    (x, _, out), steps = default_block()
    dout, dmid, din = steps["b0.dout"], steps["b0.dmid"], steps["b0.din"]
    norm = np.linalg.norm
    return {"growth": norm(out - x) / norm(x), "identity": norm(dout), "ffn": norm(dmid - dout),
            "attn": norm(din - dmid)}


def costs():
    """Parameters and multiply-adds per token of one block at the default config, and what its cache keeps."""
    ex = default_run()
    cfg, p = ex.cfg, block_params(ex.params, 0)
    matrices = sum(v.size for k, v in p.items() if v.ndim == 2)
    _, cache = block_forward(ex.trace["embedding"], p, cfg)
    return {"params": sum(v.size for v in p.values()), "matrices": matrices, "d": cfg.emb_dim,
            "fields": [f for f in cache._fields if f.endswith("_cache")]}


# ---------------------------------------------------------------- the evidence

def symbols_md():
    ex, rng = default_run(), np.random.default_rng(SEED)
    p, x = block_params(ex.params, 0), ex.trace["embedding"]
    y, cache = block_forward(x, p, ex.cfg)
    dx, grads = block_backward(rng.standard_normal(y.shape), cache)  # any upstream gradient: only shapes are kept
    g = linear_forward(ex.trace["b0.ln2"], p["ff1_w"], p["ff1_b"])[0]
    m = x + attention_forward(ex.trace["b0.ln1"], p, ex.cfg.num_heads)[0]
    rows = [
        (r"X", "x", x.shape),
        (r"U_1", "a (after LN1)", ex.trace["b0.ln1"].shape),
        (r"M", "h", m.shape),
        (r"U_2", "u (after LN2)", ex.trace["b0.ln2"].shape),
        (r"W_1", "ff1_w", p["ff1_w"].shape),
        (r"b_1", "ff1_b", p["ff1_b"].shape),
        (r"G", "u (after ff1)", g.shape),
        (r"\phi", "act_forward", "—"),
        (r"W_2", "ff2_w", p["ff2_w"].shape),
        (r"b_2", "ff2_b", p["ff2_b"].shape),
        (r"\operatorname{FFN}(U_2)", "u (after ff2)", y.shape),
        (r"X^{(l+1)}", "y", y.shape),
        (r"\partial\ell/\partial X^{(l+1)}", "dy", y.shape, "the upstream gradient"),
        (r"\partial\ell/\partial G", "du (after act_backward)", g.shape),
        (r"\partial\ell/\partial M", "dh", m.shape),
        (r"\partial\ell/\partial X", "dx", dx.shape),
    ]
    return sections.symbols_md(rows, default_note() + f"; {len(grads)} parameter gradients per block")


def gradcheck_md():
    rows, rng = [], np.random.default_rng(SEED)
    for activation in ("relu", "gelu"):
        cfg = tiny().cfg.with_(activation=activation)
        rows += sections.block_layer_check(block_forward, block_backward, BLOCK_KEYS, rng, cfg,
                                           label=f"{activation}: ")[0]
    return sections.gradcheck_table(rows)


def generate(context):
    fw, replay = forward_steps(), tiny_backward()
    values = {"seed": SEED, "ids": TINY_IDS, "forward": forward_values(fw),
              "backward": backward_values(fw, replay.steps, replay.loss), "default": flow_values(),
              "cost": costs()}
    return {"values": values, **forward_tables(fw), **backward_tables(fw, replay.steps),
            **check_tables(fw, replay.steps), "flow.png": flow_png(), "symbols": symbols_md(),
            "gradcheck": gradcheck_md()}
