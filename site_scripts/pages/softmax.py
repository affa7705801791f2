"""Generator of the Softmax & Cross-Entropy page: the values its prose shows (docs/model/softmax.md binds them),
its tables and its picture.

The checks of the derivation (`jacobian_checks`, `fused_rows`, `confident_rows`) take what they test as
arguments, so that tests/site/test_pages_lin.py can show each one fails on a planted mistake."""

import numpy as np

from transformer.gradcheck import REL_TOL
from transformer.softmax import cross_entropy_backward, cross_entropy_forward, softmax_backward, softmax_forward

from .. import sections
from ..common import md_table
from ..examples import H_STEP, SEED, TINY_IDS, TINY_TARGETS, default_note, default_run, tiny
from ..figures import new_figure, png
from ..sections import agreement, num
from ..tiny_backward import tiny_backward

ROW = 0  # the position of the tiny example whose row of logits the Jacobian check uses
SHIFTS = (0.0, 100.0, 1000.0)  # constants κ added to that row to show what subtracting the maximum prevents
SCALE = 1000.0  # the tiny logits times this: a model confident enough for p_y to underflow to 0


def softmax(z):
    return softmax_forward(np.array(z, dtype=float))[0]  # a copy: softmax_forward may work in place


def formula_jacobian(p):
    """∂p_j/∂z_j' = p_j([j = j'] − p_j'), written from the derivation."""
    return np.diag(p) - np.outer(p, p)


def code_jacobian(p):
    """The Jacobian from the code's backward: softmax_backward with the unit upstream gradient e_j gives
    Σ_j' [j' = j] ∂p_j'/∂z = row j."""
    n = p.size
    return softmax_backward(np.eye(n), np.tile(p, (n, 1)))


def numeric_jacobian(z):
    """Column j' by central differences of the code's forward: (p(z + Δ e_j') − p(z − Δ e_j')) / 2Δ."""
    steps = np.eye(z.size) * H_STEP
    return np.stack([(softmax(z + e) - softmax(z - e)) / (2 * H_STEP) for e in steps], axis=1)


def jacobian_checks(z, target, n, jacobian=formula_jacobian):
    """Rows (what, largest gap, verdict) of the Jacobian steps of the derivation, for one row z of logits whose
    target is `target` among n positions; `jacobian` is the formula under test (a test plants a wrong one)."""
    p = softmax(z)
    formula, numeric = jacobian(p), numeric_jacobian(z)
    dp = -np.eye(z.size)[target] / (n * p[target])  # the log's backward, the slow route's upstream gradient
    dl_dp = r"\partial\ell/\partial p"
    checks = [
        (r"the formula \(\operatorname{diag}(p) - p\,p^\top\) against central differences of the code's softmax",
         formula, numeric),
        ("the code's `softmax_backward` with unit upstream gradients against the formula", code_jacobian(p), formula),
        (r"each row's sum \(\sum_{j'} \partial p_j/\partial z_{j'}\) (the shift step) against 0", formula.sum(axis=1),
         np.zeros(z.size)),
        (f"`softmax_backward` of \\({dl_dp}\\) against the matrix product "
         f"\\((\\partial p/\\partial z)^\\top {dl_dp}\\), for the slow route's \\({dl_dp} = -e_y/(N p_y)\\)",
         softmax_backward(dp, p), formula.T @ dp),
    ]
    return formula, numeric, [[what, *agreement(mine, reference)] for what, mine, reference in checks]


def shift_rows(z):
    """What subtracting the maximum prevents: the code against a softmax without the shift, for z + κ."""
    p, rows = softmax(z), []
    for kappa in SHIFTS:
        with np.errstate(over="ignore", invalid="ignore"):
            e = np.exp(z + kappa)
            naive = e / e.sum()
        gap = agreement(softmax(z + kappa), p)[0]
        naive_text = f"{np.abs(naive - p).max():.1e}" if np.all(np.isfinite(naive)) else "not a number (exp overflowed)"
        rows.append([f"{kappa:g}", f"{gap:.1e}", naive_text])
    return rows


