"""Generator of the Serving several requests page: a real run of the scheduler (who runs at each step, who waits
for pages), the replay at the context limit and what it costs against the sliding window, the equality of
the served logits with a full forward and with `generate`, and the decoding benchmark (site_scripts/pages/_bench.py).
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
from ..examples import SEED, default_note
from ._bench import timed
from ._paged import profiled

PAGE_SIZE = 4
BATCH_SIZES = ((5, 6), (3, 20), (10, 4), (2, 12), (7, 9), (4, 3))  # (prompt length, tokens to add) per request
MAX_BATCH, POOL_PAGES = 4, 12  # the pool, not the batch, holds the third request back at first


class Recording(Scheduler):
    """The scheduler, noting before each step which requests run, and whether one waits for pages while the
    batch has room."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.number, self.log = {}, []

    def submit(self, request):
        self.number[id(request)] = len(self.number)
        super().submit(request)

    def step(self):
        short_of_pages = bool(self.waiting) and len(self.running) < self.max_batch
        self.log.append(([self.number[id(r.request)] for r in self.running], short_of_pages))
        super().step()


def setting():
    cfg = PRESETS["default"]
    return cfg, init_params(cfg, seed=SEED)


def requests_of(cfg, sizes, seed=SEED):
    """Requests with prompts drawn from `seed`, request i sampling with seed + i."""
    rng = np.random.default_rng(seed)
    return [Request(rng.integers(0, cfg.vocab_size, n).tolist(), m, seed=seed + i) for i, (n, m) in enumerate(sizes)]


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


def batching_md():
    cfg, scheduler, requests = batching_run()
    log = scheduler.log
    rows, waited = [], [i for i, (_, short) in enumerate(log) if short]
    for r, request in enumerate(requests):
        ran = [i for i, (running, _) in enumerate(log) if r in running]
        rows.append([r, len(request.prompt), request.num_tokens, scheduler.pages_needed(request), ran[0], ran[-1]])
    return (f"{len(requests)} requests at {default_note(batch=False)}, over a pool of {POOL_PAGES} pages of "
            f"{PAGE_SIZE} positions, at most {MAX_BATCH} decoded together:\n\n"
            + sections.md_table(["request", "prompt ids", "tokens to add", "pages promised", "first step",
                                 "last step"], rows)
            + "\nEach step draws one token for every running request. Who ran at each step (`#`), and who "
              "had been submitted but waited (`.`):\n\n" + timeline(log, len(requests))
            + f"\nThe batch sizes of the decoding steps, `scheduler.steps`, were `{scheduler.steps}`. "
              + (f"At {len(waited)} steps (the first at step {waited[0]}) a request waited although the batch had "
                 "room: the pool could not promise it its pages. " if waited else "")
              + f"After the run all {len(scheduler.pool.free)} pages are free again.\n")


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
    periods = {b - a for a, b in zip(starts, starts[1:])}
    if periods and periods != {cfg.context_len - keep + 1}:
        raise RuntimeError(f"replays every {periods} tokens, not T_max - keep + 1: the text below is wrong")
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


def replay_md():
    cfg = PRESETS["default"]
    T, n = cfg.context_len, cfg.context_len * (2 if mode() == "quick" else 4)
    prompt = np.random.default_rng(SEED).integers(0, cfg.vocab_size, T // 2).tolist()
    rows = timed("serving_replay", Path(__file__), lambda: replay_rows(cfg, prompt, n), repr(cfg), prompt, n)
    default = next(row for row in rows if row[0] == T // 2)
    ratio = float(rows[-1][6]) / float(default[6])
    return (f"One request with a prompt of {len(prompt)} ids adds {n} tokens, {n // T} times "
            f"\\(T_{{\\max}}\\) = {T}, alone, pages of {PAGE_SIZE}; each row is one \\(T_{{\\mathrm{{keep}}}}\\). "
            "Positions are counted as the code runs: every id through `forward` (prefills, and the sliding window's "
            "full passes) and every row of a `decode_batch` step.\n\n"
            + sections.md_table(["\\(T_{\\mathrm{keep}}\\)", "replays", "tokens between replays",
                                 "context seen after the limit", "positions through forward",
                                 "rows through decode_batch", "positions per token", "ms per token"], rows)
            + f"\nWith the default \\(T_{{\\mathrm{{keep}}}}\\) = {T // 2}, the request ran {default[6]} positions "
              f"through the model per token, against {rows[-1][6]} for the sliding window ({ratio:.0f} times fewer), "
              f"and every token after the limit still saw at least {default[3].split('-')[0]} tokens of its text. "
              "The milliseconds were measured on the build machine and depend on it; the counts do not.\n")


# ---------------------------------------------------------------- equality

def generate_md():
    """keep = T_max against generate: the same tokens, the same logits."""
    cfg, params = setting()
    requests = requests_of(cfg, ((3, 2 * cfg.context_len), (cfg.context_len - 2, 10), (1, cfg.context_len + 5)))
    pool = PagePool(cfg, 3 * -(-cfg.context_len // 3), 3, np.float64)
    scheduler = Scheduler(params, cfg, pool, 3, keep=cfg.context_len)
    for request in requests:
        scheduler.submit(request)
    scheduler.run()
    rows = []
    for i, r in enumerate(requests):
        new, logits = generate_tokens(params, cfg, r.prompt, r.num_tokens, seed=r.seed, return_logits=True)
        gap, verdict = sections.agreement(np.array(r.drawn_from), np.array(logits))
        rows.append([i, len(r.prompt), r.num_tokens, r.replays, f"{sum(a == b for a, b in zip(r.new, new))} of "
                     f"{len(new)}", sections.gap_text(gap), verdict])
    return ("Three requests served together with \\(T_{\\mathrm{keep}} = T_{\\max}\\), pages of 3, each beside "
            "`generate` on its own prompt with its own seed (float64):\n\n"
            + sections.md_table(["request", "prompt ids", "tokens", "replays", "same tokens", "largest logit gap",
                                 "result"], rows))


def windows_md():
    """Every token's logits against a full forward over the window it saw, for several page sizes."""
    cfg, params = setting()
    rows = []
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
        rows.append([size, len(mine), sum(r.replays for r in requests), f"{max(scheduler.steps)}",
                     sections.gap_text(gap), verdict])
    return (f"Three requests served together with the default \\(T_{{\\mathrm{{keep}}}}\\) = {cfg.context_len // 2}, "
            "two of them past the context limit; every token's logits against a full `forward` over the span of "
            "its request's text that those logits saw (`Request.windows`), float64:\n\n"
            + sections.md_table(["page size", "tokens", "replays", "largest batch", "largest gap", "result"], rows))


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
    return {"symbols": symbols_md(), "batching": batching_md(), "replay": replay_md(), "generate": generate_md(),
            "windows": windows_md()}
