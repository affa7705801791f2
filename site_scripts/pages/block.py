"""Generator of the Transformer Block page's fragments: the symbol table, the tiny example forward and
backward (block 0 of the tiny model, driven by its real loss gradient), the derivation's numeric checks
and the gradient check."""

from dataclasses import dataclass

import numpy as np

from transformer.activations import ACTIVATION_FUNCTIONS
from transformer.attention import attention_forward
from transformer.block import BLOCK_KEYS, block_backward, block_forward, block_params
from transformer.gradcheck import numerical_grad
from transformer.layernorm import layer_norm_forward
from transformer.linear import linear_forward

from .. import sections
from ..common import md_table
from ..examples import (H_STEP, SEED, TINY_IDS, biases_moved, collapsed, default_note, default_run, illustrative,
                        tiny, weighted_sum)
from ..tiny_backward import tiny_backward
from .attention import (BACK, FAKE_LOSS, aligned, bias_table, caught, gap_cells, grad, latex_table, number, products,
                        tex, verdict, weight_table)

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
    forward, backward = ACTIVATION_FUNCTIONS[cfg.activation]
    slope = backward(np.ones_like(g), forward(g)[1])  # the backward multiplies by φ'(G): times 1, φ'(G) itself
    return Forward(cfg, p, x, u1, attn, m, u2, g, hidden, out, m + out, slope)


# ---------------------------------------------------------------- the tiny example, forward

def rms(a):
    """Each row's root mean square."""
    return np.sqrt((a ** 2).mean(-1))


def growth_md(fw):
    """‖X^(l+1) − X‖ / ‖X‖, and what it means for a pre-norm block."""
    ratio = np.linalg.norm(fw.out - fw.x) / np.linalg.norm(fw.x)
    sub = np.concatenate([rms(fw.u1), rms(fw.u2)])
    return (f"At initialisation this block changes the stream by \\(\\lVert X^{{(l+1)}} - X \\rVert / \\lVert X "
            f"\\rVert\\) = {ratio:.2f} (Frobenius norms of the whole `(T, d)` arrays): what the two branches add, "
            f"\\(\\operatorname{{Attn}}(U_1) + \\operatorname{{FFN}}(U_2)\\), is {ratio:.2f} times as large as the "
            f"stream it is added to. The embeddings start small (the rows of \\(X\\) have a root mean square of "
            f"{rms(fw.x).min():.2f} to {rms(fw.x).max():.2f}), while each branch reads a LayerNorm output, whose rows "
            f"have a root mean square within {np.abs(sub - 1).max():.0e} of 1 whatever the stream's scale; so the rows "
            f"of \\(X^{{(l+1)}}\\) come out at {rms(fw.out).min():.2f} to {rms(fw.out).max():.2f}. With pre-norm the "
            "stream's scale is free to drift like this, block after block, and that is not a problem for the "
            "sub-layers: LayerNorm fixes the scale of each sub-layer's input, not of the stream, and the final "
            "LayerNorm does the same for the head.\n")


def follow_forward_md(fw):
    """X^(l+1)[ROW, 0] = M + FFN, with FFN's entry written out from φ(G) and W_2."""
    t, w2, b2 = ROW, fw.p["ff2_w"], fw.p["ff2_b"]
    terms = products([(tex(fw.hidden[t, i]), tex(w2[i, 0])) for i in range(len(w2))])  # i: a hidden unit
    lines = [f"\\operatorname{{FFN}}(U_2)_{{{t}0}} &= \\textstyle\\sum_i \\phi(G)_{{{t}i}} W_{{2,i0}} + b_{{2,0}} "
             f"\\\\ &= {terms} + {tex(b2[0])} = {number(fw.ffn[t, 0])}",
             f"X^{{(l+1)}}_{{{t}0}} &= M_{{{t}0}} + \\operatorname{{FFN}}(U_2)_{{{t}0}} = {tex(fw.m[t, 0])} + "
             f"{tex(fw.ffn[t, 0])} = {number(fw.out[t, 0])}"]
    return (f"Follow one number forward, position {t}, column 0 (factors rounded to the tables' digits; results from "
            "the unrounded arrays, equal to their entries above):\n\n" + aligned(lines))


