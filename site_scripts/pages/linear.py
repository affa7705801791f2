"""Generator of the Linear / ReLU / GELU / Initialisation page: the values its prose shows (docs/model/linear.md
binds them), its tables and its picture.

The tiny example follows the first feed-forward layer of the tiny model's last block, forward and with the
model's real loss gradient (from tiny_backward()). The checks of the activations' derivatives take the backward
as an argument (monkeypatched in tests/site/test_pages_lin.py), so that each can be shown to fail.
"""

import math
from dataclasses import dataclass

import numpy as np

from transformer.activations import (ACTIVATION_FUNCTIONS, gelu_backward, gelu_forward, gelu_tanh_backward,
                                     gelu_tanh_forward, relu_backward,
                                     relu_forward)
from transformer.config import PRESETS
from transformer.linear import linear_backward, linear_forward

from .. import sections
from ..common import md_table
from ..examples import H_STEP, SEED, TINY_IDS, TINY_TARGETS, default_note, default_run, tiny, weighted_sum
from ..figures import new_figure, png
from ..sections import agreement, num
from ..tiny_backward import tiny_backward

ACT_NAMES = {"relu": "ReLU", "gelu": "GELU"}  # how the page writes each activation
KINK_GAP = 0.1  # the gradient check keeps ReLU's inputs at least this far from 0 ...
KINK_SHIFT = 0.3  # ... by adding this to those that are closer
AGREE = 1e-9  # ReLU's code and central differences agree when they differ by less than this


def dot_text(xs, ys):
    """x₀·y₀ + x₁·y₁ + ... with the numbers themselves."""
    return " + ".join(f"{num(x)}·{num(y)}" for x, y in zip(xs, ys, strict=True))


def result(v):
    """A written-out sum's result: 4 decimals, a true minus sign, no parentheses."""
    return num(v, bracket=False)


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


# ---------------------------------------------------------------- the tiny example, forward

def forward_values(layer):
    relu, gelu = relu_forward(layer.g)[0], gelu_forward(layer.g)[0]
    tables = {"a": sections.array_md("A = U₂", layer.a, row_label="position t"),
              "w": sections.array_md(f"W = W₁ ({layer.name}_w)", layer.w, row_label="input unit i"),
              "g": sections.array_md("G = A W + b", layer.g, row_label="position t"),
              "relu": sections.array_md("ReLU(G)", relu, row_label="position t"),
              "gelu": sections.array_md("GELU(G)", gelu, row_label="position t")}
    g00 = layer.a[0] @ layer.w[:, 0] + layer.b[0]
    cfg = PRESETS["tiny"]
    return tables, {
        "name": layer.name, "block": layer.name.split(".")[0], "activation": ACT_NAMES[layer.activation],
        "sizes": {"n_v": cfg.vocab_size, "t_max": cfg.context_len, "d": cfg.emb_dim, "h": cfg.num_heads,
                  "l": cfg.num_layers, "f": cfg.ff_dim},
        "bias_max": float(np.abs(layer.b).max()), "g00_terms": dot_text(layer.a[0], layer.w[:, 0]),
        "b0": num(layer.b[0]), "g00": result(g00), "relu_zeros": int((relu == 0).sum()), "entries": relu.size,
        "gelu_min": float(gelu.min())}


# ---------------------------------------------------------------- the tiny example, backward

def replay_rows(layer):
    """Each array computed here against the replay of the model's own backward: (gradient, how, key, gap, verdict)."""
    block, act = layer.name.split(".")[0], ACT_NAMES[layer.activation]
    tex = f"\\operatorname{{{act}}}"
    loop = sum(np.outer(a_t, dg_t) for a_t, dg_t in zip(layer.a, layer.dg, strict=True))
    checks = [("G", f"\\(\\partial\\ell/\\partial {tex}(G) \\odot {tex}'(G)\\)", f"steps['{block}.dpre']", layer.dg,
               "dg"),
              ("A", "\\(\\partial\\ell/\\partial G\\, W^\\top\\)", f"steps['{block}.dln2']", layer.da, "da"),
              ("W", "\\(A^\\top \\partial\\ell/\\partial G\\)", f"grads['{layer.name}_w']", layer.dw, "dw"),
              ("W", "\\(\\sum_t A_t^\\top\\, \\partial\\ell/\\partial G_t\\), a loop over the rows",
               f"grads['{layer.name}_w']", loop, "dw"),
              ("b", "column sums of \\(\\partial\\ell/\\partial G\\)", f"grads['{layer.name}_b']", layer.db, "db")]
    return [[f"\\(\\partial\\ell/\\partial {symbol}\\)", how, f"`{key}`", *gap_verdict(agreement(mine, layer.replay[k]))]
            for symbol, how, key, mine, k in checks]


