"""The claims of the Serving page's policies, read as a test would: the picture of shared pages shows the run's
page tables and reference counts, the timeline's marks are what the scheduler fed, and the benchmark's counts
(not its times) say what the prose says of each policy; each check can fail."""

import numpy as np
import pytest

from site_scripts.pages import _serving_policies as policies
from tools import bench_serving as bench


@pytest.fixture(scope="module")
def shared():
    return policies.shared_run()


def system_shared(seen):
    """Every running request's table begins with the same system-prompt pages, each counted once per reader, and
    its other pages are its own."""
    system_pages = policies.SHARE_SYSTEM // policies.SHARE_PAGE
    heads = {tuple(table[:system_pages]) for table in seen["tables"].values()}
    own = [page for table in seen["tables"].values() for page in table[system_pages:]]
    return len(heads) == 1 and all(seen["refs"][page] == len(seen["tables"]) > 1 for page in next(iter(heads))) \
        and all(seen["refs"][page] == 1 for page in own) and len(own) == len(set(own))


def test_the_picture_shows_the_system_prompt_read_by_every_running_request(shared):
    assert system_shared(shared.seen)


def test_the_idle_pages_are_a_finished_requests_full_pages_with_their_keys(shared):
    seen = shared.seen
    assert seen["done"] and seen["idle"] and not set(seen["done"]) & set(seen["tables"])  # finished, not running
    assert all(page not in seen["refs"] and page not in seen["free"] for page in seen["idle"])
    held = {page for table in seen["tables"].values() for page in table}
    assert len(held) + len(seen["idle"]) + len(seen["free"]) == policies.SHARE_POOL  # every page accounted for


def test_a_pool_that_never_finds_a_page_shares_nothing(monkeypatch):
    """Negative control: when the lookup finds nothing, every request computes its own copy of the system prompt,
    and the check above fails."""
    monkeypatch.setattr(policies.PrefixPool, "lookup", lambda self, tokens: [])
    assert not system_shared(policies.shared_run().seen)


@pytest.fixture(scope="module")
def marked():
    return policies.timeline_run()


def test_the_long_prompt_is_fed_in_chunks_within_the_budget(marked):
    scheduler, requests = marked
    long = max(range(len(requests)), key=lambda r: len(requests[r].prompt))
    chunks = [step[long] for step in scheduler.chunks if long in step]
    assert len(chunks) > 1 and sum(chunks) >= len(requests[long].prompt)
    assert all(sum(step.values()) <= policies.TIMELINE_BUDGET for step in scheduler.chunks)


def test_every_preemption_is_marked_and_the_victim_comes_back(marked):
    scheduler, requests = marked
    bangs = [(i, r) for i, step in enumerate(scheduler.marks) for r, mark in step.items() if mark == "!"]
    assert len(bangs) == scheduler.preempted == sum(r.preemptions for r in requests) > 0
    for i, r in bangs:
        assert any(step.get(r) == "P" for step in scheduler.marks[i + 1:])  # fed its text again later
        assert all(len(requests[r].new) == requests[r].num_tokens for r in range(len(requests)))


def test_the_timeline_has_a_line_per_request_and_a_mark_per_step(marked):
    text, values = policies.timeline()
    lines = text.strip("`\n").splitlines()[3:]
    assert len(lines) == len(policies.TIMELINE) and values["steps"] == len(marked[0].marks)
    assert all(set(line[len("request 0   "):]) <= set("P#.! ") for line in lines)


@pytest.fixture(scope="module")
def counted():
    params = bench.init_params(bench.CONFIG, seed=bench.WORKLOAD["seed"], dtype=np.float32)
    pool = bench.POOLS[0]
    return {policy: bench.measure(params, policy, pool) for policy in bench.POLICIES}


def test_each_policy_does_what_the_prose_says_it_does(counted):
    plain = counted["plain"]
    assert counted["prefix cache"].computed < plain.computed and counted["prefix cache"].reused > 0
    assert counted["preemption"].preempted > 0 and counted["preemption"].steps < plain.steps
    assert counted["preemption"].computed > plain.computed  # the texts fed again
    assert counted["chunked prefill"].computed == plain.computed  # the same work, spread
    assert all(m.drawn == plain.drawn for m in counted.values())


def test_a_changed_token_changes_the_digest():
    """Negative control of "same tokens as plain": the digest sees one token changed."""
    params = bench.init_params(bench.CONFIG, seed=bench.WORKLOAD["seed"], dtype=np.float32)
    real = bench.Scheduler.draw

    def one_off(self):
        real(self)
        for r in self.running:
            if r.request.new and len(r.request.new) == 1:
                r.request.new[0] = (r.request.new[0] + 1) % bench.CONFIG.vocab_size
                r.ids[-1] = r.request.new[0]

    a = bench.measure(params, "plain", bench.POOLS[-1])
    bench.Scheduler.draw = one_off
    try:
        b = bench.measure(params, "plain", bench.POOLS[-1])
    finally:
        bench.Scheduler.draw = real
    assert a.drawn != b.drawn
