"""Generator of the LayerNorm page: the values its prose shows (docs/model/layernorm.md binds them), its
tables and its picture.

The backward examples follow the tiny model's real loss gradient at block 0's LN1: as initialised (from
tiny_backward()) and with every gain and shift moved (from the model's own backward, `ln1_upstream`). The
checks of the derivation's steps (`jacobian_check`, `row_identities`) take the backward as an argument, so that
tests/site/test_pages_ln.py can show that each one fails on a planted mistake.
"""

from dataclasses import dataclass

import numpy as np

from transformer.gradcheck import REL_TOL, check_passes, relative_gap
from transformer.layernorm import layer_norm_backward, layer_norm_forward
from transformer.model import backward, forward, loss_and_grads
from transformer.softmax import cross_entropy_backward, cross_entropy_forward

from .. import sections
from ..common import md_table, verdict_text
from ..examples import (H_STEP, MOVE, SEED, TINY_IDS, TINY_TARGETS, biases_moved, default_note, default_run,
                        tiny, weighted_sum)
from ..figures import new_figure, png
from ..prose import num
from ..tiny_backward import tiny_backward

SPREAD = 0.3  # the gradient check's gain and shift: 1 + SPREAD N(0, 1) and SPREAD N(0, 1), away from 1 and 0
# A sum that is zero in exact arithmetic comes out of float64 as rounding: about 1e-16 of the size of the
# terms summed. A missing term of the backward leaves a sum of the size of the terms themselves. Below this
# fraction of the terms' size, a sum counts as zero.
ROUNDING_TOL = 1e-12


# ---------------------------------------------------------------- the cases: one LayerNorm, forward and backward

def ln1_upstream(params, cfg, ids, targets):
    """The tiny model's real backward (mean cross-entropy against targets) at block 0's LN1: (block 0's LN1
    input X^(0), the gradient dℓ/dU_1 that attention hands to LN1, LN1's cache), from the model's own
    `forward` and `backward` (its trace)."""
    trace, steps = {}, {}
    logits, cache = forward(params, ids, cfg, trace)
    backward(cross_entropy_backward(1.0, cross_entropy_forward(logits, targets)[1]), cache, trace=steps)
    return trace["embedding"], steps["b0.dln1"], cache.block_caches[0].ln1_cache


@dataclass(frozen=True)
class Case:
    """One LayerNorm's forward and backward on one sequence, with the intermediates of the backward in the
    order `layer_norm_backward` makes them (it does not return them: they are recomputed from its cache)."""
    x: np.ndarray  # (T, d) input rows
    g: np.ndarray
    b: np.ndarray
    eps: float
    du: np.ndarray  # (T, d) the upstream gradient dℓ/du
    u: np.ndarray
    xhat: np.ndarray
    rstd: np.ndarray  # (T, 1)
    delta: np.ndarray  # dxhat = du * g
    mean_delta: np.ndarray  # (T, 1)
    mean_delta_xhat: np.ndarray  # (T, 1)
    dx: np.ndarray
    dg: np.ndarray
    db: np.ndarray


def case(x, g, b, eps, du, backward=layer_norm_backward):
    u, cache = layer_norm_forward(x, g, b, eps)
    delta = du * g
    dx, dg, db = backward(du, cache)
    return Case(x, g, b, eps, du, u, cache.xhat, cache.rstd, delta, delta.mean(axis=-1, keepdims=True),
                (delta * cache.xhat).mean(axis=-1, keepdims=True), dx, dg, db)


def initial_case():
    ex, replay = tiny(), tiny_backward()
    p = ex.params
    return case(ex.trace["embedding"][0], p["b0.ln1_g"], p["b0.ln1_b"], ex.cfg.ln_eps, replay.steps["b0.dln1"][0])


def moved_params():
    return biases_moved(tiny().params, np.random.default_rng(SEED))


def moved_case():
    ex, params = tiny(), moved_params()
    x, du, _ = ln1_upstream(params, ex.cfg, ex.ids, np.array([TINY_TARGETS]))
    return case(x[0], params["b0.ln1_g"], params["b0.ln1_b"], ex.cfg.ln_eps, du[0])


# ---------------------------------------------------------------- checks of the derivation's steps

@dataclass(frozen=True)
class Agreement:
    """One matrix against central differences, judged by the gradient checks' rule."""
    gap: float  # max |analytic - numeric|
    rel: float  # relative_gap: the gap over the larger of the two maxima

    @property
    def passed(self):
        return check_passes(self.gap, self.rel)

    def values(self):
        return {"gap": self.gap, "rel": self.rel, "verdict": verdict_text(self.passed, False, "")}


