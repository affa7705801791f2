"""Generator of the Serving several requests page: the values its prose shows (docs/generation/serving.md binds
them) and its tables. The tiny example serves one request past the context limit; then a real run of the scheduler
(who runs at each step, who waits for pages), the replay at the context limit and what it costs against the
sliding window, and the equality of the served logits with a full forward and of the tokens with `generate`.
"""

import time
from pathlib import Path

import numpy as np

from transformer.config import PRESETS
from transformer.generate import decode_batch, generate as generate_tokens
from transformer.kv_cache import PagePool
from transformer.model import forward, init_params
from transformer.scheduler import Request, Scheduler

from .. import sections
from ..common import mode
from ..examples import SEED, TINY_IDS, default_note, tiny
from ._bench import timed
from ._paged import profiled, sizes
from ._serving_policies import benchmark, shared_pages, timeline as policies_timeline
from ._serving_prefix import conversation, prefix

PAGE_SIZE = 4
BATCH_SIZES = ((5, 6), (3, 20), (10, 4), (2, 12), (7, 10), (4, 3))  # (prompt length, tokens to add) per request
MAX_BATCH, POOL_PAGES = 4, 12  # the pool, not the batch, holds the third request back at first
TINY_TOKENS, TINY_KEEP, TINY_PAGE = 6, 2, 2  # the tiny example: tokens added, T_keep, positions per page


