"""Generator of the KV cache page's fragments."""

import numpy as np

from transformer.config import PRESETS
from transformer.generate import decode_step
from transformer.kv_cache import KVCache, PagedCache, PagePool
from transformer.model import forward, init_params

from .. import sections
from ..examples import SEED, TINY_IDS, default_note, illustrative, tiny
from ._bench import fragments as bench_fragments
from ._paged import PAGE_SIZE as PAGED_SIZE, bytes_md, pages_md, symbol_rows

TINY_PAGE = 2  # positions per page of the tiny example's paged cache


def example_md():
    ex = tiny()
    cfg, full = ex.cfg, ex.trace["logits"][0]
    cache = KVCache(cfg, np.float64)
    rows = []
    for t, token in enumerate(TINY_IDS):
        logits = decode_step(ex.params, token, cache, cfg)
        rows.append([t, token, cache.length, " ".join(f"{v:.4f}" for v in logits),
                     f"{np.abs(logits - full[t]).max():.1e}"])
    return "\n".join([
        illustrative(f"ids `{TINY_IDS}` fed one at a time to `decode_step`, each result compared with row t of "
                     "the full `forward` over all the ids."),
        sections.md_table(["\\(t\\)", "token id", "cache length after", "\\(z\\) from the cache",
                           "max gap to forward"], rows),
        f"Block 0's cached keys after the last step, head 0 (rows = positions; the rest of the {cfg.context_len} "
        "rows are still zero):\n",
        sections.array_md("keys[0][head 0]", cache.keys[0][0], row_label="position"),
        paged_example_md(ex, cache),
    ])


