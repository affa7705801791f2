"""Generator of the Attention page: the values its prose shows (docs/model/attention.md binds them), its tables
and its picture.

The tiny example (block 0 of the tiny model, driven by its real loss gradient) recomputes every step from the
page's equations, one window at a time, with arrays of 2 axes (a head's arrays have 3: head, row, column); the
checks compare those steps with the code (`attention_forward`, the replayed `attention_backward`) and with
central differences. The Transformer block page reuses the table and arithmetic helpers."""

import math

import numpy as np

from transformer.attention import attention_backward, attention_forward
from transformer.block import ATTENTION_KEYS, block_params
from transformer.gradcheck import REL_TOL, check_passes, relative_gap
from transformer.softmax import softmax_backward

from .. import sections
from ..common import md_table
from ..examples import H_STEP, SEED, TINY_IDS, TINY_TARGETS, default_note, default_run, tiny
from ..figures import new_figure, png
from ..tiny_backward import tiny_backward
from ._attention_steps import from_qkv, from_scores, from_weights, masked, row_softmax, tiny_steps

ROW, COL = 1, 0  # the entry whose arithmetic the example writes out: head 0, query t = 1, key t' = 0
BACK = 5  # decimals of the backward's tables: its entries are smaller
ROUNDING_TOL = 1e-12  # arithmetic by hand that differs from the code by more than this is a mistake of the page


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


# ---------------------------------------------------------------- the picture

def weights_png(block=0, window=0):
    """The default run's attention weights in one block and window, one panel per head, the masked upper
    triangle hatched. Returns the figure and its values."""
    from matplotlib.patches import Polygon

    ex = default_run()
    att = ex.trace[f"b{block}.attention"][window]
    H, T, _ = att.shape
    upper = np.triu(np.ones((T, T), dtype=bool), 1)
    fig, axes = new_figure(1, H, figsize=(3.1 * H + 1, 3.4), sharey=True)
    stairs = [(T - 0.5, -0.5), (T - 0.5, T - 1.5)]  # the edge of the masked cells, cell by cell
    for t in range(T - 2, -1, -1):
        stairs += [(t + 0.5, t + 0.5), (t + 0.5, t - 0.5)]
    for h, ax in enumerate(axes):
        image = ax.imshow(np.ma.masked_array(att[h], upper), cmap="viridis", vmin=0, vmax=1)
        ax.add_patch(Polygon(stairs, closed=True, facecolor="0.85", edgecolor="0.5", hatch="//", lw=0.5))
        ax.text(T * 0.68, T * 0.28, "masked", ha="center", va="center", fontsize="small", color="0.3")
        ax.set(title=f"head {h}", xlabel="key position t'", xticks=range(0, T, 5), yticks=range(0, T, 5))
    axes[0].set_ylabel("query position t")
    fig.colorbar(image, ax=list(axes), label="weight α_tt'", shrink=0.85)
    even = np.tril(np.ones((T, T))) / np.arange(1, T + 1)[:, None]  # 1/(t+1) for every key a row may see
    values = {"block": block, "window": window, "T": T, "H": H, "upper": float(att[:, upper].max()),
              "first": float(att[:, 0, 0].min()), "row_sum": float(np.abs(att.sum(-1) - 1).max()),
              "uneven": float(np.abs(att - even).max())}
    return png(fig), values


# ---------------------------------------------------------------- the tiny example, forward

def weights_md(p):
    """The projections' weight tables, and their bias tables where a bias is not zero."""
    tables = [weight_table(f"W_{n}", p[f"w{n}"]) for n in "qkvo"]
    tables += [bias_table(n, p[f"b{n}"]) for n in "qkvo" if p[f"b{n}"].any()]
    return "\n".join(tables)


def head_forward_md(fw, h):
    parts = [latex_table(f"S^{{({h})}}", masked(fw.scores)[h], rows="t", cols="t'"),
             latex_table(f"\\alpha^{{({h})}}", fw.alpha[h], rows="t", cols="t'"),
             latex_table(f"V^{{({h})}}", fw.head(fw.v, h), rows="t'", cols="i"),
             latex_table(f"O^{{({h})}} = \\alpha^{{({h})}} V^{{({h})}}", fw.oh[h], rows="t", cols="i")]
    return "\n".join(parts)