def gap_verdict(found):
    gap, verdict = found
    return [f"{gap:.1e}", verdict]


def backward_values(layer):
    act = ACT_NAMES[layer.activation]
    mask = "[G > 0]" if layer.activation == "relu" else f"{act}′(G)"
    col = next((i for i in range(layer.dg.shape[1]) if np.all(layer.dg[:, i] != 0)), 0)
    tables = {"dphi": sections.array_md(f"∂ℓ/∂{act}(G) (from the replay)", layer.dphi, row_label="position t"),
              "dg": sections.array_md(f"∂ℓ/∂G = ∂ℓ/∂{act}(G) ⊙ {mask}", layer.dg, row_label="position t"),
              "da": sections.array_md("∂ℓ/∂A = ∂ℓ/∂G Wᵀ", layer.da, row_label="position t"),
              "dw": sections.array_md("∂ℓ/∂W = Aᵀ ∂ℓ/∂G", layer.dw, row_label="input unit i"),
              "db": sections.array_md("∂ℓ/∂b (column sums)", layer.db),
              "replay": md_table(["Gradient", "Computed here as", "Replay's array", "Largest gap", "Result"],
                                 replay_rows(layer))}
    closed = [i for i in range(layer.g.shape[1]) if not (layer.g[:, i] > 0).any()]
    return tables, {
        "targets": TINY_TARGETS, "col": col, "closed": closed,
        "dw_terms": dot_text(layer.a[:, 0], layer.dg[:, col]), "dw": result(layer.a[:, 0] @ layer.dg[:, col]),
        "da_terms": dot_text(layer.dg[0], layer.w[0]), "da": result(layer.dg[0] @ layer.w[0]),
        "db_terms": " + ".join(num(v) for v in layer.dg[:, col]), "db": result(layer.dg[:, col].sum())}


# ---------------------------------------------------------------- the activations' derivatives, checked

def relu_rows():
    points = np.array([-1.0, -0.5 * H_STEP, 0.0, 0.5 * H_STEP, 1.0])
    code = relu_backward(np.ones_like(points), relu_forward(points)[1])
    numeric = (relu_forward(points + H_STEP)[0] - relu_forward(points - H_STEP)[0]) / (2 * H_STEP)
    rows = []
    for x, c, n in zip(points, code, numeric, strict=True):
        if abs(c - n) < AGREE:
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
    return rows, agreement(code, cdf + density), agreement(code, numeric)


def gelu_slope(x):
    x = np.atleast_1d(np.asarray(x, dtype=float))
    return gelu_backward(np.ones_like(x), gelu_forward(x)[1])


def gelu_root():
    """Where GELU′ = Φ + Gφ crosses 0 (bisection on the code's derivative between −3, where it is negative,
    and 0), and where it is lowest on a grid from −3 to 0."""
    lo, hi = -3.0, 0.0
    if not gelu_slope(lo)[0] < 0 < gelu_slope(hi)[0]:
        raise RuntimeError("GELU′ does not change sign between −3 and 0: the bisection has no root to find")
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if gelu_slope(mid)[0] < 0 else (lo, mid)
    grid = np.linspace(-3.0, 0.0, 300_001)
    values = gelu_slope(grid)
    return lo, float(grid[values.argmin()]), float(values.min()), float(grid[1] - grid[0])


