"""Prefix caching (transformer/prefix_cache.py): requests whose texts begin alike share the full pages of that
beginning, and draw exactly the tokens they draw without it, from logits equal up to rounding (the cached
positions are not recomputed, and the rest is computed in another grouping: 1e-12 relative in float64, as in
tests/unit/test_serving.py)."""

import numpy as np
import pytest

from transformer.config import ModelConfig
from transformer.kv_cache import PagedCache, PagePool, PoolExhausted
from transformer.model import init_params
from transformer.prefix_cache import PrefixPool
from transformer.scheduler import Request, Scheduler

hypothesis = pytest.importorskip(
    "hypothesis", reason="the property tests need hypothesis, part of the test extra (pip install -e '.[test]')")
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

EQUAL_REL = 1e-12
CFG = ModelConfig(vocab_size=7, context_len=12, emb_dim=8, num_heads=2, num_layers=2, ff_dim=12)
PARAMS = init_params(CFG, seed=3)


def run(requests, pool, max_batch, keep):
    scheduler = Scheduler(PARAMS, CFG, pool, max_batch, keep)
    for r in requests:
        scheduler.submit(r)
    scheduler.run()
    return scheduler


def fresh(spec):
    return [Request(list(prompt), n, temperature=t, seed=seed) for prompt, n, t, seed in spec]


@st.composite
def workloads(draw):
    """Requests built from a few shared beginnings (any length: ending mid-page, or longer than the context) and
    their own tails, some finishing at once while others still read the shared pages, some crossing the
    context limit."""
    tokens = st.integers(0, CFG.vocab_size - 1)
    beginnings = draw(st.lists(st.lists(tokens, min_size=1, max_size=CFG.context_len + 3), min_size=1, max_size=3))
    spec = []
    for _ in range(draw(st.integers(1, 6))):
        prompt = draw(st.sampled_from(beginnings)) + draw(st.lists(tokens, max_size=5))
        spec.append((prompt, draw(st.integers(0, 2 * CFG.context_len)), draw(st.sampled_from([0.0, 1.0])),
                     draw(st.integers(0, 3))))
    page_size = draw(st.integers(1, 5))
    return spec, page_size, draw(st.integers(1, 4)), draw(st.integers(1, CFG.context_len))


@given(workloads())
@settings(max_examples=200, derandomize=True, deadline=None, database=None)
def test_the_prefix_cache_changes_no_token_and_no_logit_beyond_rounding(workload):
    spec, page_size, max_batch, keep = workload
    num_pages = 3 * (CFG.context_len // page_size + 1)
    plain, shared = fresh(spec), fresh(spec)
    run(plain, PagePool(CFG, num_pages, page_size, np.float64), max_batch, keep)
    pool = PrefixPool(CFG, num_pages, page_size, np.float64)
    run(shared, pool, max_batch, keep)
    for a, b in zip(plain, shared):
        assert a.new == b.new and a.windows == b.windows
        for x, y in zip(a.drawn_from, b.drawn_from):
            assert np.abs(x - y).max() <= EQUAL_REL * np.abs(x).max()
    assert not pool.leased and not pool.refs and pool.available == pool.num_pages  # every page came back


def test_sixteen_requests_with_one_system_prompt_compute_it_once():
    """A system prompt of three full pages and a question of its own per request: the first request computes the
    prompt, the other fifteen adopt its pages, and the pool holds them once."""
    S, rng = 3, np.random.default_rng(0)
    system = rng.integers(0, CFG.vocab_size, 3 * S).tolist()
    spec = [(system + rng.integers(0, CFG.vocab_size, 2).tolist(), 1, 1.0, i) for i in range(16)]
    pool = PrefixPool(CFG, 64, S, np.float64)
    scheduler = run(fresh(spec), pool, 16, None)
    assert scheduler.reused == 15 * 3 * S and scheduler.computed == 3 * S + 16 * 2


def test_a_conversations_next_turn_adopts_the_pages_its_answer_filled_while_decoding():
    """A first turn: a prompt of 3 ids draws 5 tokens, its cache holds 7 positions, and decoding fills pages 1
    and 2 (of 2 positions). The next turn's text is the first's prompt and answer, then a question of its own: it
    adopts all three full pages and computes only the rest, with the logits it would compute alone."""
    S = 2
    pool = PrefixPool(CFG, 16, S, np.float64)
    first = fresh([([1, 2, 3], 5, 1.0, 0)])
    run(first, pool, 1, None)
    turn = first[0].prompt + first[0].new + [4]
    second, alone = fresh([(turn, 2, 1.0, 1)]), fresh([(turn, 2, 1.0, 1)])
    scheduler = run(second, pool, 1, None)
    assert scheduler.reused == 3 * S and scheduler.computed == len(turn) - 3 * S
    run(alone, PagePool(CFG, 16, S, np.float64), 1, None)
    assert second[0].new == alone[0].new
    for x, y in zip(second[0].drawn_from, alone[0].drawn_from):
        assert np.abs(x - y).max() <= EQUAL_REL * np.abs(x).max()


def test_a_shared_page_outlives_the_request_that_filled_it_and_is_evicted_last_used_first():
    """A cache lets its pages go last page first, so a text's later page is taken back before its first one,
    which can still be found."""
    S = 2
    pool = PrefixPool(CFG, 4, S, np.float64)
    first, second = PagedCache(pool, CFG.context_len), PagedCache(pool, CFG.context_len)
    first.reserve(4)
    pool.register(first.pages, [1, 2, 3, 4])
    second.adopt(pool.lookup([1, 2, 3, 4, 5]))
    assert second.pages == first.pages and pool.refs[first.pages[0]] == 2
    pages = list(first.pages)
    first.release()  # the second still reads them
    assert pool.refs[pages[0]] == 1 and pages[0] not in pool.free
    second.release()
    assert list(pool.idle) == pages[::-1] and pool.available == 4  # kept, idle, in the order they were let go
    third = PagedCache(pool, CFG.context_len)
    third.reserve(6)  # two free pages, then the least recently released idle one is taken back
    assert third.pages[2] == pages[1] and pool.lookup([1, 2, 3, 4]) == [pages[0]]
    with pytest.raises(PoolExhausted, match="all 4 pages"):
        PagedCache(pool, CFG.context_len).reserve(4)


def test_a_request_that_replays_while_another_reads_its_pages_never_runs_the_pool_dry():
    """The second request's prompt begins with the first's ten pages. Admitted beside the first, it would adopt them;
    at the context limit the first lets them go and fills new ones while the second still reads them, so without
    preemption the pool must promise each request its whole context, shared pages counted by each reader (a
    promise that counted the shared pages once admitted both here, and the pool ran dry)."""
    prompt = [0, 2, 2, 0, 0, 0, 0, 0, 0, 0]
    requests = fresh([(prompt, 10, 0.0, 0), (prompt + [0], 10, 0.0, 0)])
    pool = PrefixPool(CFG, 14, 1, np.float64)  # 12 pages for each request's whole context: 24 without sharing
    scheduler = run(requests, pool, 2, 1)
    assert requests[0].replays >= 1
    assert max(scheduler.steps) == 1  # the second waited for the first: 12 + 12 pages cannot be promised
    plain = fresh([(prompt, 10, 0.0, 0), (prompt + [0], 10, 0.0, 0)])
    run(plain, PagePool(CFG, 14, 1, np.float64), 2, 1)
    assert [r.new for r in requests] == [r.new for r in plain]
