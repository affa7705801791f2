"""Gradient checking by central differences.

```text
df/dx_i ~ (f(x + h e_i) - f(x - h e_i)) / 2h
```

The error of this estimate shrinks like h^2 until rounding takes over (about
machine epsilon * |f| / h), so in float64 a step near 1e-5 leaves agreement
to about 1e-9 relative; far below what any real backward bug produces.
"""

import numpy as np

from .config import ModelConfig
from .model import init_params, loss_and_grads, loss_fn

# A backward passes when its relative gap (see relative_gap) is below REL_TOL.
# Central differences in float64 with h = 1e-5 agree to ~1e-9 relative, so
# 1e-6 leaves room for rounding and none for a real mistake (a gradient off
# by 0.1% has a relative gap of 1e-3).
REL_TOL = 1e-6
# Some gradients are exactly zero in exact arithmetic (the key bias: softmax
# ignores a constant added to a row of scores). Then the relative gap compares
# two rounding noises; the central difference alone carries about
# machine-epsilon * |loss| / h ~ 1e-11. An absolute gap below ABS_FLOOR passes.
ABS_FLOOR = 1e-9


def check_passes(abs_gap, rel_gap) -> bool:
    """The pass rule used by the tests and `python -m transformer gradcheck`.

    Parameters
    ----------
    abs_gap : float
        The largest absolute difference.
    rel_gap : float
        The relative gap (see `relative_gap`).

    Returns
    -------
    bool
        True when rel_gap is below REL_TOL or abs_gap is below ABS_FLOOR.
    """
    return rel_gap < REL_TOL or abs_gap < ABS_FLOOR  # eq:gradcheck-pass


def numerical_grad(f, x, h=1e-5):
    """Central-difference gradient of a scalar function with respect to an array that it reads.

    Parameters
    ----------
    f : callable
        Takes no arguments, reads x, and returns a float.
    x : ndarray
        The array to differentiate by; it is perturbed in place and always restored.
    h : float
        The step.

    Returns
    -------
    ndarray
        The estimated gradient, shaped like x.
    """
    grad = np.zeros_like(x)
    flat_x, flat_grad = x.reshape(-1), grad.reshape(-1)
    for i in range(flat_x.size):
        original = flat_x[i]
        try:
            flat_x[i] = original + h  # eq:central-diff
            f_plus = f()
            flat_x[i] = original - h  # eq:central-diff
            f_minus = f()
        finally:
            flat_x[i] = original
        flat_grad[i] = (f_plus - f_minus) / (2 * h)  # eq:central-diff
    return grad


def relative_gap(analytic, numeric):
    """Relative gap `max |a - n| / max(max |a|, max |n|)` between two arrays.

    It is one number per array, scale-free, and not blown up by single entries that happen to be near
    zero.

    Parameters
    ----------
    analytic : ndarray
        The gradient from the backward pass.
    numeric : ndarray
        The gradient from central differences, same shape.

    Returns
    -------
    float
        The gap; 0 when both arrays are all zero.
    """
    scale = max(np.abs(analytic).max(), np.abs(numeric).max())  # eq:rel-gap
    gap = np.abs(analytic - numeric).max()  # eq:rel-gap
    return 0.0 if scale == 0 else gap / scale  # eq:rel-gap


def gradcheck_model(cfg: ModelConfig, ids, targets, seed=0, h=1e-5, perturb=0.0):
    """Compare `loss_and_grads` with central differences for every parameter, in float64.

    Parameters
    ----------
    cfg : ModelConfig
        The model configuration.
    ids : array_like of shape (T,) or (B, T)
        Integer token ids.
    targets : array_like of shape (T,) or (B, T)
        Target ids, shaped like ids.
    seed : int
        Seed of the parameter initialisation and of the perturbation.
    h : float
        The central-difference step.
    perturb : float
        Scale of noise added to the LayerNorm gains and the biases (which start at exactly one and
        zero) so that every gradient term is exercised.

    Returns
    -------
    dict
        Parameter name to (max_abs_gap, relative_gap).
    """
    params = init_params(cfg, seed=seed, dtype=np.float64)
    if perturb:
        rng = np.random.default_rng(seed + 1)
        for value in params.values():
            if value.ndim == 1:
                value += perturb * rng.standard_normal(value.shape)
    _, grads = loss_and_grads(params, ids, targets, cfg)
    report = {}
    for name, value in params.items():
        numeric = numerical_grad(lambda: loss_fn(params, ids, targets, cfg), value, h)
        report[name] = (float(np.abs(grads[name] - numeric).max()), float(relative_gap(grads[name], numeric)))
    return report
