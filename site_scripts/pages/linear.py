"""Generator of the Linear / ReLU / GELU / Initialisation page's fragments."""

import math
from dataclasses import dataclass

import numpy as np

from transformer.activations import (ACTIVATION_FUNCTIONS, gelu_backward, gelu_forward, relu_backward,
                                     relu_forward)
from transformer.linear import linear_backward, linear_forward

from .. import sections
from ..examples import (H_STEP, SEED, TINY_IDS, TINY_TARGETS, default_note, default_run, illustrative, tiny,
                        weighted_sum)
from ..sections import agreement, num
from ..tiny_backward import tiny_backward

ACT_NAMES = {"relu": "ReLU", "gelu": "GELU"}  # how the page writes each activation


def dot_text(xs, ys):
    """x₀·y₀ + x₁·y₁ + ... with the numbers themselves."""
    return " + ".join(f"{num(x)}·{num(y)}" for x, y in zip(xs, ys, strict=True))


@dataclass(frozen=True)
class FFNLayer:
    """The first feed-forward layer of the tiny model's last block, forward and real backward."""
    name: str  # the parameter prefix, e.g. b1.ff1
    activation: str
    a: np.ndarray  # A = U_2, (T, d)
    w: np.ndarray  # W = W_1, (d, F)
    b: np.ndarray  # b = b_1, (F,)
    g: np.ndarray  # G = A W + b, (T, F)
    dphi: np.ndarray  # ∂ℓ/∂φ(G), from the replay (T, F)
    dg: np.ndarray  # ∂ℓ/∂G = ∂ℓ/∂φ(G) ⊙ φ'(G), computed here
    da: np.ndarray  # ∂ℓ/∂A = ∂ℓ/∂G Wᵀ, computed here
    dw: np.ndarray  # ∂ℓ/∂W = Aᵀ ∂ℓ/∂G, computed here
    db: np.ndarray  # ∂ℓ/∂b, computed here
    replay: dict  # the replay's arrays for dg, da, dw, db


def ffn_layer():
    ex, back = tiny(), tiny_backward()
    block = f"b{ex.cfg.num_layers - 1}"
    name = f"{block}.ff1"
    a, w, b = ex.trace[f"{block}.ln2"][0], ex.params[f"{name}_w"], ex.params[f"{name}_b"]
    g, _ = linear_forward(a, w, b)
    dphi = back.steps[f"{block}.dhidden"][0]
    if ex.cfg.activation == "relu":
        dg = np.where(g > 0, dphi, 0.0)  # the mask [G > 0], from G itself (np.where: no −0 entries)
    else:
        forward, backward = ACTIVATION_FUNCTIONS[ex.cfg.activation]
        dg = backward(dphi, forward(g)[1])
    replay = {"dg": back.steps[f"{block}.dpre"][0], "da": back.steps[f"{block}.dln2"][0],
              "dw": back.grads[f"{name}_w"], "db": back.grads[f"{name}_b"]}
    return FFNLayer(name, ex.cfg.activation, a, w, b, g, dphi, dg, dg @ w.T, a.T @ dg, dg.sum(axis=0), replay)


def forward_md(layer):
    act = ACTIVATION_FUNCTIONS
    relu, gelu = act["relu"][0](layer.g)[0], act["gelu"][0](layer.g)[0]
    block = layer.name.split(".")[0]
    bias = ("its bias \\(b\\) is zero at initialisation" if not layer.b.any()
            else f"its bias \\(b\\) is {np.array2string(layer.b, precision=4)}")
    g00 = layer.a[0] @ layer.w[:, 0] + layer.b[0]
    return "\n".join([
        f"The input \\(A\\) is \\(U_2\\), the last block's LN2 output (`{block}.ln2`), and the layer is "
        f"\\(W = W_1\\) (`{layer.name}_w`; row \\(i\\) of its table is an input unit, column \\(i'\\) an output "
        f"unit); {bias}.\n",
        sections.array_md("A = U₂", layer.a, row_label="position t"),
        sections.array_md(f"W = W₁ ({layer.name}_w)", layer.w, row_label="input unit i"),
        sections.array_md("G = A W + b", layer.g, row_label="position t"),
        "Follow one number: \\(G_{0,0} = \\sum_i A_{0,i} W_{i,0} + b_0\\) = "
        f"{dot_text(layer.a[0], layer.w[:, 0])} + {num(layer.b[0])} = **{num(g00, bracket=False)}**, the first "
        "entry of the table above.\n",
        sections.array_md("ReLU(G)", relu, row_label="position t"),
        sections.array_md("GELU(G)", gelu, row_label="position t"),
        f"ReLU zeroes {int((relu == 0).sum())} of {relu.size} entries; GELU keeps a small negative output for "
        f"negative entries (smallest {gelu.min():.4f}) and is close to the identity for large positive ones. The "
        f"tiny model uses {ACT_NAMES[layer.activation]}.\n",
    ])


