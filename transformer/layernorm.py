"""Layer normalisation over the last axis (the model width d).

NaN semantics: a NaN in a row makes that whole row NaN (its mean and variance are NaN), forward and
backward; the other rows are untouched.
"""

from typing import NamedTuple

import numpy as np


class LayerNormCache(NamedTuple):
    """What `layer_norm_forward` keeps for `layer_norm_backward`: the normalised rows and 1/sigma are all it needs.

    Attributes
    ----------
    xhat : ndarray of shape (..., d)
        The normalised rows (x - mean) / sigma.
    rstd : ndarray of shape (..., 1)
        r = 1 / sigma = 1 / sqrt(var + eps) of each row.
    g : ndarray of shape (d,)
        The gain, since dxhat = dy * g.
    """

    xhat: np.ndarray
    rstd: np.ndarray
    g: np.ndarray


def layer_norm_forward(x, g, b, eps):
    """Normalise each row of width d: `y = g * (x - mean) / sqrt(var + eps) + b`.

    The variance is the population variance (divided by d, not d - 1) and eps sits inside the square
    root, as in PyTorch's LayerNorm.

    Parameters
    ----------
    x : ndarray of shape (..., d)
        The rows to normalise.
    g : ndarray of shape (d,)
        The gain.
    b : ndarray of shape (d,)
        The shift.
    eps : float
        Added to the variance inside the square root.

    Returns
    -------
    y : ndarray of shape (..., d)
        The normalised, scaled and shifted rows.
    cache : LayerNormCache
        What `layer_norm_backward` needs.
    """
    d = x.shape[-1]
    # The row sums by einsum: faster than x.mean on rows this short, equal up to rounding (tools/bench_kernels.py).
    mean = np.einsum("...i->...", x)[..., None] / d  # eq:ln-mean
    xhat = x - mean
    var = np.einsum("...i,...i->...", xhat, xhat)[..., None] / d  # eq:ln-var
    rstd = 1.0 / np.sqrt(var + eps)  # eq:ln-norm
    xhat *= rstd  # eq:ln-norm  (now xhat = (x - mean) / sigma)
    y = xhat * g  # eq:ln-affine
    y += b  # eq:ln-affine
    cache = LayerNormCache(xhat, rstd, g)
    return y, cache


def layer_norm_backward(dy, cache):
    """Gradients of LayerNorm with respect to its input, gain and shift.

    Every input of a row moves that row's mean and variance, so dx is the sum of three terms: the direct
    path through xhat, the path through the mean, and the path through the variance.

    Parameters
    ----------
    dy : ndarray of shape (..., d)
        Gradient with respect to the output.
    cache : LayerNormCache
        The cache from `layer_norm_forward`.

    Returns
    -------
    dx : ndarray of shape (..., d)
        Gradient with respect to x.
    dg : ndarray of shape (d,)
        Gradient with respect to the gain.
    db : ndarray of shape (d,)
        Gradient with respect to the shift.
    """
    xhat, rstd, g = cache
    d = xhat.shape[-1]
    dxhat = dy * g  # eq:ln-dxhat
    mean_dxhat = np.einsum("...i->...", dxhat)[..., None] / d  # eq:ln-dxhat
    mean_dxhat_xhat = np.einsum("...i,...i->...", dxhat, xhat)[..., None] / d  # eq:ln-dxhat
    dx = dxhat  # eq:ln-grad eq:ln-terms eq:ln-paths  term 1: x_i -> xhat_i directly
    dx -= mean_dxhat  # eq:ln-grad eq:ln-terms eq:ln-paths eq:ln-dmean  term 2: through the mean
    dx -= xhat * mean_dxhat_xhat  # eq:ln-grad eq:ln-terms eq:ln-paths eq:ln-dvar  term 3: through the variance
    dx *= rstd  # eq:ln-grad eq:ln-terms eq:ln-paths
    dy2, xhat2 = dy.reshape(-1, d), xhat.reshape(-1, d)
    dg = np.einsum("ni,ni->i", dy2, xhat2)  # eq:ln-grad-params eq:ln-dgain  sum over every row of dy * xhat
    db = np.ones(len(dy2), dtype=dy2.dtype) @ dy2  # eq:ln-grad-params eq:ln-dshift  1ᵀ dY, as in linear_backward
    return dx, dg, db
