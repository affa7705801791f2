"""Generator of the LayerNorm page's fragments (see site_scripts/build.py).

The backward examples follow the tiny model's real loss gradient at block 0's LN1: as initialised (from
tiny_backward()) and with every gain and shift moved (from the model's own backward, `ln1_upstream`). The checks of
the derivation's steps (`jacobian_check`, `row_identities`) take the backward as an argument, so that
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
from ..examples import (H_STEP, SEED, TINY_IDS, TINY_TARGETS, biases_moved, collapsed, default_note, default_run,
                        illustrative, tiny, weighted_sum)
from ..sections import gap_text
from ..tiny_backward import tiny_backward

# A sum that is zero in exact arithmetic comes out of float64 as rounding: about 1e-16 of the size of the
# terms summed. A missing term of the backward leaves a sum of the size of the terms themselves. Below this
# fraction of the terms' size, a sum counts as zero.
ROUNDING_TOL = 1e-12
NOTATION = "../reference/notation.md"


def num(v):
    """A number as the tables print it, in parentheses when negative, for arithmetic written out."""
    return f"({v:.4f})" if v < 0 else f"{v:.4f}"


# ---------------------------------------------------------------- the real upstream gradient

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
    xhat, rstd = cache.xhat, cache.rstd
    delta = du * g
    dx, dg, db = backward(du, cache)
    return Case(x, g, b, eps, du, u, xhat, rstd, delta, delta.mean(axis=-1, keepdims=True),
                (delta * xhat).mean(axis=-1, keepdims=True), dx, dg, db)


def initial_case():
    ex, replay = tiny(), tiny_backward()
    p = ex.params
    return case(ex.trace["embedding"][0], p["b0.ln1_g"], p["b0.ln1_b"], ex.cfg.ln_eps, replay.steps["b0.dln1"][0])


def moved_params():
    return biases_moved(tiny().params, np.random.default_rng(SEED))


def moved_grads():
    ex = tiny()
    return loss_and_grads(moved_params(), ex.ids, np.array([TINY_TARGETS]), ex.cfg)[1]


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

    def text(self):
        verdict = verdict_text(self.passed, False, "")
        return f"largest gap {self.gap:.1e}, relative gap {self.rel:.1e}: {verdict}"


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


def jacobian_md():
    c, t = moved_case(), 0
    check = jacobian_check(c.x[t], c.g, c.b, c.eps)
    row_sums = np.abs(check.formula.sum(axis=1)).max()
    return "\n".join([
        f"Row \\(t\\) = {t} of the tiny example's \\(X^{{(0)}}\\), with the moved gain and shift of the second "
        "backward example below (\\(\\gamma \\ne 1\\), so its factor shows). Entry [i', i] is "
        "\\(\\partial u_{i'}/\\partial x_i\\).\n",
        sections.array_md("γ_i' r ([i' = i] − 1/d − x̂_i' x̂_i / d)", check.formula, row_label="i'"),
        sections.array_md("central differences", check.numeric, row_label="i'"),
        f"The formula against central differences: {check.of_formula.text()}. The code against central "
        "differences (`layer_norm_backward` called with the upstream gradient \\(e_{i'}\\) returns row \\(i'\\) of "
        f"the matrix): {check.of_code.text()}. In float64 with step \\(\\Delta\\) = {H_STEP:g}; a pass is the "
        f"gradient checks' rule (a relative gap below {REL_TOL:g}), and gaps of this size are the central "
        "differences' own error, far below what a missing term leaves. Each row of the matrix sums to zero (the "
        f"largest row sum is {row_sums:.0e}, rounding): adding the same number to every \\(x_i\\) changes no "
        "\\(u_{i'}\\), as [below](#two-directions-that-get-no-gradient).\n",
    ])


def identities_md():
    c = initial_case()
    ids = row_identities(c)
    share = c.eps * c.rstd[:, 0] ** 2
    cells = [[t, f"{s:.1e}", f"{scale:.4f}", f"{dot:.3e}", f"{pred:.3e}", f"{e:.1e}"] for t, (s, scale, dot, pred, e)
             in enumerate(zip(ids.sums, ids.sum_scale, ids.dots, ids.predicted, share, strict=True))]
    worst_sum = float(np.max(np.abs(ids.sums) / ids.sum_scale))
    worst_dot = float(np.max(np.abs(ids.dots - ids.predicted) / ids.dot_scale))
    dx, eps = r"\partial\ell/\partial x_i", r"\epsilon_{\mathrm{LN}}"
    dot, predicted = rf"\sum_i \hat{{x}}_i\, {dx}", rf"{eps}\, r^3 \sum_i \delta_i \hat{{x}}_i"
    return "\n".join([
        md_table(["position \\(t\\)", f"\\(\\sum_i {dx}\\)", f"\\(\\sum_i \\lvert {dx} \\rvert\\)", f"\\({dot}\\)",
                  f"\\({predicted}\\)", f"\\({eps}\\, r^2\\)"], cells),
        f"**Row sums.** The largest is {worst_sum:.0e} of the size \\(\\sum_i \\lvert {dx} \\rvert\\) of what was "
        f"summed: zero in exact arithmetic, so what is left is float64's rounding (its unit is "
        f"{np.finfo(np.float64).eps:.1e}). A sum counts as zero below {ROUNDING_TOL:g} of the terms' size: "
        f"{verdict_text(ids.sums_pass, False, '')}.\n",
        f"**Against \\(\\hat{{x}}\\).** Each row's \\({dot}\\) is its predicted \\({predicted}\\) to within "
        f"{worst_dot:.0e} of the terms' size: {verdict_text(ids.dots_pass, False, '')}. It is not zero: of the "
        "direct term's component along \\(\\hat{x}\\), \\(r \\sum_i \\delta_i \\hat{x}_i\\), the variance term cancels "
        f"all but the fraction \\({eps}\\, r^2\\) of the last column, from {share.min():.1e} to {share.max():.1e} "
        f"here, small because these rows' variances ({', '.join(f'{v:.3f}' for v in 1 / c.rstd[:, 0] ** 2 - c.eps)}) "
        f"are far above \\({eps}\\) = {c.eps:g}. For a row whose variance is \\({eps}\\) itself the fraction would "
        "be 1/2.\n",
    ])


# ---------------------------------------------------------------- the stream's scale and the sub-layers'

def initial_gains(params):
    """The sentence that every LayerNorm has gain 1 and shift 0, as init_params makes them; an error if not."""
    gains = {k: v for k, v in params.items() if k.endswith(("ln1_g", "ln2_g", "lnf_g"))}
    shifts = {k: v for k, v in params.items() if k.endswith(("ln1_b", "ln2_b", "lnf_b"))}
    if not (all(np.all(v == 1) for v in gains.values()) and all(np.all(v == 0) for v in shifts.values())):
        raise RuntimeError("init_params no longer sets every LayerNorm gain to 1 and shift to 0: reword the page")
    return f"every one of the {len(gains)} gains is 1 and every shift 0, as `init_params` makes them"

def scale_md():
    """The spread of the rows entering and leaving each LayerNorm of the tiny model, as initialised."""
    ex = tiny()
    _, cache = forward(ex.params, ex.ids, ex.cfg)
    norms = []
    for l, c in enumerate(cache.block_caches):
        norms += [(f"block {l}, LN1", f"\\(X^{{({l})}}\\)", c.ln1_cache, ex.trace[f"b{l}.ln1"]),
                  (f"block {l}, LN2", f"\\(M\\) of block {l}", c.ln2_cache, ex.trace[f"b{l}.ln2"])]
    norms.append(("LN_f", f"\\(X^{{({ex.cfg.num_layers})}} = X^{{(L)}}\\)", cache.lnf_cache, ex.trace["lnf"]))
    spread_in = [np.sqrt(1 / ln.rstd[0, :, 0] ** 2 - ex.cfg.ln_eps) for _, _, ln, _ in norms]
    spread_out = [out[0].std(axis=-1) for *_, out in norms]
    cells = [[name, reads, ", ".join(f"{v:.3f}" for v in s_in), ", ".join(f"{v:.5f}" for v in s_out)]
             for (name, reads, _, _), s_in, s_out in zip(norms, spread_in, spread_out, strict=True)]
    x0, x1 = ex.trace["embedding"], ex.trace["b0.out"]
    lo, hi = min(map(np.min, spread_in)), max(map(np.max, spread_in))
    positions = ", ".join(map(str, range(len(TINY_IDS))))
    eps = r"\epsilon_{\mathrm{LN}}"
    return "\n".join([
        md_table(["LayerNorm", "reads", f"spread \\(\\sigma\\) of its input rows, \\(t\\) = {positions}",
                  "spread of its output rows"], cells),
        f"On ids `{TINY_IDS}`, the rows of the stream that the LayerNorms read spread from \\(\\sigma\\) = {lo:.3f} "
        f"to {hi:.3f}, a factor of {hi / lo:.1f}, and the average spread grows from {spread_in[0].mean():.3f} at "
        f"\\(X^{{(0)}}\\) to {spread_in[-1].mean():.3f} at \\(X^{{(L)}}\\); block 0 alone changes the stream by "
        f"\\(\\lVert X^{{(1)}} - X^{{(0)}} \\rVert / \\lVert X^{{(0)}} \\rVert\\) = "
        f"{np.linalg.norm(x1 - x0) / np.linalg.norm(x0):.2f} of its size (the number the "
        f"[Transformer block](block.md) page shows). The rows the sub-layers read ({initial_gains(ex.params)}) "
        f"all spread from {min(map(np.min, spread_out)):.5f} to {max(map(np.max, spread_out)):.5f}: 1, less the "
        f"share that \\({eps}\\) takes, \\(\\sigma r = \\sigma / \\sqrt{{\\sigma^2 + {eps}}}\\).\n",
    ])


# ---------------------------------------------------------------- the tiny example, forward and backward

def forward_md(c):
    mean = c.x.mean(axis=-1)
    var = ((c.x - mean[:, None]) ** 2).mean(axis=-1)
    eps = r"\epsilon_{\mathrm{LN}}"
    return "\n".join([
        sections.array_md("x (rows of X^(0))", c.x, row_label="position t"),
        md_table(["position \\(t\\)", "mean \\(\\mu\\)", "variance \\(\\sigma^2\\)",
                  f"\\(r = 1/\\sqrt{{\\sigma^2 + {eps}}}\\)"],
                 [[t, f"{m:.4f}", f"{v:.4f}", f"{r:.4f}"] for t, (m, v, r) in
                  enumerate(zip(mean, var, c.rstd[:, 0], strict=True))]),
        sections.array_md("x̂ = (x − μ) r", c.xhat, row_label="position t"),
        sections.array_md("u = γ ⊙ x̂ + β", c.u, row_label="position t"),
        f"Each row of \\(u\\) has mean {np.abs(c.u.mean(axis=-1)).max():.0e} (0 up to rounding) and variance "
        f"{c.u.var(axis=-1).min():.5f} to {c.u.var(axis=-1).max():.5f}: 1 less the share \\({eps}\\, r^2\\) that "
        f"\\({eps}\\) takes ({(c.eps * c.rstd ** 2).min():.1e} to {(c.eps * c.rstd ** 2).max():.1e} for these "
        "rows).\n",
    ])


def entry_md(c):
    """One entry of dx (the largest) and of dγ, their arithmetic written out from the arrays shown."""
    t, i = np.unravel_index(np.abs(c.dx).argmax(), c.dx.shape)
    r, m1, m2 = c.rstd[t, 0], c.mean_delta[t, 0], c.mean_delta_xhat[t, 0]
    value = r * (c.delta[t, i] - m1 - c.xhat[t, i] * m2)
    terms = " + ".join(f"{num(a)} × {num(b)}" for a, b in zip(c.du[:, i], c.xhat[:, i], strict=True))
    by_hand = {"dx": (value, c.dx[t, i]), "dg": (c.du[:, i] @ c.xhat[:, i], c.dg[i])}
    wrong = [name for name, (hand, code) in by_hand.items() if abs(hand - code) > ROUNDING_TOL * max(1, abs(code))]
    if wrong:
        raise RuntimeError(f"the LayerNorm page's arithmetic by hand disagrees with layer_norm_backward for {wrong}")
    mean = r"\operatorname{mean}"
    return "\n".join([
        f"By hand, from the arrays above, for entry \\(t\\) = {t}, \\(i\\) = {i} (the largest of "
        "\\(\\partial\\ell/\\partial x\\)); the factors are shown to 4 decimals, each result is computed from the full "
        "values:\n",
        f"- \\(\\delta_{{{i}}} = \\gamma_{{{i}}}\\, \\partial\\ell/\\partial u_{{{i}}}\\) = {num(c.g[i])} × "
        f"{num(c.du[t, i])} = {num(c.delta[t, i])};",
        f"- \\(\\partial\\ell/\\partial x_{{{i}}} = r\\,(\\delta_{{{i}}} - {mean}(\\delta) - \\hat{{x}}_{{{i}}}\\, "
        f"{mean}(\\delta \\odot \\hat{{x}}))\\) = {num(r)} × ({num(c.delta[t, i])} − {num(m1)} − "
        f"{num(c.xhat[t, i])} × {num(m2)}) = {num(value)}, which is what `layer_norm_backward` returned "
        f"({num(c.dx[t, i])});",
        "- the gain's gradient sums over the positions: "
        f"\\(\\partial\\ell/\\partial \\gamma_{{{i}}} = \\sum_t \\partial\\ell/\\partial U_{{t,{i}}}\\, "
        f"\\hat{{x}}_{{t,{i}}}\\) = {terms} = {num(c.dg[i])}.\n",
    ])


def backward_md(c, source):
    cells = [[t, f"{c.rstd[t, 0]:.4f}", f"{c.mean_delta[t, 0]:.4f}", f"{c.mean_delta_xhat[t, 0]:.4f}"]
             for t in range(len(c.x))]
    mean = r"\operatorname{mean}"
    return "\n".join([
        f"Backward, in the order `layer_norm_backward` computes it. The upstream gradient is {source}.\n",
        sections.array_md("∂ℓ/∂u", c.du, row_label="position t"),
        sections.array_md("δ = γ ⊙ ∂ℓ/∂u (dxhat)", c.delta, row_label="position t"),
        md_table(["position \\(t\\)", "\\(r\\)", f"\\({mean}(\\delta)\\) (`mean_dxhat`)",
                  f"\\({mean}(\\delta \\odot \\hat{{x}})\\) (`mean_dxhat_xhat`)"], cells),
        sections.array_md("∂ℓ/∂x = r (δ − mean(δ) − x̂ mean(δ ⊙ x̂))", c.dx, row_label="position t"),
        md_table(["", *range(c.g.size)],
                 [[r"\(\partial\ell/\partial\gamma = \sum_t \partial\ell/\partial u \odot \hat{x}\)",
                   *(f"{v:.4f}" for v in c.dg)],
                  [r"\(\partial\ell/\partial\beta = \sum_t \partial\ell/\partial u\)", *(f"{v:.4f}" for v in c.db)]]),
        entry_md(c),
    ])


def follow_md(c):
    """Where LN1's dx goes next: into ∂ℓ/∂X^(0), the Embeddings page's input."""
    replay = tiny_backward()
    total = c.dx + replay.steps["b0.dmid"][0]
    gap = np.abs(total - replay.steps["dembedding"][0]).max()
    dg_gap = np.abs(c.dg - replay.grads["b0.ln1_g"]).max()
    return ("Where this goes next: \\(\\partial\\ell/\\partial x\\) is LN1's share of "
            "\\(\\partial\\ell/\\partial X^{(0)}\\). The residual path adds \\(\\partial\\ell/\\partial M\\) of "
            f"block 0, and the sum is the replay's `dembedding` (largest gap {gap_text(gap)}), the gradient that the "
            "[Embeddings](embeddings.md#tiny-numerical-example) page scatters into its tables; "
            "\\(\\partial\\ell/\\partial\\gamma\\) is the model's gradient of `b0.ln1_g` (largest gap "
            f"{gap_text(dg_gap)}).\n")


def example_md():
    c, m = initial_case(), moved_case()
    moved_gap = np.abs(m.x - c.x).max()
    return "\n".join([
        illustrative(f"Block 0's LN1 on ids `{TINY_IDS}`: its input is the embedding output \\(X^{{(0)}}\\), rows "
                     f"are positions, and its gain and shift are the model's own: \\(\\gamma\\) = {c.g.tolist()}, "
                     f"\\(\\beta\\) = {c.b.tolist()}, as `init_params` makes every LayerNorm. So here "
                     f"\\(u = \\hat{{x}}\\) (largest \\(\\lvert u - \\hat{{x}} \\rvert\\) = "
                     f"{np.abs(c.u - c.xhat).max():g}) and \\(\\delta = \\partial\\ell/\\partial u\\); the second case "
                     "below moves them."),
        forward_md(c),
        backward_md(c, "the tiny model's real one: the gradient of the mean cross-entropy against the targets "
                       f"`{TINY_TARGETS}` that block 0's attention hands back to LN1 (`b0.dln1` of "
                       "`site_scripts/tiny_backward.py`)"),
        follow_md(c),
        collapsed("The same LayerNorm with its gain and shift moved (u ≠ x̂)", "\n".join([
            "Every 1-D parameter of the tiny model moved by \\(0.1\\,\\mathcal{N}(0, 1)\\) (`examples.biases_moved`, "
            f"seed {SEED}). "
            "That is another model, so its loss gradient is replayed again by the model's own backward functions "
            "(`ln1_upstream` in this page's generator). Only gains and biases moved, so \\(X^{(0)}\\) is the same "
            f"(largest change {moved_gap:g}).\n",
            md_table(["", *range(m.g.size)], [["\\(\\gamma\\)", *(f"{v:.4f}" for v in m.g)],
                                              ["\\(\\beta\\)", *(f"{v:.4f}" for v in m.b)]]),
            sections.array_md("x̂ = (x − μ) r", m.xhat, row_label="position t"),
            sections.array_md("u = γ ⊙ x̂ + β", m.u, row_label="position t"),
            backward_md(m, "this model's real one, at the same place (block 0's attention hands it to LN1)"),
            "\\(\\partial\\ell/\\partial\\gamma\\) is this model's gradient of `b0.ln1_g` as `loss_and_grads` gives it "
            f"(largest gap {gap_text(np.abs(m.dg - moved_grads()['b0.ln1_g']).max())}).\n",
        ])),
    ])


def symbols_md():
    ex = default_run()
    x, eps, g, b = ex.trace["embedding"], ex.cfg.ln_eps, ex.params["b0.ln1_g"], ex.params["b0.ln1_b"]
    y, cache = layer_norm_forward(x, g, b, eps)
    xhat, rstd = cache.xhat, cache.rstd
    dy = np.random.default_rng(SEED).standard_normal(y.shape)
    dx, dg, db = layer_norm_backward(dy, cache)
    row, whole = "the row of position \\((w, t)\\)", "for the whole batch"
    rows = [
        (r"x", "x[w, t]", x.shape[-1:], f"{row} of the embedding output, which block 0's LN1 reads"),
        (r"d", "x.shape[-1]", f"{x.shape[-1]}"),
        (r"\mu, \sigma^2", "mean, var", rstd.shape, f"{whole}, one number per row"),
        (r"\epsilon_{\mathrm{LN}}", "eps (cfg.ln_eps)", f"{eps:g}"),
        (r"r", "rstd", rstd.shape, f"{whole}, one number per row"),
        (r"\hat{x}", "xhat", xhat.shape, whole),
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
    ex, rng = tiny(), np.random.default_rng(SEED)
    x, eps = ex.trace["embedding"][0].copy(), ex.cfg.ln_eps
    g = 1.0 + 0.3 * rng.standard_normal(ex.cfg.emb_dim)  # away from 1 and 0 so every term counts
    b = 0.3 * rng.standard_normal(ex.cfg.emb_dim)
    dy = rng.standard_normal(x.shape)
    dx, dg, db = layer_norm_backward(dy, layer_norm_forward(x, g, b, eps)[1])
    rows = sections.gradcheck_rows(weighted_sum(dy, layer_norm_forward, x, g, b, eps),
                                   [("dx", dx, x), ("dg", dg, g), ("db", db, b)], H_STEP)
    return (f"The backward against central differences of the [fake loss]({NOTATION}#fake-loss) "
            "\\(f = \\sum \\mathcal{F} \\odot R\\) with \\(\\mathcal{F} = U\\), for a random \\(R\\) "
            f"(seed {SEED}) and a random gain \\(\\gamma = 1 + 0.3\\,\\mathcal{{N}}(0, 1)\\) and shift "
            "\\(\\beta = 0.3\\,\\mathcal{N}(0, 1)\\) (away from 1 and 0 so that every term counts), on the tiny "
            "example's rows of \\(X^{(0)}\\). `dx`, `dg`, `db` are \\(\\partial f/\\partial x\\), "
            "\\(\\partial f/\\partial\\gamma\\), \\(\\partial f/\\partial\\beta\\).\n\n"
            + sections.gradcheck_table(rows))


def generate(context):
    return {"symbols": symbols_md(), "example": example_md(), "gradcheck": gradcheck_md(), "scale": scale_md(),
            "jacobian": jacobian_md(), "identities": identities_md()}