def forward_md(fw):
    trace_gap = np.abs(tiny().trace["b0.out"][0] - fw.out).max()
    weights = collapsed("The feed-forward weights (the tiny model's block 0)", "\n".join([
        weight_table("W_1", fw.p["ff1_w"]), bias_table("1", fw.p["ff1_b"]),
        weight_table("W_2", fw.p["ff2_w"]), bias_table("2", fw.p["ff2_b"])]))
    return "\n".join([
        illustrative(f"Block 0 of the tiny model (activation `{fw.cfg.activation}`) on ids `{TINY_IDS}`, each "
                     "step recomputed with the model's functions; the "
                     "[Attention page](attention.md#tiny-numerical-example) shows the attention sub-layer's own "
                     "steps."),
        "### Forward\n",
        latex_table("X", fw.x), latex_table("U_1 = \\operatorname{LN}_1(X)", fw.u1),
        latex_table("\\operatorname{Attn}(U_1)", fw.attn), latex_table("M = X + \\operatorname{Attn}(U_1)", fw.m),
        latex_table("U_2 = \\operatorname{LN}_2(M)", fw.u2), weights,
        latex_table("G = U_2 W_1 + b_1", fw.g), latex_table("\\phi(G)", fw.hidden),
        latex_table("\\operatorname{FFN}(U_2) = \\phi(G) W_2 + b_2", fw.ffn),
        latex_table("X^{(l+1)} = M + \\operatorname{FFN}(U_2)", fw.out),
        f"The forward trace's `b0.out` is the same (largest difference {trace_gap:.1e}).\n",
        follow_forward_md(fw), growth_md(fw)])


# ---------------------------------------------------------------- the tiny example, backward

STEPS = (  # (symbol, how the step computes it, the replay's step, column index), in block_backward's order
    ("X^{(l+1)}", "\\text{the upstream gradient, from block 1}", "b0.dout", "i"),
    ("\\phi(G)", grad("X^{(l+1)}") + "\\, W_2^\\top", "b0.dhidden", "i"),
    ("G", grad("\\phi(G)") + " \\odot \\phi'(G)", "b0.dpre", "i"),
    ("U_2", grad("G") + "\\, W_1^\\top", "b0.dln2", "i"),
    ("M", grad("X^{(l+1)}") + " + \\text{the feed-forward branch's term}", "b0.dmid", "i"),
    ("U_1", "\\text{attention's backward of } " + grad("M"), "b0.dln1", "i"),
    ("X", grad("M") + " + \\text{the attention branch's term}", "b0.din", "i"),
)


def branch_terms(steps):
    """The branches' terms of ∂ℓ/∂X, one window: ∂ℓ/∂M − ∂ℓ/∂X^(l+1) (FFN) and ∂ℓ/∂X − ∂ℓ/∂M (attention)."""
    return (steps["b0.dmid"] - steps["b0.dout"])[0], (steps["b0.din"] - steps["b0.dmid"])[0]


def follow_backward_md(fw, steps):
    """One entry of ∂ℓ/∂G and one of ∂ℓ/∂X, written out from the arrays above."""
    t, w2 = ROW, fw.p["ff2_w"]
    u = int(np.argmax(fw.slope[t] > 0)) if (fw.slope[t] > 0).any() else 0  # a hidden unit the activation passes
    dout, dhid, dpre = steps["b0.dout"][0], steps["b0.dhidden"][0], steps["b0.dpre"][0]
    ffn_part, attn_part = branch_terms(steps)
    terms = products([(tex(dout[t, i], BACK), tex(w2[u, i], BACK)) for i in range(w2.shape[1])], per_line=2)
    lines = [f"\\frac{{\\partial\\ell}}{{\\partial \\phi(G)_{{{t}{u}}}}} &= \\textstyle\\sum_{{i'}} "
             f"\\frac{{\\partial\\ell}}{{\\partial X^{{(l+1)}}_{{{t}i'}}}} W_{{2,{u}i'}} \\\\ &= {terms} = "
             f"{number(dhid[t, u], BACK)}",
             f"\\frac{{\\partial\\ell}}{{\\partial G_{{{t}{u}}}}} &= \\frac{{\\partial\\ell}}{{\\partial "
             f"\\phi(G)_{{{t}{u}}}}}\\, \\phi'(G_{{{t}{u}}}) = {tex(dhid[t, u], BACK)} \\cdot "
             f"{tex(fw.slope[t, u], BACK)} = {number(dpre[t, u], BACK)}",
             f"\\frac{{\\partial\\ell}}{{\\partial X_{{{t}0}}}} &= \\underbrace{{{tex(dout[t, 0], BACK)}}}_"
             f"{{\\text{{identity}}}} + \\underbrace{{{tex(ffn_part[t, 0], BACK)}}}_{{\\text{{FFN branch}}}} + "
             f"\\underbrace{{{tex(attn_part[t, 0], BACK)}}}_{{\\text{{attention branch}}}} = "
             f"{number(steps['b0.din'][0][t, 0], BACK)}"]
    return (f"Follow numbers backward, position {t} (\\(G_{{{t}{u}}}\\) = {number(fw.g[t, u])}, so "
            f"\\(\\phi'(G_{{{t}{u}}})\\) = {number(fw.slope[t, u])}; factors rounded, results from the unrounded "
            "arrays). In the last line the identity term is the entry of \\(\\partial\\ell/\\partial X^{(l+1)}\\), "
            "the two branch terms the entries of the two branch tables above, and the result the entry of "
            "\\(\\partial\\ell/\\partial X\\):\n\n" + aligned(lines))


