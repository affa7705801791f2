"""The claims of the KV cache page's paged sections and of the Serving several requests page, read as a test
would: the picture is the run's page tables, the pages hold what a contiguous cache holds, the scheduler's
recorded steps are the batches it ran, the pages promised and the replay period are the formulas the page writes,
and each check can fail."""

import re

import numpy as np
import pytest

from site_scripts import sections
from site_scripts.pages import _bench, _paged, kvcache, serving
from tools import bench_decode as bench
from transformer.model import forward
from transformer.scheduler import Scheduler


# ---------------------------------------------------------------- KV cache: pages

@pytest.fixture(scope="module")
def run():
    return _paged.two_requests()


def test_the_picture_draws_the_page_tables_the_run_ended_with(run):
    tables, pool = _paged.layout(run)
    assert {name: [page for _, page, _, _ in entries] for name, entries in tables.items()} == \
        {name: cache.pages for name, cache in zip(_paged.NAMES, run.caches)}
    for name, entries in tables.items():
        for logical, page, first, last in entries:
            assert pool[page] == (name, logical) and first == logical * _paged.PAGE_SIZE
    assert len(pool) == run.pool.num_pages + 1 and pool[run.pool.blank] is None  # the blank page, drawn last
    assert sum(owner is None for owner in pool) == len(run.pool.free) + 1
    assert _paged.pages_png(run)[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_two_requests_interleave_in_the_pool_and_hold_only_the_pages_they_filled(run):
    a, b = (cache.pages for cache in run.caches)
    assert not set(a) & set(b)
    assert a != list(range(a[0], a[0] + len(a)))  # A's pages are not one block: B's sit between them
    leases = _paged.leased_at(run)
    assert any(leases[page][2] == "prefill" and a[1] < page < a[2] for page in b)  # "B's prefill took the next page"
    for cache in run.caches:
        assert len(cache.pages) == -(-cache.length // _paged.PAGE_SIZE)


def test_the_pages_hold_what_a_contiguous_cache_holds_and_the_logits_are_a_full_forwards(run):
    assert _paged.contiguous_gap(run) < 1e-12
    assert max(run.gaps) < 1e-12
    assert _paged.alone_gap(run) < 1e-12  # "equal to the single-request step up to rounding"


def test_a_batched_step_that_attends_past_a_request_is_caught_against_the_single_request_one(run):
    """Negative control of alone_gap: logits of another request's row do not pass."""
    crossed = _paged.TwoRequests(**{**run.__dict__, "logits": run.logits[::-1]})  # each row given the other's
    assert _paged.alone_gap(crossed) > 0.01


def test_crossed_page_tables_are_caught_by_the_contiguous_comparison():
    crossed = _paged.two_requests()
    a, b = crossed.caches
    a.pages, b.pages = b.pages + a.pages[len(b.pages):], a.pages[:len(b.pages)]  # same lengths, swapped pages
    assert _paged.contiguous_gap(crossed) > 0.1


def test_the_byte_table_is_whole_pages_for_the_paged_cache_and_the_whole_context_for_the_contiguous():
    table, values = _paged.held_bytes()
    rows = [line.split(" | ") for line in table.splitlines() if re.match(r"^\| \d", line)]
    assert len({row[1] for row in rows}) == 1
    for row in rows:
        n, pages, paged = int(row[0][2:]), int(row[3]), int(row[4].replace(",", ""))
        assert pages == -(-n // _paged.PAGE_SIZE) and paged == pages * _paged.PAGE_SIZE * values["per_position"]


def test_the_tiny_example_decodes_what_the_full_forward_computes_and_prefill_agrees():
    tables, values = kvcache.example()
    assert values["decode_gap"] < 1e-12 and values["prefill_gap"] < 1e-12 and values["prefill_keys_gap"] < 1e-12
    assert values["paged"]["keys_gap"] < 1e-12


def test_the_mask_symbol_is_recorded_inside_decode_batch():
    rows = {row[0]: row for row in _paged.symbol_rows()}
    positions = [int(x) for x in re.search(r"\[([\d, ]+)\]", rows["t_w"][3])[1].split(",")]
    assert rows["t_w"][2] == (len(positions),)
    assert rows[r"\mathcal{M}"][2] == (len(positions), 1, 1, max(positions) + 1)


# ---------------------------------------------------------------- Serving: the scheduler's run

@pytest.fixture(scope="module")
def batching():
    return serving.batching_run()


def test_the_recorded_steps_are_the_batches_that_ran(batching):
    cfg, scheduler, requests = batching
    assert sum(scheduler.steps) + len(requests) == sum(r.num_tokens for r in requests)  # the first token: prefill
    assert max(scheduler.steps) <= scheduler.max_batch
    assert len(scheduler.pool.free) == scheduler.pool.num_pages


def test_a_request_waits_for_pages_and_takes_a_finished_ones_place(batching):
    cfg, scheduler, requests = batching
    log = scheduler.log
    assert any(short for _, short in log)
    first = [next(i for i, (running, _) in enumerate(log) if r in running) for r in range(len(requests))]
    last = [max(i for i, (running, _) in enumerate(log) if r in running) for r in range(len(requests))]
    assert any(first[r] == last[s] + 1 for r in range(len(requests)) for s in range(len(requests)))


def test_the_timeline_marks_every_step_a_request_ran(batching):
    cfg, scheduler, requests = batching
    lines = serving.timeline(scheduler.log, len(requests)).splitlines()[3:-1]
    for r, line in enumerate(lines):
        marks = line[len("request 0   "):]
        assert [i for i, c in enumerate(marks) if c == "#"] == [i for i, (running, _) in enumerate(scheduler.log)
                                                                 if r in running]


def test_the_pages_promised_are_the_formula_the_page_writes(batching):
    """ceil(min(prompt + max(tokens - 1, 0), T_max) / S_page), and the run shows a request where the - 1 matters."""
    cfg, scheduler, requests = batching
    extra = serving.requests_of(cfg, ((cfg.context_len + 5, 3), (4, 0), (4, 1), (3, 2 * cfg.context_len)))
    for request in requests + extra:
        fed = min(len(request.prompt) + max(request.num_tokens - 1, 0), cfg.context_len)
        assert scheduler.pages_needed(request) == -(-fed // scheduler.pool.page_size)
    example = serving.minus_one_example(scheduler, requests)
    assert example is not None and example["more"] == example["pages"] + 1
    assert example["fed"] == example["prompt"] + example["tokens"] - 1


def test_the_tiny_request_replays_every_t_max_minus_keep_plus_one_tokens_and_matches_a_full_forward():
    _, values = serving.tiny_example()
    assert values["replays"] == len(values["at"]) >= 2
    assert all(b - a == values["period"] for a, b in zip(values["at"], values["at"][1:]))
    assert values["gap"] < 1e-12


# ---------------------------------------------------------------- Serving: replay and equality

def test_the_replay_table_is_timed_once_and_then_read_from_its_cache(monkeypatch):
    monkeypatch.setenv("SITE_QUICK", "1")
    first = serving.replay()
    monkeypatch.setattr(serving, "replay_row", lambda *a: pytest.fail("the replays were timed again"))
    assert serving.replay() == first


def test_replays_come_every_t_max_minus_keep_plus_one_tokens(monkeypatch):
    cfg, params = serving.setting()
    prompt = list(range(cfg.context_len // 2))
    row = serving.replay_row(cfg, params, cfg.context_len // 2, prompt, 3 * cfg.context_len)
    assert row[2] == cfg.context_len - cfg.context_len // 2 + 1
    assert row[3].startswith(f"{cfg.context_len // 2}-")
    monkeypatch.setenv("SITE_QUICK", "1")
    table, values = serving.replay()
    for line in table.splitlines():
        cells = line.split(" | ")
        if re.match(r"^\| \d+$", cells[0]) and cells[2] != "-":  # a row of one T_keep, replayed at least twice
            assert int(cells[2]) == cfg.context_len - int(cells[0][2:]) + 1
    assert values["least"] == values["keep"] and values["per_token"] < 2  # "below twice plain decoding"


def test_a_scheduler_that_keeps_one_token_too_many_replays_at_another_period(monkeypatch):
    """Negative control of the period's check: keeping one more token shortens the period by one."""
    class OffByOne(Scheduler):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.keep += 1
    monkeypatch.setattr(serving, "Scheduler", OffByOne)
    cfg, params = serving.setting()
    row = serving.replay_row(cfg, params, cfg.context_len // 2, list(range(4)), 3 * cfg.context_len)
    assert row[2] != cfg.context_len - cfg.context_len // 2 + 1


def test_the_served_logits_pass_and_logits_of_a_window_off_by_one_fail():
    assert "FAIL" not in serving.windows()[0] and "FAIL" not in serving.against_generate()[0]
    cfg, params = serving.setting()
    requests = serving.requests_of(cfg, ((3, cfg.context_len + 4),))
    from transformer.kv_cache import PagePool
    scheduler = Scheduler(params, cfg, PagePool(cfg, 8, 4, np.float64), 1)
    scheduler.submit(requests[0])
    scheduler.run()
    r = requests[0]
    shifted = np.stack([forward(params, np.array((r.prompt + r.new)[max(a - 1, 0):b - 1]), cfg)[0][-1]
                        for a, b in r.windows])
    assert sections.agreement(np.array(r.drawn_from), shifted)[1] == "**FAIL**"


def test_keep_equal_to_the_context_draws_generates_tokens():
    text, values = serving.against_generate()
    assert values["gap"] < 1e-12  # "the logits differ by at most ...: rounding"
    for same in re.findall(r"\| (\d+) of (\d+) \|", text):
        assert same[0] == same[1]


# ---------------------------------------------------------------- Serving: the benchmark

def test_the_benchmark_is_read_from_its_cache_while_its_code_is_unchanged(monkeypatch):
    monkeypatch.setenv("SITE_QUICK", "1")  # the quick cells: the full run takes minutes
    first = _bench.measurements()
    monkeypatch.setattr(bench, "measure_all", lambda **kw: pytest.fail("the benchmark ran again"))
    assert _bench.measurements() == first


def test_the_speeds_are_read_off_the_cells_at_the_largest_context():
    cells = [bench.Measurement(s, 256, n, 10, t, None) for s, n, t in
             (("recompute", 1, 10.0), ("contiguous", 1, 1.0), ("paged one by one", 1, 4.0),
              ("paged one by one", 16, 4.0), ("paged batched", 16, 2.0))]
    cells += [bench.Measurement("recompute", 32, 1, 10, 1.0, None)]  # a smaller context is not read
    assert _bench.speeds(cells) == {"top": 256, "most": 16, "contiguous": 10.0, "paged": 2.5, "batched": 2.0}


def test_the_contiguous_and_paged_caches_hold_the_same_bytes_per_position_in_the_benchmark(monkeypatch):
    """The page says so: every request ends one position short of its context, whole pages hold the context."""
    monkeypatch.setenv("SITE_QUICK", "1")
    held = {(m.context, m.requests, m.strategy): m.bytes_per_token for m in _bench.measurements()}
    for (context, requests, strategy), value in held.items():
        if strategy != "recompute":
            assert value == held[context, requests, "contiguous"]


def test_the_kv_and_serving_prose_bind_to_their_values(monkeypatch):
    from site_scripts import prose
    from site_scripts.common import ROOT

    monkeypatch.setenv("SITE_QUICK", "1")
    for page, path in ((kvcache, "kv-cache.md"), (serving, "serving.md")):
        text = (ROOT / "docs" / "generation" / path).read_text()
        assert prose.typed_numbers(text) == []
        prose.bind(text, prose.plain(page.generate({})["values"]), path)


def test_the_figure_is_an_inline_svg_with_both_panels():
    cells = [bench.Measurement(s, c, n, 10, 1.0 + c / 100, None) for s in bench.STRATEGIES for c in (32, 64)
             for n in (1, 4)]
    svg = _bench.figure_svg(cells)
    assert svg.startswith('<div class="bench-figure"') and "<svg" in svg and "<?xml" not in svg
    assert "one request" in svg and "context 64: one by one or batched" in svg
