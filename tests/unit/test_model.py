"""The whole model: gradients, causality, initialisation, dtypes and input checks."""

import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from numpy.testing import assert_allclose, assert_array_equal

from transformer.config import PRESETS, ModelConfig
from transformer.errors import ConfigError, InputError
from transformer.gradcheck import check_passes, gradcheck_model, relative_gap
from transformer.model import (
    backward,
    forward,
    init_params,
    loss_and_grads,
    loss_fn,
    param_count,
    param_shapes,
)
from transformer.optim import AdamWConfig, adamw_init, adamw_update
from transformer.softmax import cross_entropy_backward, cross_entropy_forward

REPO_ROOT = Path(__file__).resolve().parents[2]


# ---------------------------------------------------------------- gradients


@pytest.mark.parametrize("checkpoint_blocks", [False, True], ids=["kept", "checkpointed"])
def test_backward_trace_holds_the_gradient_of_each_intermediate_as_torch_autograd_gives_it(tiny_cfg,
                                                                                       checkpoint_blocks):
    """backward(trace=...) stores, by name, the gradient reaching each tensor that forward(trace=...) stores;
    torch's autograd, asked for the gradient of the same intermediates of the torch mirror, must agree."""
    torch = pytest.importorskip("torch")
    from transformer.torch_mirror import to_torch, torch_loss

    cfg = tiny_cfg.with_(checkpoint_blocks=checkpoint_blocks)
    rng = np.random.default_rng(21)
    params = init_params(cfg, seed=21)
    ids, targets = rng.integers(0, cfg.vocab_size, (2, 3)), rng.integers(0, cfg.vocab_size, (2, 3))
    logits, cache = forward(params, ids, cfg)
    steps = {}
    backward(cross_entropy_backward(1.0, cross_entropy_forward(logits, targets)[1]), cache, trace=steps)
    torch_trace = {}
    loss = torch_loss(to_torch(params, dtype=torch.float64), ids, targets, cfg.with_(checkpoint_blocks=False),
                      torch_trace)
    for t in torch_trace.values():
        t.retain_grad()
    loss.backward()
    L = cfg.num_layers
    # the gradient into each block's output is the gradient into the next one's input (or LN_f's)
    pairs = {"dlogits": "logits", "dlnf": "lnf", "dembedding": "embedding",
             **{f"b{l}.dout": f"b{l}.out" for l in range(L)}, **{f"b{l}.din": f"b{l - 1}.out" for l in range(1, L)},
             **{f"b{l}.dln1": f"b{l}.ln1" for l in range(L)}, **{f"b{l}.dln2": f"b{l}.ln2" for l in range(L)}}
    for mine, theirs in pairs.items():
        assert_allclose(steps[mine], torch_trace[theirs].grad.numpy(), rtol=1e-10, atol=1e-13, err_msg=mine)
    assert list(steps)[:2] == ["dlogits", "dlnf"] and list(steps)[-1] == "dembedding"
    assert [k for k in steps if k.endswith(".dout")] == [f"b{l}.dout" for l in reversed(range(L))]


@pytest.mark.parametrize("batched", [False, True], ids=["single", "batch"])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_every_parameter_passes_central_difference_check(tiny_cfg, activation, batched):
    cfg = tiny_cfg.with_(activation=activation)
    rng = np.random.default_rng(20)
    shape = (2, cfg.context_len) if batched else (cfg.context_len,)
    ids = rng.integers(0, cfg.vocab_size, size=shape)
    targets = rng.integers(0, cfg.vocab_size, size=shape)
    report = gradcheck_model(cfg, ids, targets, seed=0, perturb=0.1)
    assert set(report) == set(param_shapes(cfg))
    failed = {name: gaps for name, gaps in report.items() if not check_passes(*gaps)}
    assert not failed, f"gradient check failed (abs gap, rel gap): {failed}"


# ---------------------------------------------------------------- causality


def test_future_tokens_do_not_change_earlier_logits():
    """The causal mask gives exactly zero weight to later keys, so logits[:t]
    are computed from exactly the same numbers whatever ids[t:] are."""
    cfg = PRESETS["default"]
    rng = np.random.default_rng(21)
    params = init_params(cfg, seed=1)
    ids = rng.integers(0, cfg.vocab_size, size=(2, cfg.context_len))
    logits, _ = forward(params, ids, cfg)
    for t in (1, 7, 20, cfg.context_len - 1):
        changed = ids.copy()
        # Add 1..V-1 modulo V: every token from t on is guaranteed to differ.
        changed[:, t:] = (ids[:, t:] + rng.integers(1, cfg.vocab_size, size=ids[:, t:].shape)) % cfg.vocab_size
        new_logits, _ = forward(params, changed, cfg)
        assert_array_equal(new_logits[:, :t], logits[:, :t])
        assert not np.array_equal(new_logits[:, t], logits[:, t])  # the test is not vacuous