@dataclass(frozen=True)
class JacobianCheck:
    formula: np.ndarray  # [i', i] = du_i' / dx_i from the derivation's matrix (ln-paths) times gamma_i'
    code: np.ndarray  # the same from the backward, called with the unit upstream gradient e_i'
    numeric: np.ndarray  # central differences of layer_norm_forward, one column per moved x_i
    of_formula: Agreement
    of_code: Agreement


def jacobian_check(x, g, b, eps, backward=layer_norm_backward, h=H_STEP):
    """The Jacobian du/dx of one row x, three ways."""
    d = x.size
    _, cache = layer_norm_forward(x[None], g, b, eps)
    xhat, rstd = cache.xhat[0], cache.rstd[0, 0]
    formula = g[:, None] * rstd * (np.eye(d) - 1 / d - np.outer(xhat, xhat) / d)
    code = np.array([backward(unit[None], cache)[0][0] for unit in np.eye(d)])
    numeric = np.empty((d, d))
    for i, step in enumerate(h * np.eye(d)):
        up, down = (layer_norm_forward((x + s)[None], g, b, eps)[0][0] for s in (step, -step))
        numeric[:, i] = (up - down) / (2 * h)
    agree = [Agreement(float(np.abs(a - numeric).max()), relative_gap(a, numeric)) for a in (formula, code)]
    return JacobianCheck(formula, code, numeric, *agree)


@dataclass(frozen=True)
class RowIdentities:
    """Per row: the sum of dx and its scale, and dx . xhat against its exact value eps r^3 sum(delta xhat)."""
    sums: np.ndarray
    sum_scale: np.ndarray  # sum |dx_i|
    dots: np.ndarray
    dot_scale: np.ndarray  # sum |xhat_i dx_i|
    predicted: np.ndarray

    @property
    def sums_pass(self):
        return bool(np.all(np.abs(self.sums) <= ROUNDING_TOL * self.sum_scale))

    @property
    def dots_pass(self):
        return bool(np.all(np.abs(self.dots - self.predicted) <= ROUNDING_TOL * self.dot_scale))


def row_identities(c):
    """The two directions of a row that get no gradient (see the Derivation), measured on a Case."""
    products = c.xhat * c.dx
    predicted = c.eps * c.rstd[:, 0] ** 3 * (c.delta * c.xhat).sum(axis=-1)
    return RowIdentities(c.dx.sum(axis=-1), np.abs(c.dx).sum(axis=-1), products.sum(axis=-1),
                         np.abs(products).sum(axis=-1), predicted)


# ---------------------------------------------------------------- the values the prose shows

def scale():
    """The spread of the rows entering and leaving each LayerNorm of the tiny model, as initialised: a table,
    and its figures."""
    ex = tiny()
    _, cache = forward(ex.params, ex.ids, ex.cfg)
    norms = []
    for l, c in enumerate(cache.block_caches):
        norms += [(f"block {l}, LN1", f"\\(X^{{({l})}}\\)", c.ln1_cache, ex.trace[f"b{l}.ln1"]),
                  (f"block {l}, LN2", f"\\(M\\) of block {l}", c.ln2_cache, ex.trace[f"b{l}.ln2"])]
    norms.append(("LN_f", f"\\(X^{{({ex.cfg.num_layers})}} = X^{{(L)}}\\)", cache.lnf_cache, ex.trace["lnf"]))
    spread_in = [np.sqrt(1 / ln.rstd[0, :, 0] ** 2 - ex.cfg.ln_eps) for _, _, ln, _ in norms]
    spread_out = [out[0].std(axis=-1) for *_, out in norms]
    rows = [[name, reads, ", ".join(f"{v:.3f}" for v in s_in), ", ".join(f"{v:.5f}" for v in s_out)]
            for (name, reads, _, _), s_in, s_out in zip(norms, spread_in, spread_out, strict=True)]
    table = md_table(["LayerNorm", "reads", "spread \\(\\sigma\\) of its input rows, \\(t\\) = "
                      + ", ".join(map(str, range(len(TINY_IDS)))), "spread of its output rows"], rows)
    x0, x1 = ex.trace["embedding"], ex.trace["b0.out"]
    lo, hi = min(map(np.min, spread_in)), max(map(np.max, spread_in))
    gains = [k for k in ex.params if k.endswith(("ln1_g", "ln2_g", "lnf_g"))]
    return table, {"lo": lo, "hi": hi, "ratio": hi / lo, "first": spread_in[0].mean(), "last": spread_in[-1].mean(),
                   "block0_change": np.linalg.norm(x1 - x0) / np.linalg.norm(x0), "gains": len(gains),
                   "out_lo": min(map(np.min, spread_out)), "out_hi": max(map(np.max, spread_out))}


