"""Generator of the Softmax & Cross-Entropy page's fragments."""

import numpy as np

from transformer.gradcheck import REL_TOL
from transformer.softmax import cross_entropy_backward, cross_entropy_forward, softmax_backward, softmax_forward

from .. import sections
from ..common import md_table
from ..examples import H_STEP, SEED, TINY_IDS, TINY_TARGETS, default_note, default_run, illustrative, tiny
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


def jacobian_md():
    ex = tiny()
    z = ex.trace["logits"][0][ROW]
    formula, numeric, rows = jacobian_checks(z, TINY_TARGETS[ROW], len(TINY_TARGETS))
    limit = np.log(np.finfo(np.float64).max)
    p = softmax(z)
    top = int(np.argmax(np.diag(formula)))
    return "\n".join([
        f"**Checked on the tiny model.** Row {ROW} of its real logits \\(z\\) (ids `{TINY_IDS}`, position {ROW}; "
        "the table of all rows is in the [tiny example](#tiny-numerical-example)). The Jacobian by the formula, "
        "then column by column by central differences of `softmax_forward` with step \\(\\Delta\\) (row \\(j\\), "
        "column \\(j'\\)):\n",
        sections.array_md("∂p/∂z = diag(p) − p pᵀ", formula, row_label="j"),
        sections.array_md("central differences (p(z + Δe_j′) − p(z − Δe_j′)) / 2Δ", numeric, row_label="j"),
        md_table(["Check", "Largest gap", "Result"], [[what, f"{gap:.1e}", verdict] for what, gap, verdict in rows]),
        f"\nThe diagonal is positive and everything off it negative, as \\(p_j(1 - p_j)\\) and "
        f"\\(-p_j p_{{j'}}\\) say. The largest, {formula[top, top]:.4f}, is that of entry {top}, whose probability "
        f"{p[top]:.4f} is the closest to 1/2, where \\(p(1 - p)\\) peaks. Pass: relative gap below {REL_TOL:g} "
        "(the gradient checks' rule); a sum that is 0 passes on the absolute floor.\n",
        f"**The shift, checked.** The code's softmax of \\(z + \\kappa\\) against its softmax of \\(z\\), and a "
        f"softmax written without the shift; `exp` overflows float64 above {limit:.2f}:\n",
        md_table(["\\(\\kappa\\)", "code: largest gap to \\(p\\)", "without the shift: largest gap to \\(p\\)"],
                 shift_rows(z)),
    ])


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


def fused_md():
    ex = tiny()
    z, targets = ex.trace["logits"][0], np.array(TINY_TARGETS)
    rows = fused_rows(z, targets)
    big = SCALE * z
    p_big = softmax(big)[np.arange(targets.size), targets]
    return "\n".join([
        f"**Checked on the tiny model.** All {targets.size} rows of its logits, targets `{TINY_TARGETS}`: the "
        "fused loss and gradient of the code against the slow route composed from the code's own "
        "`softmax_forward` and `softmax_backward`:\n",
        md_table(["Check", "Largest gap", "Result"], [[what, f"{gap:.1e}", verdict] for what, gap, verdict in rows]),
        f"\n**Why fused, shown.** The same logits times {SCALE:g}: a model as sure as that, and wrong, gives its "
        f"targets \\(p_y\\) = {', '.join(f'{v:.1e}' for v in p_big)} in float64, exactly 0 at "
        f"{int((p_big == 0).sum())} of {targets.size} positions.\n",
        md_table(["Route", "\\(\\mathcal{L}\\)", "Gradient finite?",
                  "Largest \\(\\lvert\\partial\\mathcal{L}/\\partial Z\\rvert\\)"], confident_rows(big, targets)),
        "\nThe fused route still gives the exact loss (a log-sum-exp minus a logit) and a gradient no larger than "
        "\\(1/N\\); the slow route takes \\(\\log 0\\) and divides by 0.\n",
    ])


