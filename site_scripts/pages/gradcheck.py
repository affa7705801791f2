"""Generator of the Gradient checking page's fragments."""

import numpy as np

from transformer.activations import relu_backward, relu_forward
from transformer.config import PRESETS
from transformer.gradcheck import ABS_FLOOR, REL_TOL, check_passes, gradcheck_model, numerical_grad, relative_gap
from transformer.layernorm import layer_norm_backward, layer_norm_forward
from transformer.model import param_shapes

from .. import sections
from ..examples import H_STEP, SEED, weighted_sum

STEPS = [1e-2, 1e-3, 1e-5, 1e-8]


def layer_norm_case(rng):
    """A random 3 × 4 input x with gain g and shift b off 1 and 0, an upstream dy, the loss f = Σ y ⊙ dy and
    the backward's (dx, dg, db)."""
    x = rng.standard_normal((3, 4))
    g, b = 1 + 0.3 * rng.standard_normal(4), 0.3 * rng.standard_normal(4)
    dy = rng.standard_normal(x.shape)
    grads = layer_norm_backward(dy, layer_norm_forward(x, g, b, 1e-5)[1])
    return x, g, weighted_sum(dy, layer_norm_forward, x, g, b, 1e-5), grads


def steps_md():
    rng = np.random.default_rng(SEED)
    x, _, ln_loss, (dx, _, _) = layer_norm_case(rng)
    z = rng.standard_normal((3, 4))
    z[0, 0] = 3e-4  # one input just right of ReLU's corner
    dz = rng.standard_normal(z.shape)
    dr = relu_backward(dz, relu_forward(z)[1])
    rows = []
    for h in STEPS:
        ln = relative_gap(dx, numerical_grad(ln_loss, x, h))
        relu = relative_gap(dr, numerical_grad(weighted_sum(dz, relu_forward, z), z, h))
        rows.append([f"{h:g}", f"{ln:.2e}", f"{relu:.2e}"])
    return ("The relative gap between the backward formula and central differences, for a smooth function "
            "(LayerNorm's dx on a random 3 × 4 input) and for ReLU with one input at 3e-4, just right of its "
            f"corner (seed {SEED}):\n\n"
            + sections.md_table(["Step h", "LayerNorm dx", "ReLU dx, input 3e-4 from the corner"], rows)
            + "\nFor the smooth function the error first falls like h² (truncation), then rises again as h shrinks "
              "because f(x + h) − f(x − h) loses digits to rounding, about ε·|f|/h. Next to the corner, any step "
              "larger than the distance to it straddles the kink and averages the two slopes: only the smaller "
              "steps see the true derivative.\n")


def model_md():
    cfg = PRESETS["tiny"].with_(activation="gelu")
    rng = np.random.default_rng(SEED)
    ids = rng.integers(0, cfg.vocab_size, (2, cfg.context_len))
    targets = rng.integers(0, cfg.vocab_size, (2, cfg.context_len))
    report = gradcheck_model(cfg, ids, targets, seed=SEED, h=H_STEP, perturb=0.1)
    shapes = param_shapes(cfg)
    rows = [sections.GradRow(k, shapes[k], gap, rel, "float64", H_STEP) for k, (gap, rel) in report.items()]
    passed = sum("FAIL" not in r.result for r in rows)
    return (f"`gradcheck_model` on the tiny model with GELU, a batch of 2 random sequences of length "
            f"{cfg.context_len} (seed {SEED}): **{passed} of {len(rows)}** gradients pass.\n\n"
            + sections.gradcheck_table(rows))


def negative_md():
    _, g, loss, (_, dg, _) = layer_norm_case(np.random.default_rng(SEED))
    numeric = numerical_grad(loss, g, H_STEP)
    rows = []
    backwards = {"the real dg": dg, "dg × 1.001": dg * 1.001, "dg without its last entry": np.r_[dg[:-1], 0.0]}
    for label, wrong in backwards.items():
        gap, rel = float(np.abs(wrong - numeric).max()), relative_gap(wrong, numeric)
        rows.append([label, f"{gap:.2e}", f"{rel:.2e}", "pass" if check_passes(gap, rel) else "**fails**, as it must"])
    return ("A check is only worth something if it can fail. The same comparison, for LayerNorm's dg, with the "
            "right gradient and two wrong ones:\n\n" + sections.md_table(["Backward", "Largest gap", "Relative gap",
                                                                         "Result"], rows)
            + f"\nThe pass rule: relative gap below {REL_TOL:g} or largest gap below {ABS_FLOOR:g}. A gradient 0.1% "
              "off fails by a factor of about a thousand. The tests keep such negative controls, and "
              "`tools/scale_backward_outputs.py` scales every backward output by 1.001 in turn to show each is "
              "caught.\n")


def generate(context):
    return {"steps": steps_md(), "model": model_md(), "negative": negative_md()}
