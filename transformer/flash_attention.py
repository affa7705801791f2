"""Flash attention: the causal attention of attention.py, computed one tile of keys at a time.

The materialized path keeps the (B, H, T, T) attention probabilities for its backward. This path never
holds them: it walks the keys in tiles of `tile` columns and keeps, for every query row, the running
maximum m of its scores, the running sum l of their exponentials and the running weighted sum of values.
When a tile raises a row's maximum, the sum and the partial output are rescaled by exp(m_old - m_new), so
after the last tile they are exactly what one softmax over the whole row gives. The backward recomputes
each tile's probabilities from the saved m and l.

Each step sweeps all the query rows that can see the tile at once (numpy's vectorisation stands in for
the query tiles a GPU kernel runs in parallel), so the largest array either pass makes is
(B, H, T, max(tile, dh)): linear in T, and never (T, T).
"""

import math
from typing import NamedTuple

import numpy as np

from .attention import merge_heads, qkv_backward, qkv_forward, split_heads
from .config import is_int
from .errors import InputError
from .linear import linear_backward, linear_forward
from .softmax import check_not_fully_masked


def diagonal_mask(size, dtype):
    """The causal mask inside a tile on the diagonal: query row i of the tile sees key column j when j <= i.

    Parameters
    ----------
    size : int
        The tile's width (the last tile may be narrower than the others).
    dtype : numpy.dtype
        The dtype of the scores it is added to.

    Returns
    -------
    ndarray of shape (size, size)
        0 on and below the diagonal, -inf above it.
    """
    return np.triu(np.full((size, size), -np.inf, dtype=dtype), k=1)


def tile_scores(q_scaled, k, start, stop):
    """The scores of key tile [start, stop) against every query that can see it (rows start to T-1).

    Parameters
    ----------
    q_scaled : ndarray of shape (B, H, T, dh)
        The queries, already times 1/sqrt(dh).
    k : ndarray of shape (B, H, T, dh)
        The keys.
    start, stop : int
        The tile's first key and one past its last.

    Returns
    -------
    ndarray of shape (B, H, T - start, stop - start)
        Row r holds query start + r; the keys it may not see (only in the tile's first stop - start rows)
        are -inf.
    """
    s = q_scaled[:, :, start:] @ k[:, :, start:stop].transpose(0, 1, 3, 2)  # eq:flash-tile-scores
    s[:, :, : stop - start] += diagonal_mask(stop - start, s.dtype)  # eq:flash-tile-scores
    return s


def check_tile(tile):
    """Refuse a tile that is not a positive integer: 0 would stop range() inside, a negative one would leave every
    row's sum at 0 and the output NaN without an error."""
    if not (is_int(tile) and tile >= 1):
        raise InputError(f"flash attention's tile must be a positive integer (keys per tile), got {tile!r}")


def flash_core_forward(q_scaled, k, v, tile):
    """softmax(q_scaled k^T + mask) v, one tile of keys at a time, with the online softmax.

    Parameters
    ----------
    q_scaled, k, v : ndarray of shape (B, H, T, dh)
        The queries (already scaled), keys and values.
    tile : int
        Keys per tile; T need not be a multiple of it.

    Returns
    -------
    out : ndarray of shape (B, H, T, dh)
        The heads' outputs, equal to the materialized path's.
    row_max : ndarray of shape (B, H, T)
        m: the largest score of each query row.
    row_sum : ndarray of shape (B, H, T)
        l: the sum of exp(score - m) over each row.

    Raises
    ------
    MaskedRowError
        If a row's scores are -inf everywhere, as the materialized path's softmax raises. The causal mask
        alone never does it: each row sees its own key, the first column of its diagonal tile.
    """
    check_tile(tile)
    B, H, T, dh = q_scaled.shape
    out = np.zeros_like(q_scaled)
    row_max = np.full((B, H, T), -np.inf, dtype=q_scaled.dtype)
    row_sum = np.zeros((B, H, T), dtype=q_scaled.dtype)
    for start in range(0, T, tile):
        stop = min(start + tile, T)
        s = tile_scores(q_scaled, k, start, stop)  # (B, H, T - start, stop - start)
        m_old = row_max[..., start:]
        m_new = np.maximum(m_old, s.max(axis=-1))  # eq:flash-max
        p = np.exp(s - m_new[..., None])  # eq:flash-exp
        rescale = np.exp(m_old - m_new)  # eq:flash-rescale  (0 for a row's first tile: m_old is -inf)
        row_sum[..., start:] = rescale * row_sum[..., start:] + p.sum(axis=-1)  # eq:flash-sum
        out[:, :, start:] = rescale[..., None] * out[:, :, start:] + p @ v[:, :, start:stop]  # eq:flash-acc
        row_max[..., start:] = m_new
    check_not_fully_masked(row_max, "flash attention")
    out /= row_sum[..., None]  # eq:flash-normalise
    return out, row_max, row_sum


