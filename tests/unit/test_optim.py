"""AdamW, the decay groups, the learning-rate schedule and gradient clipping."""

import math

import numpy as np
import pytest
from numpy.testing import assert_allclose, assert_array_equal

from transformer.config import PRESETS
from transformer.model import init_params, loss_and_grads, param_shapes
from transformer.optim import AdamWConfig, adamw_init, adamw_update, clip_grads, is_decayed, lr_at
from transformer.torch_mirror import to_torch


# -------------------------------------------------------------------- AdamW


def test_adamw_matches_torch_adamw_for_20_steps_in_float64(tiny_cfg):
    """Same gradients, same hyperparameters and decay groups: torch.optim.AdamW is the reference."""
    torch = pytest.importorskip("torch")
    cfg = tiny_cfg.with_(activation="gelu")
    rng = np.random.default_rng(30)
    ids = rng.integers(0, cfg.vocab_size, size=(2, cfg.context_len))
    targets = rng.integers(0, cfg.vocab_size, size=(2, cfg.context_len))
    params = init_params(cfg, seed=0)
    for p in params.values():
        if p.ndim == 1:  # non-trivial gains and biases from the start
            p += 0.1 * rng.standard_normal(p.shape)
    opt = AdamWConfig(lr=3e-2, beta1=0.8, beta2=0.95, eps=1e-8, weight_decay=0.2)
    state = adamw_init(params)

    tparams = to_torch(params, dtype=torch.float64)
    decayed = [t for name, t in tparams.items() if is_decayed(name)]
    others = [t for name, t in tparams.items() if not is_decayed(name)]
    assert decayed and others
    torch_opt = torch.optim.AdamW(
        [{"params": decayed, "weight_decay": opt.weight_decay},
         {"params": others, "weight_decay": 0.0}],
        lr=opt.lr, betas=(opt.beta1, opt.beta2), eps=opt.eps, foreach=False,
    )
    for step in range(20):
        lr = lr_at(step, opt.lr, warmup_steps=5, total_steps=20, min_lr=1e-3)  # lr changes every step
        _, grads = loss_and_grads(params, ids, targets, cfg)
        for name, t in tparams.items():
            t.grad = torch.tensor(grads[name].copy(), dtype=torch.float64)
        for group in torch_opt.param_groups:
            group["lr"] = lr
        torch_opt.step()
        adamw_update(params, grads, state, lr, opt)
        for name, t in tparams.items():
            assert_allclose(params[name], t.detach().numpy(), rtol=1e-12, atol=1e-14,
                            err_msg=f"step {step}, {name}")
    assert state["step"] == 20


def test_adamw_first_step_moves_each_entry_by_lr_against_the_gradient_sign():
    """At t=1 the bias-corrected m/sqrt(v) is g/|g| = sign(g): every entry moves by ~lr."""
    rng = np.random.default_rng(31)
    params = {"b0.bq": rng.standard_normal(5)}
    before = params["b0.bq"].copy()
    grads = {"b0.bq": rng.standard_normal(5)}
    opt = AdamWConfig(lr=1e-3, eps=1e-12, weight_decay=0.1)  # bq is not decayed
    adamw_update(params, grads, adamw_init(params), opt.lr, opt)
    assert_allclose(params["b0.bq"], before - opt.lr * np.sign(grads["b0.bq"]), rtol=1e-9, atol=1e-15)


# ------------------------------------------------------------- decay groups


@pytest.mark.parametrize("preset", ["tiny", "default"])
def test_is_decayed_exactly_for_matrices_and_embedding_tables(preset):
    """Matrices and tables are the 2-D parameters; biases and LayerNorm gains/shifts are 1-D."""
    shapes = param_shapes(PRESETS[preset])
    for name, shape in shapes.items():
        assert is_decayed(name) == (len(shape) == 2), name


