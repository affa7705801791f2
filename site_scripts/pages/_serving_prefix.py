"""The Serving page's prefix cache: many requests with one system prompt, served with and without sharing its
pages, counted (positions computed, positions reused, pages held at the peak and their bytes) and compared
(the tokens drawn and the logits they were drawn from)."""

import numpy as np

from transformer.kv_cache import PagePool
from transformer.prefix_cache import PrefixPool
from transformer.scheduler import Request, Scheduler

REQUESTS, SYSTEM_PAGES, OWN, NEW, PAGE = 16, 3, 4, 8, 16  # requests; pages of system prompt; own tokens; added; S


def served(params, cfg, pool, system, rng_seed):
    rng = np.random.default_rng(rng_seed)
    requests = [Request(system + rng.integers(0, cfg.vocab_size, OWN).tolist(), NEW, seed=i) for i in range(REQUESTS)]
    return served_on(params, cfg, pool, requests), requests


def prefix(params, cfg, seed):
    """The counts and comparisons of the page's prefix-cache section, both runs on pools of the same size."""
    system = np.random.default_rng(seed).integers(0, cfg.vocab_size, SYSTEM_PAGES * PAGE).tolist()
    num_pages = REQUESTS * -(-(len(system) + OWN + NEW) // PAGE)
    runs = {name: served(params, cfg, kind(cfg, num_pages, PAGE, params["tok_emb"].dtype), system, seed + 1)
            for name, kind in (("plain", PagePool), ("prefix", PrefixPool))}
    (plain, a), (shared, b) = runs["plain"], runs["prefix"]
    page_bytes = sum(k[0].nbytes + v[0].nbytes for k, v in zip(shared.pool.keys, shared.pool.values))
    gaps = [float(np.abs(x - y).max() / np.abs(x).max()) for p, q in zip(a, b) for x, y in zip(p.drawn_from, q.drawn_from)]
    if any(p.new != q.new for p, q in zip(a, b)):
        raise RuntimeError("the prefix cache changed a token: the page would claim what it did not show")
    return {"requests": REQUESTS, "system_pages": SYSTEM_PAGES, "system": len(system), "own": OWN, "new": NEW,
            "page": PAGE, "computed": {"plain": plain.computed, "prefix": shared.computed}, "reused": shared.reused,
            "work": plain.computed / shared.computed, "peak": {"plain": plain.peak, "prefix": shared.peak},
            "bytes": {"plain": plain.peak * page_bytes, "prefix": shared.peak * page_bytes},
            "held": plain.peak / shared.peak, "gap": max(gaps), "tokens": sum(len(r.new) for r in a)}


def conversation(params, cfg, seed):
    """Two turns of a conversation on one prefix-cached pool: the second turn's text is the first's, its answer
    and a question of its own, so it adopts the pages the first turn's prompt and answer filled; its tokens are
    compared with the second turn served alone on plain pages."""
    rng = np.random.default_rng(seed)
    first = Request(rng.integers(0, cfg.vocab_size, PAGE + OWN).tolist(), PAGE, seed=0)
    pages, dtype = 2 * cfg.context_len // PAGE, params["tok_emb"].dtype
    pool = PrefixPool(cfg, pages, PAGE, dtype)
    served_on(params, cfg, pool, [first])
    text = first.prompt + first.new + rng.integers(0, cfg.vocab_size, OWN).tolist()
    turn, alone = Request(text, NEW, seed=1), Request(text, NEW, seed=1)
    second = served_on(params, cfg, pool, [turn])
    served_on(params, cfg, PagePool(cfg, pages, PAGE, dtype), [alone])
    if turn.new != alone.new:
        raise RuntimeError("the adopted pages changed a token of the second turn")
    fed = len(first.prompt) + len(first.new) - 1  # the first turn's last token is drawn, never fed
    return {"prompt": len(first.prompt), "answer": len(first.new), "own": OWN, "text": len(text), "page": PAGE,
            "pages": fed // PAGE, "prompt_pages": len(first.prompt) // PAGE, "reused": second.reused,
            "computed": second.computed, "new": NEW}


def served_on(params, cfg, pool, requests):
    """Serve the requests together on the pool; the scheduler, with its counts."""
    scheduler = Scheduler(params, cfg, pool, max_batch=len(requests))
    for r in requests:
        scheduler.submit(r)
    scheduler.run()
    return scheduler
