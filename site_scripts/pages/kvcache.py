"""Generator of the KV cache page: the values its prose shows (docs/generation/kv-cache.md binds them), its tables
and its pictures. The tiny example decodes one token at a time against the full forward, and again through a
paged cache; the paged parts (two requests over one pool) are site_scripts/pages/_paged.py's, the decoding
benchmark _bench.py's."""

import numpy as np

from transformer.config import PRESETS
from transformer.generate import decode_step, prefill
from transformer.kv_cache import KVCache, PagedCache, PagePool
from transformer.model import forward, init_params

from .. import gpt2_cost, sections
from ..examples import SEED, TINY_IDS, default_note, tiny
from ._bench import fragments as bench_fragments
from ._paged import PAGE_SIZE as PAGED_SIZE, held_bytes, pages, sizes, symbol_rows

TINY_PAGE = 2  # positions per page of the tiny example's paged cache


# ---------------------------------------------------------------- the tiny example

def example():
    """TINY_IDS fed one at a time to decode_step against the full forward; the same ids prefilled in one pass;
    and through a paged cache. Tables and values."""
    ex = tiny()
    cfg, full = ex.cfg, ex.trace["logits"][0]
    cache = KVCache(cfg, np.float64)
    rows, gaps = [], []
    for t, token in enumerate(TINY_IDS):
        logits = decode_step(ex.params, token, cache, cfg)
        gaps.append(float(np.abs(logits - full[t]).max()))
        rows.append([t, token, cache.length, " ".join(f"{v:.4f}" for v in logits), f"{gaps[-1]:.1e}"])
    filled = KVCache(cfg, np.float64)
    at_once = prefill(ex.params, TINY_IDS, filled, cfg)
    prefill_keys = max(float(np.abs(a[:, :filled.length] - b[:, :filled.length]).max())
                       for a, b in zip(filled.keys + filled.values, cache.keys + cache.values))
    paged_table, paged_values = paged_example(ex, cache)
    tables = {"decode": sections.md_table(["\\(t\\)", "token id", "cache length after", "\\(z\\) from the cache",
                                           "max gap to forward"], rows),
              "keys": sections.array_md("keys[0][head 0]", cache.keys[0][0], row_label="position"),
              "paged_decode": paged_table}
    values = {"sizes": sizes(cfg), "decode_gap": max(gaps), "prefill_gap": float(np.abs(at_once - logits).max()),
              "prefill_keys_gap": prefill_keys, "paged": paged_values}
    return tables, values


def paged_example(ex, contiguous):
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
    table = sections.md_table(["\\(t\\)", "token id", "page table after", "(page, offset) of \\(t\\)",
                               "max gap to forward"], rows)
    return table, {"pages": pool.num_pages, "size": TINY_PAGE,
                   "keys_gap": float(np.abs(keys - contiguous.keys[0][:, :cache.length]).max())}


# ---------------------------------------------------------------- what the cache saves

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


def cost():
    cfg = PRESETS["default"]
    params = init_params(cfg, seed=SEED)
    T = cfg.context_len
    counts = attention_counts(params, cfg)
    per_position = sum(params[f"b0.{k}"].size for k in LINEAR_WEIGHTS)  # multiply-adds of one row through a block
    marks = sorted({0, 1, T // 4 - 1, T // 2 - 1, T - 1})
    rows = [[t, t + 1, f"{counts[t][0]:,}", f"{counts[t][1]:,}", f"{counts[t][1] / counts[t][0]:g}",
             f"{per_position:,}", f"{(t + 1) * per_position:,}"] for t in marks]
    table = sections.md_table(["step \\(t\\)", "positions attended", "attention, cache", "attention, no cache",
                               "ratio", "linear, cache", "linear, no cache"], rows)
    with_total, without_total = sum(c[0] for c in counts), sum(c[1] for c in counts)
    empty = KVCache(cfg, np.float64)
    values = {"sizes": sizes(cfg), "head_dim": cfg.head_dim, "per_position": per_position, "T": T,
              "with": with_total, "without": without_total, "ratio": without_total / with_total,
              "linear_with": T * per_position, "linear_without": per_position * T * (T + 1) // 2,
              "cache_size": sum(k.size + v.size for k, v in zip(empty.keys, empty.values))}
    values["linear_ratio"] = values["linear_without"] / values["linear_with"]
    return table, values


# ---------------------------------------------------------------- the symbols

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
    example_tables, example_values = example()
    cost_table, cost_values = cost()
    picture, lease_table, pages_values = pages()
    bytes_table, bytes_values = held_bytes()
    bench_tables, bench_values = bench_fragments()
    values = {"seed": SEED, "ids": TINY_IDS, "example": example_values, "cost": cost_values, "pages": pages_values,
              "bytes": bytes_values, "bench": bench_values, "gpt2": gpt2_cost.cited()}
    return {"values": values, "pages.png": picture, **example_tables, "cost": cost_table, "leases": lease_table,
            "bytes": bytes_table, **bench_tables, "symbols": symbols_md()}
