"""The cache inventory (site_scripts/cache_inventory.py, cache_walk.py): its bytes are those of the real cache and
agree with tools/memory_policies.py, its lines are the lines that build and read each cache, and its guards stop
a planted wrong line or byte count."""

import dataclasses
import re

import numpy as np
import pytest

from site_scripts import cache_inventory, cache_walk
from site_scripts.code_facts import enclosing_function
from site_scripts.common import ROOT
from site_scripts.examples import SEED, default_run
from tools import memory_policies
from transformer.model import forward, init_params


def default_inventory(policy):
    ex = default_run()
    return cache_walk.inventory(policy, ex.cfg, ex.ids)


def line(place):
    return (ROOT / place.path).read_text().splitlines()[place.line - 1]


@pytest.mark.parametrize("policy", cache_inventory.RUNS)
def test_the_inventorys_total_is_owned_bytes_of_a_fresh_forwards_cache(policy):
    ex = default_run()
    cfg = ex.cfg.with_(**memory_policies.POLICIES[policy])
    params = init_params(cfg, SEED)
    _, cache = forward(params, ex.ids, cfg)
    caches, total = default_inventory(policy)
    assert total == memory_policies.owned_bytes(cache, exclude=params.values()) > 0
    assert sum(c.charged for c in caches) == total


@pytest.mark.parametrize("policy", list(memory_policies.POLICIES))
def test_the_totals_agree_with_what_the_memory_benchmark_reports_as_retained(policy):
    T = 64
    ids, _ = memory_policies.batch(T)
    _, total = cache_walk.inventory(policy, memory_policies.CONFIG, ids, np.float32)
    assert total == memory_policies.measure(policy, T).retained


@pytest.mark.parametrize("policy", cache_inventory.RUNS)
def test_each_built_at_line_makes_its_cache_and_each_read_at_line_reads_it(policy):
    caches, _ = default_inventory(policy)
    for c in caches:
        made = line(c.built)
        assert re.match(rf"\s*(cache = |return .*\b{c.kind}\()", made), (c.path, made)
        assert enclosing_function(c.built.path, c.built.line) == c.built.function
        assert enclosing_function(c.read.path, c.read.line) == c.read.function
        assert c.read.function == c.built.function.replace("forward", "backward")  # the pair, by the house naming
    kinds = {c.path: c.kind for c in caches}
    assert kinds["block_caches[l]"] == ("BlockReplay" if policy == "checkpointed" else "BlockCache")


def test_the_attention_caches_are_the_ones_each_policy_builds():
    kinds = {policy: {c.path: c.kind for c in default_inventory(policy)[0]} for policy in ("materialized", "flash")}
    assert kinds["materialized"]["block_caches[l].attn_cache"] == "AttentionCache"
    assert kinds["flash"]["block_caches[l].attn_cache"] == "FlashCache"
    assert "block_caches[l].attn_cache.att_cache" not in kinds["flash"]  # flash keeps no (T, T) weights


def test_a_planted_wrong_built_at_or_read_at_line_stops_the_build():
    """Negative control: the guard that keeps a wrong file:line off the page."""
    caches, _ = default_inventory("materialized")
    attn = next(c for c in caches if c.path == "block_caches[l].attn_cache")
    cache_walk.check_lines(attn)  # the real lines pass
    for wrong in (dataclasses.replace(attn, built=dataclasses.replace(attn.built, line=attn.built.line - 1)),
                  dataclasses.replace(attn, read=dataclasses.replace(attn.read, line=attn.read.line + 1))):
        with pytest.raises(RuntimeError, match="does not"):
            cache_walk.check_lines(wrong)


def test_a_planted_wrong_byte_count_stops_the_build():
    """Negative control: rows that do not add up to the cache's owned bytes are refused."""
    caches, total = default_inventory("flash")
    cache_walk.check_total(caches, total)
    caches[1].fields[0].charged += 8
    with pytest.raises(RuntimeError, match="add up"):
        cache_walk.check_total(caches, total)


def test_the_bytes_of_the_long_run_grow_with_the_batch_as_the_page_says():
    """The page says which bytes are B times the one-sequence figure; a run with B = 2 must agree."""
    (_, total), _ = cache_inventory.runs_of("materialized")[1:]
    fixed = cache_inventory.unbatched("materialized")
    ids = np.random.default_rng(SEED).integers(0, 65, (2, cache_inventory.LONG_T))
    _, total_b2 = cache_walk.inventory("materialized", cache_inventory.long_config(), ids)
    assert 0 <= fixed < total and total_b2 == 2 * (total - fixed) + fixed  # fixed: bytes with no batch axis


def test_the_totals_table_shows_each_policys_real_totals():
    md = cache_inventory.comparison_table(cache_inventory.RUNS)
    for policy in cache_inventory.RUNS:
        (_, total), (_, long_total), _ = cache_inventory.runs_of(policy)
        assert f"| {policy} | {cache_inventory.size_text(total)} | {cache_inventory.size_text(long_total)} |" in md


@pytest.mark.parametrize("page", ["model"])
def test_the_pages_cache_keys_cover_the_inventorys_modules(page):
    from site_scripts import build

    names = [p.name for p in build.page_sources(page)]
    assert {"cache_inventory.py", "cache_walk.py", "memory_policies.py"} <= set(names)
