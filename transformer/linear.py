"""Linear (affine) layer: y = x W + b, weights stored (in, out).

Fine-tuning freezes the weights: a weight wrapped in `lora.Frozen` (dense or NF4, with or without LoRA
adapters) is computed by `lora.frozen_linear_forward` instead, and its backward forms no weight gradient.
"""

import numpy as np

from .lora import Frozen, FrozenCache, frozen_linear_backward, frozen_linear_forward


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
    cache : (x, w)
        What `linear_backward` needs:

        - x, the input, shape (..., in): dW = x^T dy;
        - w, the weights, shape (in, out): dx = dy W^T.
    """
    if isinstance(w, Frozen):  # fine-tuning: W and b are frozen
        return frozen_linear_forward(x, w, b)
    # One 2-D matmul over all rows (every position of every sequence) is
    # faster in numpy than a stacked (B, T, in) @ (in, out) product.
    y = x.reshape(-1, x.shape[-1]) @ w  # eq:linear eq:linear-entry
    y += b  # eq:linear eq:linear-entry
    cache = (x, w)
    return y.reshape(*x.shape[:-1], w.shape[1]), cache


def linear_backward(dy, cache):
    """Gradients of the affine map with respect to its input, weights and bias.

    Parameters
    ----------
    dy : ndarray of shape (..., out)
        Gradient with respect to the output.
    cache : tuple
        The cache from `linear_forward`.

    Returns
    -------
    dx : ndarray of shape (..., in)
        Gradient with respect to x.
    dw : ndarray of shape (in, out)
        Gradient with respect to w; for a `Frozen` weight, its adapters' gradients (dA, dB), or None.
    db : ndarray of shape (out,)
        Gradient with respect to b; None for a frozen bias.
    """
    if isinstance(cache, FrozenCache):  # dx and the adapters' gradients (None without adapters); no db
        return (*frozen_linear_backward(dy, cache), None)
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
