"""Fine-tuning the whole model: LoRA adapters on a frozen base (dense or NF4), against the dense model and
central differences, and what the base keeps (no gradient, no optimizer state, its bytes unchanged)."""

import numpy as np
import pytest

from transformer.config import PRESETS
from transformer.finetune import (adapter_loss_and_grads, dense_base, frozen_params, params_sha256,
                                  quantize_base, weight_bytes)
from transformer.gradcheck import REL_TOL, numerical_grad, relative_gap
from transformer.linear import linear_backward, linear_forward
from transformer.lora import TARGETS, Frozen, FrozenCache, LoRAConfig, init_adapters, merge
from transformer.model import backward, forward, loss_and_grads, param_shapes
from transformer.nf4 import NF4Weight, quantize
from transformer.optim import global_norm
from transformer.softmax import cross_entropy_forward

# Small enough for central differences on every adapter entry, wide enough for rank 2.
CFG = PRESETS["tiny"].with_(emb_dim=8, num_heads=2, ff_dim=16, context_len=8)
ALL = LoRAConfig(rank=2, alpha=3.0, targets=tuple(TARGETS))


def model(seed=0):
    from transformer.model import init_params

    return init_params(CFG, seed=seed)


def batch(seed=0, B=2):
    rng = np.random.default_rng(seed)
    shape = (B, CFG.context_len)
    return rng.integers(0, CFG.vocab_size, shape), rng.integers(0, CFG.vocab_size, shape)


def trained_adapters(lora=ALL, seed=1):
    """Adapters as training leaves them: B no longer zero."""
    rng = np.random.default_rng(seed)
    return {k: rng.standard_normal(v.shape) * 0.3 for k, v in init_adapters(param_shapes(CFG), lora).items()}


def test_adapters_start_at_zero_so_the_adapted_model_is_the_base_model():
    params, (ids, _) = model(), batch()
    adapters = init_adapters(param_shapes(CFG), ALL, seed=3)
    adapted, _ = forward(frozen_params(params, adapters, ALL), ids, CFG)
    frozen_alone, _ = forward(frozen_params(params, {}, ALL), ids, CFG)
    assert np.array_equal(adapted, frozen_alone)  # B = 0: the correction adds exactly 0
    # The frozen layers run q, k and v one by one, the base model fused: the same sums, rounded apart.
    np.testing.assert_allclose(adapted, forward(params, ids, CFG)[0], rtol=1e-13, atol=1e-13)