def paged_example_md(ex, contiguous):
    """The same ids through a paged cache: its page table after each step, and its logits and keys against the
    contiguous cache's."""
    cfg, full = ex.cfg, ex.trace["logits"][0]
    pool = PagePool(cfg, cfg.context_len // TINY_PAGE, TINY_PAGE, np.float64)
    cache = PagedCache(pool, cfg.context_len)
    rows = []
    for t, token in enumerate(TINY_IDS):
        logits = decode_step(ex.params, token, cache, cfg)
        rows.append([t, token, f"`{cache.pages}`", f"{cache.slot(t)}", f"{np.abs(logits - full[t]).max():.1e}"])
    keys, _ = cache.read(0, cache.length)
    gap = np.abs(keys - contiguous.keys[0][:, :cache.length]).max()
    return ("\nThe same ids through a `PagedCache` over a pool of "
            f"{pool.num_pages} pages of {TINY_PAGE} positions; (page, offset) is `cache.slot(t)`, where position "
            "\\(t\\)'s key and value went:\n\n"
            + sections.md_table(["\\(t\\)", "token id", "page table after", "(page, offset) of \\(t\\)",
                                 "max gap to forward"], rows)
            + f"\nBlock 0's keys read back through the page table differ from the contiguous cache's above by "
              f"{sections.gap_text(gap)}.\n")


LINEAR_WEIGHTS = ("wq", "wk", "wv", "wo", "ff1_w", "ff2_w")  # a block's matrices, each used once per position


def attention_counts(params, cfg):
    """Per step t, per block: (multiply-adds of the scores and the weighted values with the cache, read off the
    cached keys decode_step attends over; the same without the cache, read off the attention weights of the full
    forward over the prefix of t + 1 positions). Each score and each value entry costs d_h multiply-adds."""
    cache, counts = KVCache(cfg, np.float64), []
    for t in range(cfg.context_len):
        decode_step(params, t % cfg.vocab_size, cache, cfg)
        cached = cache.keys[0][:, :cache.length]  # (H, t + 1, d_h): every key step t reads
        trace = {}
        forward(params, np.arange(t + 1)[None] % cfg.vocab_size, cfg, trace)
        weights = trace["b0.attention"]  # (1, H, t + 1, t + 1): every score the full forward computes
        counts.append((2 * cached.size, 2 * weights.size * cfg.head_dim))
    return counts


def cost_md():
    cfg = PRESETS["default"]
    params = init_params(cfg, seed=SEED)
    T, d = cfg.context_len, cfg.emb_dim
    counts = attention_counts(params, cfg)
    per_position = sum(params[f"b0.{k}"].size for k in LINEAR_WEIGHTS)  # multiply-adds of one row through a block
    marks = sorted({0, 1, T // 4 - 1, T // 2 - 1, T - 1})
    rows = [[t, t + 1, f"{counts[t][0]:,}", f"{counts[t][1]:,}", f"{counts[t][1] / counts[t][0]:g}",
             f"{per_position:,}", f"{(t + 1) * per_position:,}"] for t in marks]
    with_total, without_total = sum(c[0] for c in counts), sum(c[1] for c in counts)
    linear_without = per_position * T * (T + 1) // 2
    empty = KVCache(cfg, np.float64)
    cache_size = sum(k.size + v.size for k, v in zip(empty.keys, empty.values))
    if any(c != (2 * (t + 1) * d, 2 * (t + 1) ** 2 * d) for t, c in enumerate(counts)):
        raise RuntimeError("the counts read off the arrays are not 2(t+1)d and 2(t+1)²d: the text below is wrong")
    return (f"Multiply-adds per block at {default_note(batch=False)}, read off the arrays the code multiplies: "
            "with the cache, the cached keys step \\(t\\) attends over; without it, the attention weights of the "
            "full forward over the prefix; each score, and each weight applied to a value, costs "
            f"\\(d_h\\) = {cfg.head_dim} multiply-adds. The linear layers (\\(W_q, W_k, W_v, W_o, W_1, W_2\\)) cost "
            f"{per_position:,} per position.\n\n"
            + sections.md_table(["step \\(t\\)", "positions attended", "attention, cache",
                                 "attention, no cache", "ratio", "linear, cache", "linear, no cache"],
                                rows)
            + "\nAt every step the counts are exactly \\(2(t+1)\\,d\\) with the cache "
              f"and \\(2(t+1)^2 d\\) without (\\(d\\) = {d}): with the cache each step's attention grows linearly "
              "in \\(t\\), without it quadratically, and the ratio is the number of positions, \\(t + 1\\). Over a "
              f"whole context of {T} steps, attention costs {with_total:,} multiply-adds per block with the cache and "
              f"{without_total:,} without ({without_total / with_total:.1f} times as many), the linear layers "
              f"{T * per_position:,} and {linear_without:,} ({linear_without / (T * per_position):.1f} times). "
              "The full forward also computes the masked half of each score matrix, which the mask then discards. "
              f"The cache itself holds {cache_size:,} numbers (keys and values of {cfg.num_layers} blocks, {T} "
              "positions, width \\(d\\)).\n")


SYMBOL_STEPS = 3  # tokens decoded before the symbols are recorded, so that K_{0:t} has more than one row


def symbols_md():
    cfg = PRESETS["default"]
    params = init_params(cfg, seed=SEED)
    cache = KVCache(cfg, np.float64)
    for token in range(SYMBOL_STEPS):
        logits = decode_step(params, token, cache, cfg)
    t = cache.length - 1  # the position the last decode_step fed
    attended = cache.keys[0][:, :t + 1]  # what decode_step's `keys[:, :pos + 1]` reads at that step
    buffer = cache.keys[0].shape
    rows = [
        (r"K_{0:t}, V_{0:t}", "keys[:, :pos + 1], values[:, :pos + 1]", attended.shape,
         f"one block's, at \\(t\\) = {t}: the first \\(t + 1\\) = {t + 1} positions of that block's buffers "
         f"`cache.keys[l]`, `cache.values[l]`, which have room for all \\(T_{{\\max}}\\) positions (shape "
         f"{sections.shape_text(buffer)}, zero past `cache.length`)"),
        (r"q_t, k_t, v_t", "q, k, v", (cfg.emb_dim,), "the new position's"),
        (r"t", "pos = cache.length", "int", f"the new position ({t} in this recording)"),
        (r"o_t", "heads", (cfg.emb_dim,), "the new position's"),
        (r"z", "logits", logits.shape, "the new position's next-token logits"),
    ]
    return sections.symbols_md(rows + symbol_rows(), default_note(batch=False)
                               + f", after {SYMBOL_STEPS} tokens fed to `decode_step` (the paged symbols: two "
                               f"requests over pages of {PAGED_SIZE} positions, as below)")


def generate(context):
    return {"symbols": symbols_md(), "example": example_md(), "cost": cost_md(), "pages": pages_md(),
            "bytes": bytes_md(), **bench_fragments()}