def forward_values(c):
    mean = c.x.mean(axis=-1)
    var = ((c.x - mean[:, None]) ** 2).mean(axis=-1)
    stats = md_table(["position \\(t\\)", "mean \\(\\mu\\)", "variance \\(\\sigma^2\\)",
                      "\\(r = 1/\\sqrt{\\sigma^2 + \\epsilon_{\\mathrm{LN}}}\\)"],
                     [[t, f"{m:.4f}", f"{v:.4f}", f"{r:.4f}"] for t, (m, v, r) in
                      enumerate(zip(mean, var, c.rstd[:, 0], strict=True))])
    tables = {"x": sections.array_md("x (rows of X^(0))", c.x, row_label="position t"), "stats": stats,
              "xhat": sections.array_md("x̂ = (x − μ) r", c.xhat, row_label="position t"),
              "u": sections.array_md("u = γ ⊙ x̂ + β", c.u, row_label="position t")}
    share = c.eps * c.rstd ** 2
    return tables, {"gamma": c.g, "beta": c.b, "u_xhat_gap": float(np.abs(c.u - c.xhat).max()),
                    "u_mean": float(np.abs(c.u.mean(axis=-1)).max()), "u_var_lo": c.u.var(axis=-1).min(),
                    "u_var_hi": c.u.var(axis=-1).max(), "share_lo": share.min(), "share_hi": share.max()}


def backward_tables(c, prefix):
    rows = [[t, f"{c.rstd[t, 0]:.4f}", f"{c.mean_delta[t, 0]:.4f}", f"{c.mean_delta_xhat[t, 0]:.4f}"]
            for t in range(len(c.x))]
    mean = r"\operatorname{mean}"
    return {f"{prefix}du": sections.array_md("∂ℓ/∂u", c.du, row_label="position t"),
            f"{prefix}delta": sections.array_md("δ = γ ⊙ ∂ℓ/∂u (dxhat)", c.delta, row_label="position t"),
            f"{prefix}means": md_table(["position \\(t\\)", "\\(r\\)", f"\\({mean}(\\delta)\\) (`mean_dxhat`)",
                                        f"\\({mean}(\\delta \\odot \\hat{{x}})\\) (`mean_dxhat_xhat`)"], rows),
            f"{prefix}dx": sections.array_md("∂ℓ/∂x = r (δ − mean(δ) − x̂ mean(δ ⊙ x̂))", c.dx, row_label="position t"),
            f"{prefix}dparams": md_table(["", *range(c.g.size)], [
                [r"\(\partial\ell/\partial\gamma = \sum_t \partial\ell/\partial u \odot \hat{x}\)",
                 *(f"{v:.4f}" for v in c.dg)],
                [r"\(\partial\ell/\partial\beta = \sum_t \partial\ell/\partial u\)", *(f"{v:.4f}" for v in c.db)]])}


def entry(c):
    """One entry of dx (the largest) and of dγ, their arithmetic written out from the arrays shown; an error if
    the arithmetic by hand disagrees with the code."""
    t, i = (int(k) for k in np.unravel_index(np.abs(c.dx).argmax(), c.dx.shape))
    r, m1, m2 = c.rstd[t, 0], c.mean_delta[t, 0], c.mean_delta_xhat[t, 0]
    value = r * (c.delta[t, i] - m1 - c.xhat[t, i] * m2)
    by_hand = {"dx": (value, c.dx[t, i]), "dg": (c.du[:, i] @ c.xhat[:, i], c.dg[i])}
    wrong = [name for name, (hand, code) in by_hand.items() if abs(hand - code) > ROUNDING_TOL * max(1, abs(code))]
    if wrong:
        raise RuntimeError(f"the LayerNorm page's arithmetic by hand disagrees with layer_norm_backward for {wrong}")
    return {"t": t, "i": i, "g": c.g[i], "du": c.du[t, i], "delta": c.delta[t, i], "r": r, "m1": m1, "m2": m2,
            "xhat": c.xhat[t, i], "value": value, "returned": c.dx[t, i], "dg": c.dg[i],
            "dg_terms": " + ".join(f"{num(a)} × {num(b)}" for a, b in zip(c.du[:, i], c.xhat[:, i], strict=True))}