def forward_md(ex, z, p, loss):
    """The forward part of the tiny example, and what its loss means against log n_V."""
    n_v, targets = ex.cfg.vocab_size, np.array(TINY_TARGETS)
    per_position = -np.log(p[np.arange(targets.size), targets])
    lse = np.log(np.exp(z).sum(axis=-1))
    over_targets = lse - z.mean(axis=-1)  # a row's loss averaged over all n_V possible targets
    t, y = 0, TINY_TARGETS[0]
    shifted = z[t] - z[t].max()
    exps = [f"e^{{{num(v, bracket=False)}}}" for v in shifted]
    log_nv = r"\(\log n_V\)"
    return "\n".join([
        sections.array_md("logits Z", z, row_label="position t"),
        sections.array_md("P = softmax(Z), row by row", p, row_label="position t"),
        f"Follow one number, with \\(z\\) the row of position {t}: \\(P_{{{t},{y}}} = e^{{z_{y} - \\max z}} / "
        f"\\sum_j e^{{z_j - \\max z}}\\) = \\({exps[y]} / ({' + '.join(exps)})\\) = {np.exp(shifted[y]):.4f} / "
        f"{np.exp(shifted).sum():.4f} = **{p[t, y]:.4f}**, position {t}'s probability of its target {y}.\n",
        md_table(["position \\(t\\)", "target \\(y\\)", "\\(P_{t,y}\\)", "\\(-\\log P_{t,y}\\)"],
                 [[t, y, f"{p[t, y]:.4f}", f"{per_position[t]:.4f}"] for t, y in enumerate(targets)]),
        f"\nThe loss is their mean, **\\(\\mathcal{{L}}\\) = {loss:.4f}**, against {log_nv} = {np.log(n_v):.4f} for a "
        f"uniform guess over \\(n_V\\) = {n_v} tokens. A row's loss averaged over all \\(n_V\\) possible targets is "
        f"\\(\\log \\sum_j e^{{z_j}} - \\frac{{1}}{{n_V}} \\sum_j z_j\\), here "
        f"{', '.join(f'{v:.4f}' for v in over_targets)}; it is never below {log_nv} (the log of a mean of the "
        "\\(e^{z_j}\\) is at least the mean of the \\(z_j\\), with equality only for a constant row), and the more "
        "an untrained head spreads a row, the higher it is. "
        + (f"So an untrained model whose targets have nothing to do with its logits starts above {log_nv}. "
           if over_targets.mean() > np.log(n_v) else "")
        + (f"These targets cost more still ({loss:.4f} against the rows' average {over_targets.mean():.4f}): "
           "the untrained model happens to give them less than its average probability.\n"
           if loss > over_targets.mean() else
           f"These targets cost less ({loss:.4f} against the rows' average {over_targets.mean():.4f}): the "
           "untrained model happens to give them more than its average probability.\n"),
    ])


