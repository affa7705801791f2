"""Flash attention and activation checkpointing: the same numbers as the plain path, with less kept.

Flash attention adds the softmax's terms in another order, so it is held to the materialized path at
1e-12 relative in float64 (rounding there is ~1e-16 per operation, and a handful of operations separate
the two). Checkpointing replays the very same operations on the very same arrays, so it is held to bitwise
equality, in both dtypes.
"""

import numpy as np
import pytest

import transformer.activation_checkpoint as activation_checkpoint
import transformer.flash_attention as flash
import transformer.model as model
from transformer.activation_checkpoint import BlockReplay
from transformer.attention import attention_backward, attention_forward
from transformer.checkpoint import Checkpoint, load_checkpoint, save_checkpoint
from transformer.cli import main
from transformer.config import ModelConfig
from transformer.memory import arrays_in
from transformer.data import CharTokenizer
from transformer.errors import ConfigError
from transformer.flash_attention import FlashCache, flash_attention_backward, flash_attention_forward
from transformer.gradcheck import check_passes, gradcheck_model
from transformer.model import forward, init_params, loss_and_grads, param_shapes

from test_cli import SMALL
from test_layers import ATTENTION_KEYS, assert_grad_matches, random_attention_params

EQUAL_REL = 1e-12
CFG = ModelConfig(vocab_size=11, context_len=64, emb_dim=16, num_heads=4, num_layers=2, ff_dim=24)


def zero_in_exact_arithmetic(name, T):
    """Gradients that are exactly zero mathematically, so only rounding noise is left to compare: the key
    bias always (it adds one constant to a whole row of scores), and with a single position also the
    queries and keys (a softmax over one score is 1 whatever the score)."""
    short = name.rsplit(".", 1)[-1]
    return short == "bk" or (T == 1 and short in ("wq", "bq", "wk"))


def assert_equal_gradients(ours, reference, T, what):
    """Each gradient within EQUAL_REL of the reference's largest entry; a gradient that is zero in exact
    arithmetic within EQUAL_REL of the largest gradient anywhere."""
    overall = max(np.abs(g).max() for g in reference.values())
    for name, ref in reference.items():
        scale = overall if zero_in_exact_arithmetic(name, T) else np.abs(ref).max()
        gap = np.abs(ours[name] - ref).max()
        assert gap <= EQUAL_REL * scale, f"{what}: d{name} differs by {gap:.3e} (scale {scale:.3e})"


def attention_both_ways(T, tile, B=2, d=16, H=4, seed=0):
    rng = np.random.default_rng(seed)
    p = random_attention_params(rng, d)
    x = rng.standard_normal((B, T, d))
    dy = rng.standard_normal((B, T, d))
    y, cache = attention_forward(x, p, H)
    dx, grads = attention_backward(dy, cache)
    y_f, cache_f = flash_attention_forward(x, p, H, tile)
    dx_f, grads_f = flash_attention_backward(dy, cache_f)
    return (y, dx, grads), (y_f, dx_f, grads_f), cache_f


@pytest.mark.parametrize("tile", [1, 3, 8, 64])
@pytest.mark.parametrize("T", [1, 7, 8, 9, 64])
def test_flash_attention_equals_the_materialized_path(T, tile):
    (y, dx, grads), (y_f, dx_f, grads_f), _ = attention_both_ways(T, tile)
    assert np.abs(y_f - y).max() <= EQUAL_REL * np.abs(y).max()
    assert np.abs(dx_f - dx).max() <= EQUAL_REL * np.abs(dx).max()
    assert_equal_gradients(grads_f, grads, T, f"T={T} tile={tile}")


@pytest.mark.parametrize("single", [True, False])
@pytest.mark.parametrize("T,tile", [(1, 8), (9, 3), (64, 8)])
def test_flash_model_equals_the_materialized_model(T, tile, single):
    rng = np.random.default_rng(T)
    params = init_params(CFG, seed=1)
    shape = (T,) if single else (3, T)
    ids, targets = rng.integers(0, CFG.vocab_size, shape), rng.integers(0, CFG.vocab_size, shape)
    flash_cfg = CFG.with_(attention="flash", flash_tile=tile)
    logits, _ = forward(params, ids, CFG)
    logits_f, _ = forward(params, ids, flash_cfg)
    assert logits_f.shape == logits.shape
    assert np.abs(logits_f - logits).max() <= EQUAL_REL * np.abs(logits).max()
    loss, grads = loss_and_grads(params, ids, targets, CFG)
    loss_f, grads_f = loss_and_grads(params, ids, targets, flash_cfg)
    assert abs(loss_f - loss) <= EQUAL_REL * loss
    assert_equal_gradients(grads_f, grads, T, f"model T={T} tile={tile}")


