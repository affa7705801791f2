"""GPT-2's layout (the tanh GELU, the head tied to the token table, no head bias) in every part of the model,
and the model in that layout against `transformers`' GPT2LMHeadModel, which nobody here wrote.

Float64 throughout: two computations of the same function in a different order agree to about 1e-15
relative, so 1e-12 leaves a margin of a thousand and still fails on any wrong term.
"""

import math

import numpy as np
import pytest
from numpy.testing import assert_allclose

from transformer.activations import gelu_forward, gelu_tanh_backward, gelu_tanh_forward
from transformer.config import PRESETS
from transformer.errors import ConfigError
from transformer.finetune import adapter_loss_and_grads, quantize_base
from transformer.generate import KVCache, decode_batch, decode_step, prefill
from transformer.gpt2 import from_hf, to_hf
from transformer.gradcheck import REL_TOL, check_passes, gradcheck_model, numerical_grad, relative_gap
from transformer.kv_cache import PagedCache, PagePool
from transformer.lora import LoRAConfig, init_adapters, present_targets
from transformer.model import forward, init_params, loss_and_grads, param_count, param_shapes

CFG = PRESETS["gpt2-tiny"]
EQUAL_REL = 1e-12


def batch(seed=0, B=2, T=None):
    rng = np.random.default_rng(seed)
    shape = (B, T or CFG.context_len)
    return rng.integers(0, CFG.vocab_size, shape), rng.integers(0, CFG.vocab_size, shape)


def moved_params(cfg=CFG, seed=0):
    """Initial parameters with every vector (gains, shifts, biases) moved off 1 and 0, so every term counts."""
    params = init_params(cfg, seed=seed)
    rng = np.random.default_rng(seed + 1)
    return {k: v + 0.1 * rng.standard_normal(v.shape) if v.ndim == 1 else v for k, v in params.items()}


def gap(ours, theirs):
    return float(np.abs(ours - theirs).max() / np.abs(theirs).max())


def assert_same_gradients(ours, theirs):
    """Every gradient within EQUAL_REL, but the key bias's: zero in exact arithmetic (softmax does not change
    when every score of a row moves alike), so both sides hold rounding, within 1e-14 of zero."""
    for name in theirs:
        if name.endswith(".bk"):
            assert np.abs(ours[name]).max() < 1e-14 and np.abs(theirs[name]).max() < 1e-14, name
        else:
            assert gap(ours[name], theirs[name]) < EQUAL_REL, name


# ---------------------------------------------------------------- the tanh GELU

def test_gelu_tanh_is_the_formula_torch_computes_and_stays_near_the_exact_gelu():
    rng = np.random.default_rng(1)
    x = 3.0 * rng.standard_normal(300)
    y, _ = gelu_tanh_forward(x)
    by_math = np.array([0.5 * v * (1 + math.tanh(math.sqrt(2 / math.pi) * (v + 0.044715 * v ** 3))) for v in x])
    assert_allclose(y, by_math, rtol=1e-12, atol=1e-15)
    assert 1e-5 < np.abs(y - gelu_forward(x)[0]).max() < 1e-3  # an approximation: close, not the same
    torch = pytest.importorskip("torch")
    by_torch = torch.nn.functional.gelu(torch.tensor(x), approximate="tanh").numpy()
    assert_allclose(y, by_torch, rtol=1e-12, atol=1e-15)


def test_gelu_tanh_backward_matches_central_differences():
    rng = np.random.default_rng(2)
    x, dy = 2.0 * rng.standard_normal((3, 7)), rng.standard_normal((3, 7))
    dx = gelu_tanh_backward(dy, gelu_tanh_forward(x)[1])
    numeric = numerical_grad(lambda: np.sum(gelu_tanh_forward(x)[0] * dy), x)
    assert relative_gap(dx, numeric) < REL_TOL


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_gelu_tanh_gives_a_finite_gradient_where_x_cubed_overflows(dtype):
    """Far out, tanh is exactly +-1 and the slope exactly 1 (right) or 0 (left); x^2 overflowing there must not
    turn 0 * inf into NaN."""
    x = np.array([-1e30, -60.0, 60.0, 1e30], dtype=dtype) if dtype == np.float32 else np.array([-1e200, 1e200])
    with np.errstate(over="ignore"):  # x^3 overflows in the forward; tanh(+-inf) is +-1, as it should be
        y, cache = gelu_tanh_forward(x)
    dx = gelu_tanh_backward(np.ones_like(x), cache)
    assert dx.dtype == y.dtype == dtype
    assert_allclose(dx, (x > 0).astype(dtype), rtol=0, atol=0)


