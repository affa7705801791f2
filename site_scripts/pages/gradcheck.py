"""Generator of the Gradient checking page: the values its prose shows (docs/verification/gradcheck.md binds
them), its tables and its picture.

Every check here is LayerNorm's backward or the whole model's against central differences: the error of the
differences against their step, one entry worked out, the whole model, and three wrong backwards, of which the
check catches two and the absolute floor lets the third through. tests/site/test_pages_rest.py holds the page's
sentences to these numbers.
"""

import numpy as np

from transformer.activations import relu_backward, relu_forward
from transformer.config import PRESETS
from transformer.gradcheck import ABS_FLOOR, REL_TOL, check_passes, gradcheck_model, numerical_grad, relative_gap
from transformer.layernorm import layer_norm_backward, layer_norm_forward
from transformer.model import param_shapes

from .. import sections
from ..examples import H_STEP, SEED, biases_moved, weighted_sum
from ..figures import new_figure, png

STEPS = [1e-2, 1e-3, 1e-5, 1e-8]  # the table's steps
CURVE = np.logspace(-1, -12, 45)  # the picture's steps
EPS = 1e-5  # LayerNorm's epsilon in these examples
SPREAD = 0.3  # the LayerNorm case's gain and shift: 1 + SPREAD N(0, 1) and SPREAD N(0, 1)
CORNER = 3e-4  # ReLU's input just right of its corner
PERTURB = 0.1  # gradcheck_model moves every 1-D parameter by PERTURB × N(0, 1)
SCALED = 1.001  # a backward output 0.1% off
TINY_R = 1e-12  # the scale of an upstream gradient whose gradients all fall below the floor


def layer_norm_case(rng):
    """A random 3 × 4 input x with gain g and shift b off 1 and 0, a random R, the fake loss f = Σ u ⊙ R and
    the backward's (dx, dg, db)."""
    x = rng.standard_normal((3, 4))
    g, b = 1 + SPREAD * rng.standard_normal(4), SPREAD * rng.standard_normal(4)
    r = rng.standard_normal(x.shape)
    grads = layer_norm_backward(r, layer_norm_forward(x, g, b, EPS)[1])
    return x, g, weighted_sum(r, layer_norm_forward, x, g, b, EPS), grads


def verdict(gap, rel):
    """The pass rule's verdict, and which of its two rules decided."""
    if not check_passes(gap, rel):
        return "**fails**"
    return "pass" if rel < REL_TOL else "pass, **on the floor alone**"


# ---------------------------------------------------------------- the step: the error against Δ

def step_gaps(steps):
    """(LayerNorm's, ReLU's) relative gap at each step: LayerNorm's ∂f/∂x on a random 3 × 4 input (smooth), and
    ReLU's with one input CORNER right of its corner."""
    rng = np.random.default_rng(SEED)
    x, _, ln_loss, (dx, _, _) = layer_norm_case(rng)
    z = rng.standard_normal((3, 4))
    z[0, 0] = CORNER
    r = rng.standard_normal(z.shape)
    dr = relu_backward(r, relu_forward(z)[1])
    ln = [relative_gap(dx, numerical_grad(ln_loss, x, h)) for h in steps]
    relu = [relative_gap(dr, numerical_grad(weighted_sum(r, relu_forward, z), z, h)) for h in steps]
    return np.array(ln), np.array(relu)


def steps_part():
    ln, relu = step_gaps(STEPS)
    rows = [[f"{h:g}", f"{a:.2e}", f"{b:.2e}"] for h, a, b in zip(STEPS, ln, relu)]
    table = sections.md_table(["Step \\(\\Delta\\)", "LayerNorm", f"ReLU, one input {CORNER:g} from the corner"], rows)
    return table, {"corner": CORNER, "first": STEPS[0], "second": STEPS[1], "fall": float(ln[0] / ln[1]), "machine_eps": float(np.finfo(float).eps),
                   "best": STEPS[int(np.argmin(ln))], "h": H_STEP}


