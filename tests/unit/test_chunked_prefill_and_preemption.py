"""Chunked prefill and preemption (transformer/scheduler.py): however a step's budget cuts a prompt into chunks,
and however often a request gives its pages back and is fed its text again, each request draws exactly the tokens
it draws served alone, from logits equal up to rounding (the same positions, computed in other groupings: 1e-12
relative in float64, as in tests/unit/test_serving.py)."""

import numpy as np
import pytest

import transformer.scheduler as scheduler_module
from transformer.config import ModelConfig
from transformer.errors import InputError
from transformer.kv_cache import PagedCache, PagePool, PoolExhausted
from transformer.model import init_params
from transformer.prefix_cache import PrefixPool
from transformer.scheduler import Request, Scheduler

hypothesis = pytest.importorskip(
    "hypothesis", reason="the property tests need hypothesis, part of the test extra (pip install -e '.[test]')")
from hypothesis import find, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

EQUAL_REL = 1e-12
CFG = ModelConfig(vocab_size=7, context_len=12, emb_dim=8, num_heads=2, num_layers=2, ff_dim=12)
PARAMS = init_params(CFG, seed=5)


def fresh(spec):
    return [Request(list(prompt), n, temperature=t, seed=seed) for prompt, n, t, seed in spec]


def run(requests, pool, max_batch=4, keep=None, budget=None, preempt=False):
    scheduler = Scheduler(PARAMS, CFG, pool, max_batch, keep, budget, preempt)
    for r in requests:
        scheduler.submit(r)
    scheduler.run()
    return scheduler


def alone(request, page_size, keep):
    """The request served by itself, its prompt fed whole, on a pool that holds all it may fill."""
    (r,) = fresh([(request.prompt, request.num_tokens, request.temperature, request.seed)])
    run([r], PagePool(CFG, CFG.context_len, page_size, np.float64), 1, keep)
    return r


def assert_as_alone(requests, page_size, keep):
    for r in requests:
        a = alone(r, page_size, keep)
        assert r.new == a.new and r.windows == a.windows
        for x, y in zip(r.drawn_from, a.drawn_from):
            assert np.abs(x - y).max() <= EQUAL_REL * np.abs(y).max()


