"""The bars of the memory policies, measured by tools/memory_policies.py (tracemalloc counts bytes, so
the numbers are the same on every run): flash attention's memory at T = 1024 at least 8 times smaller
than the materialized path's, and checkpointing keeping at most 1/L of the block internals."""

import numpy as np
import pytest

from tools import memory_policies as mp
from transformer.model import forward, init_params


@pytest.fixture(scope="module")
def at_1024():
    return {policy: mp.measure(policy, 1024) for policy in mp.POLICIES}


def test_flash_attention_needs_at_least_8x_less_memory_at_t_1024(at_1024):
    assert at_1024["materialized"].attention_peak >= 8 * at_1024["flash"].attention_peak
    assert at_1024["materialized"].step_peak > 4 * at_1024["flash"].step_peak


def block_internals(policy, T=1024):
    """Bytes the block caches own, besides the parameters and the block inputs."""
    cfg = mp.CONFIG.with_(**mp.POLICIES[policy])
    params = init_params(cfg, mp.SEED, np.float32)
    ids, _ = mp.batch(T)
    _, cache = forward(params, ids, cfg)
    blocks = cache.block_caches
    inputs = [c.x for c in blocks] if cfg.checkpoint_blocks else []
    return mp.owned_bytes(blocks, exclude=[*params.values(), *inputs]), mp.owned_bytes(blocks, exclude=params.values())


def test_checkpointing_keeps_at_most_one_block_in_l_of_the_internals(at_1024):
    L = mp.CONFIG.num_layers
    internals, _ = block_internals("materialized")
    kept_internals, kept = block_internals("checkpointed")
    assert kept_internals == 0  # between forward and backward nothing but the inputs is kept
    assert internals - kept >= (L - 1) / L * internals
    # While the backward runs, one block's internals come back at a time: the step's peak drops by at
    # least the other L - 1 blocks' attention probabilities.
    saved = at_1024["materialized"].step_peak - at_1024["checkpointed"].step_peak
    probabilities = mp.BATCH * mp.CONFIG.num_heads * 1024 * 1024 * 4  # float32 (B, H, T, T)
    assert saved >= (L - 1) * probabilities


def test_the_owned_bytes_count_a_view_once_and_skip_what_is_excluded():
    a = np.zeros((10, 10))
    assert mp.owned_bytes((a, a[1:], {"x": a.T}, [a.reshape(100)])) == a.nbytes
    assert mp.owned_bytes((a, np.ones(3)), exclude=[a]) == 24
