"""Token and position embedding: a lookup into two tables, added together."""

from typing import NamedTuple

import numpy as np


class EmbeddingCache(NamedTuple):
    """What `embedding_forward` keeps for `embedding_backward`: which rows were read, and the tables' shapes.

    Attributes
    ----------
    ids : ndarray of shape (B, T)
        Which table rows were read, so which receive gradient.
    tok_shape : tuple
        (n_V, d), the shape of tok_emb, to allocate its gradient (the table itself is not kept).
    pos_shape : tuple
        (T_max, d), the shape of pos_emb, likewise.
    """

    ids: np.ndarray
    tok_shape: tuple
    pos_shape: tuple


def embedding_forward(ids, tok_emb, pos_emb):
    """Embed tokens as their token row plus their position row: `x[w, t] = tok_emb[ids[w, t]] + pos_emb[t]`.

    Parameters
    ----------
    ids : ndarray of shape (B, T)
        Integer token ids.
    tok_emb : ndarray of shape (n_V, d)
        The token embedding table.
    pos_emb : ndarray of shape (T_max, d)
        The position embedding table; its first T rows are used.

    Returns
    -------
    x : ndarray of shape (B, T, d)
        The embedded sequence.
    cache : EmbeddingCache
        What `embedding_backward` needs.
    """
    T = ids.shape[-1]
    x = tok_emb[ids] + pos_emb[:T]  # eq:embed eq:embed-onehot  (B, T, d)
    cache = EmbeddingCache(ids, tok_emb.shape, pos_emb.shape)
    return x, cache


def embedding_backward(dx, cache):
    """Scatter the gradient back into the table rows that the forward pass looked up.

    Parameters
    ----------
    dx : ndarray of shape (B, T, d)
        Gradient of the loss with respect to the embedding output.
    cache : EmbeddingCache
        The cache from `embedding_forward`.

    Returns
    -------
    dtok_emb : ndarray of shape (n_V, d)
        Gradient of the token table.
    dpos_emb : ndarray of shape (T_max, d)
        Gradient of the position table.
    """
    ids, tok_shape, pos_shape = cache
    d = tok_shape[1]
    dtok_emb = np.zeros(tok_shape, dtype=dx.dtype)
    # np.add.at accumulates: a token id that occurs k times receives k
    # contributions. Plain `dtok_emb[ids] += dx` would keep only the last one.
    # Each entry is given its own index into the flattened table (row v, column j
    # at v*d + j): numpy's add.at is several times faster on single entries than
    # on whole rows (tools/bench_kernels.py), and adds the same terms in the same order.
    rows = ids.reshape(-1, 1).astype(np.intp)  # as wide as an index: uint8 ids times d would wrap around
    entries = (rows * d + np.arange(d)).reshape(-1)  # (B*T*d,): row ids[n], every column
    np.add.at(dtok_emb.reshape(-1), entries, dx.reshape(-1))  # eq:embed-grad eq:embed-grad-tok
    T = ids.shape[-1]
    dpos_emb = np.zeros(pos_shape, dtype=dx.dtype)
    dpos_emb[:T] = dx.reshape(-1, T, d).sum(axis=0)  # eq:embed-grad-pos  each position is used once per sequence
    return dtok_emb, dpos_emb
