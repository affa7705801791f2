"""A batch computed in shards by threads gives the numbers of one pass over it, up to rounding."""

import numpy as np
import pytest

from transformer.autograd_model import loss_and_grads as autograd_loss_and_grads
from transformer.config import ModelConfig
from transformer.model import init_params, loss_and_grads
from transformer.parallel import Sharded, shard_rows
from transformer.train import evaluate

CFG = ModelConfig(vocab_size=11, context_len=8, emb_dim=8, num_heads=2, num_layers=2, ff_dim=12)


@pytest.mark.parametrize("batch,shards", [(1, 2), (2, 2), (7, 2), (7, 3), (8, 16)])
def test_shards_cover_every_row_once_and_differ_in_size_by_at_most_one(batch, shards):
    rows = shard_rows(batch, shards)
    assert [r for a, b in rows for r in range(a, b)] == list(range(batch))
    sizes = [b - a for a, b in rows]
    assert min(sizes) >= 1 and max(sizes) - min(sizes) <= 1 and len(rows) == min(batch, shards)


@pytest.mark.parametrize("compute", [loss_and_grads, autograd_loss_and_grads], ids=["handwritten", "autograd"])
@pytest.mark.parametrize("batch,threads", [(7, 2), (7, 3), (5, 8), (1, 2)])
def test_a_sharded_batch_has_the_loss_and_gradients_of_one_pass(compute, batch, threads):
    """The shards are weighted by their share of the rows: 3 and 4 rows of 7 weigh 3/7 and 4/7, not 1/2 each
    (a plain mean of the shards' means would be off by a relative 1/7 here)."""
    params = init_params(CFG, seed=3)
    rng = np.random.default_rng(4)
    x, y = rng.integers(0, CFG.vocab_size, (2, batch, CFG.context_len))
    loss, grads = compute(params, x, y, CFG)
    shard_loss, shard_grads = Sharded(threads)(compute, params, x, y, CFG)
    assert shard_loss == pytest.approx(loss, rel=1e-12)
    for name, g in grads.items():
        if not name.endswith(".bk"):  # exactly zero in theory: its entries are rounding noise
            np.testing.assert_allclose(shard_grads[name], g, rtol=1e-12, atol=1e-12 * np.abs(g).max())


def test_sharded_float32_gradients_stay_float32():
    params = init_params(CFG, seed=3, dtype=np.float32)
    x = np.zeros((4, CFG.context_len), dtype=int)
    _, grads = Sharded(2)(loss_and_grads, params, x, x, CFG)
    assert {g.dtype for g in grads.values()} == {np.dtype(np.float32)}


def test_evaluation_in_threads_gives_the_same_mean_loss():
    params = init_params(CFG, seed=5)
    data = np.random.default_rng(6).integers(0, CFG.vocab_size, 301)
    one = evaluate(params, CFG, data, seq_len=8, batch_size=4, threads=1)
    assert evaluate(params, CFG, data, seq_len=8, batch_size=4, threads=3) == one