def backward_md(layer):
    closed = [i for i in range(layer.g.shape[1]) if not (layer.g[:, i] > 0).any()]
    col = next((i for i in range(layer.dg.shape[1]) if np.all(layer.dg[:, i] != 0)), 0)
    block, act = layer.name.split(".")[0], ACT_NAMES[layer.activation]
    mask = "[G > 0]" if layer.activation == "relu" else f"{act}′(G)"
    tex = f"\\operatorname{{{act}}}"
    checks = [("G", f"\\(\\partial\\ell/\\partial {tex}(G) \\odot {tex}'(G)\\)", f"steps['{block}.dpre']", layer.dg,
               "dg"),
              ("A", "\\(\\partial\\ell/\\partial G\\, W^\\top\\)", f"steps['{block}.dln2']", layer.da, "da"),
              ("W", "\\(A^\\top \\partial\\ell/\\partial G\\)", f"grads['{layer.name}_w']", layer.dw, "dw"),
              ("W", "\\(\\sum_t A_t^\\top\\, \\partial\\ell/\\partial G_t\\), a loop over the rows",
               f"grads['{layer.name}_w']",
               sum(np.outer(a_t, dg_t) for a_t, dg_t in zip(layer.a, layer.dg, strict=True)), "dw"),
              ("b", "column sums of \\(\\partial\\ell/\\partial G\\)", f"grads['{layer.name}_b']", layer.db, "db")]
    rows = [[f"\\(\\partial\\ell/\\partial {symbol}\\)", how, f"`{key}`", *fmt(agreement(mine, layer.replay[k]))]
            for symbol, how, key, mine, k in checks]
    return "\n".join([
        f"The tiny model's real backward (\\(\\ell = \\mathcal{{L}}\\), the mean cross-entropy against targets "
        f"`{TINY_TARGETS}`, replayed call by call) reaches this layer from \\(W_2\\) with "
        f"\\(\\partial\\ell/\\partial\\phi(G)\\) (`{block}.dhidden`). The page computes the rest from the arrays "
        f"shown here, in the order the backward does.\n",
        sections.array_md(f"∂ℓ/∂{act}(G) (from the replay)", layer.dphi, row_label="position t"),
        sections.array_md(f"∂ℓ/∂G = ∂ℓ/∂{act}(G) ⊙ {mask}", layer.dg, row_label="position t"),
        sections.array_md("∂ℓ/∂A = ∂ℓ/∂G Wᵀ", layer.da, row_label="position t"),
        "Row \\(i\\) of \\(\\partial\\ell/\\partial W\\) is input unit \\(i\\), column \\(i'\\) output unit \\(i'\\), "
        "as in \\(W\\):\n",
        sections.array_md("∂ℓ/∂W = Aᵀ ∂ℓ/∂G", layer.dw, row_label="input unit i"),
        sections.array_md("∂ℓ/∂b (column sums)", layer.db),
        arithmetic_md(layer, col),
        (f"Columns {', '.join(map(str, closed))} of \\(\\partial\\ell/\\partial W\\) and the same entries of "
         f"\\(\\partial\\ell/\\partial b\\) are exactly 0: \\(G \\le 0\\) in those columns at every position, so "
         "ReLU passes no gradient to those hidden units in this example.\n" if closed and layer.activation == "relu"
         else ""),
        "Each array against the replay of the model's own backward (`site_scripts/tiny_backward.py`):\n",
        sections.md_table(["Gradient", "Computed here as", "Replay's array", "Largest gap", "Result"], rows),
        f"\n\\(\\partial\\ell/\\partial A = \\partial\\ell/\\partial U_2\\) goes on into LN2's backward (the "
        f"[LayerNorm]({sections.page_link('linear', 'layernorm')}) page); \\(\\partial\\ell/\\partial W\\) and "
        f"\\(\\partial\\ell/\\partial b\\) are the gradients the optimizer receives for `{layer.name}_w` and "
        f"`{layer.name}_b`.\n",
    ])


