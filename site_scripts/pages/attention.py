"""Generator of the Attention page's fragments: the symbol table, the tiny example forward and backward
(block 0 of the tiny model, driven by its real loss gradient), the derivation's numeric checks and the
gradient check.

The tiny example recomputes every step from the page's equations, one window at a time, with arrays of
2 axes (a head's arrays have 3: head, row, column); the checks compare those steps with the code
(`attention_forward`, the replayed `attention_backward`) and with central differences."""

import math
from dataclasses import dataclass

import numpy as np

from transformer.attention import attention_backward, attention_forward
from transformer.block import ATTENTION_KEYS, block_params
from transformer.gradcheck import REL_TOL, check_passes, relative_gap
from transformer.softmax import softmax_backward

from .. import sections
from ..cache_inventory import ATTENTION, inventory_md
from ..common import md_table
from ..examples import (H_STEP, SEED, TINY_IDS, biases_moved, collapsed, default_note, default_run, illustrative,
                        tiny, weighted_sum)
from ..tiny_backward import tiny_backward

FAKE_LOSS = "../reference/notation.md#fake-loss"
ROW, COL = 1, 0  # the entry whose arithmetic the example writes out: head 0, query t = 1, key t' = 0


# ---------------------------------------------------------------- tables

def number(v, decimals=4):
    """An entry of a table: −∞ for a masked score, no sign on a zero."""
    if v == -np.inf:
        return "−∞"
    text = f"{v:.{decimals}f}"
    return text.lstrip("-") if float(text) == 0 else text


def tex(v, decimals=4):
    """A factor inside written-out arithmetic, negative ones in brackets."""
    return f"({v:.{decimals}f})" if v < 0 else f"{v:.{decimals}f}"


def latex_table(label, a, rows="t", cols="i", decimals=4):
    """A 2-D array as a table headed by its LaTeX label and the indices of its rows and columns."""
    a = np.atleast_2d(np.asarray(a, dtype=np.float64))
    header = [f"\\({label}\\) (row \\({rows}\\), column \\({cols}\\))", *map(str, range(a.shape[1]))]
    return md_table(header, [[str(r), *(number(v, decimals) for v in row)] for r, row in enumerate(a)])


def weight_table(label, w, decimals=4):
    """A weight matrix as stored, (in, out): row i an input unit, column i' an output unit (the Linear page's
    W_{i,i'})."""
    w = np.asarray(w, dtype=np.float64)
    header = [f"\\({label}\\): row \\(i\\) (input unit), column \\(i'\\) (output unit)",
              *map(str, range(w.shape[1]))]
    return md_table(header, [[str(r), *(number(v, decimals) for v in row)] for r, row in enumerate(w)])


def bias_table(name, b, decimals=4):
    """A 1-D bias b_<name>: one entry per output unit i', so the table has one row and no row index."""
    header = [f"\\(b_{name}\\): entry \\(i'\\) (output unit)", *map(str, range(len(b)))]  # name: one character
    return md_table(header, [[f"\\(b_{{{name},i'}}\\)", *(number(v, decimals) for v in b)]])


def verdict(gap, rel):
    """The pages' pass rule (transformer/gradcheck.py) in words, for a comparison that should agree."""
    return "agree" if check_passes(gap, rel) else "**DIFFER**"


def caught(gap, rel):
    """The same rule for a planted mistake, which a working check must tell apart."""
    return "caught" if not check_passes(gap, rel) else "**NOT CAUGHT**"


def gap_cells(analytic, reference):
    gap = float(np.abs(np.asarray(analytic) - np.asarray(reference)).max())
    return gap, relative_gap(np.asarray(analytic), np.asarray(reference))


# ---------------------------------------------------------------- the steps, from the page's equations