def test_is_decayed_names_for_two_layer_model(tiny_cfg):
    names = set(param_shapes(tiny_cfg))
    want = {"tok_emb", "pos_emb", "head_w"} | {
        f"b{layer}.{k}" for layer in range(2) for k in ("wq", "wk", "wv", "wo", "ff1_w", "ff2_w")}
    assert {n for n in names if is_decayed(n)} == want
    for n in ("lnf_g", "lnf_b", "head_b", "b0.bk", "b1.ln1_g", "b1.ln2_b", "b0.ff1_b"):
        assert not is_decayed(n), n


# ------------------------------------------------------------ lr schedule


PEAK, MIN_LR, WARMUP, TOTAL = 3e-3, 1e-4, 10, 110


def test_lr_warmup_is_linear_from_peak_over_warmup_to_peak():
    lrs = np.array([lr_at(s, PEAK, WARMUP, TOTAL, MIN_LR) for s in range(WARMUP)])
    assert_allclose(lrs[0], PEAK / WARMUP, rtol=1e-12)
    assert_allclose(lrs[-1], PEAK, rtol=1e-12)
    assert_allclose(np.diff(lrs), np.full(WARMUP - 1, PEAK / WARMUP), rtol=1e-9)


def test_lr_is_peak_at_end_of_warmup_and_min_at_total_steps():
    assert_allclose(lr_at(WARMUP, PEAK, WARMUP, TOTAL, MIN_LR), PEAK, rtol=1e-12)
    assert_allclose(lr_at(TOTAL, PEAK, WARMUP, TOTAL, MIN_LR), MIN_LR, rtol=1e-12)
    assert_allclose(lr_at(TOTAL + 50, PEAK, WARMUP, TOTAL, MIN_LR), MIN_LR, rtol=1e-12)


def test_lr_decreases_monotonically_after_warmup():
    lrs = np.array([lr_at(s, PEAK, WARMUP, TOTAL, MIN_LR) for s in range(WARMUP, TOTAL + 1)])
    assert (np.diff(lrs) < 0).all()
    assert lrs.max() <= PEAK and lrs.min() >= MIN_LR


def test_lr_cosine_midpoint_is_mean_of_peak_and_min():
    """cos(pi/2) = 0 halfway through the decay, leaving min + (peak - min)/2."""
    mid = WARMUP + (TOTAL - WARMUP) // 2
    assert_allclose(lr_at(mid, PEAK, WARMUP, TOTAL, MIN_LR), (PEAK + MIN_LR) / 2, rtol=1e-12)


# ------------------------------------------------------------ clipping


def random_grads(rng, scale):
    return {"a": scale * rng.standard_normal((3, 4)), "b": scale * rng.standard_normal(5),
            "c": scale * rng.standard_normal((2, 2))}


def norm_of(grads):
    return math.sqrt(sum(float(np.sum(g * g)) for g in grads.values()))


def test_clip_grads_above_max_rescales_to_max_norm():
    rng = np.random.default_rng(32)
    grads = random_grads(rng, 5.0)
    before = norm_of(grads)
    assert before > 10.0
    clipped, norm = clip_grads(grads, 1.0)
    assert_allclose(norm, before, rtol=1e-12)
    assert_allclose(norm_of(clipped), 1.0, rtol=1e-6)
    for k in grads:  # one common factor: directions are kept
        assert_allclose(clipped[k], grads[k] / before, rtol=1e-6)


def test_clip_grads_below_max_leaves_grads_untouched():
    rng = np.random.default_rng(33)
    grads = random_grads(rng, 0.1)
    copies = {k: g.copy() for k, g in grads.items()}
    before = norm_of(grads)
    assert before < 1.0
    clipped, norm = clip_grads(grads, 1.0)
    assert_allclose(norm, before, rtol=1e-12)
    assert set(clipped) == set(grads)
    for k in grads:
        assert_array_equal(clipped[k], copies[k])
        assert_array_equal(grads[k], copies[k])


def test_clip_grads_does_not_modify_the_input_arrays():
    rng = np.random.default_rng(34)
    grads = random_grads(rng, 5.0)
    copies = {k: g.copy() for k, g in grads.items()}
    clipped, _ = clip_grads(grads, 1.0)
    for k in grads:
        assert_array_equal(grads[k], copies[k])
        assert not np.shares_memory(clipped[k], grads[k])