def jacobian():
    """The Jacobian of the tiny example's row ROW, its checks, and the shift's table, with their values."""
    z = tiny().trace["logits"][0][ROW]
    formula, numeric, rows = jacobian_checks(z, TINY_TARGETS[ROW], len(TINY_TARGETS))
    p = softmax(z)
    top = int(np.argmax(np.diag(formula)))
    tables = {"jac_formula": sections.array_md("∂p/∂z = diag(p) − p pᵀ", formula, row_label="j"),
              "jac_numeric": sections.array_md("central differences (p(z + Δe_j′) − p(z − Δe_j′)) / 2Δ", numeric,
                                               row_label="j"),
              "jac_checks": md_table(["Check", "Largest gap", "Result"],
                                     [[what, f"{gap:.1e}", verdict] for what, gap, verdict in rows]),
              "shift": md_table(["\\(\\kappa\\)", "code: largest gap to \\(p\\)",
                                 "without the shift: largest gap to \\(p\\)"], shift_rows(z))}
    return tables, {"row": ROW, "top": top, "top_value": formula[top, top], "top_p": p[top], "rel_tol": REL_TOL,
                    "h": H_STEP, "overflow": float(np.log(np.finfo(np.float64).max))}


def slow_route(z, targets):
    """The loss and its gradient the slow way: log of the softmax, the log's backward, the softmax backward."""
    n = targets.size
    p = softmax(z)
    onehot = np.eye(z.shape[-1])[targets]
    with np.errstate(divide="ignore", invalid="ignore"):
        loss = -np.log(p[np.arange(n), targets]).mean()
        dp = -onehot / (n * p)  # the log's backward: ∂(−log p_y / N)/∂p_j = −[j = y] / (N p_y)
        return float(loss), softmax_backward(dp, p)


def fused_route(z, targets):
    loss, cache = cross_entropy_forward(z, targets)
    return loss, cross_entropy_backward(1.0, cache)


def fused_rows(z, targets, fused=fused_route):
    """(what, largest gap, verdict) of the fused loss and gradient against the slow route."""
    loss, grad = fused(z, targets)
    slow_loss, slow_grad = slow_route(z, targets)
    return [[r"\(\mathcal{L}\): log-sum-exp form against \(-\operatorname{mean} \log p_y\)",
             *agreement(loss, slow_loss)],
            [r"\(\partial\mathcal{L}/\partial Z\): \((P - e_y)/N\) against the log's backward then `softmax_backward`",
             *agreement(grad, slow_grad)]]


def confident_rows(z, targets):
    rows = []
    for name, route in [("fused (the code)", fused_route), ("slow (log of softmax)", slow_route)]:
        loss, grad = route(z, targets)
        finite = bool(np.all(np.isfinite(grad)))
        rows.append([name, f"{loss:.2f}", "yes" if finite else "no: " + ("not a number" if np.isnan(grad).any()
                                                                          else "infinite"),
                     f"{np.abs(grad).max():.4f}" if finite else "–"])
    return rows


def fused():
    """The fused route against the slow one on the tiny logits, and both on logits SCALE times larger."""
    z, targets = tiny().trace["logits"][0], np.array(TINY_TARGETS)
    big = SCALE * z
    p_big = softmax(big)[np.arange(targets.size), targets]
    checks = [[what, f"{gap:.1e}", verdict] for what, gap, verdict in fused_rows(z, targets)]
    tables = {"fused_checks": md_table(["Check", "Largest gap", "Result"], checks),
              "confident": md_table(["Route", "\\(\\mathcal{L}\\)", "Gradient finite?",
                                     "Largest \\(\\lvert\\partial\\mathcal{L}/\\partial Z\\rvert\\)"],
                                    confident_rows(big, targets))}
    return tables, {"n": targets.size, "scale": SCALE, "p_big": list(p_big), "zeros": int((p_big == 0).sum())}


# ---------------------------------------------------------------- the tiny example

def written_exps(shifted):
    """e^{a} for each shifted logit, as the arithmetic writes them (a true minus sign, no brackets)."""
    return [f"e^{{{num(v, bracket=False)}}}" for v in shifted]