def backward_md(ex, z, p):
    """The real dlogits of the tiny example, computed here from P and e_y and followed into the head."""
    back, targets = tiny_backward(), np.array(TINY_TARGETS)
    n, onehot = targets.size, np.eye(ex.cfg.vocab_size)[targets]
    dz = (p - onehot) / n
    t = 1
    y, other = targets[t], (targets[t] + 1) % ex.cfg.vocab_size
    xf, dxf = ex.trace["lnf"][0], dz @ ex.params["head_w"].T
    dw00 = xf[:, 0] @ dz[:, 0]
    lnf = sections.page_link("softmax", "model", "eq-model-lnf")
    return "\n".join([
        "The real backward starts here: \\(\\ell = \\mathcal{L}\\), so \\(\\partial\\ell/\\partial\\mathcal{L} = 1\\) "
        f"and \\(\\partial\\ell/\\partial Z = (P - e_y)/N\\) with \\(N\\) = {n} positions. The page computes it from "
        "\\(P\\) above and the one-hot targets:\n",
        sections.array_md("e_y (one-hot targets)", onehot, row_label="position t"),
        sections.array_md("∂ℓ/∂Z = (P − e_y) / N", dz, row_label="position t"),
        f"Follow two numbers of row {t} (target {y}): \\(\\partial\\ell/\\partial Z_{{{t},{y}}}\\) = "
        f"({p[t, y]:.4f} − 1) / {n} = **{num(dz[t, y], bracket=False)}**, the target's logit, pushed up by "
        f"gradient descent; \\(\\partial\\ell/\\partial Z_{{{t},{other}}}\\) = ({p[t, other]:.4f} − 0) / {n} = "
        f"**{num(dz[t, other], bracket=False)}**, another entry, pushed down in proportion to its probability. "
        f"Each row sums to 0 up to rounding (the largest row sum in absolute value is "
        f"{np.abs(dz.sum(axis=-1)).max():.1e}): the "
        "probabilities sum to 1 and the one-hot target takes 1 away.\n",
        md_table(["Gradient", "Computed here as", "Replay's array", "Largest gap", "Result"], [
            ["\\(\\partial\\ell/\\partial Z\\)", "\\((P - e_y) / N\\)", "`steps['dlogits']`",
             *fmt(agreement(dz, back.steps["dlogits"][0]))],
            ["\\(\\partial\\ell/\\partial X_f\\)",
             "\\(\\partial\\ell/\\partial Z\\, W_h^\\top\\) (the head's backward)", "`steps['dlnf']`",
             *fmt(agreement(dxf, back.steps["dlnf"][0]))],
            ["\\(\\partial\\ell/\\partial W_h\\)", "\\(X_f^\\top\\, \\partial\\ell/\\partial Z\\)", "`grads['head_w']`",
             *fmt(agreement(xf.T @ dz, back.grads["head_w"]))]]),
        f"\nFollow it into the head, whose backward is the [Linear page's]"
        f"({sections.page_link('softmax', 'linear', 'eq-linear-grad')}) with \\(A = X_f\\), the head's input: the "
        f"final LayerNorm's output `lnf` (the [Full Model page]({lnf}) builds it), here for ids `{TINY_IDS}`:\n",
        sections.array_md("X_f (lnf)", xf, row_label="position t"),
        "Column 0 of \\(X_f\\) against column 0 of \\(\\partial\\ell/\\partial Z\\), one product per position: "
        "\\(\\partial\\ell/\\partial W_h[0,0] = \\sum_t X_f[t,0]\\,\\partial\\ell/\\partial Z_{t,0}\\) = "
        + " + ".join(f"{num(a)}·{num(d)}" for a, d in zip(xf[:, 0], dz[:, 0], strict=True))
        + f" = **{num(dw00, bracket=False)}**, entry [0, 0] of the `g of head_w` table that the "
          f"[AdamW page]({sections.page_link('softmax', 'optim')}) feeds to the optimizer.\n",
    ])


def fmt(gap_verdict):
    gap, verdict = gap_verdict
    return [f"{gap:.1e}", verdict]


def example_md():
    ex = tiny()
    z = ex.trace["logits"][0]
    p = softmax(z)
    loss, _ = cross_entropy_forward(z, np.array(TINY_TARGETS))
    return "\n".join([
        illustrative(f"The tiny model's logits for ids `{TINY_IDS}`, with targets `{TINY_TARGETS}`."),
        "### Forward\n",
        forward_md(ex, z, p, loss),
        "### Backward, with the real loss gradient\n",
        backward_md(ex, z, p),
    ])


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


def gradcheck_md():
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
    return (f"Softmax, for random logits of shape {z.shape}, through the "
            "[fake loss](../reference/notation.md#fake-loss) \\(f = \\sum \\mathcal{F} \\odot R\\) with "
            f"\\(\\mathcal{{F}} = \\operatorname{{softmax}}(z)\\) and a random \\(R\\) (seed {SEED}):\n\n"
            + sections.gradcheck_table(rows)
            + "\nThe cross-entropy is a scalar already, so no fake loss is needed: for the same logits and random "
              "targets, \\(\\ell = \\mathcal{L}\\) itself is differentiated.\n\n"
            + sections.gradcheck_table(xent_rows, differentiated="the mean cross-entropy \\(\\mathcal{L}\\) itself"))


def generate(context):
    return {"symbols": symbols_md(), "example": example_md(), "gradcheck": gradcheck_md(),
            "jacobian": jacobian_md(), "fused": fused_md()}
