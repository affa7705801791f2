"""Generator of the Embeddings page's fragments (see site_scripts/build.py)."""

import numpy as np

from transformer.embedding import embedding_backward, embedding_forward

from .. import sections
from ..examples import H_STEP, SEED, TINY_IDS, default_note, default_run, illustrative, tiny, weighted_sum


def example_md():
    ex = tiny()
    params = ex.params
    x, cache = embedding_forward(ex.ids, params["tok_emb"], params["pos_emb"])
    dx = np.arange(1, x.size + 1, dtype=float).reshape(x.shape) / 10
    dtok, dpos = embedding_backward(dx, cache)
    repeated = [v for v in set(TINY_IDS) if TINY_IDS.count(v) > 1]
    return "\n".join([
        illustrative(f"ids `{TINY_IDS}` (one sequence); the tables as initialised."),
        sections.array_md("tok_emb", params["tok_emb"], row_label="token id"),
        sections.array_md("pos_emb", params["pos_emb"], row_label="position"),
        sections.array_md("X = tok_emb[ids] + pos_emb[:T]", x[0], row_label="position"),
        "Backward, with an upstream gradient `dX` whose entries are 0.1, 0.2, ... so that each "
        "contribution can be traced:\n",
        sections.array_md("dX", dx[0], row_label="position"),
        sections.array_md("dtok_emb", dtok, row_label="token id"),
        f"Token {repeated[0]} occurs {TINY_IDS.count(repeated[0])} times, so its row of `dtok_emb` is the sum "
        f"of rows {[t for t, v in enumerate(TINY_IDS) if v == repeated[0]]} of `dX`; ids that do not occur get "
        "zero rows. `dpos_emb` is `dX` summed over the batch (one sequence here), padded with zero rows up to "
        "T_max:\n",
        sections.array_md("dpos_emb", dpos, row_label="position"),
    ])


def symbols_md():
    ex = default_run()
    cfg, ids = ex.cfg, np.zeros(ex.ids.shape, dtype=np.int64)
    tok, pos = np.zeros((cfg.vocab_size, cfg.emb_dim)), np.zeros((cfg.context_len, cfg.emb_dim))
    x, cache = embedding_forward(ids, tok, pos)
    dtok, dpos = embedding_backward(np.ones_like(x), cache)
    rows = [
        (r"\mathrm{id}", "ids", ids.shape),
        (r"E_{\mathrm{tok}}", "tok_emb", tok.shape),
        (r"E_{\mathrm{pos}}", "pos_emb", pos.shape),
        (r"X^{(0)}", "x", x.shape),
        (r"\partial\ell/\partial E_{\mathrm{tok}}", "dtok_emb", dtok.shape, "scatter-added over the positions of each id"),
        (r"\partial\ell/\partial E_{\mathrm{pos}}", "dpos_emb", dpos.shape, "summed over the batch"),
    ]
    return sections.symbols_md(rows, default_note())


def gradcheck_md():
    ex = tiny()
    ids = np.array([TINY_IDS, TINY_IDS[::-1]])  # two sequences, repeated ids
    tok, pos = ex.params["tok_emb"].copy(), ex.params["pos_emb"].copy()
    dx = np.random.default_rng(SEED).standard_normal((*ids.shape, ex.cfg.emb_dim))
    dtok, dpos = embedding_backward(dx, embedding_forward(ids, tok, pos)[1])
    rows = sections.gradcheck_rows(weighted_sum(dx, embedding_forward, ids, tok, pos),
                                   [("dtok_emb", dtok, tok), ("dpos_emb", dpos, pos)], H_STEP)
    return (f"f = Σ X ⊙ dX for ids `{ids.tolist()}` (a repeated id in each sequence) and a random dX "
            f"(seed {SEED}).\n\n" + sections.gradcheck_table(rows))


def generate(context):
    return {"symbols": symbols_md(), "example": example_md(), "gradcheck": gradcheck_md()}