def jacobian():
    c, t = moved_case(), 0
    check = jacobian_check(c.x[t], c.g, c.b, c.eps)
    tables = {"jac_formula": sections.array_md("γ_i' r ([i' = i] − 1/d − x̂_i' x̂_i / d)", check.formula,
                                               row_label="i'"),
              "jac_numeric": sections.array_md("central differences", check.numeric, row_label="i'")}
    return tables, {"t": t, "formula": check.of_formula.values(), "code": check.of_code.values(),
                    "row_sum": float(np.abs(check.formula.sum(axis=1)).max()), "h": H_STEP, "rel_tol": REL_TOL}


def identities():
    c = initial_case()
    ids = row_identities(c)
    share = c.eps * c.rstd[:, 0] ** 2
    dx, eps = r"\partial\ell/\partial x_i", r"\epsilon_{\mathrm{LN}}"
    cells = [[t, f"{s:.1e}", f"{scale:.4f}", f"{dot:.3e}", f"{pred:.3e}", f"{e:.1e}"] for t, (s, scale, dot, pred, e)
             in enumerate(zip(ids.sums, ids.sum_scale, ids.dots, ids.predicted, share, strict=True))]
    table = md_table(["position \\(t\\)", f"\\(\\sum_i {dx}\\)", f"\\(\\sum_i \\lvert {dx} \\rvert\\)",
                      f"\\(\\sum_i \\hat{{x}}_i\\, {dx}\\)", f"\\({eps}\\, r^3 \\sum_i \\delta_i \\hat{{x}}_i\\)",
                      f"\\({eps}\\, r^2\\)"], cells)
    return table, {"worst_sum": float(np.max(np.abs(ids.sums) / ids.sum_scale)), "unit": float(np.finfo(np.float64).eps),
                   "tol": ROUNDING_TOL, "sums": verdict_text(ids.sums_pass, False, ""),
                   "worst_dot": float(np.max(np.abs(ids.dots - ids.predicted) / ids.dot_scale)),
                   "dots": verdict_text(ids.dots_pass, False, ""), "share_lo": share.min(), "share_hi": share.max(),
                   "variances": 1 / c.rstd[:, 0] ** 2 - c.eps}


def follow(c):
    """Where LN1's dx goes next: into ∂ℓ/∂X^(0), the Embeddings page's input."""
    replay = tiny_backward()
    total = c.dx + replay.steps["b0.dmid"][0]
    return {"embedding_gap": float(np.abs(total - replay.steps["dembedding"][0]).max()),
            "dg_gap": float(np.abs(c.dg - replay.grads["b0.ln1_g"]).max())}


def moved():
    ex, c, m = tiny(), initial_case(), moved_case()
    grads = loss_and_grads(moved_params(), ex.ids, np.array([TINY_TARGETS]), ex.cfg)[1]
    tables = backward_tables(m, "moved_")
    tables["moved_params"] = md_table(["", *range(m.g.size)], [["\\(\\gamma\\)", *(f"{v:.4f}" for v in m.g)],
                                                              ["\\(\\beta\\)", *(f"{v:.4f}" for v in m.b)]])
    tables["moved_xhat"] = sections.array_md("x̂ = (x − μ) r", m.xhat, row_label="position t")
    tables["moved_u"] = sections.array_md("u = γ ⊙ x̂ + β", m.u, row_label="position t")
    return tables, {"x_change": float(np.abs(m.x - c.x).max()),
                    "dg_gap": float(np.abs(m.dg - grads["b0.ln1_g"]).max())}


# ---------------------------------------------------------------- the picture: rows before and after

def rows_png():
    """Each row of block 0's LN1 input (the default run's first window) and of its output: the entries of a row
    as dots at its position, before and after, so the reader sees every row brought to mean 0 and spread 1."""
    ex = default_run()
    x = ex.trace["embedding"][0]
    u = ex.trace["b0.ln1"][0]
    from matplotlib.ticker import MaxNLocator

    fig, axes = new_figure(1, 2, figsize=(10, 3.4), sharey=True)
    for ax, rows, title in ((axes[0], x, "input rows x (one window of X⁽⁰⁾)"), (axes[1], u, "output rows u = LN1(x)")):
        t, mean, spread = np.arange(len(rows)), rows.mean(axis=1), rows.std(axis=1)
        ax.scatter(np.repeat(t, rows.shape[1]), rows.reshape(-1), s=6, alpha=0.4, color="tab:blue")
        ax.plot(t, mean, "k_", markersize=14, label="row mean")
        ax.plot(np.r_[t, t], np.r_[mean - spread, mean + spread], "_", color="tab:red", markersize=14,
                label="row mean ± spread σ")
        ax.set_title(title)
        ax.set_xlabel("position t")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    axes[0].set_ylabel("value of an entry")
    for ax in axes:
        ax.legend(loc="upper right", fontsize="small")
    return png(fig)