# ------------------------------------------------------------ initialisation


def test_initial_loss_is_close_to_value_expected_from_initialisation(cfg_a):
    """With LN gains 1 the final features have unit variance per row, so each
    logit has variance d * limit^2 / 3 = 2d/(d+V) for Xavier-uniform head_w.
    For i.i.d. normal logits of variance s2, E[logsumexp] ~ ln V + s2/2 (the
    log of E[exp z] summed over V classes) and E[z_target] = 0."""
    cfg = cfg_a
    V, d = cfg.vocab_size, cfg.emb_dim
    rng = np.random.default_rng(22)
    params = init_params(cfg, seed=0)
    ids = rng.integers(0, V, size=(8, cfg.context_len))
    targets = rng.integers(0, V, size=(8, cfg.context_len))
    loss = loss_fn(params, ids, targets, cfg)
    s2 = 2 * d / (d + V)
    assert abs(loss - (math.log(V) + s2 / 2)) < 0.15
    assert abs(loss - math.log(V)) < 1.0


def closed_form_param_count(V, T_max, d, F, L):
    """Counted component by component, independently of param_count's formula."""
    tok, pos = V * d, T_max * d
    ln = 2 * d  # gain and shift
    attention = 4 * (d * d + d)  # q, k, v, o: matrix and bias each
    ffn = (d * F + F) + (F * d + d)
    head = d * V + V
    return tok + pos + L * (ln + attention + ln + ffn) + ln + head


@pytest.mark.parametrize("cfg", [
    PRESETS["tiny"], PRESETS["default"], PRESETS["A"], PRESETS["B"],
    ModelConfig(vocab_size=7, context_len=3, emb_dim=6, num_heads=3, num_layers=5, ff_dim=11),
    ModelConfig(vocab_size=1, context_len=1, emb_dim=1, num_heads=1, num_layers=1, ff_dim=1),
], ids=["tiny", "default", "A", "B", "odd", "ones"])
def test_param_count_equals_sum_of_init_sizes_and_closed_form(cfg):
    params = init_params(cfg, seed=0)
    assert param_count(cfg) == sum(p.size for p in params.values())
    assert param_count(cfg) == closed_form_param_count(
        cfg.vocab_size, cfg.context_len, cfg.emb_dim, cfg.ff_dim, cfg.num_layers)


def test_tiny_preset_has_377_parameters(tiny_cfg):
    # 36 (tok 5x4 + pos 4x4) + 2 x 154 (block) + 33 (lnf 8, head 4x5 + 5)
    assert param_count(tiny_cfg) == 377


def test_init_params_is_deterministic_per_seed_and_differs_across_seeds():
    cfg = PRESETS["default"]
    a, b, c = init_params(cfg, seed=3), init_params(cfg, seed=3), init_params(cfg, seed=4)
    assert list(a) == list(param_shapes(cfg))
    for name in a:
        assert_array_equal(a[name], b[name])
        if a[name].ndim == 2:
            assert not np.array_equal(a[name], c[name]), name


def test_init_matrices_respect_xavier_bounds_and_variance(cfg_a):
    """Xavier-uniform on [-L, L], L = sqrt(6/(fan_in+fan_out)), has variance L^2/3."""
    params = init_params(cfg_a, seed=5)
    matrices = [name for name, p in params.items() if p.ndim == 2]
    assert len(matrices) == 3 + 6 * cfg_a.num_layers  # tok, pos, head + 6 per block
    for name in matrices:
        w = params[name]
        fan_in, fan_out = w.shape
        limit = math.sqrt(6.0 / (fan_in + fan_out))
        assert np.abs(w).max() <= limit, name
        # >= 4096 entries: the variance estimate's relative s.e. is sqrt(0.8/n) < 1.4%.
        assert w.size >= 4096
        assert_allclose(w.var(), limit**2 / 3, rtol=0.1, err_msg=name)
        assert abs(w.mean()) < 0.05 * limit, name


def test_init_biases_are_zero_and_layer_norm_gains_one(cfg_a):
    params = init_params(cfg_a, seed=6)
    vectors = {name: p for name, p in params.items() if p.ndim == 1}
    gains = [n for n in vectors if n.endswith(("ln1_g", "ln2_g")) or n == "lnf_g"]
    assert len(gains) == 2 * cfg_a.num_layers + 1
    for name, p in vectors.items():
        if name in gains:
            assert_array_equal(p, np.ones_like(p), err_msg=name)
        else:  # biases and LayerNorm shifts
            assert_array_equal(p, np.zeros_like(p), err_msg=name)


