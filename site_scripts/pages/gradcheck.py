"""Generator of the Gradient checking page's fragments."""

import numpy as np

from transformer.activations import relu_backward, relu_forward
from transformer.config import PRESETS
from transformer.gradcheck import ABS_FLOOR, REL_TOL, check_passes, gradcheck_model, numerical_grad, relative_gap
from transformer.layernorm import layer_norm_backward, layer_norm_forward
from transformer.model import param_shapes

from .. import sections
from ..examples import H_STEP, SEED, biases_moved, weighted_sum

PAGE = "gradcheck"
STEPS = [1e-2, 1e-3, 1e-5, 1e-8]
EPS = 1e-5  # LayerNorm's epsilon in these examples
PERTURB = 0.1  # gradcheck_model moves every 1-D parameter by PERTURB × N(0, 1)
TINY_R = 1e-12  # the scale of an upstream gradient whose gradients all fall below the floor


def layer_norm_case(rng):
    """A random 3 × 4 input x with gain g and shift b off 1 and 0, a random R, the fake loss f = Σ u ⊙ R and
    the backward's (dx, dg, db)."""
    x = rng.standard_normal((3, 4))
    g, b = 1 + 0.3 * rng.standard_normal(4), 0.3 * rng.standard_normal(4)
    r = rng.standard_normal(x.shape)
    grads = layer_norm_backward(r, layer_norm_forward(x, g, b, EPS)[1])
    return x, g, weighted_sum(r, layer_norm_forward, x, g, b, EPS), grads


def verdict(gap, rel):
    """The pass rule's verdict, and which of its two rules decided."""
    if not check_passes(gap, rel):
        return "**fails**"
    return "pass" if rel < REL_TOL else "pass, **on the floor alone**"


def steps_md():
    rng = np.random.default_rng(SEED)
    x, _, ln_loss, (dx, _, _) = layer_norm_case(rng)
    z = rng.standard_normal((3, 4))
    z[0, 0] = 3e-4  # one input just right of ReLU's corner
    r = rng.standard_normal(z.shape)
    dr = relu_backward(r, relu_forward(z)[1])
    rows, ln_gaps = [], []
    for step in STEPS:
        ln = relative_gap(dx, numerical_grad(ln_loss, x, step))
        relu = relative_gap(dr, numerical_grad(weighted_sum(r, relu_forward, z), z, step))
        ln_gaps.append(ln)
        rows.append([f"{step:g}", f"{ln:.2e}", f"{relu:.2e}"])
    best = STEPS[int(np.argmin(ln_gaps))]
    return ("The relative gap between the backward formula and central differences, for a smooth function "
            "(LayerNorm's \\(\\partial f/\\partial x\\) on a random 3 × 4 input) and for ReLU with one input at "
            f"{z[0, 0]:g}, just right of its corner (seed {SEED}):\n\n"
            + sections.md_table(["Step \\(\\Delta\\)", "LayerNorm", f"ReLU, one input {z[0, 0]:g} from the corner"],
                                rows)
            + "\nFor the smooth function the error first falls like \\(\\Delta^2\\) "
              f"(from {STEPS[0]:g} to {STEPS[1]:g} the gap falls by {ln_gaps[0] / ln_gaps[1]:.0f}), then rises again "
              "as \\(\\Delta\\) shrinks, because "
              f"\\(f(x + \\Delta e_i) - f(x - \\Delta e_i)\\) loses digits to rounding, about machine epsilon "
              f"({np.finfo(np.float64).eps:.1e} in float64) times \\(|f|/\\Delta\\); of these steps, {best:g} is best, "
              f"and the checks use \\(\\Delta\\) = {H_STEP:g}. Next to the corner, any step larger than the "
              "distance to it straddles the kink and averages the two slopes: only the smaller steps see the true "
              "derivative.\n")