def curve_png():
    """The relative gap against the step, both cases, on log axes, with the two slopes of the error drawn
    through the measured points, the step the checks use and the distance to ReLU's corner."""
    ln, relu = step_gaps(CURVE)
    best = int(np.argmin(ln))
    fig, ax = new_figure(figsize=(10, 4.6))
    ax.loglog(CURVE, ln, "o-", ms=3, label="LayerNorm ∂f/∂x (smooth)")
    ax.loglog(CURVE, relu, "s-", ms=3, label=f"ReLU, one input {CORNER:g} right of its corner")
    ax.loglog(CURVE[:best + 1], ln[0] * (CURVE[:best + 1] / CURVE[0]) ** 2, "k--", lw=0.8, label="∝ Δ² (truncation)")
    ax.loglog(CURVE[best:], ln[-1] * CURVE[-1] / CURVE[best:], "k:", lw=0.8, label="∝ 1/Δ (rounding)")
    ax.axvline(H_STEP, color="tab:green", lw=1, label=f"Δ = {H_STEP:g}, the checks' step")
    ax.axvline(CORNER, color="tab:red", lw=1, ls="-.", label="distance to ReLU's corner")
    ax.axhline(REL_TOL, color="gray", lw=1, label=f"REL_TOL = {REL_TOL:g}")
    ax.invert_xaxis()
    ax.set_xlabel("step Δ of the central differences (smaller to the right)")
    ax.set_ylabel("relative gap to the backward")
    ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1))
    below = ln < REL_TOL
    hi = best - int(np.argmin(below[best::-1]))  # the window of steps around the best where a right backward passes
    lo = best + int(np.argmin(below[best:]))
    values = {"n": len(CURVE), "lo": float(CURVE[-1]), "hi": float(CURVE[0]), "best": float(CURVE[best]),
              "best_gap": float(ln[best]), "pass_hi": float(CURVE[hi + 1]), "pass_lo": float(CURVE[lo - 1])}
    return png(fig), values


# ---------------------------------------------------------------- one entry, worked out

def worked():
    """One entry of LayerNorm's ∂f/∂x by central differences, written out, and the relative gap of the array."""
    x, _, loss, (dx, _, _) = layer_norm_case(np.random.default_rng(SEED))
    t, i = np.unravel_index(np.argmax(np.abs(dx)), dx.shape)
    old = x[t, i]
    x[t, i] = old + H_STEP
    up = loss()
    x[t, i] = old - H_STEP
    down = loss()
    x[t, i] = old
    numeric = numerical_grad(loss, x, H_STEP)
    by_hand = (up - down) / (2 * H_STEP)
    if by_hand != numeric[t, i]:
        raise RuntimeError(f"the entry written out, {by_hand!r}, is not numerical_grad's {numeric[t, i]!r}")
    gap = float(np.abs(dx - numeric).max())
    scale = float(max(np.abs(dx).max(), np.abs(numeric).max()))
    shown = [f"{abs(v):.15f}".replace(".", "") for v in (up, down)]
    agree = next(k for k, (a, b) in enumerate(zip(*shown)) if a != b) - len(shown[0]) + len(shown[0].lstrip("0"))
    return {"t": int(t), "i": int(i), "x": float(old), "up": up, "down": down, "diff": up - down, "agree": agree,
            "numeric": float(by_hand), "analytic": float(dx[t, i]), "entry_gap": float(abs(dx[t, i] - by_hand)),
            "gap": gap, "scale": scale, "rel": relative_gap(dx, numeric), "shape": dx.shape}


# ---------------------------------------------------------------- the whole model

def floor_values(rows):
    """What the floor does in the model's table: the rows it decides, and the rows small enough for it to matter."""
    decided = [r for r in rows if check_passes(r.gap, r.rel) and r.rel >= REL_TOL]
    scale = {r.label: r.gap / r.rel if r.rel else 0.0 for r in rows}  # the larger of max |analytic|, max |numeric|
    small = [r.label for r in rows if scale[r.label] < ABS_FLOOR / REL_TOL]
    return {"count": len(decided), "rows": len(rows), "decided": [r.label for r in decided],
            "scale_max": max(scale[r.label] for r in decided), "rel_min": min(r.rel for r in decided),
            "small_at": ABS_FLOOR / REL_TOL, "small": small, "small_count": len(small)}


def model_rows():
    cfg = PRESETS["tiny"].with_(activation="gelu")
    rng = np.random.default_rng(SEED)
    ids = rng.integers(0, cfg.vocab_size, (2, cfg.context_len))
    targets = rng.integers(0, cfg.vocab_size, (2, cfg.context_len))
    report = gradcheck_model(cfg, ids, targets, seed=SEED, h=H_STEP, perturb=PERTURB)
    shapes = param_shapes(cfg)
    return cfg, [sections.GradRow(k, shapes[k], gap, rel, "float64", H_STEP) for k, (gap, rel) in report.items()]


