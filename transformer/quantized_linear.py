"""A linear layer whose weight is stored in NF4: decoded a block of rows at a time, never whole.

`y = x W + b` with W of shape (in, out) held as an `NF4Weight`. The forward decodes `rows` input rows of W
at a time and adds their contribution, `x[..., rows] W[rows]`, to y; the backward does the same for
`dx[..., rows] = dy W[rows]^T`. At no moment does a float32 copy of the whole of W exist: the largest is
rows x out. The weight and the bias are frozen (QLoRA trains adapters beside them), so the backward computes
dx alone and needs no input: the cache is the weight itself.
"""

import numpy as np

from .errors import InputError
from .nf4 import NF4Weight, dequantize_range

ROWS = 64  # input rows of W decoded at once


def weight_rows(q: NF4Weight, start, stop, scales):
    """Rows start to stop - 1 of the (in, out) weight, decoded to float32."""
    out = q.shape[1]
    return dequantize_range(q, start * out, stop * out, scales).reshape(stop - start, out)


def nf4_linear_forward(x, q: NF4Weight, b, rows=ROWS):
    """y = x W + b with W decoded `rows` rows at a time.

    Parameters
    ----------
    x : ndarray of shape (..., in)
    q : NF4Weight of shape (in, out)
    b : ndarray of shape (out,)
    rows : int
        Input rows of W decoded at once.

    Returns
    -------
    y : ndarray of shape (..., out), the dtype of x
    cache : (q, rows)
        The weight and the row count: the backward needs nothing else.
    """
    if len(q.shape) != 2 or x.shape[-1] != q.shape[0]:
        raise InputError(f"input of width {x.shape[-1]} does not fit a weight of shape {q.shape}")
    scales = q.scales()
    y = np.zeros((*x.shape[:-1], q.shape[1]), dtype=x.dtype)
    for start in range(0, q.shape[0], rows):
        stop = min(start + rows, q.shape[0])
        y += x[..., start:stop] @ weight_rows(q, start, stop, scales).astype(x.dtype, copy=False)  # eq:qlinear-forward
    y += b
    return y, (q, rows)


def nf4_linear_backward(dy, cache):
    """dx of `nf4_linear_forward`; the frozen weight and bias get no gradient.

    Parameters
    ----------
    dy : ndarray of shape (..., out)
    cache : (q, rows)

    Returns
    -------
    dx : ndarray of shape (..., in)
    """
    q, rows = cache
    scales = q.scales()
    dx = np.empty((*dy.shape[:-1], q.shape[0]), dtype=dy.dtype)
    for start in range(0, q.shape[0], rows):
        stop = min(start + rows, q.shape[0])
        dx[..., start:stop] = dy @ weight_rows(q, start, stop, scales).astype(dy.dtype, copy=False).T  # eq:qlinear-dx
    return dx
