"""Softmax over the last axis, and cross-entropy fused from logits."""

import numpy as np


def softmax_forward(x):
    """p_i = exp(x_i - max x) / sum_j exp(x_j - max x).

    Subtracting the row maximum changes nothing mathematically and keeps exp
    from overflowing: the largest exponent is exp(0) = 1.
    x (..., n) -> p (..., n), cache
    """
    p = x - x.max(axis=-1, keepdims=True)
    np.exp(p, out=p)  # in place: saves allocating (and page-faulting) a copy
    p /= p.sum(axis=-1, keepdims=True)  # eq:softmax
    cache = p
    return p, cache


def softmax_backward(dp, cache):
    """dx_i = p_i (dp_i - sum_j dp_j p_j)."""
    p = cache
    row_dot = np.einsum("...i,...i->...", dp, p)[..., None]  # sum_j dp_j p_j, no temporary
    dx = dp - row_dot
    dx *= p  # eq:softmax-grad
    return dx


def cross_entropy_forward(logits, targets):
    """Mean over all positions of -log softmax(logits)[target].

    Computed from the logits with log-sum-exp, never as log(softmax), so a
    very confident wrong prediction gives a large finite loss, not log(0).
    logits (..., V), targets (...) ints -> loss (scalar), cache
    """
    V = logits.shape[-1]
    z = logits.reshape(-1, V)
    t = targets.reshape(-1)
    z = z - z.max(axis=-1, keepdims=True)
    log_sum_exp = np.log(np.exp(z).sum(axis=-1))
    log_probs_target = z[np.arange(t.size), t] - log_sum_exp
    loss = -log_probs_target.mean()  # eq:xent
    cache = (z, log_sum_exp, t, logits.shape)
    return float(loss), cache


def cross_entropy_backward(dloss, cache):
    """dlogits = (softmax(logits) - onehot(target)) / N, N = number of positions."""
    z, log_sum_exp, t, shape = cache
    n = t.size
    probs = np.exp(z - log_sum_exp[:, None])
    probs[np.arange(n), t] -= 1.0
    dlogits = probs * (dloss / n)  # eq:xent-grad
    return dlogits.reshape(shape)