def fmt(gap_verdict):
    gap, verdict = gap_verdict
    return [f"{gap:.1e}", verdict]


def arithmetic_md(layer, col):
    """One entry of each gradient, its sum written out with the numbers of the tables above."""
    dw = layer.a[:, 0] @ layer.dg[:, col]
    da = layer.dg[0] @ layer.w[0]
    db = layer.dg[:, col].sum()
    return "\n".join([
        "Follow the numbers back (each sum is of the unrounded arrays; the terms are shown to 4 decimals):\n",
        f"- \\(\\partial\\ell/\\partial W_{{0,{col}}} = \\sum_t A_{{t,0}}\\,\\partial\\ell/\\partial G_{{t,{col}}}\\)"
        f" = {dot_text(layer.a[:, 0], layer.dg[:, col])} = **{num(dw, bracket=False)}**: every position adds its "
        "share, the sum the code does by flattening the rows.",
        f"- \\(\\partial\\ell/\\partial A_{{0,0}} = \\sum_{{i'}} \\partial\\ell/\\partial G_{{0,i'}}\\,W_{{0,i'}}\\) = "
        f"{dot_text(layer.dg[0], layer.w[0])} = **{num(da, bracket=False)}**: row 0 of "
        "\\(\\partial\\ell/\\partial G\\) against row 0 of \\(W\\), which is column 0 of \\(W^\\top\\).",
        f"- \\(\\partial\\ell/\\partial b_{{{col}}} = \\sum_t \\partial\\ell/\\partial G_{{t,{col}}}\\) = "
        + " + ".join(num(v) for v in layer.dg[:, col]) + f" = **{num(db, bracket=False)}**.\n",
    ])


def example_md():
    layer = ffn_layer()
    return "\n".join([
        illustrative(f"The first feed-forward layer of the last block, `{layer.name}`, for ids `{TINY_IDS}`: the "
                     "forward, then the real gradient of the loss flowing back through it."),
        "### Forward\n",
        forward_md(layer),
        "### Backward, with the real loss gradient\n",
        backward_md(layer),
    ])


def relu_rows():
    points = np.array([-1.0, -0.5 * H_STEP, 0.0, 0.5 * H_STEP, 1.0])
    code = relu_backward(np.ones_like(points), relu_forward(points)[1])
    numeric = (relu_forward(points + H_STEP)[0] - relu_forward(points - H_STEP)[0]) / (2 * H_STEP)
    rows = []
    for x, c, n in zip(points, code, numeric, strict=True):
        if abs(c - n) < 1e-9:
            verdict = "agree"
        elif abs(x) < H_STEP:
            verdict = "differ: the step \\(\\Delta\\) straddles the corner at 0"
        else:
            verdict = "**FAIL**"
        rows.append([f"{x:g}", f"{c:g}", f"{n:.4f}", verdict])
    return rows


def gelu_table():
    """GELU′ at a few points: its two terms by the formula (with math.erf, not the code), the code's backward
    with upstream gradient 1 (so that it returns the derivative itself), central differences of the code's
    forward."""
    points = np.linspace(-3.0, 3.0, 7)
    cdf = np.array([0.5 * (1 + math.erf(x / math.sqrt(2))) for x in points])
    density = points * np.exp(-points ** 2 / 2) / math.sqrt(2 * math.pi)
    code = gelu_backward(np.ones_like(points), gelu_forward(points)[1])
    numeric = (gelu_forward(points + H_STEP)[0] - gelu_forward(points - H_STEP)[0]) / (2 * H_STEP)
    rows = [[f"{x:g}", f"{c:.6f}", f"{d:.6f}", f"{c + d:.6f}", f"{k:.6f}", f"{n:.6f}", f"{abs(k - n):.1e}"]
            for x, c, d, k, n in zip(points, cdf, density, code, numeric, strict=True)]
    formula_gap, formula_verdict = agreement(code, cdf + density)
    numeric_gap, numeric_verdict = agreement(code, numeric)
    return rows, (formula_gap, formula_verdict), (numeric_gap, numeric_verdict)