def products(pairs, per_line=3):
    """The written-out sum a·b + c·d + ..., continued on a new aligned line after every `per_line` products."""
    terms = [f"{a} \\cdot {b}" for a, b in pairs]
    chunks = [" + ".join(terms[i:i + per_line]) for i in range(0, len(terms), per_line)]
    return " \\\\\n&\\quad + ".join(chunks)


def aligned(lines):
    """Display maths: the lines one under the other, aligned at their `&`."""
    return "$$\n\\begin{aligned}\n" + " \\\\\n".join(lines) + "\n\\end{aligned}\n$$\n"


def check_by_hand(pairs, what):
    """Refuse arithmetic written out on the page that does not give what the code computed."""
    wrong = [name for name, (hand, code) in pairs.items() if abs(hand - code) > ROUNDING_TOL * max(1, abs(code))]
    if wrong:
        raise RuntimeError(f"the Attention page's {what} by hand disagrees with the code for {wrong}")


def follow_forward(fw):
    """One entry of S^(0), α^(0) and O^(0): the written-out terms (factors rounded as the tables round them)
    and the results, computed from the unrounded arrays."""
    t, c, dh = ROW, COL, fw.q.shape[1] // fw.num_heads
    q, k, v, s, a = fw.head(fw.q, 0), fw.head(fw.k, 0), fw.head(fw.v, 0), fw.scores[0], fw.alpha[0]
    check_by_hand({"S": (q[t] @ k[c] / math.sqrt(dh), s[t, c]),
                   "alpha": (math.exp(s[t, c]) / sum(math.exp(s[t, u]) for u in range(t + 1)), a[t, c]),
                   "O": (sum(a[t, u] * v[u, 0] for u in range(t + 1)), fw.oh[0][t, 0])}, "forward")
    return {"t": t, "c": c, "s_terms": " + ".join(f"{tex(q[t, i])} \\times {tex(k[c, i])}" for i in range(dh)),
            "s": s[t, c], "s_exp": number(s[t, c]),
            "exps": " + ".join(f"e^{{{number(s[t, u])}}}" for u in range(t + 1)),
            "alpha": a[t, c], "mix": " + ".join(f"{tex(a[t, u])} \\times {tex(v[u, 0])}" for u in range(t + 1)),
            "o": fw.oh[0][t, 0]}


def forward_part(fw):
    """The tiny example's forward: its tables and values."""
    ex = tiny()
    y, _ = attention_forward(fw.u1[None], fw.p, fw.num_heads)
    upper = fw.alpha[(slice(None), *np.triu_indices(len(fw.u1), 1))]
    others = list(range(1, fw.num_heads))
    tables = {"u1": latex_table("U_1", fw.u1), "weights": weights_md(fw.p),
              "q": latex_table("Q = U_1 W_q + b_q", fw.q), "k": latex_table("K = U_1 W_k + b_k", fw.k),
              "v": latex_table("V = U_1 W_v + b_v", fw.v), "head0_forward": head_forward_md(fw, 0),
              "heads_forward": "\n".join(head_forward_md(fw, h) for h in others),
              "o": latex_table("O = [O^{(0)} \\cdots O^{(H-1)}]", fw.o),
              "y": latex_table("\\operatorname{Attn}(U_1) = O W_o + b_o", fw.y)}
    values = {"bias_max": float(max(np.abs(fw.p[f"b{n}"]).max() for n in "qkvo")), "other_heads": others,
              "upper": float(upper.max()), "row_sum": float(np.abs(fw.alpha.sum(-1) - 1).max()),
              "follow": follow_forward(fw), "y_gap": float(np.abs(y[0] - fw.y).max()),
              "alpha_gap": float(np.abs(ex.trace["b0.attention"][0] - fw.alpha).max())}
    return tables, values


# ---------------------------------------------------------------- the tiny example, backward

def grad(symbol):
    return f"\\partial\\ell/\\partial {symbol}"


