"""AdamW, the decay groups, the learning-rate schedule and gradient clipping."""

import math

import numpy as np
import pytest
from numpy.testing import assert_allclose, assert_array_equal

from transformer.config import PRESETS
from transformer.errors import InputError
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


# ------------------------------------------------------- the global norm, overflow-safe


def plain_norm(grads):
    """The formula as written, squares first: what global_norm must equal wherever it does not overflow."""
    return math.sqrt(sum(float(np.vdot(g, g)) for g in grads.values()))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("scale", [1e-3, 1.0, 7.0, 1e6])
def test_global_norm_gives_the_plain_formulas_very_bits_where_that_is_exact(dtype, scale):
    from transformer.optim import global_norm

    rng = np.random.default_rng(35)
    grads = {k: g.astype(dtype) for k, g in random_grads(rng, scale).items()}
    assert global_norm(grads) == plain_norm(grads)


@pytest.mark.parametrize("dtype, huge", [(np.float64, 1e200), (np.float32, 3e19), (np.float32, 1e38)])
def test_global_norm_of_huge_finite_gradients_is_their_finite_norm(dtype, huge):
    """Their squares overflow (the plain formula says inf); the norm itself is a finite number."""
    from transformer.optim import global_norm

    grads = {"a": np.full(4, huge, dtype=dtype), "b": np.array([-huge, 0.0], dtype=dtype)}
    with np.errstate(over="ignore"):
        assert plain_norm(grads) == math.inf
    assert_allclose(global_norm(grads), math.sqrt(5) * float(dtype(huge)), rtol=1e-6)


@pytest.mark.parametrize("dtype, huge", [(np.float64, 1e200), (np.float32, 3e19)])
def test_clipping_huge_gradients_gives_the_requested_norm_not_zeros(dtype, huge):
    from transformer.optim import global_norm

    rng = np.random.default_rng(36)
    grads = {k: (g * huge).astype(dtype) for k, g in random_grads(rng, 1.0).items()}
    clipped, norm = clip_grads(grads, 1.0)
    assert math.isfinite(norm) and norm > huge
    assert_allclose(global_norm(clipped), 1.0, rtol=1e-5)
    for k in grads:  # the direction is kept
        assert clipped[k].dtype == dtype
        assert_allclose(clipped[k], grads[k].astype(np.float64) / norm, rtol=1e-5, atol=1e-30)


def test_global_norm_of_tiny_gradients_does_not_underflow_to_zero():
    from transformer.optim import global_norm

    grads = {"a": np.full(9, 1e-30, dtype=np.float32)}
    assert_allclose(global_norm(grads), 3e-30, rtol=1e-6)
    assert global_norm({"a": np.zeros(3), "b": np.zeros((0, 2))}) == 0.0


@pytest.mark.parametrize("dtype, tiny", [(np.float32, 1e-39), (np.float64, 1e-310)])
def test_global_norm_of_subnormal_gradients_is_their_norm(dtype, tiny):
    """Below 2^-126 (float32) or 2^-1022 (float64) the entries are subnormal and the scale s is too: 1/s would
    overflow to inf in the gradients' dtype, so the norm must divide by s, not multiply by 1/s."""
    from transformer.optim import global_norm

    grads = {"a": np.array([tiny, 0.0, tiny], dtype=dtype), "b": np.array([-tiny], dtype=dtype)}
    assert_allclose(global_norm(grads), math.sqrt(3) * float(dtype(tiny)), rtol=1e-6)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_a_non_finite_gradient_has_a_non_finite_norm_and_is_not_clipped(bad):
    from transformer.optim import global_norm

    grads = {"a": np.ones(3), "b": np.array([1.0, bad])}
    assert not math.isfinite(global_norm(grads))
    clipped, norm = clip_grads(grads, 1.0)
    assert not math.isfinite(norm) and clipped is grads


# ------------------------------------------------------- AdamW commits all or nothing


def adam_case(rng):
    params = {"w": rng.standard_normal((3, 2)), "b": rng.standard_normal(2)}
    state = adamw_init(params)
    grads = {k: rng.standard_normal(p.shape) for k, p in params.items()}
    adamw_update(params, grads, state, 1e-2, AdamWConfig())  # non-zero moments and a step count of 1
    return params, state


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_adamw_with_a_non_finite_gradient_changes_nothing_and_names_it(bad):
    from transformer.errors import NonFiniteError

    rng = np.random.default_rng(37)
    params, state = adam_case(rng)
    before = {"p": {k: v.copy() for k, v in params.items()}, "m": {k: v.copy() for k, v in state["m"].items()},
              "v": {k: v.copy() for k, v in state["v"].items()}}
    grads = {"w": rng.standard_normal((3, 2)), "b": np.array([0.5, bad])}
    with pytest.raises(NonFiniteError, match="the gradient of b is not finite") as raised:
        adamw_update(params, grads, state, 1e-2, AdamWConfig())
    assert raised.value.name == "b" and state["step"] == 1
    for group, now in (("p", params), ("m", state["m"]), ("v", state["v"])):
        for k in now:
            assert_array_equal(now[k], before[group][k])


def test_adamw_refuses_an_update_that_would_overflow_a_parameter():
    from transformer.errors import NonFiniteError

    rng = np.random.default_rng(38)
    params, state = adam_case(rng)
    params = {k: p.astype(np.float32) for k, p in params.items()}
    state = {"m": {k: m.astype(np.float32) for k, m in state["m"].items()},
             "v": {k: v.astype(np.float32) for k, v in state["v"].items()}, "step": 1}
    kept = {k: p.copy() for k, p in params.items()}
    grads = {k: np.ones_like(p) for k, p in params.items()}
    with pytest.raises(NonFiniteError, match="the update would make w non-finite"), np.errstate(over="ignore"):
        adamw_update(params, grads, state, 1e39, AdamWConfig(weight_decay=0.0))
    assert state["step"] == 1 and all(np.array_equal(params[k], kept[k]) for k in params)


def test_adamw_updates_the_callers_arrays_in_place():
    """The commit writes into the arrays the caller holds (a run's dict and any view of it)."""
    rng = np.random.default_rng(39)
    params, state = adam_case(rng)
    w, m = params["w"], state["m"]["w"]
    adamw_update(params, {k: np.ones_like(p) for k, p in params.items()}, state, 1e-2, AdamWConfig())
    assert params["w"] is w and state["m"]["w"] is m and state["step"] == 2


@pytest.mark.parametrize("max_norm", [-1.0, 0.0, float("nan"), float("inf"), "1", True])
def test_a_max_norm_that_is_not_a_positive_number_is_refused_not_used(max_norm):
    """A negative max_norm would flip every gradient's sign (the factor max_norm / norm is negative), 0 would
    zero them all; None is how a caller asks for no clipping."""
    grads = {"w": np.full((2, 2), 3.0)}
    with pytest.raises(InputError, match="max_norm must be None or a positive finite number"):
        clip_grads(grads, max_norm)
    assert clip_grads(grads, None)[0] is grads