def gelu_root():
    """Where GELU′ = Φ + Gφ crosses 0 (bisection on the code's derivative between −3, where it is negative,
    and 0), and where it is lowest on a grid from −3 to 0."""
    def slope(x):
        x = np.atleast_1d(np.asarray(x, dtype=float))
        return gelu_backward(np.ones_like(x), gelu_forward(x)[1])
    lo, hi = -3.0, 0.0
    if not slope(lo)[0] < 0 < slope(hi)[0]:
        raise RuntimeError("GELU′ does not change sign between −3 and 0: the bisection has no root to find")
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if slope(mid)[0] < 0 else (lo, mid)
    grid = np.linspace(-3.0, 0.0, 300_001)
    values = slope(grid)
    return lo, float(grid[values.argmin()]), float(values.min()), float(grid[1] - grid[0])


def activation_checks_md():
    rows, (fgap, fverdict), (ngap, nverdict) = gelu_table()
    root, low, low_slope, step = gelu_root()
    relu = r"\operatorname{ReLU}"
    return "\n".join([
        f"**\\({relu}'\\)**: the code's derivative (`relu_backward` with upstream gradient 1) against central "
        "differences with step \\(\\Delta\\):\n",
        sections.md_table(["\\(G\\)", "code: \\([G > 0]\\)",
                           f"\\(({relu}(G+\\Delta) - {relu}(G-\\Delta)) / 2\\Delta\\)", "Verdict"], relu_rows()),
        "\nWherever \\(|G| \\ge \\Delta\\) the two agree. At 0 the central difference sees half of each side, 1/2, "
        "and within \\(\\Delta\\) of 0 it sees a mix, whatever the code chose: this is why no finite-difference check "
        "can confirm the convention, and why the gradient check below keeps ReLU's inputs away from 0.\n",
        "**\\(\\operatorname{GELU}' = \\Phi(G) + G\\,\\varphi(G)\\)**: the two terms of the product rule computed from "
        "the formula (with `math.erf`, not the code), the code's derivative (`gelu_backward` with upstream gradient "
        "1), and central differences of `gelu_forward`:\n",
        sections.md_table(["\\(G\\)", "\\(\\Phi(G)\\)", "\\(G\\,\\varphi(G)\\)", "\\(\\Phi + G\\,\\varphi\\)", "code",
                           "central difference", "|code − central|"], rows),
        f"\nCode against the formula: largest gap {fgap:.1e}, {fverdict}. Code against central differences: "
        f"largest gap {ngap:.1e}, {nverdict} (the difference's own error, about \\(\\Delta^2\\) times the third "
        f"derivative, is the floor here; \\(\\Delta\\) = {H_STEP:g}). \\(\\operatorname{{GELU}}'\\) crosses 0 at "
        f"\\(G\\) = {root:.4f} (bisection on the code's derivative): left of it, raising \\(G\\) lowers the output a "
        f"little. It is lowest, {low_slope:.4f}, at \\(G\\) = {low:.4f} on a grid of step {step:.0e}, against "
        f"\\(-\\sqrt{{2}}\\) = {-math.sqrt(2):.4f} from the derivation "
        "(\\(\\operatorname{GELU}''(G) = \\varphi(G)\\,(2 - G^2)\\) is 0 there).\n",
    ])


def xavier_md():
    rows = []
    for name, w in default_run().params.items():
        if w.ndim == 2 and not name.startswith("b1."):
            a = np.sqrt(6.0 / sum(w.shape))
            rows.append([f"`{name}`", sections.shape_text(w.shape), f"{a:.4f}", f"{np.abs(w).max():.4f}",
                         f"{w.std():.4f}", f"{a / np.sqrt(3):.4f}"])
    absw = r"\(\lvert W \rvert\)"
    return (sections.md_table(["Matrix", "Shape", "Limit \\(a\\)", f"Largest {absw}", "Std of \\(W\\)",
                               r"\(a/\sqrt{3}\) (std of \(\mathcal{U}(-a, a)\))"], rows)
            + f"\nAt {default_note(batch=False)}, seed {SEED}; block 1's matrices have the same shapes and limits as "
              f"block 0's. Every largest {absw} lies below its limit, and each standard deviation is close to "
              "\\(a/\\sqrt{3}\\).\n")