def forward(z, p, loss, n_v):
    """The tiny example's forward: its tables and values (the loss against log n_V, one probability by hand)."""
    targets = np.array(TINY_TARGETS)
    per_position = -np.log(p[np.arange(targets.size), targets])
    over_targets = np.log(np.exp(z).sum(axis=-1)) - z.mean(axis=-1)  # a row's loss averaged over all n_V targets
    t, y = 0, TINY_TARGETS[0]
    shifted = z[t] - z[t].max()
    exps = written_exps(shifted)
    if abs(np.exp(shifted[y]) / np.exp(shifted).sum() - p[t, y]) > 1e-12:
        raise RuntimeError("the Softmax page's probability by hand disagrees with softmax_forward")
    tables = {"logits": sections.array_md("logits Z", z, row_label="position t"),
              "probs": sections.array_md("P = softmax(Z), row by row", p, row_label="position t"),
              "per_position": md_table(["position \\(t\\)", "target \\(y\\)", "\\(P_{t,y}\\)", "\\(-\\log P_{t,y}\\)"],
                                       [[t_, y_, f"{p[t_, y_]:.4f}", f"{per_position[t_]:.4f}"]
                                        for t_, y_ in enumerate(targets)])}
    follow = {"t": t, "y": y, "exp_y": exps[y], "exps": " + ".join(exps), "numerator": np.exp(shifted[y]),
              "denominator": np.exp(shifted).sum(), "p": p[t, y]}
    return tables, {"follow": follow, "loss": loss, "log_nv": np.log(n_v), "n_v": n_v,
                    "over_targets": list(over_targets), "over_mean": over_targets.mean()}


def backward(ex, p):
    """The real dlogits of the tiny example, computed here from P and e_y and followed into the head."""
    back, targets = tiny_backward(), np.array(TINY_TARGETS)
    n, onehot = targets.size, np.eye(ex.cfg.vocab_size)[targets]
    dz = (p - onehot) / n
    t = 1
    y, other = int(targets[t]), int((targets[t] + 1) % ex.cfg.vocab_size)
    xf, dxf = ex.trace["lnf"][0], dz @ ex.params["head_w"].T
    grad = r"\(\partial\ell/\partial {}\)".format
    checks = [[grad("Z"), "\\((P - e_y) / N\\)", "`steps['dlogits']`", *fmt(agreement(dz, back.steps["dlogits"][0]))],
              [grad("X_f"), "\\(\\partial\\ell/\\partial Z\\, W_h^\\top\\) (the head's backward)", "`steps['dlnf']`",
               *fmt(agreement(dxf, back.steps["dlnf"][0]))],
              [grad("W_h"), "\\(X_f^\\top\\, \\partial\\ell/\\partial Z\\)", "`grads['head_w']`",
               *fmt(agreement(xf.T @ dz, back.grads["head_w"]))]]
    tables = {"onehot": sections.array_md("e_y (one-hot targets)", onehot, row_label="position t"),
              "dlogits": sections.array_md("∂ℓ/∂Z = (P − e_y) / N", dz, row_label="position t"),
              "replay": md_table(["Gradient", "Computed here as", "Replay's array", "Largest gap", "Result"], checks),
              "lnf": sections.array_md("X_f (lnf)", xf, row_label="position t")}
    values = {"n": n, "t": t, "y": y, "other": other, "p_y": p[t, y], "dz_y": dz[t, y], "p_other": p[t, other],
              "dz_other": dz[t, other], "row_sum": float(np.abs(dz.sum(axis=-1)).max()),
              "dw_terms": " + ".join(f"{num(a)}·{num(d)}" for a, d in zip(xf[:, 0], dz[:, 0], strict=True)),
              "dw": xf[:, 0] @ dz[:, 0], "head_w": back.grads["head_w"][0, 0]}
    return tables, values


def fmt(gap_verdict):
    gap, verdict = gap_verdict
    return [f"{gap:.1e}", verdict]


def row_png(ex, p, t):
    """One row of the tiny example: its logits, its probabilities and its gradient (P − e_y)/N, target marked."""
    z, y, n = ex.trace["logits"][0][t], TINY_TARGETS[t], len(TINY_TARGETS)
    grad = (p[t] - np.eye(z.size)[y]) / n
    colors = ["tab:orange" if j == y else "tab:blue" for j in range(z.size)]
    fig, axes = new_figure(1, 3, figsize=(11, 3.2))
    for ax, values, title in ((axes[0], z, "logits z_j"), (axes[1], p[t], "probabilities p_j = softmax(z)_j"),
                              (axes[2], grad, "gradient ∂ℓ/∂z_j = (p_j − [j = y]) / N")):
        ax.bar(range(z.size), values, color=colors)
        ax.axhline(0, color="black", lw=0.6)
        ax.set(title=title, xlabel="vocabulary entry j", xticks=range(z.size))
    axes[0].set_ylabel("value")
    from matplotlib.patches import Patch

    axes[2].legend(handles=[Patch(color="tab:orange", label=f"the target y = {y}"),
                            Patch(color="tab:blue", label="the other entries")], loc="lower left", fontsize="small")
    return png(fig)