HEAD_STEPS = (  # (fragment, label, field of Backward, row index, column index); @ stands for the head's superscript
    ("doh", r"\partial\ell/\partial O@", "doh", "t", "i"),
    ("dalpha", r"\partial\ell/\partial \alpha@ = (\partial\ell/\partial O@)\, V@{}^\top", "dalpha", "t", "t'"),
    ("dvh", r"\partial\ell/\partial V@ = \alpha@{}^\top\, \partial\ell/\partial O@", "dvh", "t'", "i"),
    ("dscores", r"\partial\ell/\partial S@", "dscores", "t", "t'"),
    ("dqh", r"\partial\ell/\partial Q@ = \tfrac{1}{\sqrt{d_h}}\, (\partial\ell/\partial S@)\, K@", "dqh", "t", "i"),
    ("dkh", r"\partial\ell/\partial K@ = (\partial\ell/\partial S@)^\top\, Q@/\sqrt{d_h}", "dkh", "t'", "i"),
)


def head_step_md(bw, h, step):
    _, label, field, rows, cols = step
    return latex_table(label.replace("@", f"^{{({h})}}"), getattr(bw, field)[h], rows, cols, BACK)


def head_backward_md(bw, h):
    return "\n".join(head_step_md(bw, h, step) for step in HEAD_STEPS)


def follow_backward(fw, bw):
    """One entry followed from ∂ℓ/∂Attn(U_1) to ∂ℓ/∂Q^(0): the written-out terms and the results."""
    t, c, dh, d = ROW, COL, fw.q.shape[1] // fw.num_heads, fw.q.shape[1]
    wo, v, k, a = fw.p["wo"], fw.head(fw.v, 0), fw.head(fw.k, 0), fw.alpha[0]
    da, ds = bw.dalpha[0], bw.dscores[0]
    f = lambda x: tex(x, BACK)  # noqa: E731
    check_by_hand({"dO": (bw.dy[t] @ wo[0], bw.do[t, 0]), "dalpha": (bw.doh[0][t] @ v[c], da[t, c]),
                   "dS": (a[t, c] * (da[t, c] - a[t] @ da[t]), ds[t, c]),
                   "dQ": (ds[t] @ k[:, 0] / math.sqrt(dh), bw.dqh[0][t, 0])}, "backward")
    dot = " + ".join(f"{f(a[t, u])} \\cdot {f(da[t, u])}" for u in range(t + 1))
    return {"t": t, "c": c, "dh": dh,
            "do_terms": products([(f(bw.dy[t, i]), f(wo[0, i])) for i in range(d)], per_line=2), "do": bw.do[t, 0],
            "da_terms": " + ".join(f"{f(bw.doh[0][t, i])} \\cdot {f(v[c, i])}" for i in range(dh)), "da": da[t, c],
            "ds_terms": f"{f(a[t, c])} \\cdot ({f(da[t, c])} - ({dot}))", "ds": ds[t, c],
            "dq_terms": " + ".join(f"{f(ds[t, u])} \\cdot {f(k[u, 0])}" for u in range(t + 1)), "dq": bw.dqh[0][t, 0]}


def backward_part(fw, bw):
    """The tiny example's backward: its tables (one per step, head 0 open, the other heads together) and values."""
    replay = tiny_backward()
    dln1 = replay.steps["b0.dln1"][0]
    gap = float(np.abs(bw.du1 - dln1).max())
    tables = {"dy": latex_table(grad("\\operatorname{Attn}(U_1)"), bw.dy, decimals=BACK),
              "do": latex_table(grad("O") + " = " + grad("\\operatorname{Attn}(U_1)") + "\\, W_o^\\top", bw.do,
                                decimals=BACK),
              **{f"{step[0]}0": head_step_md(bw, 0, step) for step in HEAD_STEPS},
              "heads_backward": "\n".join(head_backward_md(bw, h) for h in range(1, fw.num_heads)),
              **{f"d{n}": latex_table(grad(n.upper()), getattr(bw, f"d{n}"), decimals=BACK) for n in "qkv"},
              "terms": "\n".join(latex_table(f"{grad(n.upper())}\\, W_{n}^\\top", bw.terms[n], decimals=BACK)
                                 for n in "qkv"),
              "du1": latex_table(grad("U_1"), bw.du1, decimals=BACK)}
    values = {"loss": replay.loss, "row0": float(np.abs(bw.dscores[:, 0]).max()),
              "row_sums": float(np.abs(bw.dscores.sum(-1)).max()), "follow": follow_backward(fw, bw),
              "du1_gap": gap, "du1_verdict": verdict(gap, relative_gap(bw.du1, dln1))}
    return tables, values


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
    return md_table(["Step", "Against", "Largest gap", "Result"], rows)


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
    return sections.gradcheck_table(rows)


