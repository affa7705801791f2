"""The pieces of fine-tuning, one layer at a time: the NF4 linear layer, the LoRA layer (dense and on an
NF4 base), merging, and the loss over part of a window."""

import tracemalloc

import numpy as np
import pytest

from transformer import nf4
from transformer.config import PRESETS
from transformer.errors import ConfigError, InputError
from transformer.gradcheck import REL_TOL, numerical_grad, relative_gap
from transformer.linear import linear_forward
from transformer.linear import linear_backward
from transformer.lora import Frozen, LoRAConfig, adapter_shapes, init_adapters, merge
from transformer.model import param_shapes
from transformer.quantized_linear import nf4_linear_backward, nf4_linear_forward
from transformer.softmax import (cross_entropy_forward, cross_entropy_time_range_backward,
                                 cross_entropy_time_range_forward)

H_STEP = 1e-5


def assert_grad(analytic, f, x, what):
    gap = relative_gap(analytic, numerical_grad(f, x, H_STEP))
    assert gap < REL_TOL, f"{what}: relative gap {gap:.2e}"


def nf4_weight(shape, seed=0):
    return nf4.quantize(np.random.default_rng(seed).standard_normal(shape) * 0.1, block_size=64)


# ------------------------------------------------------------------ the NF4 linear layer

@pytest.mark.parametrize("rows", [1, 7, 64, 1000])
def test_the_nf4_layer_equals_a_dense_layer_holding_the_decoded_weight(rows):
    rng = np.random.default_rng(1)
    q = nf4_weight((96, 40))
    w, b = nf4.dequantize(q).astype(np.float64), rng.standard_normal(40)
    x, dy = rng.standard_normal((3, 5, 96)), rng.standard_normal((3, 5, 40))
    y, cache = nf4_linear_forward(x, q, b, rows)
    np.testing.assert_allclose(y, linear_forward(x, w, b)[0], rtol=1e-12, atol=1e-12)
    dx = nf4_linear_backward(dy, cache)
    np.testing.assert_allclose(dx, dy @ w.T, rtol=1e-12, atol=1e-12)
    assert_grad(dx, lambda: np.sum(nf4_linear_forward(x, q, b, rows)[0] * dy), x, "nf4 linear dx")


def test_the_nf4_layer_never_holds_the_whole_weight_in_float32():
    q = nf4_weight((1024, 512))
    x = np.ones((1, 1024), dtype=np.float32)
    dense_bytes = 1024 * 512 * 4
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        nf4_linear_forward(x, q, np.zeros(512, np.float32), rows=64)
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    assert peak < dense_bytes / 4  # a block of 64 rows is 1/16 of the weight; codes and scales add a little


def test_a_weight_of_another_width_is_refused():
    with pytest.raises(InputError, match="does not fit a weight of shape"):
        nf4_linear_forward(np.ones((2, 5)), nf4_weight((4, 3)), np.zeros(3))


# ------------------------------------------------------------------ LoRA

CFG = PRESETS["default"]


def test_adapters_start_with_b_zero_so_the_layer_is_the_base_layer():
    lora = LoRAConfig(rank=4, alpha=8, targets=("q", "v", "head"))
    adapters = init_adapters(param_shapes(CFG), lora, seed=0)
    assert set(adapters) == {f"b{l}.{w}.lora_{m}" for l in range(CFG.num_layers) for w in ("wq", "wv")
                             for m in "ab"} | {"head_w.lora_a", "head_w.lora_b"}
    rng = np.random.default_rng(0)
    x, w, b = rng.standard_normal((2, 3, 32)), rng.standard_normal((32, 32)), rng.standard_normal(32)
    y, _ = linear_forward(x, Frozen(w, adapters["b0.wq.lora_a"], adapters["b0.wq.lora_b"], lora.scale), b)
    # B = 0 makes the correction exactly zero: the same bits as the frozen layer without adapters.
    assert np.array_equal(y, linear_forward(x, Frozen(w), b)[0])
    np.testing.assert_allclose(y, linear_forward(x, w, b)[0], rtol=1e-13, atol=1e-14)


@pytest.mark.parametrize("base", ["dense", "nf4"])
def test_the_lora_backward_matches_central_differences_and_gives_the_base_nothing(base):
    rng = np.random.default_rng(2)
    d_in, d_out, r, scale = 64, 24, 3, 2.5
    w = nf4_weight((d_in, d_out)) if base == "nf4" else rng.standard_normal((d_in, d_out))
    b, a, bm = rng.standard_normal(d_out), rng.standard_normal((d_in, r)), rng.standard_normal((r, d_out))
    x, dy = rng.standard_normal((2, 4, d_in)), rng.standard_normal((2, 4, d_out))

    def f():
        return np.sum(linear_forward(x, Frozen(w, a, bm, scale), b)[0] * dy)

    dx, adapter_grads, db = linear_backward(dy, linear_forward(x, Frozen(w, a, bm, scale), b)[1])
    assert db is None  # no gradient of W or b exists: dx, then dA and dB
    for g, v, name in zip((dx, *adapter_grads), (x, a, bm), ("dx", "dA", "dB")):
        assert_grad(g, f, v, f"lora {base} {name}")


