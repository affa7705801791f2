# %% [markdown]
# # Gradient checking by hand: the step must be small, but not too small
#
# A finite-difference check worked with numbers, on LayerNorm's backward, and
# then the question every such check has to answer: how large should the step
# \(\Delta\) be? Everything below is computed by `transformer/` as this page is
# built.

# %% tags=["hide-input"]
import numpy as np

from notebooks._figures import plt, say, show, table
from transformer.activations import relu_backward, relu_forward
from transformer.gradcheck import numerical_grad, relative_gap
from transformer.layernorm import layer_norm_backward, layer_norm_forward

# %% [markdown]
# ## One row, one entry, by hand
#
# Take one row \(x\) of four numbers, a gain \(\gamma\) and a shift \(\beta\)
# (`g` and `b` below), and a fixed random array \(R\) of the output's shape.
# The scalar we differentiate is the [fake loss](../reference/notation.md#fake-loss)
# \(f = \sum \mathcal{F} \odot R\), with \(\mathcal{F}\) the LayerNorm's
# output: its upstream gradient is exactly \(R\), so calling the backward with
# `dy = R` returns its gradient with respect to \(x\) as `dx`. The central
# difference moves the first entry of \(x\) by \(\pm\Delta\) (\(e_0\) is the
# unit array of that entry):

# %%
rng = np.random.default_rng(0)
x = rng.standard_normal((1, 4))
g, b = 1 + 0.3 * rng.standard_normal(4), 0.3 * rng.standard_normal(4)
R = rng.standard_normal((1, 4))
eps = 1e-5  # LayerNorm's guard against a constant row


def f(x):
    y, _ = layer_norm_forward(x, g, b, eps)
    return float(np.sum(y * R))


dx, dg, db = layer_norm_backward(R, layer_norm_forward(x, g, b, eps)[1])
step = 1e-5
x_plus, x_minus = x.copy(), x.copy()
x_plus[0, 0] += step
x_minus[0, 0] -= step
estimate = (f(x_plus) - f(x_minus)) / (2 * step)

# %% tags=["hide-input"]
table(["quantity", "value"], [
    [r"\(x_0\)", f"{x[0, 0]:.10f}"],
    [r"\(f(x + \Delta e_0)\)", f"{f(x_plus):.12f}"],
    [r"\(f(x - \Delta e_0)\)", f"{f(x_minus):.12f}"],
    [r"the difference over \(2\Delta\)", f"{estimate:.10f}"],
    ["`dx[0]` from `layer_norm_backward`", f"{dx[0, 0]:.10f}"],
    ["gap", f"{abs(estimate - dx[0, 0]):.2e}"],
])
digits = int(np.floor(-np.log10(abs(estimate - dx[0, 0]) / abs(dx[0, 0]))))
say(rf"With \(\Delta\) = {step:g} the two agree to {digits} significant digits.")

# %% [markdown]
# `numerical_grad` does the same for every entry of an array, and
# `relative_gap` turns the comparison into one number: the largest gap
# divided by the largest entry.

# %% tags=["hide-input"]
rows = []
for label, analytic, wrt in [("dx", dx, x), ("dg", dg, g), ("db", db, b)]:
    numeric = numerical_grad(lambda: f(x), wrt, step)
    rows.append([label, np.array2string(analytic.ravel(), precision=6), f"{relative_gap(analytic, numeric):.1e}"])
table(["gradient", "backward formula", "relative gap to central differences"], rows)

# %% [markdown]
# ## Why the step matters
#
# Central differences err in two ways. The estimate itself is off by a term
# proportional to \(\Delta^2\) (truncation), which favours small steps; but
# \(f(x + \Delta e_0)\) and \(f(x - \Delta e_0)\) agree in more and more
# leading digits as \(\Delta\) shrinks, and their difference loses them to
# rounding, an error of about \(\epsilon_{\mathrm{mach}} \lvert f\rvert/\Delta\)
# with \(\epsilon_{\mathrm{mach}}\) the spacing of float64 numbers near 1.
# Near a corner such as ReLU's at 0, any step larger than the distance to the
# corner puts the two evaluations on different sides, and the estimate
# averages the two slopes. Both are measured below, on the LayerNorm above and
# on a ReLU whose first input lies just right of its corner.

# %% tags=["hide-input"]
STEPS = [1e-2, 1e-3, 1e-5, 1e-8]
fine_steps = np.logspace(-12, -1, 45)
CORNER = 3e-4  # how far right of ReLU's corner its first input lies
z = np.array([[CORNER, -0.8, 1.1, 0.6]])
dz = np.array([[1.0, 0.5, -0.7, 0.2]])


def relu_f():
    return float(np.sum(relu_forward(z)[0] * dz))


relu_dx = relu_backward(dz, relu_forward(z)[1])


def gaps(s):
    smooth = relative_gap(dx, numerical_grad(lambda: f(x), x, s))
    corner = relative_gap(relu_dx, numerical_grad(relu_f, z, s))
    return smooth, corner


table([r"step \(\Delta\)", "LayerNorm dx (smooth)", f"ReLU dx, {CORNER:g} from the corner"],
      [[f"{s:g}", *(f"{v:.1e}" for v in gaps(s))] for s in STEPS])
curve = np.array([gaps(s) for s in fine_steps])
best_at = int(np.argmin(curve[:, 0]))
best = fine_steps[best_at]
between = (fine_steps > best) & (fine_steps < CORNER)  # truncation rules the smooth gap; ReLU is linear there
lower = int((curve[between, 1] < curve[between, 0]).sum())
say(rf"For the smooth function the gap is smallest near \(\Delta\) = {best:.0e}, "
    + ("inside the range of steps tried: larger steps lose to truncation, smaller ones to rounding, as the "
       "title says. " if 0 < best_at < len(fine_steps) - 1 else
       "at an end of the range of steps tried, so this run does not show the title's balance. ")
    + f"Between that step and the distance to the corner ({CORNER:g}), the ReLU gap is below the smooth one at "
    f"**{lower} of {between.sum()}** steps: ReLU is linear on each side of its corner, so there central "
    "differences have no truncation error, only rounding.")

# %% tags=["hide-input"]
fig, ax = plt.subplots(figsize=(7, 4.2))
ax.loglog(fine_steps, np.maximum(curve[:, 0], 1e-17), label="LayerNorm dx (smooth)")
ax.loglog(fine_steps, np.maximum(curve[:, 1], 1e-17), label=f"ReLU dx, input {CORNER:g} from the corner")
ax.axvline(CORNER, color="grey", linestyle=":", label=f"distance to the corner ({CORNER:g})")
ax.set_xlabel("step Δ (units of the input)")
ax.set_ylabel("relative gap (dimensionless)")
ax.set_title("Central differences against the backward formula")
ax.legend()
ax.grid(True, which="major", alpha=0.3)
show(fig)
