# %% [markdown]
# # Gradient checking by hand
#
# A finite-difference check worked with numbers, on LayerNorm's backward, and
# then the question every such check has to answer: how large should the step
# be? Everything below is computed by `transformer/` as this page is built.

# %% tags=["hide-input"]
import numpy as np

from notebooks._figures import plt, say, show, table
from transformer.activations import relu_backward, relu_forward
from transformer.gradcheck import numerical_grad, relative_gap
from transformer.layernorm import layer_norm_backward, layer_norm_forward

# %% [markdown]
# ## One row, one entry, by hand
#
# Take one row of four numbers, a gain and a shift, and an upstream gradient
# `dy`. The scalar we differentiate is f(x) = Σ y ⊙ dy, whose gradient with
# respect to x is exactly what `layer_norm_backward` returns as `dx`.

# %%
rng = np.random.default_rng(0)
x = rng.standard_normal((1, 4))
g, b = 1 + 0.3 * rng.standard_normal(4), 0.3 * rng.standard_normal(4)
dy = rng.standard_normal((1, 4))
eps = 1e-5


def f(x):
    y, _ = layer_norm_forward(x, g, b, eps)
    return float(np.sum(y * dy))


dx, dg, db = layer_norm_backward(dy, layer_norm_forward(x, g, b, eps)[1])
h = 1e-5
x_plus, x_minus = x.copy(), x.copy()
x_plus[0, 0] += h
x_minus[0, 0] -= h
estimate = (f(x_plus) - f(x_minus)) / (2 * h)
table(["quantity", "value"], [
    ["x[0]", f"{x[0, 0]:.10f}"],
    ["f(x + h e₀)", f"{f(x_plus):.12f}"],
    ["f(x − h e₀)", f"{f(x_minus):.12f}"],
    ["difference / 2h", f"{estimate:.10f}"],
    ["dx[0] from layer_norm_backward", f"{dx[0, 0]:.10f}"],
    ["gap", f"{abs(estimate - dx[0, 0]):.2e}"],
])

# %% [markdown]
# The two agree to about ten digits. `numerical_grad` does the same for every
# entry of an array, and `relative_gap` turns the comparison into one number:
# the largest gap divided by the largest entry.

# %%
checks = [("dx", dx, x), ("dg", dg, g), ("db", db, b)]
rows = []
for label, analytic, wrt in checks:
    numeric = numerical_grad(lambda: f(x), wrt, h)
    rows.append([label, np.array2string(analytic.ravel(), precision=6), f"{relative_gap(analytic, numeric):.1e}"])
table(["gradient", "backward formula", "relative gap to central differences"], rows)

# %% [markdown]
# ## Why the step matters
#
# Central differences err in two ways. The estimate itself is off by a term
# proportional to h² (truncation), which favours small steps; but f(x + h) and
# f(x − h) agree in more and more leading digits as h shrinks, and their
# difference loses them to rounding, an error of about ε|f|/h. Near a corner
# such as ReLU's at 0, any step larger than the distance to the corner puts
# the two evaluations on different sides, and the estimate averages the two
# slopes.

# %%
steps = [1e-2, 1e-3, 1e-5, 1e-8]
fine_steps = np.logspace(-12, -1, 45)
z = np.array([[3e-4, -0.8, 1.1, 0.6]])  # entry 0 lies 3e-4 right of ReLU's corner
dz = np.array([[1.0, 0.5, -0.7, 0.2]])


def relu_f():
    return float(np.sum(relu_forward(z)[0] * dz))


relu_dx = relu_backward(dz, relu_forward(z)[1])


def gaps(step):
    smooth = relative_gap(dx, numerical_grad(lambda: f(x), x, step))
    corner = relative_gap(relu_dx, numerical_grad(relu_f, z, step))
    return smooth, corner


table(["step h", "LayerNorm dx (smooth)", "ReLU dx, 3e-4 from the corner"],
      [[f"{s:g}", *(f"{v:.1e}" for v in gaps(s))] for s in steps])
curve = np.array([gaps(s) for s in fine_steps])
best = fine_steps[np.argmin(curve[:, 0])]
say(f"For the smooth function the gap is smallest near h = {best:.0e}; below that, rounding takes over. "
    "Once the step is smaller than the distance to the corner, the ReLU curve lies below the smooth one: ReLU is "
    "linear on each side of its corner, so central differences there have no truncation error at all, only "
    "rounding.")

# %%
fig, ax = plt.subplots(figsize=(7, 4.2))
ax.loglog(fine_steps, np.maximum(curve[:, 0], 1e-17), label="LayerNorm dx (smooth)")
ax.loglog(fine_steps, np.maximum(curve[:, 1], 1e-17), label="ReLU dx, input 3e-4 from the corner")
ax.axvline(3e-4, color="grey", linestyle=":", label="distance to the corner (3e-4)")
ax.set_xlabel("step h (units of the input)")
ax.set_ylabel("relative gap (dimensionless)")
ax.set_title("Central differences against the backward formula")
ax.legend()
ax.grid(True, which="major", alpha=0.3)
show(fig)