def gelu_tanh_values():
    """The tanh approximation's derivative against its formula (with math.tanh, not the code) and against central
    differences of the code's forward, at the points of the GELU table; and how far it lies from the exact GELU."""
    points = np.linspace(-3.0, 3.0, 7)
    c = math.sqrt(2 / math.pi)
    formula = []
    for x in points:
        t = math.tanh(c * (x + 0.044715 * x ** 3))
        formula.append(0.5 * (1 + t) + 0.5 * x * (1 - t * t) * c * (1 + 3 * 0.044715 * x * x))
    code = gelu_tanh_backward(np.ones_like(points), gelu_tanh_forward(points)[1])
    numeric = (gelu_tanh_forward(points + H_STEP)[0] - gelu_tanh_forward(points - H_STEP)[0]) / (2 * H_STEP)
    (fgap, fverdict), (ngap, nverdict) = agreement(code, np.array(formula)), agreement(code, numeric)
    grid = np.linspace(-6.0, 6.0, 120_001)
    apart = np.abs(gelu_tanh_forward(grid)[0] - gelu_forward(grid)[0])
    return {"formula_gap": fgap, "formula": fverdict, "numeric_gap": ngap, "numeric": nverdict,
            "apart": float(apart.max()), "apart_at": float(abs(grid[apart.argmax()]))}


def activation_checks():
    rows, (fgap, fverdict), (ngap, nverdict) = gelu_table()
    root, low, low_slope, step = gelu_root()
    relu = r"\operatorname{ReLU}"
    tables = {
        "relu_check": md_table(["\\(G\\)", "code: \\([G > 0]\\)",
                                f"\\(({relu}(G+\\Delta) - {relu}(G-\\Delta)) / 2\\Delta\\)", "Verdict"], relu_rows()),
        "gelu_check": md_table(["\\(G\\)", "\\(\\Phi(G)\\)", "\\(G\\,\\Phi'(G)\\)", "\\(\\Phi + G\\,\\Phi'\\)", "code",
                                "central difference", "|code − central|"], rows)}
    return tables, {"formula_gap": fgap, "formula": fverdict, "numeric_gap": ngap, "numeric": nverdict, "h": H_STEP,
                    "root": root, "low": low, "low_slope": low_slope, "grid_step": step, "minus_sqrt2": -math.sqrt(2),
                    "tanh": gelu_tanh_values()}


# ---------------------------------------------------------------- initialisation

def xavier():
    """Every matrix of block 0 and outside the blocks at the default config: limit, largest entry, spread."""
    rows, worst_max, worst_std = [], 0.0, 0.0
    for name, w in default_run().params.items():
        if w.ndim == 2 and not name.startswith("b1."):
            a = np.sqrt(6.0 / sum(w.shape))
            rows.append([f"`{name}`", sections.shape_text(w.shape), f"{a:.4f}", f"{np.abs(w).max():.4f}",
                         f"{w.std():.4f}", f"{a / np.sqrt(3):.4f}"])
            worst_max = max(worst_max, np.abs(w).max() / a)
            worst_std = max(worst_std, abs(w.std() / (a / np.sqrt(3)) - 1))
    absw = r"\(\lvert W \rvert\)"
    table = md_table(["Matrix", "Shape", "Limit \\(a\\)", f"Largest {absw}", "Std of \\(W\\)",
                      r"\(a/\sqrt{3}\) (std of \(\mathcal{U}(-a, a)\))"], rows)
    return table, {"worst_max": worst_max, "worst_std": worst_std}


def variance_factors():
    """What Xavier's limit does to the spread through the default config's first feed-forward layer: forward,
    std(G)/std(U_2) on the default run; backward, std(∂ℓ/∂A)/std(∂ℓ/∂G) for an upstream gradient of independent
    standard normal entries; each against the factor the variance argument predicts."""
    ex = default_run()
    w, u = ex.params["b0.ff1_w"], ex.trace["b0.ln2"]
    n_in, n_out = w.shape
    g = linear_forward(u, w, ex.params["b0.ff1_b"])[0]
    dg = np.random.default_rng(SEED).standard_normal(g.shape)
    da = linear_backward(dg, linear_forward(u, w, ex.params["b0.ff1_b"])[1])[0]
    return {"n_in": n_in, "n_out": n_out, "forward": float(g.std() / u.std()),
            "forward_pred": math.sqrt(2 * n_in / (n_in + n_out)), "backward": float(da.std() / dg.std()),
            "backward_pred": math.sqrt(2 * n_out / (n_in + n_out))}