def test_merging_folds_the_adapters_into_the_weights():
    lora = LoRAConfig(rank=2, alpha=4, targets=("q",))
    rng = np.random.default_rng(3)
    params = {"b0.wq": rng.standard_normal((8, 8)), "b0.bq": rng.standard_normal(8)}
    adapters = {"b0.wq.lora_a": rng.standard_normal((8, 2)), "b0.wq.lora_b": rng.standard_normal((2, 8))}
    x = rng.standard_normal((5, 8))
    adapted, _ = linear_forward(x, Frozen(params["b0.wq"], adapters["b0.wq.lora_a"], adapters["b0.wq.lora_b"],
                                          lora.scale), params["b0.bq"])
    merged = merge(params, adapters, lora)
    np.testing.assert_allclose(linear_forward(x, merged["b0.wq"], params["b0.bq"])[0], adapted, rtol=1e-12)
    assert merged["b0.bq"] is params["b0.bq"] and params["b0.wq"] is not merged["b0.wq"]


@pytest.mark.parametrize("kwargs,message", [
    ({"rank": 0}, "rank must be a positive integer"), ({"alpha": 0}, "alpha must be a positive finite number"),
    ({"targets": ("q", "z")}, "targets must be some of"), ({"targets": ()}, "targets must be some of"),
])
def test_bad_lora_settings_are_refused_by_name(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        LoRAConfig(**kwargs)


def test_a_rank_larger_than_the_width_is_refused():
    with pytest.raises(ConfigError, match="larger than b0.wq's smaller side 32"):
        adapter_shapes(param_shapes(CFG), LoRAConfig(rank=33))


# ------------------------------------------------------------------ loss over part of a window

def test_the_time_range_loss_counts_only_its_positions():
    rng = np.random.default_rng(4)
    logits, targets = rng.standard_normal((3, 10, 7)), rng.integers(0, 7, (3, 10))
    loss, cache = cross_entropy_time_range_forward(logits, targets, 4, 3)
    assert loss == pytest.approx(cross_entropy_forward(logits[:, 4:7], targets[:, 4:7])[0], rel=1e-15)
    dlogits = cross_entropy_time_range_backward(1.0, cache)
    assert np.all(dlogits[:, :4] == 0) and np.all(dlogits[:, 7:] == 0)
    assert_grad(dlogits, lambda: cross_entropy_time_range_forward(logits, targets, 4, 3)[0], logits, "time range")
    # The mean is over B * time_count positions: every counted row of dlogits sums to 0 and is (P - e_y)/9.
    np.testing.assert_allclose(dlogits[:, 4:7].sum(axis=-1), 0, atol=1e-15)


@pytest.mark.parametrize("offset,count", [(-1, 2), (0, 0), (8, 3), (2.0, 1), (True, 1)])
def test_a_time_range_outside_the_window_is_refused(offset, count):
    with pytest.raises(InputError, match="is not a non-empty range of the window's 10 positions"):
        cross_entropy_time_range_forward(np.zeros((1, 10, 3)), np.zeros((1, 10), dtype=int), offset, count)


@pytest.mark.parametrize("logits_shape, targets_shape", [((10, 3), (10,)), ((1, 10, 3), (10,)),
                                                         ((1, 10, 3), (1, 9)), ((1, 10), (1, 10))])
def test_logits_and_targets_not_shaped_as_windows_are_refused_by_name(logits_shape, targets_shape):
    """The time range counts positions of windows: logits (B, T, n_V) and targets (B, T); anything else is the
    library's input error naming both shapes, not an IndexError from inside."""
    with pytest.raises(InputError, match=r"logits \(B, T, n_V\) and targets \(B, T\)"):
        cross_entropy_time_range_forward(np.zeros(logits_shape), np.zeros(targets_shape, dtype=int), 0, 2)


@pytest.mark.parametrize("stabilized, expected", [(False, 12.0 / 4), (True, 12.0 / 2)])
def test_the_correction_is_scaled_by_alpha_over_r_or_over_its_root(stabilized, expected):
    """LoRA scales x A B by alpha / r; rank-stabilized LoRA (rsLoRA, Kalajdzievski 2023) by alpha / sqrt(r). With
    alpha = 12 and r = 4 the scales are 3 and 6, and neither is alpha itself: the adapted layer's output, minus
    the frozen one's, is that multiple of x A B computed here by hand."""
    lora = LoRAConfig(rank=4, alpha=12.0, rank_stabilized=stabilized)
    assert lora.scale == expected
    rng = np.random.default_rng(60)
    x, w, b = rng.standard_normal((3, 5)), rng.standard_normal((5, 6)), rng.standard_normal(6)
    a, bm = rng.standard_normal((5, 4)), rng.standard_normal((4, 6))
    y, _ = linear_forward(x, Frozen(w, a, bm, lora.scale), b)
    np.testing.assert_allclose(y - (x @ w + b), expected * (x @ a) @ bm, rtol=1e-12, atol=1e-12)
    merged = merge({"wq": w}, {"wq.lora_a": a, "wq.lora_b": bm}, lora)["wq"]
    np.testing.assert_allclose(merged, w + expected * a @ bm, rtol=1e-12, atol=1e-12)