def heads(a, num_heads):
    """(T, d) to (H, T, d_h): `split_heads` for one window."""
    T, d = a.shape
    return a.reshape(T, num_heads, d // num_heads).transpose(1, 0, 2)


def merged(a):
    """(H, T, d_h) to (T, d): `merge_heads` for one window."""
    H, T, dh = a.shape
    return a.transpose(1, 0, 2).reshape(T, H * dh)


def row_softmax(s):
    e = np.exp(s - s.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def masked(scores):
    return scores + np.triu(np.full(scores.shape[-2:], -np.inf), 1)


def from_weights(alpha, v, p):
    """Attn(U_1) from the weights on: O^(h) = α^(h) V^(h), joined, times W_o, plus b_o."""
    return merged(alpha @ heads(v, len(alpha))) @ p["wo"] + p["bo"]


def from_scores(scores, v, p):
    return from_weights(row_softmax(masked(scores)), v, p)


def from_qkv(q, k, v, p, num_heads):
    dh = q.shape[1] // num_heads
    return from_scores(heads(q, num_heads) / math.sqrt(dh) @ heads(k, num_heads).transpose(0, 2, 1), v, p)


@dataclass(frozen=True)
class Forward:
    """Block 0's attention on the tiny example, one array per equation of the page (one window)."""
    p: dict
    u1: np.ndarray  # U_1, (T, d)
    q: np.ndarray  # Q, (T, d); head h is columns h d_h to (h+1) d_h - 1
    k: np.ndarray
    v: np.ndarray
    scores: np.ndarray  # S^(h) before the mask, (H, T, T)
    alpha: np.ndarray  # α^(h), (H, T, T)
    oh: np.ndarray  # O^(h), (H, T, d_h)
    o: np.ndarray  # O, (T, d)
    y: np.ndarray  # Attn(U_1), (T, d)

    @property
    def num_heads(self):
        return len(self.alpha)

    def head(self, a, h):
        return heads(a, self.num_heads)[h]


def forward_steps():
    ex = tiny()
    p, u1, H = block_params(ex.params, 0), ex.trace["b0.ln1"][0], ex.cfg.num_heads
    q, k, v = (u1 @ p[f"w{n}"] + p[f"b{n}"] for n in "qkv")
    scores = heads(q, H) / math.sqrt(ex.cfg.head_dim) @ heads(k, H).transpose(0, 2, 1)
    alpha = row_softmax(masked(scores))
    oh = alpha @ heads(v, H)
    o = merged(oh)
    return Forward(p, u1, q, k, v, scores, alpha, oh, o, o @ p["wo"] + p["bo"])


@dataclass(frozen=True)
class Backward:
    """The derivation's steps, in the order `attention_backward` computes them (one window)."""
    dy: np.ndarray  # ∂ℓ/∂Attn(U_1), (T, d)
    do: np.ndarray  # ∂ℓ/∂O, (T, d)
    doh: np.ndarray  # ∂ℓ/∂O^(h), (H, T, d_h)
    dalpha: np.ndarray  # ∂ℓ/∂α^(h), (H, T, T)
    dvh: np.ndarray  # ∂ℓ/∂V^(h), (H, T, d_h)
    dscores: np.ndarray  # ∂ℓ/∂S^(h), (H, T, T)
    dqh: np.ndarray  # ∂ℓ/∂Q^(h)
    dkh: np.ndarray  # ∂ℓ/∂K^(h)
    dq: np.ndarray  # ∂ℓ/∂Q, (T, d)
    dk: np.ndarray
    dv: np.ndarray
    terms: dict  # q, k, v: that projection's term of ∂ℓ/∂U_1
    du1: np.ndarray  # ∂ℓ/∂U_1, (T, d)
    grads: dict  # the parameters' gradients, by the keys of p


def backward_steps(fw, dy):
    p, H = fw.p, fw.num_heads
    scale = 1 / math.sqrt(fw.q.shape[1] // H)
    do = dy @ p["wo"].T  # eq-attn-grad-out
    doh = heads(do, H)  # eq-attn-grad-merge
    dalpha = doh @ heads(fw.v, H).transpose(0, 2, 1)  # eq-attn-grad-mix
    dvh = fw.alpha.transpose(0, 2, 1) @ doh
    dscores = fw.alpha * (dalpha - (fw.alpha * dalpha).sum(-1, keepdims=True))  # eq-attn-grad-softmax
    dqh = dscores @ heads(fw.k, H) * scale  # eq-attn-grad-qk
    dkh = dscores.transpose(0, 2, 1) @ heads(fw.q, H) * scale
    dq, dk, dv = merged(dqh), merged(dkh), merged(dvh)  # eq-attn-grad-split
    terms = {n: g @ p[f"w{n}"].T for n, g in zip("qkv", (dq, dk, dv))}  # eq-attn-grad-input
    grads = {"wo": fw.o.T @ dy, "bo": dy.sum(0)}
    for n, g in zip("qkv", (dq, dk, dv)):  # eq-attn-grad-params
        grads[f"w{n}"], grads[f"b{n}"] = fw.u1.T @ g, g.sum(0)
    return Backward(dy, do, doh, dalpha, dvh, dscores, dqh, dkh, dq, dk, dv, terms, sum(terms.values()), grads)


def tiny_steps():
    fw = forward_steps()
    return fw, backward_steps(fw, tiny_backward().steps["b0.dmid"][0])


# ---------------------------------------------------------------- the tiny example, forward

def weights_md(p):
    tables = [weight_table(f"W_{n}", p[f"w{n}"]) for n in "qkvo"]
    if all(not p[f"b{n}"].any() for n in "qkvo"):
        text = ("Every bias is 0 at initialisation (\\(b_q, b_k, b_v, b_o\\) are all zero), so here "
                "\\(Q = U_1 W_q\\), and likewise for the others.\n")
    else:
        text = "\n".join(bias_table(n, p[f"b{n}"]) for n in "qkvo")
    return collapsed("The projections' weights (the tiny model's block 0)", "\n".join(tables) + "\n" + text)


def head_forward_md(fw, h):
    parts = [latex_table(f"S^{{({h})}}", masked(fw.scores)[h], rows="t", cols="t'"),
             latex_table(f"\\alpha^{{({h})}}", fw.alpha[h], rows="t", cols="t'"),
             latex_table(f"V^{{({h})}}", fw.head(fw.v, h), rows="t'", cols="i"),
             latex_table(f"O^{{({h})}} = \\alpha^{{({h})}} V^{{({h})}}", fw.oh[h], rows="t", cols="i")]
    return "\n".join(parts)


def follow_forward_md(fw):
    """One entry of S^(0), α^(0) and O^(0), with the arithmetic written out from the arrays above."""
    t, c, dh = ROW, COL, fw.q.shape[1] // fw.num_heads
    q, k, v, s, a = fw.head(fw.q, 0), fw.head(fw.k, 0), fw.head(fw.v, 0), fw.scores[0], fw.alpha[0]
    prods = " + ".join(f"{tex(q[t, i])} \\times {tex(k[c, i])}" for i in range(dh))
    exps = " + ".join(f"e^{{{number(s[t, u])}}}" for u in range(t + 1))
    mix = " + ".join(f"{tex(a[t, u])} \\times {tex(v[u, 0])}" for u in range(t + 1))
    lines = [f"S^{{(0)}}_{{{t}{c}}} &= \\tfrac{{1}}{{\\sqrt{{{dh}}}}}\\,({prods}) = {number(s[t, c])}",
             f"\\alpha^{{(0)}}_{{{t}{c}}} &= e^{{{number(s[t, c])}}} / ({exps}) = {number(a[t, c])}",
             f"O^{{(0)}}_{{{t}0}} &= {mix} = {number(fw.oh[0][t, 0])}"]
    return (f"Follow one number forward: head 0, query \\(t = {t}\\), key \\(t' = {c}\\) (each factor "
            "rounded to the tables' digits, each result computed from the unrounded arrays and equal to its "
            "entry above).\n\n" + aligned(lines))


def products(pairs, per_line=3):
    """The written-out sum a·b + c·d + ..., continued on a new aligned line after every `per_line` products."""
    terms = [f"{a} \\cdot {b}" for a, b in pairs]
    chunks = [" + ".join(terms[i:i + per_line]) for i in range(0, len(terms), per_line)]
    return " \\\\\n&\\quad + ".join(chunks)


def aligned(lines):
    """Display maths: the lines one under the other, aligned at their `&`."""
    return "$$\n\\begin{aligned}\n" + " \\\\\n".join(lines) + "\n\\end{aligned}\n$$\n"


def forward_md(fw):
    ex = tiny()
    y, _ = attention_forward(fw.u1[None], fw.p, fw.num_heads)
    upper = fw.alpha[(slice(None), *np.triu_indices(len(fw.u1), 1))]
    parts = [illustrative(f"Block 0 of the tiny model on ids `{TINY_IDS}`: its input is \\(U_1 = "
                          f"\\operatorname{{LN}}_1(X)\\) below; {fw.num_heads} heads of width \\(d_h = d/H = "
                          f"{ex.cfg.head_dim}\\). Every step is recomputed here from the equations, "
                          "independently of `attention_forward`, and compared with it at the end."),
             "### Forward\n",
             latex_table("U_1", fw.u1), weights_md(fw.p),
             latex_table("Q = U_1 W_q + b_q", fw.q), latex_table("K = U_1 W_k + b_k", fw.k),
             latex_table("V = U_1 W_v + b_v", fw.v),
             "Head \\(h\\) reads columns \\(h d_h\\) to \\((h+1) d_h - 1\\) of each. Head 0, with the mask "
             "applied (row = query \\(t\\), column = key \\(t'\\)):\n",
             head_forward_md(fw, 0)]
    for h in range(1, fw.num_heads):
        parts.append(collapsed(f"Head {h}: its scores, weights, values and weighted values", head_forward_md(fw, h)))
    parts += [f"Every weight above the diagonal is exactly {upper.max():g}: position \\(t\\) never sees a later "
              f"position. Each row sums to 1 (largest deviation {np.abs(fw.alpha.sum(-1) - 1).max():.1e}); row 0 "
              "can only attend to itself.\n",
              follow_forward_md(fw),
              latex_table("O = [O^{(0)} \\cdots O^{(H-1)}]", fw.o),
              latex_table("\\operatorname{Attn}(U_1) = O W_o + b_o", fw.y),
              f"`attention_forward` gives the same output (largest difference {np.abs(y[0] - fw.y).max():.1e}) "
              f"and the same weights ({np.abs(ex.trace['b0.attention'][0] - fw.alpha).max():.1e}).\n"]
    return "\n".join(parts)


# ---------------------------------------------------------------- the tiny example, backward

BACK = 5  # decimals of the backward's tables: its entries are smaller


def grad(symbol):
    return f"\\partial\\ell/\\partial {symbol}"


HEAD_STEPS = (  # (label, field of Backward, row index, column index); @ stands for the head's superscript
    (r"\partial\ell/\partial O@", "doh", "t", "i"),
    (r"\partial\ell/\partial \alpha@ = (\partial\ell/\partial O@)\, V@{}^\top", "dalpha", "t", "t'"),
    (r"\partial\ell/\partial V@ = \alpha@{}^\top\, \partial\ell/\partial O@", "dvh", "t'", "i"),
    (r"\partial\ell/\partial S@", "dscores", "t", "t'"),
    (r"\partial\ell/\partial Q@ = \tfrac{1}{\sqrt{d_h}}\, (\partial\ell/\partial S@)\, K@", "dqh", "t", "i"),
    (r"\partial\ell/\partial K@ = (\partial\ell/\partial S@)^\top\, Q@/\sqrt{d_h}", "dkh", "t'", "i"),
)


def head_backward_md(bw, h):
    return "\n".join(latex_table(label.replace("@", f"^{{({h})}}"), getattr(bw, field)[h], rows, cols, BACK)
                     for label, field, rows, cols in HEAD_STEPS)


def follow_backward_md(fw, bw):
    """One entry followed from ∂ℓ/∂Attn(U_1) to ∂ℓ/∂Q^(0), each step written out from the arrays above."""
    t, c, dh, d = ROW, COL, fw.q.shape[1] // fw.num_heads, fw.q.shape[1]
    wo, v, k, a = fw.p["wo"], fw.head(fw.v, 0), fw.head(fw.k, 0), fw.alpha[0]
    da, ds = bw.dalpha[0], bw.dscores[0]
    f = lambda x: tex(x, BACK)  # noqa: E731
    g = lambda x: number(x, BACK)  # noqa: E731
    dot = " + ".join(f"{f(a[t, u])} \\cdot {f(da[t, u])}" for u in range(t + 1))
    lines = [
        f"\\frac{{\\partial\\ell}}{{\\partial O_{{{t}0}}}} &= \\textstyle\\sum_{{i'}} "
        f"\\frac{{\\partial\\ell}}{{\\partial \\operatorname{{Attn}}(U_1)_{{{t}i'}}}} W_{{o,0i'}} \\\\ &= "
        + products([(f(bw.dy[t, i]), f(wo[0, i])) for i in range(d)], per_line=2) + f" = {g(bw.do[t, 0])}",
        f"\\frac{{\\partial\\ell}}{{\\partial \\alpha^{{(0)}}_{{{t}{c}}}}} &= \\textstyle\\sum_i "
        f"\\frac{{\\partial\\ell}}{{\\partial O^{{(0)}}_{{{t}i}}}} V^{{(0)}}_{{{c}i}} \\\\ &= "
        + " + ".join(f"{f(bw.doh[0][t, i])} \\cdot {f(v[c, i])}" for i in range(dh)) + f" = {g(da[t, c])}",
        f"\\frac{{\\partial\\ell}}{{\\partial S^{{(0)}}_{{{t}{c}}}}} &= \\alpha^{{(0)}}_{{{t}{c}}} \\big("
        f"\\tfrac{{\\partial\\ell}}{{\\partial \\alpha^{{(0)}}_{{{t}{c}}}}} - \\textstyle\\sum_{{t'}} "
        f"\\alpha^{{(0)}}_{{{t}t'}} \\tfrac{{\\partial\\ell}}{{\\partial \\alpha^{{(0)}}_{{{t}t'}}}}\\big) \\\\ &= "
        f"{f(a[t, c])} \\cdot ({f(da[t, c])} - ({dot})) = {g(ds[t, c])}",
        f"\\frac{{\\partial\\ell}}{{\\partial Q^{{(0)}}_{{{t}0}}}} &= \\tfrac{{1}}{{\\sqrt{{{dh}}}}}\\textstyle"
        f"\\sum_{{t'}} \\frac{{\\partial\\ell}}{{\\partial S^{{(0)}}_{{{t}t'}}}} K^{{(0)}}_{{t'0}} \\\\ &= "
        f"\\tfrac{{1}}{{\\sqrt{{{dh}}}}}(" + " + ".join(f"{f(ds[t, u])} \\cdot {f(k[u, 0])}" for u in range(t + 1))
        + f") = {g(bw.dqh[0][t, 0])}"]
    return (f"Follow one number backward, through the same head, query \\(t = {t}\\) and key \\(t' = {c}\\) "
            f"(the sums over \\(t'\\) stop at \\(t' = {t}\\): the masked weights and score gradients are 0; each "
            "factor rounded to the tables' digits, each result computed from the unrounded arrays and equal to "
            "its entry in the tables):\n\n" + aligned(lines))


def backward_md(fw, bw):
    replay = tiny_backward()
    dln1 = replay.steps["b0.dln1"][0]
    gap = float(np.abs(bw.du1 - dln1).max())
    parts = ["### Backward\n",
             f"The upstream gradient is the tiny model's real one: the mean cross-entropy (loss "
             f"{replay.loss:.4f}) of the next tokens, replayed call by call (`site_scripts/tiny_backward.py`). "
             "Block 0's attention receives \\(\\partial\\ell/\\partial \\operatorname{Attn}(U_1) = "
             "\\partial\\ell/\\partial M\\) (`b0.dmid`: the residual \\(M = X + \\operatorname{Attn}(U_1)\\) hands it "
             "on unchanged). Each step below is recomputed from the [derivation](#derivation)'s equations, in the "
             "order `attention_backward` computes them.\n",
             latex_table(grad("\\operatorname{Attn}(U_1)"), bw.dy, decimals=BACK),
             latex_table(grad("O") + " = " + grad("\\operatorname{Attn}(U_1)") + "\\, W_o^\\top", bw.do, decimals=BACK),
             "Head 0 (its \\(\\partial\\ell/\\partial O^{(0)}\\) is the first \\(d_h\\) columns of "
             "\\(\\partial\\ell/\\partial O\\)):\n",
             head_backward_md(bw, 0)]
    for h in range(1, fw.num_heads):
        parts.append(collapsed(f"Head {h}: the same steps", head_backward_md(bw, h)))
    single = [str(h) for h in range(fw.num_heads) if not bw.dscores[h][0].any()]
    where = "every head" if len(single) == fw.num_heads else "head " + ", ".join(single) if single else "no head"
    parts += [f"Row 0 of \\(\\partial\\ell/\\partial S^{{(h)}}\\) is exactly 0 in {where}: position 0 sees only "
              "itself, so its one weight is 1 whatever its score, and that score has no effect on the loss.\n",
              follow_backward_md(fw, bw),
              "The heads joined again, and the three terms of \\(\\partial\\ell/\\partial U_1\\):\n"]
    for n in "QKV":
        parts.append(latex_table(grad(n), getattr(bw, "d" + n.lower()), decimals=BACK))
    for n in "qkv":
        parts.append(latex_table(f"{grad(n.upper())}\\, W_{n}^\\top", bw.terms[n], decimals=BACK))
    parts += ["Their sum is \\(\\partial\\ell/\\partial U_1\\) ([three paths](#eq-attn-grad-input)):\n",
              latex_table(grad("U_1"), bw.du1, decimals=BACK),
              f"The sum equals the replay's `b0.dln1`, what `attention_backward` returned for the same upstream "
              f"gradient, to {gap:.1e} (largest difference of an entry; {verdict(gap, relative_gap(bw.du1, dln1))}"
              f"). The [LayerNorm page]({sections.page_link('attention', 'layernorm', 'eq-ln-grad')}) takes it from "
              "there, back to the block's input.\n"]
    return "\n".join(parts)


def example_md():
    fw, bw = tiny_steps()
    return forward_md(fw) + "\n" + backward_md(fw, bw)


# ---------------------------------------------------------------- the derivation, checked

def against_code_md(fw, bw):
    """Each step's result against what the code computes for the same input and upstream gradient."""
    ex, replay = tiny(), tiny_backward()
    y, _ = attention_forward(fw.u1[None], fw.p, fw.num_heads)
    pairs = [("\\alpha^{(h)}", "forward trace `b0.attention`", fw.alpha, ex.trace["b0.attention"][0]),
             ("\\operatorname{Attn}(U_1)", "`attention_forward`", fw.y, y[0]),
             (grad("U_1"), "replay `b0.dln1`", bw.du1, replay.steps["b0.dln1"][0])]
    pairs += [(grad(("W" if n[0] == "w" else "b") + f"_{n[1]}"), f"replay `b0.{n}`", bw.grads[n],
               replay.grads[f"b0.{n}"]) for n in ATTENTION_KEYS]
    rows = [[f"\\({symbol}\\)", code, f"{gap:.1e}", verdict(gap, rel)]
            for symbol, code, mine, theirs in pairs for gap, rel in [gap_cells(mine, theirs)]]
    return ("The steps of the tiny example, recomputed from the equations above, against the code run on the same "
            "input and the same upstream gradient (the tiny model's real one):\n\n"
            + md_table(["Step", "Against", "Largest gap", "Result"], rows))


def central_differences_md(fw, bw):
    """Each intermediate gradient against central differences of f = Σ Attn(U_1) ⊙ ∂ℓ/∂Attn(U_1)."""
    p, H, dy = fw.p, fw.num_heads, bw.dy
    alpha, scores, q, k, v, u1 = (a.copy() for a in (fw.alpha, fw.scores, fw.q, fw.k, fw.v, fw.u1[None]))
    f = lambda out: lambda: float(np.sum(out() * dy))  # noqa: E731
    rows = sections.gradcheck_rows(f(lambda: from_weights(alpha, fw.v, p)), [("datt", bw.dalpha, alpha)], H_STEP)
    rows += sections.gradcheck_rows(f(lambda: from_scores(scores, fw.v, p)), [("dscores", bw.dscores, scores)],
                                    H_STEP)
    rows += sections.gradcheck_rows(f(lambda: from_qkv(q, k, v, p, H)),
                                    [("dq", bw.dq, q), ("dk", bw.dk, k), ("dv", bw.dv, v)], H_STEP)
    rows += sections.gradcheck_rows(f(lambda: attention_forward(u1, p, H)[0][0]), [("dx", bw.du1[None], u1)], H_STEP)
    return (f"Each step's gradient against central differences. Holding the upstream gradient fixed, "
            f"\\(f = \\sum \\operatorname{{Attn}}(U_1) \\odot \\partial\\ell/\\partial \\operatorname{{Attn}}(U_1)\\) "
            f"(the [fake loss]({FAKE_LOSS}) with \\(R\\) the real upstream gradient) has, at this point, the same "
            "gradients as \\(\\ell\\); each row moves one intermediate of all heads, entry by entry, by "
            "\\(\\pm\\Delta\\) and reruns the forward from there (the scores before the mask; the last row reruns "
            "`attention_forward` itself):\n\n" + sections.gradcheck_table(rows))


def jacobian_md(fw):
    """The softmax Jacobian of head 0's last row, from its formula and by central differences."""
    t, s, a = len(fw.u1) - 1, fw.scores[0][-1].copy(), fw.alpha[0][-1]
    formula = np.diag(a) - np.outer(a, a)
    numeric = np.zeros_like(formula)
    for j in range(len(s)):
        step = np.eye(len(s))[j] * H_STEP
        numeric[:, j] = (row_softmax(s + step) - row_softmax(s - step)) / (2 * H_STEP)
    gap, rel = gap_cells(formula, numeric)
    label = (f"\\partial\\alpha^{{(0)}}_{{{t}t'}} / \\partial S^{{(0)}}_{{{t}t''}} = \\alpha^{{(0)}}_{{{t}t'}}"
             f"([t' = t''] - \\alpha^{{(0)}}_{{{t}t''}})")
    return (latex_table(label, formula, rows="t'", cols="t''", decimals=BACK)
            + f"\nThe [softmax's Jacobian](#eq-attn-softmax-jacobian) of head 0's last row (query \\(t = {t}\\), "
              f"which sees every key), from the formula; central differences of the {len(s)} weights, moving each "
              f"score by \\(\\pm\\Delta\\) (\\(\\Delta\\) = {H_STEP:g}), differ from it by at most {gap:.1e} "
              f"(relative {rel:.1e}: {verdict(gap, rel)}). Each column sums to zero (the largest sum is "
              f"{np.abs(formula.sum(0)).max():.0e} in size): moving one score moves weight between the entries of "
              "the row, which still sums to 1.\n")


def zeros_md(fw, bw):
    """The exact zeros the derivation predicts: the masked scores' gradient, each row sum, the key bias."""
    upper = np.triu(np.ones(fw.scores.shape[-2:], dtype=bool), 1)
    code = softmax_backward(bw.dalpha, fw.alpha.copy())  # what attention_backward calls, on the same arrays
    replay = tiny_backward()
    rows = [[f"\\({grad('S^{(h)}')}\\) at the {upper.sum() * fw.num_heads} masked entries, by the equation",
             f"{np.abs(bw.dscores[:, upper]).max():g}",
             "exactly 0" if not bw.dscores[:, upper].any() else "**not zero**"],
            ["the same, by `softmax_backward` (what `attention_backward` calls)", f"{np.abs(code[:, upper]).max():g}",
             "exactly 0" if not code[:, upper].any() else "**not zero**"],
            [f"\\({grad(chr(92) + 'alpha^{(h)}')}\\) at the same entries", f"{np.abs(bw.dalpha[:, upper]).max():.5f}",
             "not zero: the zero comes from the factor \\(\\alpha^{(h)}_{tt''} = 0\\), not from here"],
            [f"each row's sum of \\({grad('S^{(h)}')}\\)", f"{np.abs(bw.dscores.sum(-1)).max():.1e}",
             "zero up to rounding"],
            [f"\\({grad('b_k')}\\), the replay's `b0.bk`", f"{np.abs(replay.grads['b0.bk']).max():.1e}",
             "zero up to rounding (the row sums above)"]]
    return ("The zeros the derivation predicts (the largest entry in size of each):\n\n"
            + md_table(["Quantity", "Largest in size", "Reading"], rows))


def three_terms_md(fw, bw):
    """∂ℓ/∂U_1 against the sum of its three terms computed separately, and against sums missing one of them."""
    dln1 = tiny_backward().steps["b0.dln1"][0]
    rows = []
    for left_out in (None, *"qkv"):
        total = sum(term for n, term in bw.terms.items() if n != left_out)
        gap, rel = gap_cells(total, dln1)
        name = ("all three terms" if left_out is None else
                f"without \\({grad(left_out.upper())}\\, W_{left_out}^\\top\\) (a planted mistake)")
        rows.append([name, f"{np.linalg.norm(bw.terms[left_out]) if left_out else np.linalg.norm(total):.5f}",
                     f"{gap:.1e}", f"{rel:.1e}", verdict(gap, rel) if left_out is None else caught(gap, rel)])
    return ("The sum of three paths: \\(\\partial\\ell/\\partial U_1\\) from `attention_backward` (the replay's "
            "`b0.dln1`, one matmul with the gradients side by side) against the three terms of the "
            "[equation](#eq-attn-grad-input) computed one by one and added, and against the sums that leave one term "
            "out. The second column is the norm of the whole sum, or of the term left out.\n\n"
            + md_table(["Sum", "Norm", "Largest gap", "Relative gap", "Result"], rows)
            + "\nEach path matters: leaving any one term out changes the gradient by far more than the tolerance "
              f"of the gradient checks (a relative gap of {REL_TOL:g}).\n")


def derivation_checks_md():
    fw, bw = tiny_steps()
    return "\n".join([illustrative("Block 0's attention, with the tiny model's real upstream gradient (`b0.dmid`)."),
                      against_code_md(fw, bw), central_differences_md(fw, bw), jacobian_md(fw),
                      zeros_md(fw, bw), three_terms_md(fw, bw)])


# ---------------------------------------------------------------- the symbols and the gradient check

def symbols_md():
    ex, rng = default_run(), np.random.default_rng(SEED)
    p, x = block_params(ex.params, 0), ex.trace["b0.ln1"]
    y, cache = attention_forward(x, p, ex.cfg.num_heads)
    q_scaled, k, v, att = cache.q_scaled, cache.k, cache.v, cache.att
    dx, _ = attention_backward(rng.standard_normal(y.shape), cache)  # any upstream gradient: only shapes are kept
    rows = [
        (r"U_1", "x", x.shape, r"block 0's \(\operatorname{LN}_1\) output"),
        (r"W_q, W_k, W_v, W_o", "wq, wk, wv, wo", p["wq"].shape,
         r"the first three side by side as one `(d, 3d)` matrix, so that one matmul computes \(Q\), \(K\) "
         r"and \(V\)"),
        (r"b_q, b_k, b_v, b_o", "bq, bk, bv, bo", p["bq"].shape),
        (r"Q, K, V", "np.split(qkv, 3, axis=-1)", x.shape),
        (r"Q^{(h)}, K^{(h)}, V^{(h)}", "q, k, v", k.shape),
        (r"Q^{(h)}/\sqrt{d_h}", "q_scaled", q_scaled.shape),
        (r"d_h", "cfg.head_dim", f"{ex.cfg.head_dim}"),
        (r"S^{(h)}", "scores", att.shape),
        (r"\alpha^{(h)}", "att", att.shape),
        (r"O^{(h)}", "heads", v.shape),
        (r"O", "merge_heads(heads)", y.shape),
        (r"\operatorname{Attn}(U_1)", "y", y.shape),
        (r"\partial\ell/\partial \operatorname{Attn}(U_1)", "dy", y.shape, "the upstream gradient"),
        (r"\partial\ell/\partial O", "dheads (before split_heads)", y.shape),
        (r"\partial\ell/\partial \alpha^{(h)}", "datt", att.shape),
        (r"\partial\ell/\partial S^{(h)}", "dscores", att.shape),
        (r"\partial\ell/\partial U_1", "dx", dx.shape),
    ]
    return sections.symbols_md(rows, default_note())


def gradcheck_md():
    ex, rng = tiny(), np.random.default_rng(SEED)
    p = biases_moved(block_params(ex.params, 0), rng)
    x = rng.standard_normal((2, ex.cfg.context_len, ex.cfg.emb_dim))
    dy = rng.standard_normal(x.shape)
    dx, grads = attention_backward(dy, attention_forward(x, p, ex.cfg.num_heads)[1])
    checks = [("dx", dx, x)] + [(f"d{k}", grads[k], p[k]) for k in ATTENTION_KEYS]
    rows = sections.gradcheck_rows(weighted_sum(dy, attention_forward, x, p, ex.cfg.num_heads), checks, H_STEP)
    bk = next(row for row in rows if row.label == "dbk")
    return (f"The [fake loss]({FAKE_LOSS}) \\(f = \\sum \\operatorname{{Attn}}(U_1) \\odot R\\) on the tiny model's "
            f"block 0 parameters (biases moved off zero), with a random input \\(U_1\\) of shape `{x.shape}` and a "
            f"random \\(R\\) (seed {SEED}). The key bias gradient is zero in exact arithmetic "
            "([derivation](#eq-attn-grad-key-bias)): the analytic one is at most "
            f"{np.abs(grads['bk']).max():.0e} in size and the central differences' at most {bk.gap:.0e} off it, both "
            f"rounding noise. Their relative gap, {bk.rel:.2f}, compares one noise with another and means nothing; "
            "the row passes on the absolute floor instead.\n\n" + sections.gradcheck_table(rows))


def generate(context):
    inventory = inventory_md("attention", context["repo_url"], runs=("materialized", "flash"), caches=ATTENTION)
    return {"symbols": symbols_md(), "example": example_md(), "derivation-checks": derivation_checks_md(),
            "gradcheck": gradcheck_md(), "cache-inventory": inventory}
