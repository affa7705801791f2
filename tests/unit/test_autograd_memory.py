"""The tape lets go of each step's graph: counted in live Tensors and in bytes (tracemalloc), with the
cyclic garbage collector off, so what is freed is what reference counting frees and every run counts
the same."""

import numpy as np
import pytest

from transformer.autograd_memory import graph_census, train_steps
from transformer.config import PRESETS
from transformer.model import init_params

STEPS = 12
FIRST = 4  # growth is measured from this step on, after the first steps' one-off allocations


@pytest.fixture(scope="module")
def batch():
    rng = np.random.default_rng(0)
    cfg = PRESETS["default"]
    return cfg, rng.integers(0, cfg.vocab_size, (4, 16)), rng.integers(0, cfg.vocab_size, (4, 16))


@pytest.fixture(scope="module")
def census(batch):
    cfg, ids, targets = batch
    return graph_census(init_params(cfg), ids, targets, cfg)


def growth_per_step(records):
    return (records[-1].traced_bytes - records[FIRST - 1].traced_bytes) / (len(records) - FIRST)


@pytest.mark.parametrize("keep_losses, self_capturing", [(False, False), (True, False), (False, True)])
def test_freed_graphs_leave_memory_flat(batch, census, keep_losses, self_capturing):
    cfg, ids, targets = batch
    records = train_steps(cfg, ids, targets, STEPS, keep_losses=keep_losses, self_capturing=self_capturing)
    # Nothing of a step outlives it but the loss Tensors a loop chose to keep, one number each.
    assert [r.live_tensors for r in records] == [r.step if keep_losses else 0 for r in records]
    # A few hundred bytes a step remain: the records themselves and Python's free lists filling up.
    assert growth_per_step(records) < census.graph_bytes / 100
    assert records[-1].loss < records[0].loss  # it did train


@pytest.mark.parametrize("keep_losses, self_capturing", [(True, False), (False, True)])
def test_graphs_not_freed_grow_by_a_graph_a_step(batch, census, keep_losses, self_capturing):
    """Without the freeing, a kept loss holds its whole graph; a graph whose nodes hold themselves (the
    reference engine's bug) is kept by its own cycles even when nothing else refers to it."""
    cfg, ids, targets = batch
    records = train_steps(cfg, ids, targets, STEPS, free_graph=False, keep_losses=keep_losses,
                          self_capturing=self_capturing)
    assert [r.live_tensors for r in records] == [(census.nodes + census.constants) * r.step for r in records]
    assert growth_per_step(records) >= census.graph_bytes


def test_the_graph_holds_more_than_the_hand_written_cache(census):
    """Every node keeps its value until the backward, where the hand-written forward keeps only what
    its backward reads (LayerNorm's xhat and 1/sigma, not the centred rows, the variance, ...)."""
    assert census.graph_bytes > 2 * census.cache_bytes > 0
    assert census.nodes > census.parameters


def test_backward_drops_each_intermediate_gradient_once_passed_on(batch, census):
    """What a backward holds at once: the parameters' gradients and a few intermediate ones, far below what
    keeping every node's gradient until the end holds (keep_grads=True, the negative control)."""
    cfg, *_ = batch
    parameters = sum(p.nbytes for p in init_params(cfg).values())
    assert parameters < census.grads_peak_bytes < census.grads_kept_peak_bytes / 3
