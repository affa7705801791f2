"""Linear (affine) layer: y = x W + b, weights stored (in, out).

A weight that is not an array computes its own layer: `linear_forward` hands it the input
(`w.linear_forward(x, b)`), and `linear_backward` hands the cache it made its gradient
(`cache.linear_backward(dy)`). That is how fine-tuning's frozen weights (transformer/lora.py: dense or NF4,
with or without adapters) run inside the unchanged model; this layer knows nothing else about them.
"""

from typing import NamedTuple

import numpy as np


class LinearCache(NamedTuple):
    """What `linear_forward` keeps for `linear_backward`.

    Attributes
    ----------
    x : ndarray of shape (..., in)
        The input: dW = x^T dy.
    w : ndarray of shape (in, out)
        The weights: dx = dy W^T.
    """

    x: np.ndarray
    w: np.ndarray


def linear_forward(x, w, b):
    """Apply the affine map `y = x W + b` to the last axis of x.

    Parameters
    ----------
    x : ndarray of shape (..., in)
        The input; any number of leading axes.
    w : ndarray of shape (in, out)
        The weights, stored (in, out).
    b : ndarray of shape (out,)
        The bias.

    Returns
    -------
    y : ndarray of shape (..., out)
        The output, with the leading axes of x.
    cache : LinearCache
        What `linear_backward` needs.
    """
    if not isinstance(w, np.ndarray):  # a weight that computes its own layer (see the module docstring)
        return w.linear_forward(x, b)
    # One 2-D matmul over all rows (every position of every sequence) is
    # faster in numpy than a stacked (B, T, in) @ (in, out) product.
    y = x.reshape(-1, x.shape[-1]) @ w  # eq:linear eq:linear-entry
    y += b  # eq:linear eq:linear-entry
    cache = LinearCache(x, w)
    return y.reshape(*x.shape[:-1], w.shape[1]), cache


def linear_backward(dy, cache):
    """Gradients of the affine map with respect to its input, weights and bias.

    Parameters
    ----------
    dy : ndarray of shape (..., out)
        Gradient with respect to the output.
    cache : LinearCache
        The cache from `linear_forward` (or the cache a weight that computes its own layer made).

    Returns
    -------
    dx : ndarray of shape (..., in)
        Gradient with respect to x.
    dw : ndarray of shape (in, out)
        Gradient with respect to w (what a weight that computes its own layer returns in its place).
    db : ndarray of shape (out,)
        Gradient with respect to b.
    """
    if not isinstance(cache, LinearCache):  # made by a weight that computes its own layer
        return cache.linear_backward(dy)
    x, w = cache
    # Flatten the leading dimensions: every row (every position of every
    # sequence) adds its outer product x_row^T dy_row into dw in one matmul.
    x2 = x.reshape(-1, x.shape[-1])  # eq:linear-flatten
    dy2 = dy.reshape(-1, dy.shape[-1])  # eq:linear-flatten
    dx = (dy2 @ w.T).reshape(x.shape)  # eq:linear-grad eq:linear-grad-a
    dw = x2.T @ dy2  # eq:linear-grad eq:linear-grad-w eq:linear-flatten
    # db, the sum of the rows of dY, is written as the product 1ᵀ dY with a column of ones: BLAS adds the rows in
    # blocks, several times faster than dy2.sum(axis=0), which adds one row at a time; the two agree to float32
    # rounding (tools/bench_kernels.py).
    db = np.ones(len(dy2), dtype=dy2.dtype) @ dy2  # eq:linear-grad eq:linear-grad-b eq:linear-flatten
    return dx, dw, db
