"""The Serving page's policies: a picture of shared pages and their reference counts, a timeline of chunked
prefill and preemption, and tools/bench_serving.py's measurements of every policy at several pool sizes.

Everything is read off real runs of the `Scheduler`; the timings are kept under a key of the code they time (see
_bench.timed), the counts are the same on every machine.
"""

import numpy as np

from tools import bench_serving as bench
from transformer.config import PRESETS
from transformer.kv_cache import PagePool
from transformer.model import init_params
from transformer.prefix_cache import PrefixPool
from transformer.scheduler import Request, Scheduler

from .. import sections
from ..common import ROOT, mode
from ..examples import SEED
from ..figures import new_figure, png
from ._bench import timed

SHARE_PAGE, SHARE_SYSTEM, SHARE_POOL = 4, 8, 24  # the picture: positions per page, system prompt, pool pages
SHARE_OWN, SHARE_NEW = (5, 6, 1, 7), (2, 8, 8, 8)  # each request's own ids and tokens to add
COLORS = ("tab:blue", "tab:orange", "tab:green", "tab:red")


class Snapshot(Scheduler):
    """The scheduler, keeping the page tables and the pool's counts after the step where a request first retires."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.seen, self.submitted = None, []

    def submit(self, request):
        self.submitted.append(request)
        super().submit(request)

    def retire(self):
        before = len(self.running)
        super().retire()
        if self.seen is None and len(self.running) < before:
            pool, number = self.pool, {id(q): i for i, q in enumerate(self.submitted)}
            self.seen = {"tables": {number[id(r.request)]: list(r.cache.pages) for r in self.running},
                         "refs": dict(pool.refs), "idle": list(pool.idle), "free": set(pool.free),
                         "step": len(self.times),
                         "done": [i for i, r in enumerate(self.submitted) if len(r.new) == r.num_tokens]}


def shared_run():
    cfg = PRESETS["default"]
    params = init_params(cfg, seed=SEED)
    rng = np.random.default_rng(SEED)
    system = rng.integers(0, cfg.vocab_size, SHARE_SYSTEM).tolist()
    scheduler = Snapshot(params, cfg, PrefixPool(cfg, SHARE_POOL, SHARE_PAGE, np.float64), len(SHARE_OWN))
    for i, (own, new) in enumerate(zip(SHARE_OWN, SHARE_NEW)):
        scheduler.submit(Request(system + rng.integers(0, cfg.vocab_size, own).tolist(), new, seed=i))
    scheduler.run()
    return scheduler


def shared_png(seen):
    """Top: each running request's page table, one box per logical page, an arrow to its physical page. Bottom: the
    pool, each page with its reference count; idle pages (key kept, no reader) hatched, free pages white."""
    from matplotlib.patches import Rectangle

    fig, ax = new_figure(figsize=(12, 4.6))
    for page in range(SHARE_POOL):
        refs = seen["refs"].get(page, 0)
        idle, free = page in seen["idle"], page in seen["free"]
        face = "white" if free else "0.8" if idle else "tab:purple" if refs > 1 else "tab:gray"
        ax.add_patch(Rectangle((page, 0), 0.9, 1, facecolor=face, alpha=0.5, edgecolor="black",
                               hatch="//" if idle else None))
        label = "free" if free else f"idle\nρ = 0" if idle else f"ρ = {refs}"
        ax.text(page + 0.45, 0.5, label, ha="center", va="center", fontsize=8)
    x0, y = 0.0, 2.2
    for r, table in seen["tables"].items():
        ax.text(x0, y + 1.15, f"request {r}", fontsize=9)
        for logical, page in enumerate(table):
            x = x0 + 0.8 * logical
            ax.add_patch(Rectangle((x, y), 0.7, 1, facecolor=COLORS[r % len(COLORS)], alpha=0.6, edgecolor="black"))
            ax.text(x + 0.35, y + 0.5, f"{page}", ha="center", va="center", fontsize=8)
            ax.annotate("", xy=(page + 0.45, 1.0), xytext=(x + 0.35, y),
                        arrowprops={"arrowstyle": "->", "color": COLORS[r % len(COLORS)], "alpha": 0.7})
        x0 += 0.8 * len(table) + 0.9
    ax.set_xlim(-0.3, max(SHARE_POOL, x0) + 0.2)
    ax.set_ylim(-0.2, 3.8)
    ax.set_yticks([0.5, 2.7], ["pool", "page tables"])
    ax.set_xticks([page + 0.45 for page in range(SHARE_POOL)], [str(page) for page in range(SHARE_POOL)])
    ax.set_xlabel("physical page of the pool (its number), with its reference count ρ")
    ax.set_ylabel("page tables and the pool")
    ax.set_title(f"after step {seen['step']}: the system prompt's pages shared, a finished request's pages idle")
    return png(fig)


def named(noun, numbers):
    """"request 0", or "requests 0 and 3": the numbers with their noun, for a sentence."""
    if len(numbers) == 1:
        return f"{noun} {numbers[0]}"
    return f"{noun}s {', '.join(map(str, numbers[:-1]))} and {numbers[-1]}"


def shared_pages():
    """The picture and the values its prose reads."""
    scheduler = shared_run()
    seen = scheduler.seen
    shared = sorted(page for page, refs in seen["refs"].items() if refs > 1)
    return shared_png(seen), {
        "page": SHARE_PAGE, "system": SHARE_SYSTEM, "system_pages": SHARE_SYSTEM // SHARE_PAGE, "pool": SHARE_POOL,
        "requests": len(SHARE_OWN), "own": list(SHARE_OWN), "new": list(SHARE_NEW), "step": seen["step"],
        "done": named("request", seen["done"]), "shared": shared, "refs": seen["refs"][shared[0]], "idle": seen["idle"],
        "idle_pages": named("page", seen["idle"]), "free": len(seen["free"]), "running": len(seen["tables"]), "reused": scheduler.reused,
        "computed": scheduler.computed}


# ---------------------------------------------------------------- chunked prefill and preemption, step by step

TIMELINE_PAGE, TIMELINE_POOL, TIMELINE_BUDGET = 4, 10, 6
TIMELINE = ((3, 14), (20, 6), (4, 12), (2, 10))  # (prompt length, tokens to add)


class Marking(Scheduler):
    """The scheduler, marking for each step what each request did: P fed a chunk of its prompt (or of its text
    again), # decoded, . waited, ! gave its pages back."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.number, self.marks, self.chunks = {}, [], []

    def submit(self, request):
        self.number[id(request)] = len(self.number)
        super().submit(request)

    def step(self):
        self.marks.append({self.number[id(r.request)]: "." for r in self.waiting})
        self.chunks.append({})
        super().step()

    def give_way(self, victim):
        super().give_way(victim)
        self.marks[-1][self.number[id(victim.request)]] = "!"

    def feed_chunk(self, r, n):
        self.marks[-1][self.number[id(r.request)]] = "P"
        self.chunks[-1][self.number[id(r.request)]] = n
        super().feed_chunk(r, n)

    def feed(self, feeds):
        for r, n in feeds.items():
            if r.decoding:
                self.marks[-1][self.number[id(r.request)]] = "#"
            elif n == 1 and r.cache.length:  # a last chunk of one id, fed in the batched step
                self.marks[-1][self.number[id(r.request)]] = "P"
                self.chunks[-1][self.number[id(r.request)]] = 1
        super().feed(feeds)