def flash_core_backward(dout, q_scaled, k, v, out, row_max, row_sum, tile):
    """Gradients of `flash_core_forward`, recomputing each tile's probabilities from m and l.

    Parameters
    ----------
    dout : ndarray of shape (B, H, T, dh)
        Gradient with respect to out.
    q_scaled, k, v, out : ndarray of shape (B, H, T, dh)
        The forward's inputs and output.
    row_max, row_sum : ndarray of shape (B, H, T)
        The forward's m and l.
    tile : int
        Keys per tile (any value gives the same gradients; the forward's is used).

    Returns
    -------
    dq_scaled, dk, dv : ndarray of shape (B, H, T, dh)
        Gradients with respect to the scaled queries, the keys and the values.
    """
    T = q_scaled.shape[2]
    # sum_j P_ij dP_ij = sum_j P_ij (dO_i . v_j) = dO_i . O_i: the softmax backward's row term, computed
    # once from O instead of from a whole row of P.
    big_d = np.sum(dout * out, axis=-1)  # eq:flash-d  (B, H, T)
    dq_scaled, dk, dv = np.zeros_like(q_scaled), np.empty_like(k), np.empty_like(v)
    for start in range(0, T, tile):
        stop = min(start + tile, T)
        s = tile_scores(q_scaled, k, start, stop)
        p = np.exp(s - row_max[..., start:, None]) / row_sum[..., start:, None]  # eq:flash-recompute
        dv[:, :, start:stop] = p.transpose(0, 1, 3, 2) @ dout[:, :, start:]  # eq:flash-grad-v
        dp = dout[:, :, start:] @ v[:, :, start:stop].transpose(0, 1, 3, 2)  # eq:flash-grad-p
        ds = p * (dp - big_d[..., start:, None])  # eq:flash-grad-scores
        dq_scaled[:, :, start:] += ds @ k[:, :, start:stop]  # eq:flash-grad-qk
        dk[:, :, start:stop] = ds.transpose(0, 1, 3, 2) @ q_scaled[:, :, start:]  # eq:flash-grad-qk
    return dq_scaled, dk, dv


class FlashCache(NamedTuple):
    """What `flash_attention_forward` keeps for `flash_attention_backward`: no (T, T) array.

    Attributes
    ----------
    q_scaled : ndarray of shape (B, H, T, dh)
        The queries, already times 1/sqrt(dh).
    k : ndarray of shape (B, H, T, dh)
        The keys.
    v : ndarray of shape (B, H, T, dh)
        The values.
    row_max : ndarray of shape (B, H, T)
        m, each query row's largest score.
    row_sum : ndarray of shape (B, H, T)
        l, each row's sum of exp(score - m).
    tile : int
        Keys per tile.
    qkv_cache : QKVCache
        The cache of `qkv_forward`: its three projections' `linear_forward` caches.
    o_cache : tuple
        The cache of the output projection's `linear_forward`: the merged heads, O, and wo. O is read back
        from it, so it is kept once.
    """

    q_scaled: np.ndarray
    k: np.ndarray
    v: np.ndarray
    row_max: np.ndarray
    row_sum: np.ndarray
    tile: int
    qkv_cache: tuple
    o_cache: tuple


def flash_attention_forward(x, p, num_heads, tile=8):
    """Causal multi-head self-attention, equal to `attention_forward`, without the (T, T) probabilities.

    Parameters
    ----------
    x : ndarray of shape (B, T, d)
        The input.
    p : dict
        The parameters wq, bq, wk, bk, wv, bv, wo and bo.
    num_heads : int
        H, the number of heads.
    tile : int
        Keys per tile.

    Returns
    -------
    y : ndarray of shape (B, T, d)
        The output.
    cache : FlashCache
        What `flash_attention_backward` needs (see `FlashCache`).
    """
    (q_scaled, k, v), qkv_cache = qkv_forward(x, p, num_heads)
    heads, row_max, row_sum = flash_core_forward(q_scaled, k, v, tile)
    y, o_cache = linear_forward(merge_heads(heads), p["wo"], p["bo"])  # eq:flash-out
    return y, FlashCache(q_scaled, k, v, row_max, row_sum, tile, qkv_cache, o_cache)


def flash_attention_backward(dy, cache):
    """Gradients of flash attention with respect to its input and its parameters.

    Parameters
    ----------
    dy : ndarray of shape (B, T, d)
        Gradient with respect to the output.
    cache : FlashCache
        The cache from `flash_attention_forward`.

    Returns
    -------
    dx : ndarray of shape (B, T, d)
        Gradient with respect to x.
    grads : dict
        Gradient of each parameter, with the keys of p.
    """
    q_scaled, k, v, row_max, row_sum, tile, qkv_cache, o_cache = cache
    num_heads = k.shape[1]
    dheads, dwo, dbo = linear_backward(dy, o_cache)  # eq:flash-grad-out
    heads = split_heads(o_cache.x, num_heads)  # O, from the output projection's own input
    dq_scaled, dk, dv = flash_core_backward(split_heads(dheads, num_heads), q_scaled, k, v, heads,
                                            row_max, row_sum, tile)
    dq = dq_scaled * (1.0 / math.sqrt(k.shape[-1]))  # q_scaled = q / sqrt(dh)
    dx, qkv_grads = qkv_backward((dq, dk, dv), qkv_cache)
    grads = {**qkv_grads, "wo": dwo, "bo": dbo}
    return dx, grads