@st.composite
def workloads(draw):
    """Requests (some sharing a beginning, some crossing the context limit), a page size, a batch, a keep, a budget
    from the smallest allowed up, preemption on or off, plain or prefix-cached pages, and a pool from the least
    that holds the largest request (where preemption is forced) to plenty."""
    tokens = st.integers(0, CFG.vocab_size - 1)
    beginning = draw(st.lists(tokens, min_size=1, max_size=CFG.context_len + 2))
    spec = []
    for _ in range(draw(st.integers(1, 5))):
        own = draw(st.lists(tokens, max_size=CFG.context_len))
        prompt = (beginning if draw(st.booleans()) else []) + own or [0]
        spec.append((prompt, draw(st.integers(1, 2 * CFG.context_len)), draw(st.sampled_from([0.0, 1.0])),
                     draw(st.integers(0, 3))))
    page_size, max_batch = draw(st.integers(1, 5)), draw(st.integers(1, 4))
    budget = draw(st.one_of(st.none(), st.integers(max_batch, max_batch + 2 * CFG.context_len)))
    least = max(-(-min(len(p) + n - 1, CFG.context_len) // page_size) for p, n, _, _ in spec)
    pages = least + draw(st.integers(0, 2 * CFG.context_len // page_size))
    return spec, page_size, max_batch, draw(st.integers(1, CFG.context_len)), budget, draw(st.booleans()), \
        draw(st.booleans()), pages


def served(workload):
    spec, page_size, max_batch, keep, budget, preempt, prefix, pages = workload
    pool = (PrefixPool if prefix else PagePool)(CFG, pages, page_size, np.float64)
    requests = fresh(spec)
    return requests, run(requests, pool, max_batch, keep, budget, preempt), pool


@given(workloads())
@settings(max_examples=200, derandomize=True, deadline=None, database=None)
def test_every_request_draws_what_it_draws_alone_whatever_the_budget_and_the_preemptions(workload):
    requests, scheduler, pool = served(workload)
    assert_as_alone(requests, workload[1], workload[3])
    assert not pool.leased and pool.available == pool.num_pages  # every page came back


def test_the_random_workloads_do_chunk_prompts_and_preempt_requests():
    """Negative control of the property's reach: the strategy does draw workloads where a prompt is fed over several
    steps and where a request gives its pages back (a strategy that never did would make the property empty)."""
    settings_ = settings(max_examples=500, derandomize=True, database=None)
    chunked = find(workloads(), lambda w: w[4] is not None and served(w)[1].computed > w[4], settings=settings_)
    preempted = find(workloads(), lambda w: served(w)[1].preempted > 0, settings=settings_)
    assert chunked[4] is not None and preempted[5]


def fed_per_step(monkeypatch):
    """Record the ids each step feeds, through every path (prefill, extend, batched decoding)."""
    steps = [[]]
    for name in ("prefill", "extend"):
        real = getattr(scheduler_module, name)
        monkeypatch.setattr(scheduler_module, name,
                            lambda params, ids, cache, cfg, real=real: steps[-1].append(len(ids)) or real(params, ids, cache, cfg))
    real_decode, real_retire = scheduler_module.decode_batch, Scheduler.retire
    monkeypatch.setattr(scheduler_module, "decode_batch",
                        lambda params, tokens, caches, cfg: steps[-1].append(len(tokens)) or real_decode(params, tokens, caches, cfg))
    monkeypatch.setattr(Scheduler, "retire", lambda self: steps.append([]) or real_retire(self))
    return steps


def test_a_long_prompt_is_fed_in_chunks_while_the_others_decode(monkeypatch):
    """Budget 4, two short requests and a prompt of 10: the first step feeds 2 + 1 + the 1 id left; from then on two
    ids decode and the prompt takes the other 2 each step, until its last id joins the batched step."""
    steps = fed_per_step(monkeypatch)
    requests = fresh([([1, 2], 12, 1.0, 0), ([3], 12, 1.0, 1), ([4, 5, 6, 0, 1, 2, 3, 4, 5, 6], 3, 1.0, 2)])
    scheduler = run(requests, PagePool(CFG, 12, 4, np.float64), max_batch=3, budget=4)
    assert all(sum(fed) <= 4 for fed in steps)
    assert steps[:7] == [[2, 1, 1], [2, 2], [2, 2], [2, 2], [2, 2], [3], [3]]
    assert scheduler.computed == 2 + 1 + 10 + CFG.context_len // 2  # the prompts, and the first one's replay
    assert [r.replays for r in requests] == [1, 0, 0]
    assert_as_alone(requests, 4, None)


def test_without_a_budget_a_prompt_is_fed_whole(monkeypatch):
    steps = fed_per_step(monkeypatch)
    requests = fresh([([1, 2], 3, 1.0, 0), (list(range(7)) + [1, 2, 3, 4], 3, 1.0, 1)])
    run(requests, PagePool(CFG, 12, 4, np.float64), max_batch=2)
    assert steps[0] == [2, 11]


def test_the_youngest_gives_its_pages_back_when_the_pool_runs_short_and_is_fed_again_later():
    """Two requests that each fill 3 pages of 4, on a pool of 4 pages: with preemption both start, the younger gives
    its pages back when the older needs a third, and is fed its text again once the older is done."""
    spec = [([1, 2, 3], 9, 1.0, 0), ([4, 5, 6], 9, 1.0, 1)]
    waiting, preempting = fresh(spec), fresh(spec)
    reserved = run(waiting, PagePool(CFG, 4, 4, np.float64), max_batch=2)
    pool = PagePool(CFG, 4, 4, np.float64)
    preempted = run(preempting, pool, max_batch=2, preempt=True)
    assert reserved.preempted == 0 and max(reserved.steps) == 1  # the second waits for all its pages
    assert preempting[0].preemptions == 0 and preempting[1].preemptions == 1 == preempted.preempted
    assert max(preempted.steps) == 2 and preempted.computed > reserved.computed  # together, then recomputed
    assert_as_alone(preempting, 4, None)
    assert len(pool.free) == pool.num_pages


def test_a_preempted_request_finds_its_own_pages_in_the_prefix_cache():
    """Its full pages stay idle with their keys, so being fed again costs only what was evicted."""
    spec = [([1, 2, 3, 4, 5], 6, 1.0, 0), ([6, 5, 4, 3, 2], 6, 1.0, 1)]
    requests = fresh(spec)
    scheduler = run(requests, PrefixPool(CFG, 7, 2, np.float64), max_batch=2, preempt=True)
    assert scheduler.preempted >= 1 and scheduler.reused > 0
    assert_as_alone(requests, 2, None)


def test_pages_leased_elsewhere_stop_a_preempting_run_with_an_error_not_a_loop():
    pool = PagePool(CFG, 4, 4, np.float64)
    PagedCache(pool, CFG.context_len).reserve(5)  # two pages taken by something else
    scheduler = Scheduler(PARAMS, CFG, pool, 2, preempt=True)
    scheduler.submit(Request([1, 2, 3], 12))  # it fills 3 pages at most; 2 are free
    with pytest.raises(PoolExhausted, match="needs 3 pages and the pool has 2 free: pages leased outside"):
        scheduler.run()
    assert len(pool.free) == 2 and len(pool.leased) == 2  # its own pages went back; the others' stay


@pytest.mark.parametrize("budget", [0, 1, 2.5, "4"])
def test_a_budget_below_the_batch_is_refused_by_name(budget):
    with pytest.raises(InputError, match="budget must be an integer of at least max_batch = 2"):
        Scheduler(PARAMS, CFG, PagePool(CFG, 4, 4, np.float64), max_batch=2, budget=budget)


@pytest.mark.parametrize("kind,spec,pages,page_size,max_batch,budget", [
    (PagePool, [([1, 2, 3], 11, 1.0, 0), ([4, 5, 6, 0, 1, 2, 3, 4], 3, 1.0, 1), ([5, 6, 0, 1], 9, 1.0, 2),
                ([2, 3], 8, 1.0, 3)], 6, 3, 4, 5),
    # Shared pages: a request that gave way can adopt its full pages again at once, and would, without the rule.
    (PrefixPool, [([0, 3, 4, 5, 6, 3], 11, 1.0, 0), ([0, 3, 4, 5, 6], 6, 1.0, 1), ([0, 3, 4, 5, 6], 6, 1.0, 2)],
     8, 2, 3, 6),
])
def test_a_request_that_gives_way_waits_a_step_before_it_is_fed_again(monkeypatch, kind, spec, pages, page_size,
                                                                      max_batch, budget):
    """Fed again in the step it gave way in, it would find the pool as short at the next step and give way again,
    recomputing its text without drawing a token."""
    events = []
    real_give_way, real_feed_chunk = Scheduler.give_way, Scheduler.feed_chunk
    monkeypatch.setattr(Scheduler, "give_way",
                        lambda self, r: events.append(("gave way", len(self.times), r.order)) or real_give_way(self, r))
    monkeypatch.setattr(Scheduler, "feed_chunk",
                        lambda self, r, n: events.append(("fed", len(self.times), r.order)) or real_feed_chunk(self, r, n))
    requests = fresh(spec)
    scheduler = run(requests, kind(CFG, pages, page_size, np.float64), max_batch, budget=budget, preempt=True)
    gave_way = {(step, order) for what, step, order in events if what == "gave way"}
    assert gave_way and not any(what == "fed" and (step, order) in gave_way for what, step, order in events)
    assert scheduler.preempted == len(gave_way)
    assert_as_alone(requests, page_size, None)