def timeline_run():
    cfg = PRESETS["default"]
    params = init_params(cfg, seed=SEED)
    rng = np.random.default_rng(SEED)
    scheduler = Marking(params, cfg, PagePool(cfg, TIMELINE_POOL, TIMELINE_PAGE, np.float64), len(TIMELINE),
                        budget=TIMELINE_BUDGET, preempt=True)
    requests = [Request(rng.integers(0, cfg.vocab_size, n).tolist(), m, seed=i) for i, (n, m) in enumerate(TIMELINE)]
    for request in requests:
        scheduler.submit(request)
    scheduler.run()
    return scheduler, requests


def timeline():
    """The run's timeline, one character per step, and the values its prose reads."""
    scheduler, requests = timeline_run()
    width = len(scheduler.marks)
    lines = ["step        " + "".join(str(i // 10) if i % 10 == 0 else " " for i in range(width)),
             "            " + "".join(str(i % 10) for i in range(width))]
    for r in range(len(requests)):
        lines.append(f"request {r}   " + "".join(step.get(r, " ") for step in scheduler.marks).rstrip())
    long = max(range(len(requests)), key=lambda r: len(requests[r].prompt))
    chunks = [step[long] for step in scheduler.chunks if long in step]
    victims = [r for r in range(len(requests)) if requests[r].preemptions]
    return "```text\n" + "\n".join(lines) + "\n```\n", {
        "page": TIMELINE_PAGE, "pool": TIMELINE_POOL, "budget": TIMELINE_BUDGET, "count": len(requests),
        "prompts": [n for n, _ in TIMELINE], "adds": [m for _, m in TIMELINE], "long": long, "long_prompt": len(requests[long].prompt),
        "chunks": chunks, "preempted": scheduler.preempted, "victims": victims,
        "needed": [scheduler.pages_needed(r) for r in requests], "steps": width}


# ---------------------------------------------------------------- the benchmark

def cells():
    return {"pools": (bench.POOLS[0], bench.POOLS[-1]), "rounds": 1} if mode() == "quick" else \
        {"pools": bench.POOLS, "rounds": bench.ROUNDS}


def measurements():
    chosen = cells()
    stored = timed("bench_serving", ROOT / "tools" / "bench_serving.py",
                   lambda: [m.__dict__ for m in bench.measure_all(chosen["pools"], rounds=chosen["rounds"])],
                   repr(sorted(chosen.items())))
    return [bench.Measurement(**m) for m in stored]


def benchmark_png(results):
    """Tokens per second and mean time to first token against the pool's size, one line per policy."""
    fig, (left, right) = new_figure(1, 2, figsize=(11, 3.8))
    pools = sorted({m.pool for m in results})
    for policy in bench.POLICIES:
        line = sorted((m for m in results if m.policy == policy), key=lambda m: m.pool)
        left.plot([m.pool for m in line], [m.tokens_per_second for m in line], marker="o", label=policy)
        right.plot([m.pool for m in line], [1e3 * m.ttft_mean for m in line], marker="o", label=policy)
    for ax, label in ((left, "new tokens per second"), (right, "mean time to first token (ms)")):
        ax.set(xscale="log", xlabel="pages in the pool", ylabel=label)
        ax.set_xticks(pools, [str(p) for p in pools])
        ax.minorticks_off()
        ax.legend(fontsize=7)
    return png(fig)


def benchmark():
    """The counted table, the timed one, the figure and the values the prose reads (ratios against the plain
    scheduler, same pool)."""
    results = measurements()
    plain = {m.pool: m for m in results if m.policy == "plain"}
    counted = sections.md_table(
        ["pool (pages)", "policy", "positions prefilled", "positions adopted", "KiB held at the peak", "preemptions",
         "steps", "same tokens as plain"],
        [[m.pool, m.policy, m.computed, m.reused, f"{m.peak_bytes / 1024:,.0f}", m.preempted, m.steps,
          "yes" if m.drawn == plain[m.pool].drawn else "**no**"] for m in results])
    timed_table = sections.md_table(
        ["pool (pages)", "policy", "tokens per second", "against plain", "mean TTFT (ms)", "worst TTFT (ms)",
         "longest step (ms)"],
        [[m.pool, m.policy, f"{m.tokens_per_second:,.0f}", f"{m.tokens_per_second / plain[m.pool].tokens_per_second:.2f}",
          f"{1e3 * m.ttft_mean:.1f}", f"{1e3 * m.ttft_worst:.1f}", f"{1e3 * m.longest_step:.1f}"] for m in results])
    small, large = min(plain), max(plain)
    at = {(m.policy, m.pool): m for m in results}
    workload = bench.requests()
    values = {"requests": len(workload), "system": bench.WORKLOAD["system"], "page": bench.WORKLOAD["page"],
              "own_min": bench.WORKLOAD["own"][0], "own_max": bench.WORKLOAD["own"][1],
              "new_min": bench.WORKLOAD["new"][0], "new_max": bench.WORKLOAD["new"][1], "budget": bench.WORKLOAD["budget"],
              "t_max": bench.CONFIG.context_len, "pools": sorted(plain), "small": small, "large": large,
              "rounds": results[0].rounds, "same": all(m.drawn == plain[m.pool].drawn for m in results),
              "prefix_work": plain[large].computed / at["prefix cache", large].computed,
              "prefix_bytes": plain[large].peak_bytes / at["prefix cache", large].peak_bytes,
              "chunk_step": plain[large].longest_step / at["chunked prefill", large].longest_step,
              "chunk_ttft": at["chunked prefill", large].ttft_mean / plain[large].ttft_mean,
              "chunk_speed": at["chunked prefill", large].tokens_per_second / plain[large].tokens_per_second,
              "preempt_steps": at["preemption", small].steps, "plain_steps": plain[small].steps,
              "preempt_computed": at["preemption", small].computed, "plain_computed": plain[small].computed,
              "all_speed": at["all three", small].tokens_per_second / plain[small].tokens_per_second,
              "all_ttft": plain[small].ttft_mean / at["all three", small].ttft_mean,
              "all_reused": at["all three", small].reused, "all_computed": at["all three", small].computed}
    return counted, timed_table, benchmark_png(results), values