def shares_md(steps):
    """∂ℓ/∂X − ∂ℓ/∂X^(l+1): the branches' part of the input's gradient, against the identity path's."""
    dout, din = steps["b0.dout"][0], steps["b0.din"][0]
    (ffn_part, attn_part), both = branch_terms(steps), din - dout
    norm = np.linalg.norm
    return (f"\\(\\partial\\ell/\\partial X - \\partial\\ell/\\partial X^{{(l+1)}}\\) ranges from {both.min():.4f} to "
            f"{both.max():.4f}: it is what the two branches add on top of the identity path, which hands "
            f"\\(\\partial\\ell/\\partial X^{{(l+1)}}\\) (entries from {dout.min():.4f} to {dout.max():.4f}) to the "
            f"input unchanged. In norms: the identity path carries {norm(dout):.4f}, the feed-forward branch adds "
            f"{norm(ffn_part):.4f} (\\(\\partial\\ell/\\partial M - \\partial\\ell/\\partial X^{{(l+1)}}\\)) and the "
            f"attention branch {norm(attn_part):.4f} (\\(\\partial\\ell/\\partial X - \\partial\\ell/\\partial M\\)), "
            f"{norm(attn_part) / norm(dout):.1f} times the identity path's. At initialisation the branches' gradients "
            "are not small; what the identity path guarantees is that \\(\\partial\\ell/\\partial X^{(l+1)}\\) "
            "arrives whatever they do.\n")


def ln_factor_md(fw, steps):
    """Where the attention branch's large share comes from: the attention's backward, then LN_1's factor r."""
    r = 1 / np.sqrt(fw.x.var(-1) + fw.cfg.ln_eps)
    norm = np.linalg.norm
    return (f"Where the attention branch's share comes from: the attention's backward turns "
            f"\\(\\partial\\ell/\\partial M\\) (norm {norm(steps['b0.dmid']):.4f}) into "
            f"\\(\\partial\\ell/\\partial U_1\\) (norm {norm(steps['b0.dln1']):.4f}), and "
            f"\\(\\operatorname{{LN}}_1\\)'s backward multiplies by each row's \\(r = 1/\\sqrt{{\\sigma^2 + "
            f"\\epsilon_{{\\mathrm{{LN}}}}}}\\) ([LayerNorm](layernorm.md#eq-ln-grad)), which is {r.min():.2f} to "
            f"{r.max():.2f} for these small rows of \\(X\\): a LayerNorm divides its input by the row's spread, so "
            "its backward multiplies by the reciprocal.\n")


BRANCH_TABLES = {  # after the step named: (branch, the two gradients whose difference is its term, which table)
    "b0.dmid": ("feed-forward", "M", "X^{(l+1)}", 0),
    "b0.din": ("attention", "X", "M", 1),
}


def branch_table_md(steps, name):
    """The branch term a residual step adds, as the difference of the step's table and the one it started from."""
    branch, mine, start, which = BRANCH_TABLES[name]
    label = f"{grad(mine)} - {grad(start)}"
    return (f"The {branch} branch's term of the [residual rule](#eq-block-residual-grad), \\({label}\\): the table "
            f"just above minus the one of \\({grad(start)}\\).\n\n"
            + latex_table(label, branch_terms(steps)[which], decimals=BACK))


def backward_md(fw):
    replay = tiny_backward()
    steps = replay.steps
    _, cache = block_forward(fw.x[None], fw.p, fw.cfg)
    dx, _ = block_backward(steps["b0.dout"], cache)
    gap = float(np.abs(dx - steps["b0.din"]).max())
    parts = ["### Backward\n",
             f"The upstream gradient is the tiny model's real one: the mean cross-entropy (loss {replay.loss:.4f}) "
             "of the next tokens, replayed call by call (`site_scripts/tiny_backward.py`); block 0 receives "
             "\\(\\partial\\ell/\\partial X^{(l+1)}\\) from block 1 (`b0.dout`). The gradients below are the replay's, "
             "in the order `block_backward` computes them, each under the replay's name.\n"]
    for symbol, how, name, cols in STEPS:
        parts.append(f"`{name}`: \\({grad(symbol)} = {how}\\)\n")
        parts.append(latex_table(grad(symbol), steps[name][0], cols=cols, decimals=BACK))
        if name in BRANCH_TABLES:
            parts.append(branch_table_md(steps, name))
    parts += [f"`block_backward` called with `b0.dout` returns `b0.din` (largest difference {gap:.1e}).\n",
              follow_backward_md(fw, steps), shares_md(steps), ln_factor_md(fw, steps)]
    return "\n".join(parts)