def test_flash_attention_backward_matches_central_differences():
    rng = np.random.default_rng(3)
    B, T, d, H, tile = 2, 7, 8, 2, 3
    p = random_attention_params(rng, d)
    x = rng.standard_normal((B, T, d))
    dy = rng.standard_normal((B, T, d))

    def f():
        return np.sum(flash_attention_forward(x, p, H, tile)[0] * dy)

    dx, grads = flash_attention_backward(dy, flash_attention_forward(x, p, H, tile)[1])
    assert_grad_matches(dx, f, x, "flash dx")
    for name in ATTENTION_KEYS:
        if name != "bk":  # zero in exact arithmetic: the central difference is noise (see test_layers)
            assert_grad_matches(grads[name], f, p[name], f"flash d{name}")


def test_the_online_softmax_survives_a_maximum_that_grows_by_a_thousand_per_tile():
    """Scores that rise steeply along the keys: every tile raises every row's maximum by 4000 or more, so a
    partial sum and output not rescaled by exp(m_old - m_new) keep the earlier tiles' terms at full weight
    where they should be e^-4000 = 0: the sums come out near 2, 3, ... instead of 1."""
    T, dh = 12, 1
    q = np.ones((1, 1, T, dh))
    k = (1000.0 * np.arange(T, dtype=float)).reshape(1, 1, T, dh)
    v = np.arange(T, dtype=float).reshape(1, 1, T, dh)
    out, row_max, row_sum = flash.flash_core_forward(q, k, v, tile=4)
    # Each row t is dominated by its last visible key, t: the output is t to within e^-1000, the maximum
    # is exactly 1000 t, and the sum is 1 plus terms below e^-1000.
    np.testing.assert_allclose(out[0, 0, :, 0], np.arange(T), rtol=1e-12, atol=0)
    np.testing.assert_array_equal(row_max[0, 0], 1000.0 * np.arange(T))
    np.testing.assert_array_equal(row_sum[0, 0], np.ones(T))


