"""Token and position embedding: a lookup into two tables, added together."""

import numpy as np


def embedding_forward(ids, tok_emb, pos_emb):
    """X[b, t] = tok_emb[ids[b, t]] + pos_emb[t].

    ids (B, T) ints, tok_emb (V, d), pos_emb (T_max, d) -> x (B, T, d), cache
    """
    T = ids.shape[-1]
    x = tok_emb[ids] + pos_emb[:T]  # eq:embed  (B, T, d)
    cache = (ids, tok_emb.shape, pos_emb.shape)
    return x, cache


def embedding_backward(dx, cache):
    """Scatter the gradient back into the rows that were looked up.

    dx (B, T, d) -> dtok_emb (V, d), dpos_emb (T_max, d)
    """
    ids, tok_shape, pos_shape = cache
    d = tok_shape[1]
    dtok_emb = np.zeros(tok_shape, dtype=dx.dtype)
    # np.add.at accumulates: a token id that occurs k times receives k
    # contributions. Plain `dtok_emb[ids] += dx` would keep only the last one.
    np.add.at(dtok_emb, ids.reshape(-1), dx.reshape(-1, d))  # eq:embed-grad
    T = ids.shape[-1]
    dpos_emb = np.zeros(pos_shape, dtype=dx.dtype)
    dpos_emb[:T] = dx.reshape(-1, T, d).sum(axis=0)  # each position is used once per sequence
    return dtok_emb, dpos_emb