def symbols_md():
    ex = default_run()
    block = f"b{ex.cfg.num_layers - 1}"
    p, u = ex.params, ex.trace[f"{block}.ln2"]
    g, cache = linear_forward(u, p[f"{block}.ff1_w"], p[f"{block}.ff1_b"])
    r = np.random.default_rng(SEED).standard_normal(g.shape)  # an upstream gradient, for the recorded shapes
    da, dw, db = linear_backward(r, cache)
    rows = [
        (r"A", "x", u.shape, f"the last block's LN2 output \\(U_2\\) (`{block}.ln2`)"),
        (r"W", "w", p[f"{block}.ff1_w"].shape, f"\\(W_1\\), `{block}.ff1_w`"),
        (r"b", "b", p[f"{block}.ff1_b"].shape, f"\\(b_1\\), `{block}.ff1_b`"),
        (r"Y", "y", g.shape, "the pre-activation \\(G\\)"),
        (r"G", "x (activations.py)", g.shape),
        (r"\partial\ell/\partial Y", "dy", r.shape, "the upstream gradient"),
        (r"\partial\ell/\partial A", "dx", da.shape),
        (r"\partial\ell/\partial W", "dw", dw.shape, "every row's outer product, summed"),
        (r"\partial\ell/\partial b", "db", db.shape, "the column sums of \\(\\partial\\ell/\\partial Y\\)"),
        (r"\phi", "relu_forward, gelu_forward", g.shape),
        (r"\Phi, \varphi", "phi_cdf, phi_pdf", g.shape),
        (r"a", "limit", "see the table below"),
        (r"\Delta", "h", f"{H_STEP:g}"),
    ]
    return sections.symbols_md(rows, default_note())


def gradcheck_md():
    rng = np.random.default_rng(SEED)
    x, w, b = rng.standard_normal((2, 3, 4)), rng.standard_normal((4, 5)), rng.standard_normal(5)
    dy = rng.standard_normal((2, 3, 5))
    dx, dw, db = linear_backward(dy, linear_forward(x, w, b)[1])
    rows = sections.gradcheck_rows(weighted_sum(dy, linear_forward, x, w, b),
                                   [("linear: dx", dx, x), ("linear: dw", dw, w), ("linear: db", db, b)], H_STEP)
    # Keep activation inputs away from ReLU's corner at 0, where central differences straddle the kink.
    z = rng.standard_normal((3, 6))
    z[np.abs(z) < 0.1] += 0.3
    dz = rng.standard_normal(z.shape)
    for name, fwd, bwd in [("relu", relu_forward, relu_backward), ("gelu", gelu_forward, gelu_backward)]:
        rows += sections.gradcheck_rows(weighted_sum(dz, fwd, z), [(f"{name}: dx", bwd(dz, fwd(z)[1]), z)], H_STEP)
    return ("Each function is checked through the [fake loss](../reference/notation.md#fake-loss) "
            "\\(f = \\sum \\mathcal{F} \\odot R\\), where \\(\\mathcal{F}\\) is its output (\\(Y\\) for the affine "
            f"layer, \\(\\phi(G)\\) for an activation), with random inputs and a random \\(R\\) (seed {SEED}), so that "
            "the backward is called with upstream gradient \\(R\\). The ReLU inputs are kept at least 0.1 away from "
            "0: there the function has a corner and central differences with step \\(\\Delta\\) see an average of "
            "both slopes ([above](#the-activations-derivatives-checked)).\n\n" + sections.gradcheck_table(rows))


def generate(context):
    return {"symbols": symbols_md(), "example": example_md(), "xavier": xavier_md(), "gradcheck": gradcheck_md(),
            "activation_checks": activation_checks_md()}
