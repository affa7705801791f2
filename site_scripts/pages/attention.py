"""Generator of the Attention page's fragments."""

import numpy as np

from transformer.attention import attention_backward, attention_forward
from transformer.block import ATTENTION_KEYS, block_params

from .. import sections
from ..examples import H_STEP, SEED, TINY_IDS, biases_moved, default_note, default_run, illustrative, tiny, weighted_sum


def example_md():
    ex = tiny()
    cfg, dh = ex.cfg, ex.cfg.head_dim
    a, p = ex.trace["b0.ln1"], block_params(ex.params, 0)
    att = ex.trace["b0.attention"][0]  # (H, T, T)
    y, _ = attention_forward(a, p, cfg.num_heads)
    parts = [illustrative(f"Block 0 of the tiny model on ids `{TINY_IDS}`: its input is the LN1 output "
                          f"below; {cfg.num_heads} heads of width d/H = {dh}.")]
    parts.append(sections.array_md("LN1(X)", a[0], row_label="position"))
    q = a[0] @ p["wq"] + p["bq"]
    k = a[0] @ p["wk"] + p["bk"]
    scores = (q[:, :dh] @ k[:, :dh].T) / np.sqrt(dh)
    masked = scores + np.triu(np.full(scores.shape, -np.inf), 1)
    parts.append(f"Head 0, step by step (its slice is the first d/H = {dh} columns of Q and K; recomputed here from "
                 "the equations, independently of `attention_forward`):\n")
    parts.append(sections.array_md("Q = LN1(X) W_q + b_q", q, row_label="position"))
    parts.append(sections.array_md("K = LN1(X) W_k + b_k", k, row_label="position"))
    parts.append(sections.array_md("S = Q K^T / √dh (head 0)", scores, row_label="query t"))
    parts.append(sections.md_table(["`S` masked (head 0)", *map(str, range(masked.shape[1]))],
                                   [[t, *("−∞" if np.isinf(v) else f"{v:.4f}" for v in row)]
                                    for t, row in enumerate(masked)]))
    soft = np.exp(masked - masked.max(-1, keepdims=True))
    soft /= soft.sum(-1, keepdims=True)
    parts.append(f"Its softmax, row by row, is head 0's A below (largest difference from `attention_forward`'s: "
                 f"{np.abs(soft - att[0]).max():.1e}).\n")
    for h in range(cfg.num_heads):
        parts.append(f"Head {h}: attention weights A (row = query position t, column = key position s).\n")
        parts.append(sections.array_md(f"A (head {h})", att[h], row_label="query t"))
    upper = att[:, np.triu_indices(att.shape[-1], 1)[0], np.triu_indices(att.shape[-1], 1)[1]]
    parts.append(f"Every entry above the diagonal is exactly {upper.max():g}: position t never sees a later "
                 f"position. Each row sums to 1 (largest deviation {np.abs(att.sum(-1) - 1).max():.1e}); row 0 "
                 "can only attend to itself.\n")
    parts.append(sections.array_md("Attn(LN1(X))", y[0], row_label="position"))
    return "\n".join(parts)


def symbols_md():
    ex = default_run()
    p, x = block_params(ex.params, 0), ex.trace["b0.ln1"]
    y, cache = attention_forward(x, p, ex.cfg.num_heads)
    q_scaled, k, v, att, *_ = cache
    dx, _ = attention_backward(np.ones_like(y), cache)
    rows = [
        (r"U_1", "x", x.shape, "block 0's LN1 output"),
        (r"W_q, W_k, W_v, W_o", "wq, wk, wv, wo", p["wq"].shape, "(q, k and v as one (d, 3d) matmul)"),
        (r"b_q, b_k, b_v, b_o", "bq, bk, bv, bo", p["bq"].shape),
        (r"Q^{(h)}, K^{(h)}, V^{(h)}", "q, k, v", k.shape),
        (r"Q^{(h)}/\sqrt{d_h}", "q_scaled", q_scaled.shape),
        (r"d_h", "cfg.head_dim", f"{ex.cfg.head_dim}"),
        (r"S^{(h)}", "scores", att.shape),
        (r"\alpha^{(h)}", "att", att.shape),
        (r"O^{(h)}", "heads", v.shape),
        (r"\operatorname{Attn}(U_1)", "y", y.shape),
        (r"\partial\ell/\partial U_1", "dx", dx.shape),
    ]
    return sections.symbols_md(rows, default_note())


def gradcheck_md():
    ex, rng = tiny(), np.random.default_rng(SEED)
    p = biases_moved(block_params(ex.params, 0), rng)
    x = rng.standard_normal((2, ex.cfg.context_len, ex.cfg.emb_dim))
    dy = rng.standard_normal(x.shape)
    dx, grads = attention_backward(dy, attention_forward(x, p, ex.cfg.num_heads)[1])
    checks = [("dx", dx, x)] + [(f"d{k}", grads[k], p[k]) for k in ATTENTION_KEYS]
    rows = sections.gradcheck_rows(weighted_sum(dy, attention_forward, x, p, ex.cfg.num_heads), checks, H_STEP)
    return (f"f = Σ Attn(X) ⊙ dY on the tiny model's block 0 parameters (biases moved off zero), random X of "
            f"shape {x.shape} and dY (seed {SEED}). The key bias gradient is zero in exact arithmetic: adding "
            "the same vector to every key adds the same number to every score of a row, which the softmax "
            "ignores; its row passes on the absolute floor.\n\n" + sections.gradcheck_table(rows))


def generate(context):
    return {"symbols": symbols_md(), "example": example_md(), "gradcheck": gradcheck_md()}
