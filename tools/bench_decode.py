"""Benchmark: the cost of decoding, by strategy, context and number of concurrent requests.

Every request has a prompt of half the context and draws as many tokens again, so the last token it feeds
sits at position context - 2 and no request reaches the context limit. Three strategies:

- recompute: no cache; each new token reruns `forward` over the whole text so far;
- contiguous: `prefill` into a `KVCache`, then `decode_step` per token;
- paged: the `Scheduler` over a `PagePool`, one request at a time (`one by one`) or all of them decoded
  together in batched steps (`batched`).

Requests of the first three run one after another; tokens per second counts new tokens over the wall time
of the whole run, prefill included. Bytes per token is what a strategy's caches hold at the end of the
run (before release), divided by the positions they cache.

Each cell is measured in several rounds, the strategies alternating within a round, and reported by its
median time: one measurement of a few hundred milliseconds moves by a third when something else wakes up
on the machine, and a median of alternating rounds keeps that out of the ratios.

    python -m tools.bench_decode [--contexts 32 64 128 256] [--requests 1 4 16] [--rounds 3] [--json out.json]

The site's KV-cache page imports `measure` and `CONFIG` from here.
"""

import argparse
import json
import time
from dataclasses import asdict, dataclass, replace

import numpy as np

from transformer.config import ModelConfig
from transformer.generate import decode_step, prefill, sample_next
from transformer.kv_cache import KVCache, PagePool
from transformer.memory import keep_freed_memory
from transformer.model import forward, init_params
from transformer.scheduler import Request, Scheduler

CONFIG = ModelConfig(vocab_size=65, context_len=256, emb_dim=64, num_heads=4, num_layers=3, ff_dim=256)
CONTEXTS = (32, 64, 128, 256)
REQUESTS = (1, 4, 16)
STRATEGIES = ("recompute", "contiguous", "paged one by one", "paged batched")
PAGE_SIZE = 16
ROUNDS = 3
SEED = 0


@dataclass(frozen=True)
class Measurement:
    strategy: str
    context: int
    requests: int
    tokens: int
    seconds: float  # the median over the rounds
    bytes_per_token: float | None  # None for recompute, which keeps nothing between tokens
    rounds: int = 1

    @property
    def tokens_per_second(self):
        return self.tokens / self.seconds


def prompts(context, requests, seed=SEED):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, CONFIG.vocab_size, context // 2).tolist() for _ in range(requests)]


def recompute(params, cfg, prompt, n):
    ids, rng = list(prompt), np.random.default_rng(SEED)
    for _ in range(n):
        ids.append(sample_next(forward(params, np.array(ids), cfg)[0][-1], 1.0, None, rng))
    return None


def contiguous(params, cfg, prompt, n):
    cache, rng = KVCache(cfg, params["tok_emb"].dtype), np.random.default_rng(SEED)
    logits = prefill(params, prompt, cache, cfg)
    for i in range(n):
        token = sample_next(logits, 1.0, None, rng)
        if i < n - 1:
            logits = decode_step(params, token, cache, cfg)
    return cache.nbytes / cache.length


def paged(params, cfg, batch, n, max_batch):
    pool = PagePool(cfg, len(batch) * -(-cfg.context_len // PAGE_SIZE), PAGE_SIZE, params["tok_emb"].dtype)
    scheduler = Scheduler(params, cfg, pool, max_batch=max_batch, keep=cfg.context_len)
    held = []
    real_retire = scheduler.retire

    def retire():  # record what the caches hold before a finishing request hands its pages back
        held.append(sum(r.cache.nbytes for r in scheduler.running) / sum(r.cache.length for r in scheduler.running))
        real_retire()

    scheduler.retire = retire
    for prompt in batch:
        scheduler.submit(Request(prompt, n, seed=SEED))
    scheduler.run()
    return held[-1]


def measure(strategy, context, requests, dtype=np.float32):
    cfg = CONFIG.with_(context_len=context)
    params = init_params(cfg, SEED, dtype)
    batch, n = prompts(context, requests), context // 2
    start = time.perf_counter()
    if strategy == "recompute":
        held = [recompute(params, cfg, p, n) for p in batch][-1]
    elif strategy == "contiguous":
        held = [contiguous(params, cfg, p, n) for p in batch][-1]
    else:
        held = paged(params, cfg, batch, n, max_batch=1 if strategy == "paged one by one" else requests)
    return Measurement(strategy, context, requests, n * requests, time.perf_counter() - start, held)


def measure_all(contexts=CONTEXTS, requests=REQUESTS, strategies=STRATEGIES, rounds=ROUNDS, log=None):
    """Every cell (context, requests, strategy), each the median of `rounds` measurements taken with the
    strategies alternating."""
    keep_freed_memory()
    out = []
    for context in contexts:
        for count in requests:
            taken = [[measure(strategy, context, count) for strategy in strategies] for _ in range(rounds)]
            for cell in zip(*taken):
                seconds = float(np.median([m.seconds for m in cell]))
                out.append(replace(cell[0], seconds=seconds, rounds=rounds))
                if log:
                    log(out[-1])
    return out


def speedup(results, faster, slower, context, requests):
    """tokens/s of `faster` over `slower` in the same run, or None when the run lacks one of them."""
    cell = {(m.strategy, m.context, m.requests): m.tokens_per_second for m in results}
    if (faster, context, requests) in cell and (slower, context, requests) in cell:
        return cell[faster, context, requests] / cell[slower, context, requests]
    return None


BARS = (  # (faster, slower, context, requests, at least)
    ("contiguous", "recompute", 256, 1, 5.0),
    ("paged one by one", "recompute", 256, 1, 5.0),
    ("paged batched", "paged one by one", 256, 16, 3.0),
)


def bars(results):
    """One line per target ratio that the run measured: the ratio, the target and the verdict."""
    lines = []
    for faster, slower, context, requests, least in BARS:
        ratio = speedup(results, faster, slower, context, requests)
        if ratio is not None:
            verdict = "meets" if ratio >= least else "MISSES"
            lines.append(f"bar: {faster} / {slower} at context {context}, {requests} request(s): {ratio:.1f}x, "
                         f"{verdict} the bar of {least:g}x")
    return lines


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--contexts", type=int, nargs="+", default=list(CONTEXTS))
    parser.add_argument("--requests", type=int, nargs="+", default=list(REQUESTS))
    parser.add_argument("--rounds", type=int, default=ROUNDS, help="measurements per cell, reported by their median")
    parser.add_argument("--json", help="also write the measurements to this file")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error(f"--rounds must be at least 1, got {args.rounds}")
    print(f"model: {CONFIG} (context_len set per row), float32, page size {PAGE_SIZE}, "
          f"median of {args.rounds} alternating rounds per cell")
    print(f"{'context':>7} {'requests':>8} {'strategy':<18} {'tokens/s':>9} {'bytes/token':>11}")

    def log(m):
        held = "" if m.bytes_per_token is None else f"{m.bytes_per_token:>11.0f}"
        print(f"{m.context:>7} {m.requests:>8} {m.strategy:<18} {m.tokens_per_second:>9.0f} {held}", flush=True)

    results = measure_all(args.contexts, args.requests, rounds=args.rounds, log=log)
    for line in bars(results):
        print(line)
    if args.json:
        with open(args.json, "w") as f:
            json.dump([asdict(m) | {"tokens_per_second": m.tokens_per_second} for m in results], f, indent=1)


if __name__ == "__main__":
    main()