def model_part():
    cfg, rows = model_rows()
    values = {"batch": 2, "T": cfg.context_len, "moved": sum(len(r.shape) == 1 for r in rows),
              "passed": sum("FAIL" not in r.result for r in rows), "rows": len(rows), "floor": floor_values(rows)}
    return sections.gradcheck_table(rows, "\\(\\mathcal{L}\\) itself"), values


# ---------------------------------------------------------------- can the check fail?

def gap_row(label, analytic, numeric):
    gap, rel = float(np.abs(analytic - numeric).max()), relative_gap(analytic, numeric)
    return [label, f"{np.abs(analytic).max():.1e}", f"{gap:.2e}", f"{rel:.2e}", verdict(gap, rel)]


GAP_HEADER = ["Backward", "largest |analytic|", "Largest gap", "Relative gap", "Result"]


def wrong_dg():
    _, g, loss, (_, dg, _) = layer_norm_case(np.random.default_rng(SEED))
    numeric = numerical_grad(loss, g, H_STEP)
    backwards = {"the real dg": dg, f"dg × {SCALED:g}": dg * SCALED, "dg without its last entry": np.r_[dg[:-1], 0.0]}
    rel, real = relative_gap(dg * SCALED, numeric), relative_gap(dg, numeric)
    table = sections.md_table(GAP_HEADER, [gap_row(k, v, numeric) for k, v in backwards.items()])
    return table, {"off": SCALED - 1, "rel": rel, "times": rel / REL_TOL, "real_below": REL_TOL / max(real, 1e-300)}


def gain_forgotten_md():
    """A backward that leaves out the gain (δ = ∂ℓ/∂u instead of γ ⊙ ∂ℓ/∂u) against central differences,
    with the gain at its initial 1 and moved off it."""
    rng = np.random.default_rng(SEED)
    x, r = rng.standard_normal((3, 4)), rng.standard_normal((3, 4))
    at_init = {"g": np.ones(4), "b": np.zeros(4)}
    rows = []
    for label, p in [("γ = 1, β = 0 (initialisation)", at_init), ("γ, β moved", biases_moved(at_init, rng))]:
        cache = layer_norm_forward(x, p["g"], p["b"], EPS)[1]
        numeric = numerical_grad(weighted_sum(r, layer_norm_forward, x, p["g"], p["b"], EPS), x, H_STEP)
        rows.append([label, *gap_row("the real dx", layer_norm_backward(r, cache)[0], numeric)])
        rows.append([label, *gap_row("dx with the gain left out", layer_norm_backward(r / p["g"], cache)[0], numeric)])
    return sections.md_table(["Parameters", *GAP_HEADER], rows)


def floor_blind():
    """A wrong gradient (the sign of dg flipped) that the floor lets through once every entry is tiny."""
    rows = []
    for scale in (1.0, TINY_R):
        rng = np.random.default_rng(SEED)
        x = rng.standard_normal((3, 4))
        g, b = 1 + SPREAD * rng.standard_normal(4), SPREAD * rng.standard_normal(4)
        r = scale * rng.standard_normal(x.shape)
        dg = layer_norm_backward(r, layer_norm_forward(x, g, b, EPS)[1])[1]
        numeric = numerical_grad(weighted_sum(r, layer_norm_forward, x, g, b, EPS), g, H_STEP)
        rows.append([f"{scale:g}", *gap_row("−dg (sign flipped)", -dg, numeric)])
    return sections.md_table(["scale of \\(R\\)", *GAP_HEADER], rows), {"rel": float(rows[0][4]),
                                                                        "rel_tiny": float(rows[1][4])}


def generate(context):
    steps_table, steps_values = steps_part()
    picture, curve = curve_png()
    model_table, model_values = model_part()
    wrong_table, wrong_values = wrong_dg()
    blind_table, blind_values = floor_blind()
    values = {"seed": SEED, "eps": EPS, "spread": SPREAD, "perturb": PERTURB, "rel_tol": REL_TOL, "floor": ABS_FLOOR,
              "tiny_r": TINY_R, "factor": SCALED, "steps": steps_values, "curve": curve, "worked": worked(),
              "model": model_values, "wrong": wrong_values, "blind": blind_values}
    return {"values": values, "steps": steps_table, "error.png": picture, "model": model_table,
            "wrong_dg": wrong_table, "gain_forgotten": gain_forgotten_md(), "floor_blind": blind_table}
