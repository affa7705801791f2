"""Causal multi-head self-attention with q/k/v/o projections and biases.

NaN semantics: a NaN in a window's input stays inside that window, forward and backward, and reaches every
position of it: the causal mask is added to the scores, and NaN + (-inf) is NaN, so a NaN key poisons even the
rows that may not see it. (Flash attention skips the tiles of keys that lie wholly above the diagonal, so in its
forward a NaN key reaches only the queries of its own tile of keys and later ones; within a tile it is added to
the mask like here.)
"""

import math
from functools import lru_cache
from typing import NamedTuple

import numpy as np

from .linear import linear_backward, linear_forward
from .softmax import softmax_backward, softmax_forward


def split_heads(x, num_heads):
    """Split the model width into heads, (B, T, d) to (B, H, T, dh).

    Parameters
    ----------
    x : ndarray of shape (B, T, d)
        The input.
    num_heads : int
        H, which divides d.

    Returns
    -------
    ndarray of shape (B, H, T, dh)
        One slice of width dh = d/H per head.
    """
    B, T, d = x.shape
    return x.reshape(B, T, num_heads, d // num_heads).transpose(0, 2, 1, 3)


def merge_heads(x):
    """Join the heads back into the model width, (B, H, T, dh) to (B, T, d); the inverse of `split_heads`.

    Parameters
    ----------
    x : ndarray of shape (B, H, T, dh)
        One slice per head.

    Returns
    -------
    ndarray of shape (B, T, d)
        The heads side by side, d = H * dh.
    """
    B, H, T, dh = x.shape
    return x.transpose(0, 2, 1, 3).reshape(B, T, H * dh)


class QKVCache(NamedTuple):
    """What `qkv_forward` keeps for `qkv_backward`: the caches of its three `linear_forward` calls."""
    q_cache: tuple
    k_cache: tuple
    v_cache: tuple


def qkv_forward(x, p, num_heads):
    """The queries, keys and values of every head: the first step of attention, shared by
    `attention_forward` and `flash_attention_forward`.

    Parameters
    ----------
    x : ndarray of shape (B, T, d)
        The input.
    p : dict
        The parameters wq, bq, wk, bk, wv and bv (others are ignored).
    num_heads : int
        H, the number of heads.

    Returns
    -------
    (q_scaled, k, v) : ndarray of shape (B, H, T, dh) each
        The queries (already times 1/sqrt(dh)), the keys and the values.
    cache : QKVCache
        The caches of the three projections.
    """
    projections = [linear_forward(x, p[f"w{name}"], p[f"b{name}"]) for name in "qkv"]  # eq:attn-qkv  (B, T, d)
    q, k, v = (split_heads(y, num_heads) for y, _ in projections)  # (B, H, T, dh)
    # Scaling q (B, H, T, dh) instead of the scores (B, H, T, T) is the same
    # product on a smaller array whenever T > dh.
    q_scaled = q * (1.0 / math.sqrt(q.shape[-1]))  # eq:attn-scores
    return (q_scaled, k, v), QKVCache(*(cache for _, cache in projections))


def qkv_backward(dqkv, cache):
    """Gradients of `qkv_forward` with respect to its input and its six parameters.

    Parameters
    ----------
    dqkv : (dq, dk, dv), ndarray of shape (B, H, T, dh) each
        Gradients with respect to the (unscaled) queries, the keys and the values.
    cache : QKVCache
        The cache `qkv_forward` returned.

    Returns
    -------
    dx : ndarray of shape (B, T, d)
        Gradient with respect to x.
    grads : dict
        The gradients of wq, bq, wk, bk, wv and bv.
    """
    dx = 0
    grads = {}
    for name, d_heads, proj_cache in zip("qkv", dqkv, cache, strict=True):
        d_proj = merge_heads(d_heads)  # eq:attn-grad-split  (B, T, d)
        dx_part, grads[f"w{name}"], grads[f"b{name}"] = linear_backward(d_proj, proj_cache)  # eq:attn-grad-params eq:attn-grad-key-bias
        dx = dx + dx_part  # eq:attn-grad-input  x fed all three projections: their gradients add up
    return dx, grads


@lru_cache(maxsize=None)
def causal_mask(T, dtype, column_major=False):
    """Additive causal mask: 0 where query t may see key s (s <= t), -inf above the diagonal.

    It is built once per (T, dtype) and shared read-only, since every step adds the same mask. The
    diagonal is never masked (each query sees its own key), so no row is masked everywhere: the softmax's
    refusal of a fully masked row (MaskedRowError) can come only from scores that are -inf themselves.

    Parameters
    ----------
    T : int
        The sequence length.
    dtype : numpy.dtype
        The dtype of the scores the mask is added to.
    column_major : bool
        Store it column by column, as `attention_forward` stores its scores: adding arrays laid out alike is
        one pass through memory in order, faster than adding a row-major mask to them
        (tools/bench_kernels.py). The values are the same either way.

    Returns
    -------
    ndarray of shape (T, T)
        The mask, read-only.
    """
    mask = np.triu(np.full((T, T), -np.inf, dtype=dtype), k=1)
    mask = np.asfortranarray(mask) if column_major else mask
    mask.setflags(write=False)
    return mask


class AttentionCache(NamedTuple):
    """What `attention_forward` keeps for `attention_backward`; a tuple, so it also unpacks by position.

    Attributes
    ----------
    q_scaled : ndarray of shape (B, H, T, dh)
        The queries, already times 1/sqrt(dh): dk = dscores^T q_scaled.
    k : ndarray of shape (B, H, T, dh)
        The keys: dq = dscores k / sqrt(dh); their shape also gives H and dh.
    v : ndarray of shape (B, H, T, dh)
        The values: datt = dheads v^T.
    att : ndarray of shape (B, H, T, T)
        The attention probabilities: dv = att^T dheads.
    att_cache : ndarray
        The cache of `softmax_forward` (the same probabilities), for dscores.
    qkv_cache : QKVCache
        The caches of the q, k and v projections' `linear_forward`.
    o_cache : tuple
        The cache of the output projection's `linear_forward` (the merged heads and wo).
    """

    q_scaled: np.ndarray
    k: np.ndarray
    v: np.ndarray
    att: np.ndarray
    att_cache: np.ndarray
    qkv_cache: tuple
    o_cache: tuple


def attention_forward(x, p, num_heads, trace=None):
    """Causal multi-head self-attention, with biased q, k, v and output projections.

    Parameters
    ----------
    x : ndarray of shape (B, T, d)
        The input.
    p : dict
        The parameters wq, bq, wk, bk, wv, bv, wo and bo.
    num_heads : int
        H, the number of heads.
    trace : dict, optional
        If given, the attention probabilities, shape (B, H, T, T), are stored in trace["attention"]
        (for the pages and the cross-check).

    Returns
    -------
    y : ndarray of shape (B, T, d)
        The output.
    cache : AttentionCache
        What `attention_backward` needs (see `AttentionCache`).
    """
    (q_scaled, k, v), qkv_cache = qkv_forward(x, p, num_heads)
    # The scores are computed transposed, (k q^T)^T: the same numbers, seen through a transposed view, so that
    # each row of scores lies down a column in memory. numpy then takes the softmax's row maxima and sums with
    # one vector loop over many rows at once instead of one short loop per row: faster (tools/bench_kernels.py).
    scores = (k @ q_scaled.transpose(0, 1, 3, 2)).transpose(0, 1, 3, 2)  # eq:attn-scores  (B, H, T, T)
    scores += causal_mask(x.shape[1], np.dtype(scores.dtype), column_major=True)  # eq:attn-mask
    att, att_cache = softmax_forward(scores)  # eq:attn-softmax
    if trace is not None:
        trace["attention"] = att
    heads = att @ v  # eq:attn-mix  (B, H, T, dh)
    y, o_cache = linear_forward(merge_heads(heads), p["wo"], p["bo"])  # eq:attn-out
    cache = AttentionCache(q_scaled, k, v, att, att_cache, qkv_cache, o_cache)
    return y, cache


def attention_backward(dy, cache):
    """Gradients of attention with respect to its input and its parameters.

    Parameters
    ----------
    dy : ndarray of shape (B, T, d)
        Gradient with respect to the output.
    cache : AttentionCache
        The cache from `attention_forward`.

    Returns
    -------
    dx : ndarray of shape (B, T, d)
        Gradient with respect to x.
    grads : dict
        Gradient of each parameter, with the keys of p.
    """
    q_scaled, k, v, att, att_cache, qkv_cache, o_cache = cache
    num_heads = k.shape[1]
    scale = 1.0 / math.sqrt(k.shape[-1])
    dheads, dwo, dbo = linear_backward(dy, o_cache)  # eq:attn-grad-out
    dheads = split_heads(dheads, num_heads)  # eq:attn-grad-merge  (B, H, T, dh)
    datt = (v @ dheads.transpose(0, 1, 3, 2)).transpose(0, 1, 3, 2)  # eq:attn-grad-mix  (B, H, T, T), laid out as att
    dv = att.transpose(0, 1, 3, 2) @ dheads  # eq:attn-grad-mix  (B, H, T, dh)
    # The masked entries have att = 0, so their dscores are exactly 0.
    dscores = softmax_backward(datt, att_cache)  # eq:attn-grad-softmax eq:attn-softmax-jacobian eq:attn-grad-masked
    dq = (dscores @ k) * scale  # eq:attn-grad-qk  (B, H, T, dh)
    dk = dscores.transpose(0, 1, 3, 2) @ q_scaled  # eq:attn-grad-qk  (B, H, T, dh)
    dx, qkv_grads = qkv_backward((dq, dk, dv), qkv_cache)
    grads = {**qkv_grads, "wo": dwo, "bo": dbo}
    return dx, grads