# ---------------------------------------------------------------- training


def test_tiny_model_overfits_one_window(tiny_cfg):
    """377 parameters can memorise 4 next-token targets: the loss must go to ~0."""
    cfg = tiny_cfg
    rng = np.random.default_rng(23)
    ids = rng.integers(0, cfg.vocab_size, size=cfg.context_len)
    targets = rng.integers(0, cfg.vocab_size, size=cfg.context_len)
    params = init_params(cfg, seed=0)
    opt = AdamWConfig(lr=1e-2, weight_decay=0.0)
    state = adamw_init(params)
    first = loss_fn(params, ids, targets, cfg)
    for _ in range(200):
        _, grads = loss_and_grads(params, ids, targets, cfg)
        adamw_update(params, grads, state, opt.lr, opt)
    final = loss_fn(params, ids, targets, cfg)
    assert first > 1.0
    assert final < 0.05


# ------------------------------------------------------------ dtypes, shapes


def test_float32_params_give_float32_logits_and_grads_close_to_float64():
    cfg = PRESETS["default"]
    rng = np.random.default_rng(24)
    ids = rng.integers(0, cfg.vocab_size, size=(2, cfg.context_len))
    targets = rng.integers(0, cfg.vocab_size, size=(2, cfg.context_len))
    p64 = init_params(cfg, seed=0, dtype=np.float64)
    p32 = init_params(cfg, seed=0, dtype=np.float32)
    assert all(p.dtype == np.float32 for p in p32.values())
    logits32, _ = forward(p32, ids, cfg)
    assert logits32.dtype == np.float32
    loss32, g32 = loss_and_grads(p32, ids, targets, cfg)
    loss64, g64 = loss_and_grads(p64, ids, targets, cfg)
    assert_allclose(loss32, loss64, rtol=1e-5)
    scale = max(np.abs(g).max() for g in g64.values())
    for name in g64:
        assert g32[name].dtype == np.float32, name
        if name.endswith(".bk"):
            # Exactly zero in exact arithmetic (see test_key_bias_gradient_is_zero):
            # both dtypes only carry rounding noise, so compare against the overall scale.
            assert np.abs(g32[name]).max() < 1e-6 * scale, name
            continue
        assert relative_gap(g32[name].astype(np.float64), g64[name]) < 1e-4, name


def test_single_sequence_logits_equal_batch_of_one(tiny_cfg):
    """(T,) is shorthand for a batch of one: same numbers, batch axis dropped."""
    cfg = tiny_cfg.with_(activation="gelu")
    rng = np.random.default_rng(25)
    params = init_params(cfg, seed=2)
    ids = rng.integers(0, cfg.vocab_size, size=cfg.context_len)
    targets = rng.integers(0, cfg.vocab_size, size=cfg.context_len)
    single, _ = forward(params, ids, cfg)
    batch, _ = forward(params, ids[None], cfg)
    assert single.shape == (cfg.context_len, cfg.vocab_size)
    assert batch.shape == (1, cfg.context_len, cfg.vocab_size)
    assert_array_equal(single, batch[0])
    loss_s, grads_s = loss_and_grads(params, ids, targets, cfg)
    loss_b, grads_b = loss_and_grads(params, ids[None], targets[None], cfg)
    assert loss_s == loss_b
    for name in params:
        assert_array_equal(grads_s[name], grads_b[name])


def test_shorter_sequences_than_context_are_accepted(tiny_cfg):
    params = init_params(tiny_cfg, seed=0)
    logits, _ = forward(params, np.array([[1, 2], [3, 4]]), tiny_cfg)
    assert logits.shape == (2, 2, tiny_cfg.vocab_size)


# -------------------------------------------------------------- bad inputs


def test_error_classes_are_value_errors():
    assert issubclass(InputError, ValueError)
    assert issubclass(ConfigError, ValueError)


@pytest.mark.parametrize("ids, match", [
    (np.array([0, 5]), r"\[0, 5\).*found 5"),
    (np.array([3, -1]), r"\[0, 5\).*found -1"),  # numpy would silently read row V-1
    (np.zeros(5, dtype=np.int64), r"longer than the position table.*context_len=4"),
    (np.array([0.0, 1.0]), r"integers.*float64"),
    (np.array([True, False]), r"integers.*bool"),
    (np.zeros((1, 2, 3), dtype=np.int64), r"shape \(T,\) or \(B, T\)"),
    (np.zeros((0,), dtype=np.int64), r"empty"),
    (np.zeros((2, 0), dtype=np.int64), r"empty"),
    (np.zeros((0, 3), dtype=np.int64), r"empty"),
], ids=["id>=V", "negative-id", "too-long", "float-ids", "bool-ids", "3d-ids",
        "empty", "empty-rows", "empty-batch"])
