"""Softmax over the last axis, and cross-entropy fused from logits.

NaN semantics: a NaN anywhere in a row makes the whole row of probabilities NaN (the row maximum is NaN),
forward and backward; nothing turns it back into a number. A row whose every score is -inf (masked
everywhere) has no softmax at all: it raises MaskedRowError instead of returning NaN.
"""

from typing import NamedTuple

import numpy as np

from .config import is_int
from .errors import InputError, MaskedRowError


def check_not_fully_masked(row_max, what="softmax"):
    """Refuse rows whose largest score is -inf: every entry of such a row is masked.

    Parameters
    ----------
    row_max : ndarray
        The maximum of each row (NaN for a row holding a NaN, which is let through).
    what : str
        What the rows are, for the message.

    Raises
    ------
    MaskedRowError
        Naming how many rows are masked everywhere and the first of them.
    """
    masked = np.isneginf(row_max)
    if masked.any():
        first = tuple(int(i) for i in np.argwhere(masked)[0])
        raise MaskedRowError(f"{what}: {int(masked.sum())} row(s) are -inf everywhere (fully masked), the first "
                             f"at index {first}; a softmax needs at least one score that is not -inf")


def softmax_forward(x):
    """Softmax over the last axis, `p_i = exp(x_i - max x) / sum_j exp(x_j - max x)`.

    Subtracting the row maximum changes nothing mathematically and keeps exp from overflowing: the
    largest exponent is exp(0) = 1.

    Parameters
    ----------
    x : ndarray of shape (..., n)
        The scores.

    Returns
    -------
    p : ndarray of shape (..., n)
        The probabilities; each row sums to 1.
    cache : p
        What `softmax_backward` needs: the probabilities p themselves (the same array as the output).

    Raises
    ------
    MaskedRowError
        If a row is -inf everywhere.
    """
    row_max = x.max(axis=-1, keepdims=True)
    check_not_fully_masked(row_max)
    p = x - row_max  # eq:softmax eq:softmax-shift
    np.exp(p, out=p)  # eq:softmax  in place: saves allocating (and page-faulting) a copy
    p /= p.sum(axis=-1, keepdims=True)  # eq:softmax
    cache = p
    return p, cache


def softmax_backward(dp, cache):
    """Gradient of softmax, `dx_i = p_i (dp_i - sum_j dp_j p_j)`.

    Parameters
    ----------
    dp : ndarray of shape (..., n)
        Gradient with respect to the probabilities.
    cache : ndarray
        The cache from `softmax_forward`.

    Returns
    -------
    dx : ndarray of shape (..., n)
        Gradient with respect to the scores.
    """
    p = cache
    row_dot = np.einsum("...i,...i->...", dp, p)[..., None]  # eq:softmax-vjp  sum_j dp_j p_j, no temporary
    dx = dp - row_dot  # eq:softmax-vjp eq:softmax-jacobian
    dx *= p  # eq:softmax-grad eq:softmax-vjp eq:softmax-jacobian
    return dx


class CrossEntropyCache(NamedTuple):
    """What `cross_entropy_forward` keeps for `cross_entropy_backward`.

    Attributes
    ----------
    z : ndarray of shape (N, n_V)
        The logits of the N = B*T positions, shifted by their row maximum.
    log_sum_exp : ndarray of shape (N,)
        log sum_j exp(z_j) of each row, so softmax = exp(z - log_sum_exp).
    t : ndarray of shape (N,)
        The targets, flattened like the rows of z.
    shape : tuple
        The shape of the logits, given back to their gradient.
    """

    z: np.ndarray
    log_sum_exp: np.ndarray
    t: np.ndarray
    shape: tuple