def jacobian(fw):
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
    table = latex_table(label, formula, rows="t'", cols="t''", decimals=BACK)
    return table, {"t": t, "n": len(s), "h": H_STEP, "gap": gap, "rel": rel, "verdict": verdict(gap, rel),
                   "col_sum": float(np.abs(formula.sum(0)).max())}


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
    return md_table(["Quantity", "Largest in size", "Reading"], rows)


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
    return md_table(["Sum", "Norm", "Largest gap", "Relative gap", "Result"], rows)


def checks(fw, bw):
    """The derivation's checks on the tiny example: tables, and the Jacobian's values."""
    jacobian_table, jacobian_values = jacobian(fw)
    tables = {"against_code": against_code_md(fw, bw), "central": central_differences_md(fw, bw),
              "jacobian": jacobian_table, "zeros": zeros_md(fw, bw), "three_terms": three_terms_md(fw, bw)}
    return tables, {"jacobian": jacobian_values, "rel_tol": REL_TOL}


# ---------------------------------------------------------------- what it costs

def cost():
    """What the default run's attention keeps for its backward: the weights against the queries, keys and values."""
    ex = default_run()
    _, cache = attention_forward(ex.trace["b0.ln1"], block_params(ex.params, 0), ex.cfg.num_heads)
    qkv = cache.q_scaled.nbytes + cache.k.nbytes + cache.v.nbytes
    return {"att_shape": cache.att.shape, "att_bytes": cache.att.nbytes, "qkv_shape": cache.k.shape,
            "qkv_bytes": qkv, "layers": ex.cfg.num_layers}


# ---------------------------------------------------------------- the symbols and the gradient check

def symbols_md():
    ex, rng = default_run(), np.random.default_rng(SEED)
    p, x = block_params(ex.params, 0), ex.trace["b0.ln1"]
    y, cache = attention_forward(x, p, ex.cfg.num_heads)
    q_scaled, k, v, att = cache.q_scaled, cache.k, cache.v, cache.att
    dx, _ = attention_backward(rng.standard_normal(y.shape), cache)  # any upstream gradient: only shapes are kept
    rows = [
        (r"U_1", "x", x.shape, r"block 0's \(\operatorname{LN}_1\) output"),
        (r"W_q, W_k, W_v, W_o", "wq, wk, wv, wo", p["wq"].shape, "four separate matrices, one matmul each"),
        (r"b_q, b_k, b_v, b_o", "bq, bk, bv, bo", p["bq"].shape),
        (r"Q, K, V", "linear_forward(x, wq, bq)[0], ...", x.shape, "in `qkv_forward`, before `split_heads`"),
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


def gradcheck():
    """The backward against central differences with the biases moved off zero: the table, and its values."""
    cfg = tiny().cfg
    rows, grads = sections.block_layer_check(attention_forward, attention_backward, ATTENTION_KEYS,
                                             np.random.default_rng(SEED), cfg.num_heads)
    x_shape = (2, cfg.context_len, cfg.emb_dim)
    bk = next(row for row in rows if row.label == "dbk")
    return sections.gradcheck_table(rows), {"shape": x_shape, "bk_max": float(np.abs(grads["bk"]).max()),
                                            "bk_gap": bk.gap, "bk_rel": bk.rel}


def generate(context):
    fw, bw = tiny_steps()
    cfg = tiny().cfg
    picture, picture_values = weights_png()
    forward_tables, forward_values = forward_part(fw)
    backward_tables, backward_values = backward_part(fw, bw)
    check_tables, check_values = checks(fw, bw)
    gradcheck_table, gradcheck_values = gradcheck()
    values = {"seed": SEED, "ids": TINY_IDS, "targets": TINY_TARGETS, "dh": cfg.head_dim,
              "sizes": {"n_v": cfg.vocab_size, "t_max": cfg.context_len, "d": cfg.emb_dim, "h": cfg.num_heads,
                        "l": cfg.num_layers, "f": cfg.ff_dim},
              "picture": picture_values, "forward": forward_values, "backward": backward_values,
              "checks": check_values, "cost": cost(), "gradcheck": gradcheck_values}
    return {"values": values, "weights.png": picture, **forward_tables, **backward_tables, **check_tables,
            "symbols": symbols_md(), "gradcheck": gradcheck_table}