class Recording(Scheduler):
    """The scheduler, noting before each step which requests run, and whether one waits for pages while the
    batch has room."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.number, self.log = {}, []

    def submit(self, request):
        self.number[id(request)] = len(self.number)
        super().submit(request)

    def admit(self, *args):
        super().admit(*args)
        short_of_pages = bool(self.waiting) and len(self.running) < self.max_batch
        self.log.append(([self.number[id(r.request)] for r in self.running], short_of_pages))


def setting():
    cfg = PRESETS["default"]
    return cfg, init_params(cfg, seed=SEED)


def requests_of(cfg, lengths, seed=SEED):
    """Requests of (prompt length, tokens to add) `lengths`, prompts drawn from `seed`, request i sampling with
    seed + i."""
    rng = np.random.default_rng(seed)
    return [Request(rng.integers(0, cfg.vocab_size, n).tolist(), m, seed=seed + i) for i, (n, m) in enumerate(lengths)]


def batching_run():
    cfg, params = setting()
    scheduler = Recording(params, cfg, PagePool(cfg, POOL_PAGES, PAGE_SIZE, np.float64), MAX_BATCH)
    requests = requests_of(cfg, BATCH_SIZES)
    for request in requests:
        scheduler.submit(request)
    scheduler.run()
    return cfg, scheduler, requests


def timeline(log, count):
    """One line per request, one character per step: # running, . submitted but not yet admitted, blank once
    done (every request is submitted before the run)."""
    width = len(log)
    tens = "".join(str(i // 10) if i % 10 == 0 else " " for i in range(width))
    lines = ["step        " + tens, "            " + "".join(str(i % 10) for i in range(width))]
    for r in range(count):
        first = next(i for i, (running, _) in enumerate(log) if r in running)
        marks = ["#" if r in running else ("." if i < first else " ") for i, (running, _) in enumerate(log)]
        lines.append(f"request {r}   " + "".join(marks).rstrip())
    return "```text\n" + "\n".join(lines) + "\n```\n"


def batching():
    """The run of the scheduler: the table of requests, the timeline, and the values the prose reads."""
    cfg, scheduler, requests = batching_run()
    log = scheduler.log
    rows, waited = [], [i for i, (_, short) in enumerate(log) if short]
    for r, request in enumerate(requests):
        ran = [i for i, (running, _) in enumerate(log) if r in running]
        rows.append([r, len(request.prompt), request.num_tokens, scheduler.pages_needed(request), ran[0], ran[-1]])
    table = sections.md_table(["request", "prompt ids", "tokens to add", "pages promised", "first step",
                               "last step"], rows)
    values = {"sizes": sizes(cfg), "count": len(requests), "pool": POOL_PAGES, "size": PAGE_SIZE,
              "max_batch": MAX_BATCH, "steps": scheduler.steps, "waited": len(waited), "first_wait": waited[0],
              "free": len(scheduler.pool.free), "example": minus_one_example(scheduler, requests)}
    return table, timeline(log, len(requests)), values


def minus_one_example(scheduler, requests):
    """The first request of the run whose promise the − 1 changes: its sizes, its pages, and what counting its
    last token too would promise."""
    ceil = lambda n: -(-n // PAGE_SIZE)  # noqa: E731
    for r, request in enumerate(requests):
        fed = len(request.prompt) + request.num_tokens - 1
        if ceil(min(fed + 1, scheduler.cfg.context_len)) != scheduler.pages_needed(request):
            return {"request": r, "prompt": len(request.prompt), "tokens": request.num_tokens, "fed": fed,
                    "pages": scheduler.pages_needed(request), "more": ceil(min(fed + 1, scheduler.cfg.context_len))}
    return None


def tiny_example():
    """One request on the tiny model, served alone past the context limit with a small T_keep: per new token, the
    span of text its logits saw, its logits, and their gap to a full forward over that span."""
    ex = tiny()
    cfg = ex.cfg
    scheduler = Scheduler(ex.params, cfg, PagePool(cfg, cfg.context_len // TINY_PAGE, TINY_PAGE, np.float64), 1,
                          keep=TINY_KEEP)
    request = Request(list(TINY_IDS), TINY_TOKENS, seed=SEED)
    scheduler.submit(request)
    scheduler.run()
    text, rows, gaps = request.prompt + request.new, [], []
    for k, ((start, stop), logits, token) in enumerate(zip(request.windows, request.drawn_from, request.new)):
        gaps.append(float(np.abs(forward(ex.params, np.array(text[start:stop]), cfg)[0][-1] - logits).max()))
        rows.append([k, f"[{start}, {stop})", f"`{text[start:stop]}`", " ".join(f"{v:.4f}" for v in logits), token,
                     f"{gaps[-1]:.1e}"])
    table = sections.md_table(["new token", "span \\([a, b)\\) of the text", "ids the model saw",
                               "logits \\(z\\)", "token drawn", "gap to a full forward"], rows)
    starts = [k for k in range(1, len(request.windows)) if request.windows[k][0] != request.windows[k - 1][0]]
    return table, {"sizes": sizes(cfg), "prompt": len(TINY_IDS), "tokens": TINY_TOKENS, "keep": TINY_KEEP, "page": TINY_PAGE,
                   "pages": cfg.context_len // TINY_PAGE, "replays": request.replays, "at": starts,
                   "period": cfg.context_len - TINY_KEEP + 1, "gap": max(gaps)}


# ---------------------------------------------------------------- reset and replay

def positions_run(call):
    """(positions through forward, rows through decode_batch) while `call()` runs: what it cost, counted."""
    counts = {"forward": 0, "decode": 0}

    def profile(frame, event, arg):
        if event == "call" and frame.f_code is forward.__code__:
            counts["forward"] += int(np.asarray(frame.f_locals["ids"]).size)
        elif event == "call" and frame.f_code is decode_batch.__code__:
            counts["decode"] += len(frame.f_locals["tokens"])
    profiled(call, profile)
    return counts


def replay_cases(cfg):
    T = cfg.context_len
    return sorted({1, T // 4, T // 2, 3 * T // 4, T})


def replay_row(cfg, params, keep, prompt, n):
    """One long request served alone with this keep: replays, the period between them, the context its tokens
    saw after the limit, positions counted, seconds per token."""
    def serve_one():
        scheduler = Scheduler(params, cfg, PagePool(cfg, -(-cfg.context_len // PAGE_SIZE), PAGE_SIZE, np.float64),
                              1, keep)
        request = Request(list(prompt), n, seed=SEED)
        scheduler.submit(request)
        scheduler.run()
        return request
    start = time.perf_counter()
    request = serve_one()
    seconds = time.perf_counter() - start
    counts = positions_run(serve_one)
    starts = [i for i in range(1, n) if request.windows[i][0] != request.windows[i - 1][0]]
    periods = {b - a for a, b in zip(starts, starts[1:])}  # one period, T_max - keep + 1 (tests/site/test_pages_kv.py)
    after = [b - a for a, b in request.windows[starts[0]:]] if starts else []
    return [keep, request.replays, periods.pop() if periods else "-", f"{min(after)}-{max(after)}" if after else "-",
            counts["forward"], counts["decode"], f"{(counts['forward'] + counts['decode']) / n:.1f}",
            f"{1e3 * seconds / n:.2f}"]


def replay_rows(cfg, prompt, n):
    """A row per T_keep, then the sliding window's (`generate`): counted, and timed."""
    params = init_params(cfg, seed=SEED)
    rows = [replay_row(cfg, params, keep, prompt, n) for keep in replay_cases(cfg)]
    start = time.perf_counter()
    generate_tokens(params, cfg, prompt, n, seed=SEED)
    seconds = time.perf_counter() - start
    counts = positions_run(lambda: generate_tokens(params, cfg, prompt, n, seed=SEED))
    return rows + [["`generate` (sliding window)", "-", "-", f"{cfg.context_len}", counts["forward"],
                    counts["decode"], f"{(counts['forward'] + counts['decode']) / n:.1f}", f"{1e3 * seconds / n:.2f}"]]