def cross_entropy_forward(logits, targets):
    """Mean over all positions of `-log softmax(logits)[target]`.

    It is computed from the logits with log-sum-exp, never as log(softmax), so a very confident wrong
    prediction gives a large finite loss, not log(0).

    Parameters
    ----------
    logits : ndarray of shape (..., n_V)
        The logits of every position.
    targets : ndarray of shape (...)
        The integer target id of every position.

    Returns
    -------
    loss : float
        The mean cross-entropy, a scalar.
    cache : CrossEntropyCache
        What `cross_entropy_backward` needs.

    Raises
    ------
    MaskedRowError
        If a row of logits is -inf everywhere.
    """
    n_v = logits.shape[-1]
    z = logits.reshape(-1, n_v)
    t = targets.reshape(-1)
    row_max = z.max(axis=-1, keepdims=True)
    check_not_fully_masked(row_max, "cross-entropy")
    z = z - row_max  # eq:softmax-shift
    log_sum_exp = np.log(np.exp(z).sum(axis=-1))  # eq:xent eq:xent-row eq:softmax-log
    log_probs_target = z[np.arange(t.size), t] - log_sum_exp  # eq:xent eq:xent-row eq:softmax-log
    loss = -log_probs_target.mean()  # eq:xent
    cache = CrossEntropyCache(z, log_sum_exp, t, logits.shape)
    return float(loss), cache


def cross_entropy_backward(dloss, cache):
    """Gradient of the mean cross-entropy, `dlogits = (softmax(logits) - onehot(target)) / N`.

    N is the number of positions; the result is also scaled by dloss.

    Parameters
    ----------
    dloss : float
        Gradient with respect to the loss (1.0 when the loss is the final output).
    cache : CrossEntropyCache
        The cache from `cross_entropy_forward`.

    Returns
    -------
    dlogits : ndarray of shape (..., n_V)
        Gradient with respect to the logits, shaped like them.
    """
    z, log_sum_exp, t, shape = cache
    n = t.size
    probs = np.exp(z - log_sum_exp[:, None])  # eq:lse-grad eq:xent-row-grad
    probs[np.arange(n), t] -= 1.0  # eq:xent-row-grad
    dlogits = probs * (dloss / n)  # eq:xent-grad eq:xent-slow
    return dlogits.reshape(shape)


class TimeRangeCache(NamedTuple):
    """What `cross_entropy_time_range_forward` keeps for its backward: where the counted positions lie, and the
    cross-entropy's own cache of them."""
    time_offset: int
    time_count: int
    T: int
    inner: CrossEntropyCache


def cross_entropy_time_range_forward(logits, targets, time_offset, time_count):
    """The mean cross-entropy over positions time_offset to time_offset + time_count - 1 of every window.

    For fine-tuning on part of a window (a reply after its cue): the other positions still pass through
    the model, as context, but add nothing to the loss and get a gradient of exactly zero.

    Parameters
    ----------
    logits : ndarray of shape (B, T, n_V)
    targets : ndarray of shape (B, T)
    time_offset : int
        The first position counted, 0 <= time_offset < T.
    time_count : int
        How many positions are counted, 1 <= time_count <= T - time_offset.

    Returns
    -------
    loss : float
        The mean over the B * time_count counted positions.
    cache : TimeRangeCache

    Raises
    ------
    InputError
        If the logits and targets are not shaped as windows, or the range is empty or reaches outside them.
    """
    logits, targets = np.asarray(logits), np.asarray(targets)
    if logits.ndim != 3 or targets.shape != logits.shape[:2]:
        raise InputError(f"the time range needs logits (B, T, n_V) and targets (B, T), got logits of shape "
                         f"{logits.shape} and targets of shape {targets.shape}")
    T = logits.shape[1]
    if not (is_int(time_offset) and is_int(time_count) and 0 <= time_offset and time_count >= 1
            and time_offset + time_count <= T):
        raise InputError(f"time range [{time_offset!r}, {time_offset!r} + {time_count!r}) is not a non-empty "
                         f"range of the window's {T} positions")
    stop = time_offset + time_count
    loss, cache = cross_entropy_forward(logits[:, time_offset:stop], targets[:, time_offset:stop])  # eq:time-range-loss
    return loss, TimeRangeCache(time_offset, time_count, T, cache)


def cross_entropy_time_range_backward(dloss, cache):
    """Gradient of `cross_entropy_time_range_forward`: the counted positions' (P - e_y) / (B time_count),
    exactly zero elsewhere."""
    time_offset, time_count, T, inner = cache
    counted = cross_entropy_backward(dloss, inner)  # (B, time_count, n_V)
    dlogits = np.zeros((counted.shape[0], T, counted.shape[2]), dtype=counted.dtype)  # eq:time-range-grad
    dlogits[:, time_offset:time_offset + time_count] = counted  # eq:time-range-grad
    return dlogits