def floor_md(rows):
    """What the floor does in the model's table: the rows it decides, and the rows small enough for it to matter."""
    decided = [r for r in rows if check_passes(r.gap, r.rel) and r.rel >= REL_TOL]
    scale = {r.label: r.gap / r.rel if r.rel else 0.0 for r in rows}  # the larger of max |analytic|, max |numeric|
    small = [r for r in rows if scale[r.label] < ABS_FLOOR / REL_TOL]
    return (f"The floor decides {len(decided)} of the {len(rows)} rows: "
            + ", ".join(f"`{r.label}` (largest entry of either gradient {scale[r.label]:.1e}, relative gap "
                        f"{r.rel:.2f})" for r in decided)
            + ". These are the key biases \\(b_k\\), whose gradient is zero in exact arithmetic: adding \\(b_k\\) to "
              "every key adds \\(Q^{(h)}_{w,t} \\cdot b_k^{(h)} / \\sqrt{d_h}\\) (\\(b_k^{(h)}\\) is head \\(h\\)'s "
              "\\(d_h\\) entries of \\(b_k\\)) to every score of head \\(h\\) in query row \\((w, t)\\), the same "
              "number for every key position of that row, which the softmax ignores ([the Attention page's "
              "derivation](" + sections.page_link(PAGE, "attention", "eq-attn-grad-key-bias") + ")). "
              "The computed gradient and the central difference are both rounding noise, one far smaller "
              "than the other, so the relative gap is 1 or next to it by its definition ([above](#eq-rel-gap)): a "
              "number without meaning, and only the absolute gap can judge.\n\n"
              f"The floor can only matter for a small gradient: where the largest entry is above "
              f"{ABS_FLOOR:g} / {REL_TOL:g} = {ABS_FLOOR / REL_TOL:g}, a gap below the floor already means a relative "
              f"gap below {REL_TOL:g}. In this table {len(small)} rows are that small ("
              + ", ".join(f"`{r.label}`" for r in small) + "); every other row was judged by its relative gap. "
              "Below that size the floor passes any gap under it, right or wrong: see the "
              "[last section](#can-the-check-fail).\n")


def model_md():
    cfg = PRESETS["tiny"].with_(activation="gelu")
    rng = np.random.default_rng(SEED)
    ids = rng.integers(0, cfg.vocab_size, (2, cfg.context_len))
    targets = rng.integers(0, cfg.vocab_size, (2, cfg.context_len))
    report = gradcheck_model(cfg, ids, targets, seed=SEED, h=H_STEP, perturb=PERTURB)
    shapes = param_shapes(cfg)
    rows = [sections.GradRow(k, shapes[k], gap, rel, "float64", H_STEP) for k, (gap, rel) in report.items()]
    passed = sum("FAIL" not in r.result for r in rows)
    moved = [k for k, shape in shapes.items() if len(shape) == 1]
    return (f"`gradcheck_model` on the tiny model with GELU, a batch of 2 random sequences of length "
            f"{cfg.context_len} (seed {SEED}), differentiating the mean cross-entropy \\(\\mathcal{{L}}\\) itself. "
            f"Before the check it moves each of the {len(moved)} one-dimensional parameters (the biases, the "
            f"LayerNorm gains and shifts) by {PERTURB:g} × N(0, 1), as `examples.biases_moved` does for the "
            "component pages: at initialisation the biases are exactly 0 and the gains exactly 1, and a backward "
            "that forgets to multiply by a gain, or uses an input where it should use input + bias, would then give "
            "the right numbers (the [last section](#can-the-check-fail) shows one). "
            f"**{passed} of {len(rows)}** gradients pass.\n\n"
            + sections.gradcheck_table(rows, "\\(\\mathcal{L}\\) itself") + "\n" + floor_md(rows))


def gap_row(label, analytic, numeric):
    gap, rel = float(np.abs(analytic - numeric).max()), relative_gap(analytic, numeric)
    return [label, f"{np.abs(analytic).max():.1e}", f"{gap:.2e}", f"{rel:.2e}", verdict(gap, rel)]


GAP_HEADER = ["Backward", "largest |analytic|", "Largest gap", "Relative gap", "Result"]