# ---------------------------------------------------------------- the evidence

def symbols_md():
    z = default_run().trace["logits"]
    targets = np.random.default_rng(SEED).integers(0, z.shape[-1], z.shape[:-1])
    p, _ = softmax_forward(z.copy())
    _, cache = cross_entropy_forward(z, targets)
    dz = cross_entropy_backward(1.0, cache)
    rows = [
        (r"Z", "logits", z.shape),
        (r"z", "logits[w, t], a row of z in the cache", z.shape[-1:]),
        (r"P", "p, probs", p.shape),
        (r"p", "p (one row)", p.shape[-1:]),
        (r"y", "targets, t", targets.shape, "random ids, to record the shapes"),
        (r"e_y", "probs[arange(n), t] -= 1", p.shape, "never stored: 1 is subtracted at each target"),
        (r"N", "n = t.size", f"{targets.size}"),
        (r"n_V", "V = logits.shape[-1]", f"{z.shape[-1]}"),
        (r"\mathcal{L}", "loss", "a float"),
        (r"\partial\ell/\partial p", "dp[w, t]", p.shape[-1:],
         "the row of position \\((w, t)\\); the code's `dp` holds every row, shaped like \\(P\\)"),
        (r"\partial\ell/\partial Z", "dlogits", dz.shape, "with \\(\\ell = \\mathcal{L}\\)"),
        (r"\Delta", "h", f"{H_STEP:g}"),
    ]
    return sections.symbols_md(rows, default_note())


def gradcheck():
    """Softmax through the fake loss, then the cross-entropy itself, for the same random logits."""
    rng = np.random.default_rng(SEED)
    z = rng.standard_normal((2, 3, 5))
    r = rng.standard_normal(z.shape)
    analytic = softmax_backward(r, softmax_forward(z.copy())[1])
    rows = sections.gradcheck_rows(lambda: float(np.sum(softmax_forward(z.copy())[0] * r)),
                                   [("softmax: dz", analytic, z)], H_STEP)
    targets = rng.integers(0, 5, (2, 3))
    analytic = cross_entropy_backward(1.0, cross_entropy_forward(z, targets)[1])
    xent_rows = sections.gradcheck_rows(lambda: cross_entropy_forward(z, targets)[0],
                                        [("cross-entropy: dlogits", analytic, z)], H_STEP)
    table = (sections.gradcheck_table(rows) + "\n"
             + sections.gradcheck_table(xent_rows, differentiated="the mean cross-entropy \\(\\mathcal{L}\\) itself"))
    return table, list(z.shape)


def cost():
    """The backward's work per row against the Jacobian's size, at the default configuration's n_V."""
    n_v = default_run().cfg.vocab_size
    return {"n_v": n_v, "product": 3 * n_v, "jacobian": n_v * n_v}


def generate(context):
    ex = tiny()
    z = ex.trace["logits"][0]
    p = softmax(z)
    loss, _ = cross_entropy_forward(z, np.array(TINY_TARGETS))
    forward_tables, forward_values = forward(z, p, loss, ex.cfg.vocab_size)
    backward_tables, backward_values = backward(ex, p)
    jacobian_tables, jacobian_values = jacobian()
    fused_tables, fused_values = fused()
    gradcheck_table, gradcheck_shape = gradcheck()
    cfg = ex.cfg
    values = {"ids": TINY_IDS, "targets": TINY_TARGETS, "seed": SEED,
              "sizes": {"n_v": cfg.vocab_size, "t_max": cfg.context_len, "d": cfg.emb_dim, "h": cfg.num_heads,
                        "l": cfg.num_layers, "f": cfg.ff_dim},
              "forward": forward_values, "backward": backward_values, "jacobian": jacobian_values,
              "fused": fused_values, "cost": cost(), "gradcheck_shape": gradcheck_shape}
    return {"values": values, **forward_tables, **backward_tables, **jacobian_tables, **fused_tables,
            "row.png": row_png(ex, p, backward_values["t"]), "symbols": symbols_md(), "gradcheck": gradcheck_table}