def test_the_merged_model_computes_what_the_adapted_model_does():
    params, adapters, (ids, _) = model(), trained_adapters(), batch()
    adapted, _ = forward(frozen_params(params, adapters, ALL), ids, CFG)
    merged, _ = forward(merge(params, adapters, ALL), ids, CFG)
    assert not np.allclose(adapted, forward(params, ids, CFG)[0], atol=1e-3)  # the adapters do something
    np.testing.assert_allclose(merged, adapted, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("policy", [{}, {"attention": "flash", "flash_tile": 3, "checkpoint_blocks": True}])
@pytest.mark.parametrize("learn_from", [0, 5])
def test_every_adapter_gradient_matches_central_differences(policy, learn_from):
    cfg = CFG.with_(**policy)
    params, adapters, (ids, targets) = model(), trained_adapters(), batch()
    _, grads = adapter_loss_and_grads(params, adapters, ids, targets, cfg, ALL, learn_from)
    assert set(grads) == set(adapters)
    for name, a in adapters.items():
        numeric = numerical_grad(lambda: adapter_loss_and_grads(params, adapters, ids, targets, cfg, ALL,
                                                                learn_from)[0], a)
        gap = relative_gap(grads[name], numeric)
        assert gap < REL_TOL, f"{name}: relative gap {gap:.2e}"


def test_adapter_gradients_follow_from_the_dense_model_by_the_chain_rule():
    """Independently of the frozen layers: with W' = W + s A B, dL/dA = s G B^T and dL/dB = s A^T G, where G is
    the dense model's gradient of W' (the merged model, whose backward the other pages verify)."""
    params, adapters, (ids, targets) = model(), trained_adapters(), batch()
    loss, grads = adapter_loss_and_grads(params, adapters, ids, targets, CFG, ALL)
    merged_loss, dense = loss_and_grads(merge(params, adapters, ALL), ids, targets, CFG)
    assert loss == pytest.approx(merged_loss, rel=1e-12)
    for weight in (name[:-len(".lora_a")] for name in adapters if name.endswith(".lora_a")):
        a, bm, G = adapters[f"{weight}.lora_a"], adapters[f"{weight}.lora_b"], dense[weight]
        np.testing.assert_allclose(grads[f"{weight}.lora_a"], ALL.scale * G @ bm.T, rtol=1e-10, atol=1e-13)
        np.testing.assert_allclose(grads[f"{weight}.lora_b"], ALL.scale * a.T @ G, rtol=1e-10, atol=1e-13)


def test_a_frozen_layer_forms_no_weight_gradient_and_keeps_no_input_without_adapters():
    rng = np.random.default_rng(0)
    x, w, b = rng.standard_normal((3, 8)), rng.standard_normal((8, 5)), rng.standard_normal(5)
    y, cache = linear_forward(x, Frozen(w), b)
    assert isinstance(cache, FrozenCache) and cache.x is None and cache.xa is None
    dx, dw, db = linear_backward(np.ones_like(y), cache)
    assert dw is None and db is None
    np.testing.assert_allclose(dx, np.ones_like(y) @ w.T, rtol=1e-14)


def test_the_backward_of_a_fine_tuned_model_has_gradients_for_the_adapters_only():
    params, adapters, (ids, _) = model(), trained_adapters(LoRAConfig(2, 4.0, ("q", "v"))), batch()
    logits, cache = forward(frozen_params(params, adapters, LoRAConfig(2, 4.0, ("q", "v"))), ids, CFG)
    grads = backward(np.ones_like(logits), cache, embeddings=False)
    assert "tok_emb" not in grads and "pos_emb" not in grads
    for name in param_shapes(CFG):
        short = name.rsplit(".", 1)[-1]
        if short in ("wq", "wv"):
            assert isinstance(grads[name], tuple) and len(grads[name]) == 2  # (dA, dB)
        elif short in TARGETS.values() or short.startswith("b") and short != "b":  # frozen weights, biases
            assert grads.get(name) is None, name


def test_an_nf4_base_runs_as_its_decoded_weights_and_is_smaller():
    params, adapters, (ids, targets) = model(), trained_adapters(), batch()
    base = quantize_base(params)
    assert all(isinstance(base[n], NF4Weight) == (n.rsplit(".", 1)[-1] in TARGETS.values()) for n in base)
    loss_q, grads_q = adapter_loss_and_grads(base, adapters, ids, targets, CFG, ALL)
    loss_d, grads_d = adapter_loss_and_grads(dense_base(base), adapters, ids, targets, CFG, ALL)
    assert loss_q == pytest.approx(loss_d, rel=1e-12)
    for name in adapters:
        np.testing.assert_allclose(grads_q[name], grads_d[name], rtol=1e-10, atol=1e-14)
    # ... and differs from the float64 model by the quantization error only.
    loss_f, _ = adapter_loss_and_grads(params, adapters, ids, targets, CFG, ALL)
    assert loss_q != loss_f and abs(loss_q - loss_f) < 0.05


def test_quantize_base_stores_each_linear_weight_as_quantize_does_and_keeps_every_other_array():
    """What quantize_base adds to quantize (which test_nf4.py checks against the tables, by hand and against
    bitsandbytes where it is installed): the choice of the weights it quantizes and the block sizes it passes
    on. Every other array comes back equal (the embeddings, LayerNorms and biases keep their dtype), and each
    linear weight is the NF4Weight that quantize makes of it with the same block sizes, field for field. The
    large weight has 600 blocks of 32, so its 128-scale groups (5) differ from the default's 256 (3)."""
    big = {"b0.wq": np.random.default_rng(0).standard_normal((120, 160)), "lnf_g": np.ones(160)}
    for params in (model(), big):
        base = quantize_base(params, block_size=32, block_size2=128)
        assert list(base) == list(params)
        for name, p in params.items():
            if name.rsplit(".", 1)[-1] in TARGETS.values():
                want, got = quantize(p, 32, block_size2=128), base[name]
                assert isinstance(got, NF4Weight), name
                assert (got.shape, got.block_size, got.block_size2) == (p.shape, 32, 128), name
                for field in ("packed", "absmax", "absmax_codes", "absmax2", "offset"):
                    np.testing.assert_array_equal(getattr(got, field), getattr(want, field), err_msg=f"{name}.{field}")
            else:
                assert base[name].dtype == p.dtype and np.array_equal(base[name], p), name
    assert base["b0.wq"].absmax2.size == 5


def test_weight_bytes_counts_four_bits_a_weight_one_byte_a_block_and_the_second_level_scales():
    """QLoRA's storage of n weights in blocks of 64, their scales in groups of 256: n / 2 bytes of codes (rounded
    up), one byte per block's scale, one float32 per group and one float32 offset; every other array at its own
    size (float64 here: 8 bytes a number)."""
    params = model()
    assert all(p.dtype == np.float64 for p in params.values())
    assert weight_bytes(params) == 8 * sum(p.size for p in params.values())
    expected = 0
    for name, p in params.items():
        if name.rsplit(".", 1)[-1] in TARGETS.values():
            blocks = -(-p.size // 64)
            expected += -(-p.size // 2) + blocks + 4 * -(-blocks // 256) + 4
        else:
            expected += 8 * p.size
    assert weight_bytes(quantize_base(params)) == expected
    # 19,200 weights: 300 blocks, so two groups of scales
    big = {"b0.wq": np.random.default_rng(0).standard_normal((120, 160))}
    assert weight_bytes(quantize_base(big)) == 9600 + 300 + 2 * 4 + 4


def test_the_time_range_loss_learns_nothing_from_the_context_positions():
    """With learn_from = 5, changing the targets of positions 0-4 changes neither the loss nor a gradient."""
    params, adapters, (ids, targets) = model(), trained_adapters(), batch()
    loss, grads = adapter_loss_and_grads(params, adapters, ids, targets, CFG, ALL, learn_from=5)
    other = targets.copy()
    other[:, :5] = (other[:, :5] + 1) % CFG.vocab_size
    loss2, grads2 = adapter_loss_and_grads(params, adapters, ids, other, CFG, ALL, learn_from=5)
    assert loss == loss2 and all(np.array_equal(grads[k], grads2[k]) for k in grads)
    logits, _ = forward(frozen_params(params, adapters, ALL), ids, CFG)
    assert loss == pytest.approx(cross_entropy_forward(logits[:, 5:], targets[:, 5:])[0], rel=1e-14)


def test_the_base_hash_names_the_parameters_exactly():
    params = model()
    assert params_sha256(params) == params_sha256({k: v.copy() for k, v in params.items()})
    nudged = dict(params, lnf_b=params["lnf_b"] + np.finfo(np.float64).eps)
    assert params_sha256(nudged) != params_sha256(params)
    renamed = {("x" + k if k == "lnf_b" else k): v for k, v in params.items()}
    assert params_sha256(renamed) != params_sha256(params)


def test_qlora_training_changes_the_adapters_only():
    """AdamW steps through FineTuneRun: the packed base is byte for byte what it was, only the adapters have
    optimizer state, and the norm the clip measured is the adapters' global norm."""
    from transformer.data import make_tokenizer, sample_batch
    from transformer.finetune_run import FineTuneRun
    from transformer.model import init_params
    from transformer.optim import adamw_init
    from transformer.step import train_step
    from transformer.train_config import TrainConfig

    text = "to be or not to be, that is the question\n" * 40
    tokenizer = make_tokenizer("char", text)
    cfg = CFG.with_(vocab_size=tokenizer.vocab_size)
    base = quantize_base(init_params(cfg, seed=0, dtype=np.float32))
    packed_before = {n: (p.packed.copy(), p.absmax_codes.copy(), p.absmax2.copy(), p.offset)
                     for n, p in base.items() if isinstance(p, NF4Weight)}
    dense_before = {n: p.copy() for n, p in base.items() if not isinstance(p, NF4Weight)}
    lora = LoRAConfig(2, 4.0, ("q", "v", "ff2"))
    adapters = init_adapters(param_shapes(cfg), lora, dtype=np.float32)
    start = {k: v.copy() for k, v in adapters.items()}
    tc = TrainConfig(steps=5, batch_size=3, seq_len=8, warmup=1, grad_clip=1e-3, dtype="float32")
    run = FineTuneRun(cfg, tc, tokenizer, adapters, adamw_init(adapters), np.random.default_rng(0), base=base,
                      lora=lora, quantize="nf4")
    ids = tokenizer.encode(text)
    for _ in range(5):
        replay = np.random.default_rng()
        replay.bit_generator.state = run.rng.bit_generator.state
        x, y = sample_batch(ids, 3, 8, replay)  # the batch this step will draw
        _, expected = adapter_loss_and_grads(base, run.params, x, y, cfg, lora)
        record = train_step(run, ids, 8)
        assert record["grad_norm"] == pytest.approx(global_norm(expected), rel=1e-6)
        assert record["grad_norm"] > tc.grad_clip  # so the clip acted
    assert set(run.opt_state["m"]) == set(run.opt_state["v"]) == set(adapters)
    assert all(not np.array_equal(run.params[k], start[k]) for k in adapters)
    for n, (packed, codes, absmax2, offset) in packed_before.items():
        assert np.array_equal(base[n].packed, packed) and np.array_equal(base[n].absmax_codes, codes)
        assert np.array_equal(base[n].absmax2, absmax2) and base[n].offset == offset
    assert all(np.array_equal(base[n], p) for n, p in dense_before.items())


def test_one_window_is_a_batch_of_one():
    params, adapters, (ids, targets) = model(), trained_adapters(), batch(B=1)
    for learn_from in (0, 3):
        single = adapter_loss_and_grads(params, adapters, ids[0], targets[0], CFG, ALL, learn_from)
        batched = adapter_loss_and_grads(params, adapters, ids, targets, CFG, ALL, learn_from)
        assert single[0] == batched[0]
        assert all(np.array_equal(single[1][k], batched[1][k]) for k in adapters)


def test_initial_adapters_fill_plus_minus_one_over_sqrt_in_and_b_starts_at_zero():
    """LoRA's start (Hu et al.): B = 0, so the adapted model is the base model, and A uniform in +-1/sqrt(in).
    Preset A's q and v adapters hold 6 x 64 x 8 = 3,072 draws, enough that the largest reaches the last 0.1%
    of the range (a draw misses it with probability 0.999^3072 < 5%; the seed is fixed); so A made even 0.1%
    larger or smaller fails one of the bounds."""
    shapes = param_shapes(PRESETS["A"])
    adapters = init_adapters(shapes, LoRAConfig(rank=8, targets=("q", "v")), seed=0)
    a = {k: v for k, v in adapters.items() if k.endswith(".lora_a")}
    assert len(a) == 6 and all(v.shape == (64, 8) for v in a.values())
    assert all(not v.any() for k, v in adapters.items() if k.endswith(".lora_b"))
    draws = np.concatenate([v.ravel() for v in a.values()]) * np.sqrt(64)  # in units of the limit
    assert np.abs(draws).max() <= 1.0
    assert np.abs(draws).max() >= 0.999
    assert abs(draws.mean()) < 4 / np.sqrt(3 * draws.size)  # four standard errors of U(-1, 1)'s mean
    assert abs(draws.std() - 1 / np.sqrt(3)) < 0.02
