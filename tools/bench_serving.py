"""Benchmark: the scheduler's three policies (prefix cache, chunked prefill, preemption) on one workload, at
several pool sizes.

The workload is many requests that share a long system prompt, each with a question of its own and a number of
tokens to add, all submitted before the run starts (so a request's time to first token counts its wait in the
queue). Each policy is measured alone and all three together, against the plain scheduler (whole prompts,
promised pages, no sharing), on pools from a few requests' worth of pages to every request's. Per run:

- positions computed by prefill (prompts, replays and recomputation after preemption) and positions adopted from
  the prefix cache instead;
- the most pages held at once, in bytes of keys and values;
- how many times a request gave its pages back (preemptions) and the number of steps;
- new tokens per second over the whole run, the mean and the worst time to first token, and the longest step
  (what a decoding request waits between two of its tokens at worst).

The counts do not depend on the machine; the times do. Every run of a round uses one process, one after the
other, after one warm-up run; a cell is the median of its rounds, the configurations alternating within a round.

    python -m tools.bench_serving [--pools 8 16 32 64] [--rounds 3] [--json out.json]

The site's Serving page imports `measure_all` and `WORKLOAD` from here.
"""

import argparse
import hashlib
import json
from dataclasses import asdict, dataclass, replace

import numpy as np

from transformer.config import PRESETS
from transformer.kv_cache import PagePool
from transformer.memory import keep_freed_memory
from transformer.model import init_params
from transformer.prefix_cache import PrefixPool
from transformer.scheduler import Request, Scheduler

CONFIG = PRESETS["A"].with_(context_len=128)  # preset A's shape, with room for long answers
WORKLOAD = {"requests": 16, "system": 48, "own": (2, 16), "new": (8, 64), "page": 16, "budget": 32, "seed": 0}
POOLS = (8, 16, 32, 128)  # pages; a request fills at most 8
POLICIES = {  # name: (prefix cache, budget, preemption)
    "plain": (False, None, False),
    "prefix cache": (True, None, False),
    "chunked prefill": (False, WORKLOAD["budget"], False),
    "preemption": (False, None, True),
    "all three": (True, WORKLOAD["budget"], True),
}
ROUNDS = 3


@dataclass(frozen=True)
class Measurement:
    policy: str
    pool: int
    computed: int  # positions fed by prefill
    reused: int  # positions adopted from cached pages
    peak_bytes: int
    preempted: int
    steps: int
    tokens: int
    seconds: float
    ttft_mean: float
    ttft_worst: float
    longest_step: float
    drawn: str  # a digest of every request's new tokens: equal digests, equal tokens
    rounds: int = 1

    @property
    def tokens_per_second(self):
        return self.tokens / self.seconds


def requests(cfg=CONFIG, workload=WORKLOAD):
    """The workload's requests: one system prompt, then each request's own ids; request i samples with seed i."""
    rng = np.random.default_rng(workload["seed"])
    system = rng.integers(0, cfg.vocab_size, workload["system"]).tolist()
    out = []
    for i in range(workload["requests"]):
        own = rng.integers(0, cfg.vocab_size, int(rng.integers(*workload["own"], endpoint=True))).tolist()
        out.append(Request(system + own, int(rng.integers(*workload["new"], endpoint=True)), seed=i))
    return out


def run(params, policy, pool_pages, cfg=CONFIG, workload=WORKLOAD):
    """One run of the workload under a policy: the scheduler after it, and the requests with their results."""
    prefix, budget, preempt = POLICIES[policy]
    pool = (PrefixPool if prefix else PagePool)(cfg, pool_pages, workload["page"], params["tok_emb"].dtype)
    scheduler = Scheduler(params, cfg, pool, max_batch=workload["requests"], budget=budget, preempt=preempt)
    batch = requests(cfg, workload)
    for request in batch:
        scheduler.submit(request)
    scheduler.run()
    return scheduler, batch


def measure(params, policy, pool_pages):
    scheduler, batch = run(params, policy, pool_pages)
    page_bytes = sum(k[0].nbytes + v[0].nbytes for k, v in zip(scheduler.pool.keys, scheduler.pool.values))
    times = scheduler.times
    first = [times[r.drawn_at[0]] for r in batch]
    return Measurement(policy, pool_pages, scheduler.computed, scheduler.reused, scheduler.peak * page_bytes,
                       scheduler.preempted, len(times), sum(len(r.new) for r in batch), times[-1],
                       float(np.mean(first)), max(first), float(max(np.diff([0.0, *times]))),
                       hashlib.sha256(json.dumps([[int(t) for t in r.new] for r in batch]).encode()).hexdigest()[:16])


def measure_all(pools=POOLS, policies=tuple(POLICIES), rounds=ROUNDS, log=None):
    """Every cell (pool, policy), the median of `rounds` measurements taken with the policies alternating; the
    counts and the tokens drawn must be the same in every round."""
    keep_freed_memory()
    params = init_params(CONFIG, seed=WORKLOAD["seed"], dtype=np.float32)
    run(params, "plain", max(pools))  # warm-up: the first run pays for imports and first allocations
    out = []
    for pool_pages in pools:
        taken = [[measure(params, policy, pool_pages) for policy in policies] for _ in range(rounds)]
        for cell in zip(*taken):
            counts = {(m.computed, m.reused, m.peak_bytes, m.preempted, m.steps, m.drawn) for m in cell}
            if len(counts) > 1:
                raise RuntimeError(f"{cell[0].policy} at {pool_pages} pages counted differently between rounds")
            med = {f: float(np.median([getattr(m, f) for m in cell]))
                   for f in ("seconds", "ttft_mean", "ttft_worst", "longest_step")}
            out.append(replace(cell[0], **med, rounds=rounds))
            if log:
                log(out[-1])
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pools", type=int, nargs="+", default=list(POOLS), help="pool sizes, in pages")
    parser.add_argument("--rounds", type=int, default=ROUNDS, help="measurements per cell, reported by their median")
    parser.add_argument("--json", help="also write the measurements to this file")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error(f"--rounds must be at least 1, got {args.rounds}")
    least = max(-(-min(len(r.prompt) + r.num_tokens - 1, CONFIG.context_len) // WORKLOAD["page"]) for r in requests())
    if min(args.pools) < least:
        parser.error(f"--pools must be at least {least} pages, what the largest request may fill")
    print(f"model: preset A's shape, random weights, float32; workload {WORKLOAD}; median of {args.rounds} rounds")
    print(f"{'pool':>4} {'policy':<16} {'computed':>8} {'reused':>6} {'peak KB':>7} {'preempt':>7} {'steps':>5} "
          f"{'tokens/s':>8} {'TTFT ms':>7} {'worst':>6} {'step ms':>7}")

    def log(m):
        print(f"{m.pool:>4} {m.policy:<16} {m.computed:>8} {m.reused:>6} {m.peak_bytes / 1024:>7.0f} {m.preempted:>7} "
              f"{m.steps:>5} {m.tokens_per_second:>8.0f} {1e3 * m.ttft_mean:>7.1f} {1e3 * m.ttft_worst:>6.1f} "
              f"{1e3 * m.longest_step:>7.1f}", flush=True)

    results = measure_all(args.pools, rounds=args.rounds, log=log)
    if args.json:
        with open(args.json, "w") as f:
            json.dump([asdict(m) | {"tokens_per_second": m.tokens_per_second} for m in results], f, indent=1)


if __name__ == "__main__":
    main()