def test_gelu_tanh_works_in_float32_and_returns_float32():
    rng = np.random.default_rng(6)
    x = (2.0 * rng.standard_normal((4, 9))).astype(np.float32)
    dy = rng.standard_normal((4, 9)).astype(np.float32)
    y32, cache32 = gelu_tanh_forward(x)
    y64, cache64 = gelu_tanh_forward(x.astype(np.float64))
    assert y32.dtype == gelu_tanh_backward(dy, cache32).dtype == np.float32
    assert_allclose(y32, y64, rtol=1e-5, atol=1e-6)  # float32 carries about 7 digits
    assert_allclose(gelu_tanh_backward(dy, cache32), gelu_tanh_backward(dy.astype(np.float64), cache64),
                    rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------- the tied head

def test_gpt2_small_has_its_published_124m_parameters():
    """GPT-2 small's 124,439,808 parameters: the count of the Hugging Face checkpoint `gpt2`, and the sum of
    its tensors' sizes (wte 50257 x 768, wpe 1024 x 768, 12 blocks of 7,087,872, ln_f 2 x 768)."""
    cfg = PRESETS["gpt2"]
    assert param_count(cfg) == 124_439_808 == 50257 * 768 + 1024 * 768 + 12 * 7_087_872 + 2 * 768
    assert param_count(cfg) == sum(math.prod(s) for s in param_shapes(cfg).values())
    assert "head_w" not in param_shapes(cfg) and "head_b" not in param_shapes(cfg)


@pytest.mark.parametrize("tied_head, head_bias", [(True, False), (True, True), (False, False)])
def test_param_count_is_the_sum_of_the_shapes_for_each_head_layout(tied_head, head_bias):
    cfg = PRESETS["default"].with_(tied_head=tied_head, head_bias=head_bias)
    assert param_count(cfg) == sum(math.prod(s) for s in param_shapes(cfg).values())


@pytest.mark.parametrize("policy", [{}, {"attention": "flash", "flash_tile": 3, "checkpoint_blocks": True}],
                         ids=["plain", "flash+checkpointed"])
def test_every_gradient_of_gpt2s_layout_matches_central_differences(policy):
    """tok_emb is read twice (the embedding and the head), so its gradient is the sum of two uses: central
    differences see both."""
    ids, targets = batch(3)
    report = gradcheck_model(CFG.with_(**policy), ids, targets, seed=0, perturb=0.1)
    assert set(report) == set(param_shapes(CFG))
    failed = {name: gaps for name, gaps in report.items() if not check_passes(*gaps)}
    assert not failed, failed


def test_the_tied_table_gets_the_heads_gradient_in_every_row_and_the_embeddings_in_the_rows_read():
    """dℓ/d tok_emb = (the head's: dlogits^T LN_f(X), every row) + (the embedding's: only rows of ids read)."""
    params, (ids, targets) = moved_params(), batch(4, T=4)
    _, grads = loss_and_grads(params, ids, targets, CFG)
    trace = {}
    logits, _ = forward(params, ids, CFG, trace)
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    dlogits = (probs - np.eye(CFG.vocab_size)[targets]) / targets.size  # mean cross-entropy's gradient
    head_part = np.einsum("btv,btd->vd", dlogits, trace["lnf"])
    unread = np.setdiff1d(np.arange(CFG.vocab_size), ids)
    assert unread.size and np.abs(head_part[unread]).max() > 1e-3
    assert_allclose(grads["tok_emb"][unread], head_part[unread], rtol=1e-12, atol=1e-15)
    read = np.unique(ids)
    assert np.abs(grads["tok_emb"][read] - head_part[read]).min(axis=1).max() > 1e-6  # the embedding adds there


# ---------------------------------------------------------------- every capability in GPT-2's layout

def test_the_autograd_engine_and_the_torch_mirror_agree_with_the_numpy_model():
    from transformer import autograd, autograd_model

    params, (ids, targets) = moved_params(), batch(5)
    loss, grads = loss_and_grads(params, ids, targets, CFG)
    leaves = autograd_model.as_leaves(params, CFG)
    engine_loss = autograd_model.cross_entropy(autograd_model.forward(leaves, ids, CFG), targets)
    autograd.backward(engine_loss)
    assert abs(engine_loss.data - loss) <= EQUAL_REL * loss
    assert_same_gradients({name: leaf.grad for name, leaf in leaves.items()}, grads)
    torch = pytest.importorskip("torch")
    from transformer.torch_mirror import to_torch, torch_loss

    tparams = to_torch(params, dtype=torch.float64)
    torch_loss(tparams, ids, targets, CFG).backward()
    assert_same_gradients(grads, {name: t.grad.numpy() for name, t in tparams.items()})


@pytest.mark.parametrize("page_size", [None, 3])
def test_cached_decoding_in_gpt2s_layout_equals_the_full_forward(page_size):
    params, texts = moved_params(), [[1, 2, 3, 4, 5, 6], [7, 8, 9, 10, 0, 1, 2, 3]]
    if page_size is None:
        caches = [KVCache(CFG, np.float64) for _ in texts]
    else:
        pool = PagePool(CFG, 8, page_size, np.float64)
        caches = [PagedCache(pool, CFG.context_len) for _ in texts]
    for text, cache in zip(texts, caches):
        prefill(params, text[:-1], cache, CFG)
    rows = decode_batch(params, [t[-1] for t in texts], caches, CFG)
    for text, row in zip(texts, rows):
        assert gap(row, forward(params, np.array(text), CFG)[0][-1]) < EQUAL_REL
    one = KVCache(CFG, np.float64)
    full = forward(params, np.array(texts[1]), CFG)[0]
    for t, token in enumerate(texts[1]):
        assert gap(decode_step(params, token, one, CFG), full[t]) < EQUAL_REL


def test_lora_cannot_target_a_tied_head_and_names_why():
    assert "head" not in present_targets(param_shapes(CFG))
    with pytest.raises(ConfigError, match="head names no weight of this model .*tied to the token table"):
        init_adapters(param_shapes(CFG), LoRAConfig(rank=2, targets=("q", "head")))


@pytest.mark.parametrize("quantized", [False, True], ids=["lora", "qlora"])
def test_adapter_gradients_in_gpt2s_layout_match_central_differences(quantized):
    cfg = CFG.with_(emb_dim=8, num_heads=2)
    lora = LoRAConfig(rank=2, alpha=3.0, targets=present_targets(param_shapes(cfg)))
    params, (ids, targets) = moved_params(cfg), batch(6)
    base = quantize_base(params, block_size=8, block_size2=4) if quantized else params
    rng = np.random.default_rng(7)
    adapters = {k: 0.3 * rng.standard_normal(v.shape) for k, v in init_adapters(param_shapes(cfg), lora).items()}
    _, grads = adapter_loss_and_grads(base, adapters, ids, targets, cfg, lora)
    for name, a in adapters.items():
        numeric = numerical_grad(lambda: adapter_loss_and_grads(base, adapters, ids, targets, cfg, lora)[0], a)
        assert relative_gap(grads[name], numeric) < REL_TOL, name


# ---------------------------------------------------------------- against transformers' GPT-2

def hf_model(cfg=CFG, seed=0):
    """A GPT2LMHeadModel of cfg's sizes in float64, every tensor moved off its initial value (biases start at
    zero, gains at one), and this model's parameters read from its state."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    hc = transformers.GPT2Config(vocab_size=cfg.vocab_size, n_positions=cfg.context_len, n_embd=cfg.emb_dim,
                                 n_layer=cfg.num_layers, n_head=cfg.num_heads, n_inner=cfg.ff_dim,
                                 layer_norm_epsilon=cfg.ln_eps, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                                 bos_token_id=0, eos_token_id=0)
    torch.manual_seed(seed)
    model = transformers.GPT2LMHeadModel(hc).double().eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    state = {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}
    return model, from_hf(state, cfg)


def test_logits_hidden_states_loss_and_every_gradient_equal_transformers_gpt2():
    import torch

    model, params = hf_model()
    ids, targets = batch(8)
    out = model(torch.tensor(ids), output_hidden_states=True)
    trace = {}
    logits, _ = forward(params, ids, CFG, trace)
    ours = [trace["embedding"], *(trace[f"b{l}.out"] for l in range(CFG.num_layers - 1)), trace["lnf"]]
    assert len(out.hidden_states) == len(ours)  # GPT-2's last hidden state is after ln_f
    for l, (mine, theirs) in enumerate(zip(ours, out.hidden_states)):
        assert gap(mine, theirs.detach().numpy()) < EQUAL_REL, f"hidden state {l}"
    assert gap(logits, out.logits.detach().numpy()) < EQUAL_REL
    hf_loss = torch.nn.functional.cross_entropy(out.logits.reshape(-1, CFG.vocab_size), torch.tensor(targets).reshape(-1))
    hf_loss.backward()
    loss, grads = loss_and_grads(params, ids, targets, CFG)
    assert abs(loss - hf_loss.item()) <= EQUAL_REL * loss
    hf_grads = {k: v.grad.numpy() for k, v in model.named_parameters()}
    for name, ours_grad in to_hf(grads, CFG).items():
        assert gap(ours_grad, hf_grads[name]) < EQUAL_REL, name


def test_greedy_decoding_gives_transformers_tokens():
    import torch

    from transformer.generate import generate

    model, params = hf_model(seed=1)
    prompt = [3, 1, 4]
    new = generate(params, CFG, prompt, CFG.context_len - len(prompt), temperature=0.0)
    hf = model.generate(torch.tensor([prompt]), max_new_tokens=CFG.context_len - len(prompt), do_sample=False,
                        pad_token_id=0)
    assert prompt + list(new) == hf[0].tolist()


# ---------------------------------------------------------------- the names and layout of GPT-2's checkpoints

def test_a_state_dictionary_goes_in_and_out_unchanged_to_the_bit():
    rng = np.random.default_rng(9)
    params = {k: rng.standard_normal(s) for k, s in param_shapes(CFG).items()}
    state = to_hf(params, CFG)
    assert state["transformer.h.1.attn.c_attn.weight"].shape == (CFG.emb_dim, 3 * CFG.emb_dim)
    back = from_hf(state, CFG)
    assert list(back) == list(params) and all(np.array_equal(back[k], params[k]) for k in params)
    again = to_hf(back, CFG)
    assert all(np.array_equal(again[k], state[k]) for k in state)


def test_c_attn_holds_q_then_k_then_v():
    params = {k: np.zeros(s) for k, s in param_shapes(CFG).items()}
    d = CFG.emb_dim
    params.update({"b0.bq": np.full(d, 1.0), "b0.bk": np.full(d, 2.0), "b0.bv": np.full(d, 3.0)})
    bias = to_hf(params, CFG)["transformer.h.0.attn.c_attn.bias"]
    assert bias.tolist() == [1.0] * d + [2.0] * d + [3.0] * d


@pytest.mark.parametrize("change, message", [
    (lambda s: s.pop("transformer.h.1.ln_2.bias"), "missing tensor h.1.ln_2.bias"),
    (lambda s: s.update({"transformer.h.2.ln_1.weight": np.ones(8)}), "unexpected tensor h.2.ln_1.weight"),
    (lambda s: s.update({"transformer.wpe.weight": np.ones((9, 8))}), r"wpe.weight has shape \(9, 8\), .* \(8, 8\)"),
    (lambda s: s.update({"lm_head.weight": np.ones((11, 8))}), "lm_head.weight differs from wte.weight"),
])
def test_a_state_that_does_not_fit_is_refused_by_name(change, message):
    state = to_hf(init_params(CFG), CFG)
    change(state)
    with pytest.raises(ConfigError, match=message):
        from_hf(state, CFG)


def test_a_config_not_in_gpt2s_layout_is_refused():
    with pytest.raises(ConfigError, match="tied_head=True, head_bias=False"):
        to_hf(init_params(PRESETS["tiny"]), PRESETS["tiny"])