def replay():
    """The replay table (counted, and timed once per change of the code it times) and the values its prose reads."""
    cfg = PRESETS["default"]
    T, n = cfg.context_len, cfg.context_len * (2 if mode() == "quick" else 4)
    prompt = np.random.default_rng(SEED).integers(0, cfg.vocab_size, T // 2).tolist()
    rows = timed("serving_replay", Path(__file__), lambda: replay_rows(cfg, prompt, n), repr(cfg), prompt, n)
    table = sections.md_table(["\\(T_{\\mathrm{keep}}\\)", "replays", "tokens between replays",
                               "context seen after the limit", "positions through forward",
                               "rows through decode_batch", "positions per token", "ms per token"], rows)
    default, window = next(row for row in rows if row[0] == T // 2), rows[-1]
    full = next(row for row in rows if row[0] == T)
    values = {"prompt": len(prompt), "tokens": n, "multiple": n // T, "T": T, "size": PAGE_SIZE, "keep": T // 2,
              "per_token": float(default[6]), "window_per_token": float(window[6]),
              "ratio": float(window[6]) / float(default[6]), "least": int(default[3].split("-")[0]),
              "full_per_token": float(full[6])}
    return table, values


# ---------------------------------------------------------------- equality

GENERATE_PAGE = 3  # positions per page of the run against generate


def against_generate():
    """keep = T_max against generate: the same tokens, the same logits up to rounding."""
    cfg, params = setting()
    requests = requests_of(cfg, ((3, 2 * cfg.context_len), (cfg.context_len - 2, 10), (1, cfg.context_len + 5)))
    pool = PagePool(cfg, 3 * -(-cfg.context_len // GENERATE_PAGE), GENERATE_PAGE, np.float64)
    scheduler = Scheduler(params, cfg, pool, 3, keep=cfg.context_len)
    for request in requests:
        scheduler.submit(request)
    scheduler.run()
    rows, gaps = [], []
    for i, r in enumerate(requests):
        new, logits = generate_tokens(params, cfg, r.prompt, r.num_tokens, seed=r.seed, return_logits=True)
        gap, verdict = sections.agreement(np.array(r.drawn_from), np.array(logits))
        gaps.append(gap)
        rows.append([i, len(r.prompt), r.num_tokens, r.replays, f"{sum(a == b for a, b in zip(r.new, new))} of "
                     f"{len(new)}", sections.gap_text(gap), verdict])
    table = sections.md_table(["request", "prompt ids", "tokens", "replays", "same tokens", "largest logit gap",
                               "result"], rows)
    return table, {"count": len(requests), "size": GENERATE_PAGE, "gap": max(gaps)}


def windows():
    """Every token's logits against a full forward over the window it saw, for several page sizes."""
    cfg, params = setting()
    rows, gaps = [], []
    for size in sorted({1, 3, 16, cfg.context_len}):
        requests = requests_of(cfg, ((3, 2 * cfg.context_len), (9, 12), (1, cfg.context_len + 10)))
        pool = PagePool(cfg, 3 * -(-cfg.context_len // size), size, np.float64)
        scheduler = Scheduler(params, cfg, pool, len(requests))
        for request in requests:
            scheduler.submit(request)
        scheduler.run()
        mine = np.concatenate([np.array(r.drawn_from) for r in requests])
        full = np.stack([forward(params, np.array((r.prompt + r.new)[a:b]), cfg)[0][-1]
                         for r in requests for a, b in r.windows])
        gap, verdict = sections.agreement(mine, full)
        gaps.append(gap)
        rows.append([size, len(mine), sum(r.replays for r in requests), f"{max(scheduler.steps)}",
                     sections.gap_text(gap), verdict])
    table = sections.md_table(["page size", "tokens", "replays", "largest batch", "largest gap", "result"], rows)
    return table, {"count": len(requests), "keep": cfg.context_len // 2, "gap": max(gaps)}


def symbols_md():
    cfg, scheduler, requests = batching_run()
    return sections.symbols_md([
        (r"T_{\mathrm{keep}}", "keep", "int", f"{scheduler.keep} (the default, \\(T_{{\\max}}/2\\))"),
        (r"S_{\mathrm{page}}", "pool.page_size", "int", f"{scheduler.pool.page_size}"),
        (r"N_{\mathrm{page}}", "pool.num_pages", "int", f"{scheduler.pool.num_pages}"),
        (r"B", "len(batch)", "int", f"requests decoded together in a step: at most `max_batch` = "
         f"{scheduler.max_batch}, {max(scheduler.steps)} in this run"),
    ], default_note(batch=False) + ", in the run of the scheduler below")


def generate(context):
    tiny_table, tiny_values = tiny_example()
    batching_table, batching_timeline, batching_values = batching()
    replay_table, replay_values = replay()
    generate_table, generate_values = against_generate()
    windows_table, windows_values = windows()
    cfg_a = PRESETS["A"]  # a context of 64 positions: room for a system prompt of three pages of 16
    shared_png, shared_values = shared_pages()
    policies_md, policies_values = policies_timeline()
    bench_counted, bench_timed, bench_png, bench_values = benchmark()
    values = {"seed": SEED, "ids": TINY_IDS, "tiny": tiny_values, "batching": batching_values,
              "replay": replay_values, "generate": generate_values, "windows": windows_values,
              "prefix": {**prefix(init_params(cfg_a, seed=SEED), cfg_a, SEED), "t_max": cfg_a.context_len},
              "conversation": conversation(init_params(cfg_a, seed=SEED), cfg_a, SEED),
              "shared": shared_values, "timeline": policies_values, "bench": bench_values}
    return {"values": values, "tiny": tiny_table, "batching": batching_table, "timeline": batching_timeline,
            "replay": replay_table, "generate": generate_table, "windows": windows_table, "symbols": symbols_md(),
            "shared.png": shared_png, "policies": policies_md, "bench_counted": bench_counted,
            "bench_timed": bench_timed, "bench.png": bench_png}