def test_bad_ids_raise_input_error_naming_the_problem(tiny_cfg, ids, match):
    params = init_params(tiny_cfg, seed=0)
    with pytest.raises(InputError, match=match):
        forward(params, ids, tiny_cfg)


@pytest.mark.parametrize("targets, match", [
    (np.array([0, 1, 2]), r"targets have shape \(3,\), ids have shape \(4,\)"),
    (np.array([[0, 1, 2, 3]]), r"targets have shape \(1, 4\), ids have shape \(4,\)"),
    (np.array([0, 1, 5, 2]), r"targets must lie in \[0, 5\), found 5"),
    (np.array([0, -1, 2, 3]), r"targets must lie in \[0, 5\), found -1"),
    (np.array([0.0, 1.0, 2.0, 3.0]), r"targets must be integers"),
], ids=["shorter", "extra-axis", "target>=V", "negative-target", "float-targets"])
def test_bad_targets_raise_input_error_naming_the_problem(tiny_cfg, targets, match):
    params = init_params(tiny_cfg, seed=0)
    ids = np.array([0, 1, 2, 3])
    with pytest.raises(InputError, match=match):
        loss_and_grads(params, ids, targets, tiny_cfg)
    with pytest.raises(InputError, match=match):
        loss_fn(params, ids, targets, tiny_cfg)


def test_empty_ids_and_targets_raise_input_error_in_loss(tiny_cfg):
    params = init_params(tiny_cfg, seed=0)
    empty = np.zeros((0,), dtype=np.int64)
    with pytest.raises(InputError, match="empty"):
        loss_and_grads(params, empty, empty, tiny_cfg)
    with pytest.raises(InputError, match="ids is empty"):
        forward(params, [], tiny_cfg)  # an empty list is float64 to numpy: say empty, not "not integers"


def test_num_heads_not_dividing_emb_dim_raises_config_error():
    with pytest.raises(ConfigError, match=r"num_heads=3 does not divide emb_dim=10"):
        ModelConfig(emb_dim=10, num_heads=3)


@pytest.mark.parametrize("name", ["vocab_size", "context_len", "emb_dim", "num_heads", "num_layers", "ff_dim"])
@pytest.mark.parametrize("value", [0, -1, 2.0, True])
def test_sizes_must_be_positive_integers(name, value):
    with pytest.raises(ConfigError, match=f"{name} must be a positive integer, got {value!r}"):
        ModelConfig(**{name: value})


@pytest.mark.parametrize("name", ["vocab_size", "context_len", "emb_dim", "ff_dim"])
def test_a_size_no_array_could_be_indexed_by_is_refused_at_the_config(name):
    """10**30 passed as a size, and failed later as an allocation or an overflowing index; a size past
    2**31 - 1 is refused by name (an embedding's flat index id * d + j must fit 64 bits)."""
    with pytest.raises(ConfigError, match=f"{name} must be at most 2147483647, got {10**30}"):
        ModelConfig(**{name: 10**30})
    ModelConfig(**{name: 2**31 - 1, "num_heads": 1})  # the largest is a config (allocating it is another matter)


def test_unknown_activation_raises_config_error():
    with pytest.raises(ConfigError, match=r"activation must be one of.*'tanh'"):
        ModelConfig(activation="tanh")


def test_input_checks_still_raise_under_python_O():
    """python -O strips assert statements; the checks must be real raises."""
    script = (
        "import sys\n"
        "import numpy as np\n"
        "from transformer.config import PRESETS\n"
        "from transformer.errors import InputError\n"
        "from transformer.model import forward, init_params\n"
        "cfg = PRESETS['tiny']\n"
        "if __debug__: sys.exit('not running under -O')\n"
        "try:\n"
        "    forward(init_params(cfg), np.array([0, -1]), cfg)\n"
        "except InputError as e:\n"
        "    print('raised:', e)\n"
        "    sys.exit(0)\n"
        "sys.exit('no InputError for id -1 under -O')\n"
    )
    result = subprocess.run([sys.executable, "-O", "-c", script], cwd=REPO_ROOT,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "raised:" in result.stdout and "-1" in result.stdout