# ---------------------------------------------------------------- the evidence: symbols, gradient check

def symbols_md():
    ex = default_run()
    x, eps, g, b = ex.trace["embedding"], ex.cfg.ln_eps, ex.params["b0.ln1_g"], ex.params["b0.ln1_b"]
    y, cache = layer_norm_forward(x, g, b, eps)
    dy = np.random.default_rng(SEED).standard_normal(y.shape)
    dx, dg, db = layer_norm_backward(dy, cache)
    row, whole = "the row of position \\((w, t)\\)", "for the whole batch"
    rows = [
        (r"x", "x[w, t]", x.shape[-1:], f"{row} of the embedding output, which block 0's LN1 reads"),
        (r"d", "x.shape[-1]", f"{x.shape[-1]}"),
        (r"\mu, \sigma^2", "mean, var", cache.rstd.shape, f"{whole}, one number per row"),
        (r"\epsilon_{\mathrm{LN}}", "eps (cfg.ln_eps)", f"{eps:g}"),
        (r"r", "rstd", cache.rstd.shape, f"{whole}, one number per row"),
        (r"\hat{x}", "xhat", cache.xhat.shape, whole),
        (r"\gamma", "g (b{l}.ln1_g, ...)", g.shape),
        (r"\beta", "b (b{l}.ln1_b, ...)", b.shape),
        (r"U", "y", y.shape, f"{whole}: block 0's LN1 output, \\(U_1\\)"),
        (r"u", "y[w, t]", y.shape[-1:], row),
        (r"\partial\ell/\partial u", "dy[w, t]", dy.shape[-1:], f"{row} of the code's `dy`, which holds every row"),
        (r"\delta", "dxhat", (dy * g).shape, whole),
        (r"\partial\ell/\partial x", "dx[w, t]", dx.shape[-1:], f"{row} of the code's `dx`, which holds every row"),
        (r"\partial\ell/\partial \gamma", "dg", dg.shape),
        (r"\partial\ell/\partial \beta", "db", db.shape),
    ]
    return sections.symbols_md(rows, default_note())


def gradcheck_md():
    """The backward against central differences of the fake loss, with a random gain and shift away from 1 and 0
    so that every term counts (the prose above the table says so)."""
    ex, rng = tiny(), np.random.default_rng(SEED)
    x, eps = ex.trace["embedding"][0].copy(), ex.cfg.ln_eps
    g = 1.0 + SPREAD * rng.standard_normal(ex.cfg.emb_dim)
    b = SPREAD * rng.standard_normal(ex.cfg.emb_dim)
    dy = rng.standard_normal(x.shape)
    dx, dg, db = layer_norm_backward(dy, layer_norm_forward(x, g, b, eps)[1])
    rows = sections.gradcheck_rows(weighted_sum(dy, layer_norm_forward, x, g, b, eps),
                                   [("dx", dx, x), ("dg", dg, g), ("db", db, b)], H_STEP)
    return sections.gradcheck_table(rows)


def generate(context):
    c = initial_case()
    scale_table, scale_values = scale()
    forward_tables, forward_values_ = forward_values(c)
    jacobian_tables, jacobian_values = jacobian()
    identities_table, identities_values = identities()
    moved_tables, moved_values = moved()
    values = {"ids": TINY_IDS, "targets": TINY_TARGETS, "seed": SEED, "move": MOVE, "spread": SPREAD, "scale": scale_values,
              "forward": forward_values_, "entry": entry(c), "follow": follow(c), "jacobian": jacobian_values,
              "identities": identities_values, "moved": moved_values}
    return {"values": values, "scale": scale_table, **forward_tables, **backward_tables(c, ""), **jacobian_tables,
            "identities": identities_table, **moved_tables, "rows.png": rows_png(), "symbols": symbols_md(),
            "gradcheck": gradcheck_md()}