def test_flash_never_forms_a_t_by_t_matrix_and_keeps_no_probabilities(monkeypatch):
    B, T, H, tile = 2, 64, 4, 8
    shapes = []
    original = flash.tile_scores
    monkeypatch.setattr(flash, "tile_scores", lambda *a: shapes.append(original(*a).shape) or original(*a))
    *_, cache = attention_both_ways(T, tile, B=B, H=H)
    # Forward and backward each score every tile once: T/tile tiles, none wider than the tile.
    assert len(shapes) == 2 * (T // tile)
    assert all(s[:2] == (B, H) and s[3] <= tile for s in shapes)
    assert isinstance(cache, FlashCache)
    for name in ("q_scaled", "k", "v"):
        assert getattr(cache, name).shape == (B, H, T, 16 // H)
    assert cache.row_max.shape == cache.row_sum.shape == (B, H, T)
    assert not [a.shape for a in arrays_in(cache) if list(a.shape).count(T) >= 2]  # nothing (T, T), anywhere


def test_the_t_by_t_check_sees_the_materialized_probabilities():
    """Negative control of the check above: the materialized cache does hold a (T, T) array."""
    T = 12
    rng = np.random.default_rng(0)
    _, cache = attention_forward(rng.standard_normal((1, T, 16)), random_attention_params(rng, 16), 4)
    assert [a.shape for a in arrays_in(cache) if list(a.shape).count(T) >= 2]


def test_a_tile_wider_than_the_sequence_and_a_ragged_last_tile_both_work():
    for T, tile in ((5, 64), (10, 4)):
        (y, dx, _), (y_f, dx_f, _), _ = attention_both_ways(T, tile, seed=T)
        assert np.abs(y_f - y).max() <= EQUAL_REL * np.abs(y).max()
        assert np.abs(dx_f - dx).max() <= EQUAL_REL * np.abs(dx).max()


# ------------------------------------------------------------------ activation checkpointing

@pytest.mark.parametrize("attention", ["materialized", "flash"])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_checkpointed_gradients_are_bitwise_the_same(dtype, attention):
    cfg = CFG.with_(attention=attention, flash_tile=5)
    rng = np.random.default_rng(0)
    params = init_params(cfg, seed=2, dtype=dtype)
    ids, targets = rng.integers(0, cfg.vocab_size, (3, 20)), rng.integers(0, cfg.vocab_size, (3, 20))
    loss, grads = loss_and_grads(params, ids, targets, cfg)
    loss_c, grads_c = loss_and_grads(params, ids, targets, cfg.with_(checkpoint_blocks=True))
    assert loss_c == loss
    for name in grads:
        assert grads_c[name].dtype == grads[name].dtype
        np.testing.assert_array_equal(grads_c[name], grads[name], err_msg=name)


def counting(monkeypatch, module, calls):
    """Replace module.block_forward by a wrapper that records which block (its wq array) each call ran."""
    original = module.block_forward

    def wrapper(x, p, cfg, trace=None):
        calls.append(id(p["wq"]))
        return original(x, p, cfg, trace)

    monkeypatch.setattr(module, "block_forward", wrapper)


@pytest.mark.parametrize("checkpoint_blocks", [False, True])
def test_checkpointing_runs_exactly_one_extra_forward_per_block(monkeypatch, checkpoint_blocks):
    cfg = CFG.with_(num_layers=3, checkpoint_blocks=checkpoint_blocks)
    calls = []
    counting(monkeypatch, model, calls)
    counting(monkeypatch, activation_checkpoint, calls)
    params = init_params(cfg, seed=0)
    ids = np.arange(10) % cfg.vocab_size
    loss_and_grads(params, ids, ids, cfg)
    per_block = {id(params[f"b{layer}.wq"]): calls.count(id(params[f"b{layer}.wq"])) for layer in range(3)}
    assert len(calls) == sum(per_block.values())
    assert list(per_block.values()) == [2 if checkpoint_blocks else 1] * 3


def test_a_checkpointed_forward_keeps_only_each_block_input():
    cfg = CFG.with_(checkpoint_blocks=True)
    params = init_params(cfg, seed=0)
    trace = {}
    _, cache = forward(params, np.arange(12)[None] % cfg.vocab_size, cfg, trace)
    block_caches = cache.block_caches
    assert all(isinstance(c, BlockReplay) for c in block_caches)
    assert block_caches[0].x is trace["embedding"]
    assert np.array_equal(block_caches[1].x, trace["b0.out"])
    for layer, c in enumerate(block_caches):
        assert all(c.p[name] is params[f"b{layer}.{name}"] for name in c.p)  # references, not copies


# ------------------------------------------------------------------ configuration and command line

@pytest.mark.parametrize("changes,message", [
    ({"attention": "fast"}, "attention must be one of"),
    ({"flash_tile": 0}, "flash_tile must be a positive integer"),
    ({"flash_tile": 2.5}, "flash_tile must be a positive integer"),
    ({"checkpoint_blocks": "yes"}, "checkpoint_blocks must be True or False"),
])
def test_bad_memory_policy_settings_are_refused_by_name(changes, message):
    with pytest.raises(ConfigError, match=message):
        CFG.with_(**changes)


def test_checkpoints_record_the_memory_policies(tmp_path):
    cfg = CFG.with_(attention="flash", flash_tile=3, checkpoint_blocks=True)
    path = tmp_path / "c.npz"
    save_checkpoint(path, Checkpoint(init_params(cfg), cfg, CharTokenizer("abcdefghijk")))
    assert load_checkpoint(path).cfg == cfg


def test_a_config_saved_before_the_policies_existed_loads_with_the_defaults():
    old = {k: v for k, v in CFG.to_dict().items() if k not in ("attention", "flash_tile", "checkpoint_blocks")}
    cfg = ModelConfig.from_dict(old)
    assert (cfg.attention, cfg.flash_tile, cfg.checkpoint_blocks) == ("materialized", 8, False)


def test_the_command_line_selects_the_policies_and_the_checkpoint_keeps_them(tmp_path, capsys):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("to be or not to be\n" * 20)
    out = tmp_path / "run"
    code = main(["train", "--corpus", str(corpus), "--out", str(out), "--steps", "2", "--eval-every", "2",
                 "--attention", "flash", "--flash-tile", "3", "--checkpoint-blocks", *SMALL])
    assert code == 0, capsys.readouterr().err
    cfg = load_checkpoint(out / "checkpoint.npz").cfg
    assert (cfg.attention, cfg.flash_tile, cfg.checkpoint_blocks) == ("flash", 3, True)


@pytest.mark.parametrize("changes", [{"attention": "flash", "flash_tile": 3},
                                     {"attention": "flash", "flash_tile": 2, "checkpoint_blocks": True}])
def test_the_whole_model_under_the_policies_passes_central_differences(tiny_cfg, changes):
    cfg = tiny_cfg.with_(**changes)
    rng = np.random.default_rng(5)
    ids, targets = rng.integers(0, cfg.vocab_size, (2, 4)), rng.integers(0, cfg.vocab_size, (2, 4))
    report = gradcheck_model(cfg, ids, targets, seed=5, perturb=0.1)
    failed = {name: gaps for name, gaps in report.items() if not check_passes(*gaps)}
    assert not failed and len(report) == len(param_shapes(cfg))