# ---------------------------------------------------------------- what it costs

def costs():
    """Multiply-adds and cached bytes of the default config's first feed-forward layer on the default run."""
    ex = default_run()
    u, w = ex.trace["b0.ln2"], ex.params["b0.ff1_w"]
    rows = int(np.prod(u.shape[:-1]))
    g, cache = linear_forward(u, w, ex.params["b0.ff1_b"])
    gelu_cache = gelu_forward(g)[1]
    return {"rows": rows, "n_in": w.shape[0], "n_out": w.shape[1], "forward": rows * w.size,
            "backward": 2 * rows * w.size, "x_bytes": cache.x.nbytes, "x_shape": cache.x.shape,
            "gelu_bytes": sum(a.nbytes for a in gelu_cache), "dtype": str(u.dtype)}


# ---------------------------------------------------------------- the picture

def activations_png():
    """ReLU and GELU and their slopes (the code's backward with upstream gradient 1), with the tiny example's
    pre-activations G marked on the axis."""
    x = np.linspace(-4, 4, 801)
    g = ffn_layer().g.reshape(-1)
    fig, (left, right) = new_figure(1, 2, figsize=(10, 3.4))
    left.plot(x, relu_forward(x)[0], label="ReLU(G)")
    left.plot(x, gelu_forward(x)[0], label="GELU(G) = G Φ(G)")
    left.plot(g, np.zeros_like(g), "|", color="k", markersize=12, label="the tiny example's entries of G")
    right.plot(x, relu_backward(np.ones_like(x), relu_forward(x)[1]), label="ReLU′(G) = [G > 0]")
    right.plot(x, gelu_slope(x), label="GELU′(G) = Φ(G) + G φ(G)")
    root, low, low_slope, _ = gelu_root()
    right.plot([low], [low_slope], "o", color="tab:red", label="GELU′ lowest, below 0")
    left.set_title("the activation")
    right.set_title("its slope, from the backward")
    for ax in (left, right):
        ax.set_xlabel("pre-activation G")
        ax.axhline(0, color="grey", linewidth=0.5)
        ax.legend(loc="upper left", fontsize="small")
    left.set_ylabel("output")
    right.set_ylabel("slope")
    return png(fig)


# ---------------------------------------------------------------- the evidence

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
        (r"\Phi, \Phi'", "phi_cdf, phi_pdf", g.shape),
        (r"a", "limit", "see the initialisation table"),
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
    z = rng.standard_normal((3, 6))
    z[np.abs(z) < KINK_GAP] += KINK_SHIFT  # away from ReLU's corner, where central differences straddle the kink
    dz = rng.standard_normal(z.shape)
    for name, (fwd, bwd) in ACTIVATION_FUNCTIONS.items():
        rows += sections.gradcheck_rows(weighted_sum(dz, fwd, z), [(f"{name}: dx", bwd(dz, fwd(z)[1]), z)], H_STEP)
    return sections.gradcheck_table(rows)


def generate(context):
    layer = ffn_layer()
    forward_tables, forward = forward_values(layer)
    backward_tables, backward = backward_values(layer)
    check_tables, checks = activation_checks()
    xavier_table, init = xavier()
    values = {"seed": SEED, "ids": TINY_IDS, "forward": forward, "backward": backward, "checks": checks,
              "init": {**init, "spread": variance_factors()}, "cost": costs(),
              "kink": {"gap": KINK_GAP, "shift": KINK_SHIFT}}
    return {"values": values, **forward_tables, **backward_tables, **check_tables, "xavier": xavier_table,
            "activations.png": activations_png(), "symbols": symbols_md(), "gradcheck": gradcheck_md()}