def wrong_dg_md():
    _, g, loss, (_, dg, _) = layer_norm_case(np.random.default_rng(SEED))
    numeric = numerical_grad(loss, g, H_STEP)
    backwards = {"the real dg": dg, "dg × 1.001": dg * 1.001, "dg without its last entry": np.r_[dg[:-1], 0.0]}
    rel = relative_gap(dg * 1.001, numeric)
    return ("A check is only worth something if it can fail. The same comparison, for LayerNorm's "
            "\\(\\partial f/\\partial\\gamma\\), with the right gradient and two wrong ones:\n\n"
            + sections.md_table(GAP_HEADER, [gap_row(k, v, numeric) for k, v in backwards.items()])
            + f"\nThe pass rule: relative gap below {REL_TOL:g} or largest gap below {ABS_FLOOR:g}. A gradient "
              f"0.1% off has a relative gap of {rel:.1e}, {rel / REL_TOL:.0f} times the threshold; the real one sits "
              f"{REL_TOL / max(relative_gap(dg, numeric), 1e-300):.0f} times below it. The tests keep such negative "
              "controls, and `tools/scale_backward_outputs.py` scales every backward output by 1.001 in turn to show "
              "each is caught.\n")


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
    return ("**Why the parameters are moved.** LayerNorm's \\(\\partial f/\\partial x\\) with the gain left out of "
            "\\(\\delta = \\gamma \\odot \\partial\\ell/\\partial u\\), against central differences, at the "
            f"initial gain and shift and after `biases_moved` moves them by {PERTURB:g} × N(0, 1) (seed {SEED}):\n\n"
            + sections.md_table(["Parameters", *GAP_HEADER], rows)
            + f"\nAt \\(\\gamma = 1\\) the wrong backward {'passes' if 'fail' not in rows[1][-1] else 'fails'}: it "
              "computes the same numbers, so no check at these inputs can tell. Moved, it "
              f"{'fails' if 'fail' in rows[3][-1] else 'passes'}. A check is only as good as its inputs.\n")


def floor_blind_md():
    """A wrong gradient (the sign of dg flipped) that the floor lets through once every entry is tiny."""
    rows = []
    for scale in (1.0, TINY_R):
        rng = np.random.default_rng(SEED)
        x = rng.standard_normal((3, 4))
        g, b = 1 + 0.3 * rng.standard_normal(4), 0.3 * rng.standard_normal(4)
        r = scale * rng.standard_normal(x.shape)
        dg = layer_norm_backward(r, layer_norm_forward(x, g, b, EPS)[1])[1]
        numeric = numerical_grad(weighted_sum(r, layer_norm_forward, x, g, b, EPS), g, H_STEP)
        rows.append([f"{scale:g}", *gap_row("−dg (sign flipped)", -dg, numeric)])
    return ("**What the floor lets through.** The same wrong LayerNorm \\(\\partial f/\\partial\\gamma\\), its sign "
            "flipped, with \\(R\\) at its usual size and scaled down so that every entry of the gradient is tiny:\n\n"
            + sections.md_table(["scale of \\(R\\)", *GAP_HEADER], rows)
            + f"\nThe relative gap is {rows[0][4]} and {rows[1][4]} (the sign flipped makes it 2 in exact "
              f"arithmetic), but with \\(R\\) scaled by {TINY_R:g} the largest gap falls below the floor of "
              f"{ABS_FLOOR:g} and the check "
              f"{'passes' if 'fail' not in rows[1][-1] else 'fails'}. A pass on the floor therefore means only "
              "that the gradient is tiny, not that it is right: it is trusted here for the key biases, which are "
              "zero for the reason given above, and every other row of the model's table passes on its relative "
              "gap.\n")


def negative_md():
    return "\n".join([wrong_dg_md(), gain_forgotten_md(), floor_blind_md()])


def generate(context):
    return {"steps": steps_md(), "model": model_md(), "negative": negative_md()}