def example_md():
    fw = forward_steps()
    return forward_md(fw) + "\n" + backward_md(fw)


# ---------------------------------------------------------------- the derivation, checked

def central_differences_md(fw, steps):
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
    return (f"Each step's gradient against central differences. Holding the upstream gradient fixed, "
            f"\\(f = \\sum X^{{(l+1)}} \\odot \\partial\\ell/\\partial X^{{(l+1)}}\\) (the [fake loss]({FAKE_LOSS}) "
            "with \\(R\\) = `b0.dout`, the real upstream gradient) has, at this point, the same gradients as "
            "\\(\\ell\\). Each row moves one array entry by entry by \\(\\pm\\Delta\\) and reruns the block from there "
            "with the model's functions: \\(G\\), \\(U_2\\), \\(M\\) (through \\(\\operatorname{LN}_2\\), the "
            "feed-forward network and the residual) and \\(X\\) (the whole `block_forward`).\n\n"
            + sections.gradcheck_table(rows))


def planted_md(fw, steps):
    """∂ℓ/∂X with one of its three terms left out, against the same central differences: each must be caught."""
    r, x = steps["b0.dout"], fw.x[None].copy()
    numeric = numerical_grad(lambda: float(np.sum(block_forward(x, fw.p, fw.cfg)[0] * r)), x, H_STEP)
    identity, ffn_part, attn_part = r, steps["b0.dmid"] - r, steps["b0.din"] - steps["b0.dmid"]
    cases = [("all three terms (`b0.din`)", identity + ffn_part + attn_part),
             ("without the identity path \\(\\partial\\ell/\\partial X^{(l+1)}\\)", ffn_part + attn_part),
             ("without the feed-forward branch", identity + attn_part),
             ("without the attention branch", identity + ffn_part)]
    rows = []
    for n, (name, analytic) in enumerate(cases):
        gap, rel = gap_cells(analytic, numeric)
        rows.append([name if n == 0 else name + " (a planted mistake)", f"{gap:.1e}", f"{rel:.1e}",
                     verdict(gap, rel) if n == 0 else caught(gap, rel)])
    return ("The [identity argument](#eq-block-grad-identity) splits \\(\\partial\\ell/\\partial X\\) into three "
            "terms. Against the central differences of the last row above, the sum of all three agrees, and each "
            "sum with one term left out is told apart:\n\n"
            + md_table(["\\(\\partial\\ell/\\partial X\\) from", "Largest gap", "Relative gap", "Result"], rows))


def derivation_checks_md():
    fw, steps = forward_steps(), tiny_backward().steps
    return "\n".join([illustrative("Block 0, with the tiny model's real upstream gradient (`b0.dout`)."),
                      central_differences_md(fw, steps), planted_md(fw, steps)])


# ---------------------------------------------------------------- the symbols and the gradient check

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
    rows_all, ex, rng = [], tiny(), np.random.default_rng(SEED)
    for activation in ("relu", "gelu"):
        cfg = ex.cfg.with_(activation=activation)
        p = biases_moved(block_params(ex.params, 0), rng)
        x = rng.standard_normal((2, cfg.context_len, cfg.emb_dim))
        dy = rng.standard_normal(x.shape)
        dx, grads = block_backward(dy, block_forward(x, p, cfg)[1])
        checks = [(f"{activation}: dx", dx, x)] + [(f"{activation}: d{k}", grads[k], p[k]) for k in BLOCK_KEYS]
        rows_all += sections.gradcheck_rows(weighted_sum(dy, block_forward, x, p, cfg), checks, H_STEP)
    return (f"The [fake loss]({FAKE_LOSS}) \\(f = \\sum X^{{(l+1)}} \\odot R\\) through a whole block (tiny sizes, "
            f"1-D parameters moved off their initial values, random \\(X\\) and \\(R\\), seed {SEED}), once with "
            "ReLU and once with GELU.\n\n" + sections.gradcheck_table(rows_all))


def generate(context):
    return {"symbols": symbols_md(), "example": example_md(), "derivation-checks": derivation_checks_md(),
            "gradcheck": gradcheck_md()}
