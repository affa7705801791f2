"""Generator of the KV cache page's fragments."""

import numpy as np

from transformer.config import PRESETS
from transformer.generate import KVCache, decode_step
from transformer.model import init_params

from .. import sections
from ..examples import SEED, TINY_IDS, default_note, illustrative, tiny


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
        sections.md_table(["t", "token", "cache length after", "logits from the cache", "max gap to forward"], rows),
        f"Block 0's cached keys after the last step, head 0 (rows = positions; the rest of the {cfg.context_len} "
        "rows are still zero):\n",
        sections.array_md("keys[0][head 0]", cache.keys[0][0], row_label="position"),
    ])


def cost_md():
    cfg = PRESETS["default"]
    T = cfg.context_len
    with_cache = T  # one position through the model per new token
    without = T * (T + 1) // 2  # the whole prefix again for every new token
    return (f"Generating T = {T} tokens at {default_note(batch=False)}: with the cache the model processes one "
            f"position per token, {with_cache} in all; without it, the whole prefix each time, 1 + 2 + … + {T} = "
            f"{without} positions, {without / with_cache:.1f} times as many. Attention itself still reads every "
            "cached key and value, so each step's attention cost grows with t either way.\n")


def symbols_md():
    cfg = PRESETS["default"]
    params = init_params(cfg, seed=SEED)
    cache = KVCache(cfg, np.float64)
    logits = decode_step(params, 0, cache, cfg)
    rows = [
        (r"K_{0:t}, V_{0:t}", "cache.keys[l], cache.values[l]", cache.keys[0].shape,
         "one block's, filled up to `length`"),
        (r"q_t, k_t, v_t", "q, k, v", (cfg.emb_dim,), "the new position's"),
        (r"t", "pos = cache.length", "int", "the new position"),
        (r"o_t", "heads", (cfg.emb_dim,), "the new position's"),
        (r"z", "logits", logits.shape, "the new position's next-token logits"),
    ]
    return sections.symbols_md(rows, default_note(batch=False))


def generate(context):
    return {"symbols": symbols_md(), "example": example_md(), "cost": cost_md()}
