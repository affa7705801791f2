"""The claims of the KV cache page's paged sections and of the Serving several requests page, read as a test
would: the diagram is the run's page tables, the pages hold what a contiguous cache holds, the scheduler's
recorded steps are the batches it ran, the replay period is the formula's, and each check can fail."""

import re

import numpy as np
import pytest

from site_scripts import sections
from site_scripts.pages import _bench, _paged, serving
from tools import bench_decode as bench
from transformer.model import forward
from transformer.scheduler import Scheduler


# ---------------------------------------------------------------- KV cache: pages

@pytest.fixture(scope="module")
def run():
    return _paged.two_requests()


def test_the_diagram_draws_the_page_tables_the_run_ended_with(run):
    edges = re.findall(r"^  ([AB])(\d+) --> P(\d+)$", _paged.diagram_md(run), flags=re.M)
    drawn = {name: [int(p) for n, _, p in edges if n == name] for name in _paged.NAMES}
    assert drawn == {name: cache.pages for name, cache in zip(_paged.NAMES, run.caches)}


def test_the_two_requests_interleave_in_the_pool_and_hold_only_the_pages_they_filled(run):
    a, b = (cache.pages for cache in run.caches)
    assert not set(a) & set(b)
    assert a != list(range(a[0], a[0] + len(a)))  # A's pages are not one block: B's sit between them
    for cache in run.caches:
        assert len(cache.pages) == -(-cache.length // _paged.PAGE_SIZE)


def test_the_pages_hold_what_a_contiguous_cache_holds_and_the_logits_are_a_full_forwards(run):
    assert _paged.contiguous_gap(run) < 1e-12
    assert max(run.gaps) < 1e-12


def test_crossed_page_tables_are_caught_by_the_contiguous_comparison():
    crossed = _paged.two_requests()
    a, b = crossed.caches
    a.pages, b.pages = b.pages + a.pages[len(b.pages):], a.pages[:len(b.pages)]  # same lengths, swapped pages
    assert _paged.contiguous_gap(crossed) > 0.1


def test_the_byte_table_is_whole_pages_for_the_paged_cache_and_the_whole_context_for_the_contiguous():
    text = _paged.bytes_md()
    rows = [line.split(" | ") for line in text.splitlines() if re.match(r"^\| \d", line)]
    per_position = int(re.search(r"One position costs ([\d,]+) bytes", text)[1].replace(",", ""))
    contiguous = {row[1] for row in rows}
    assert len(contiguous) == 1
    for row in rows:
        n, pages, paged = int(row[0][2:]), int(row[3]), int(row[4].replace(",", ""))
        assert pages == -(-n // _paged.PAGE_SIZE) and paged == pages * _paged.PAGE_SIZE * per_position


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


# ---------------------------------------------------------------- Serving: replay and equality

def test_the_replay_table_is_timed_once_and_then_read_from_its_cache(monkeypatch):
    monkeypatch.setenv("SITE_QUICK", "1")
    first = serving.replay_md()
    monkeypatch.setattr(serving, "replay_row", lambda *a: pytest.fail("the replays were timed again"))
    assert serving.replay_md() == first


def test_replays_come_every_t_max_minus_keep_plus_one_tokens():
    cfg, params = serving.setting()
    prompt = list(range(cfg.context_len // 2))
    row = serving.replay_row(cfg, params, cfg.context_len // 2, prompt, 3 * cfg.context_len)
    assert row[2] == cfg.context_len - cfg.context_len // 2 + 1
    assert row[3].startswith(f"{cfg.context_len // 2}-")


def test_a_scheduler_that_keeps_one_token_too_many_is_refused(monkeypatch):
    class OffByOne(Scheduler):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.keep += 1
    monkeypatch.setattr(serving, "Scheduler", OffByOne)
    cfg, params = serving.setting()
    with pytest.raises(RuntimeError, match="replays every"):
        serving.replay_row(cfg, params, cfg.context_len // 2, list(range(4)), 3 * cfg.context_len)


def test_the_served_logits_pass_and_logits_of_a_window_off_by_one_fail():
    assert "FAIL" not in serving.windows_md() and "FAIL" not in serving.generate_md()
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
    text = serving.generate_md()
    for same in re.findall(r"\| (\d+) of (\d+) \|", text):
        assert same[0] == same[1]


# ---------------------------------------------------------------- Serving: the benchmark

def test_the_benchmark_is_read_from_its_cache_while_its_code_is_unchanged(monkeypatch):
    monkeypatch.setenv("SITE_QUICK", "1")  # the quick cells: the full run takes minutes
    first = _bench.measurements()
    monkeypatch.setattr(bench, "measure_all", lambda **kw: pytest.fail("the benchmark ran again"))
    assert _bench.measurements() == first


def test_the_bars_are_stated_when_measured_and_their_absence_is_said():
    cells = [bench.Measurement(s, 256, n, 10, t, None) for s, n, t in
             (("recompute", 1, 10.0), ("contiguous", 1, 1.0), ("paged one by one", 1, 4.0),
              ("paged one by one", 16, 4.0), ("paged batched", 16, 2.0))]
    text = _bench.bars_md(cells)
    assert "10.0x, meets the bar of 5x" in text and "2.5x, MISSES the bar of 5x" in text
    assert "2.0x, MISSES the bar of 3x" in text
    assert "quick build" in _bench.bars_md([m for m in cells if m.context != 256])


def test_the_figure_is_an_inline_svg_with_both_panels():
    cells = [bench.Measurement(s, c, n, 10, 1.0 + c / 100, None) for s in bench.STRATEGIES for c in (32, 64)
             for n in (1, 4)]
    svg = _bench.figure_svg(cells)
    assert svg.startswith('<div class="bench-figure"') and "<svg" in svg and "<?xml" not in svg
    assert "one request" in svg and "context 64: one by one or batched" in svg
