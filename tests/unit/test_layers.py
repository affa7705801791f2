"""Each layer's forward/backward pair, checked one op at a time.

Every output of every backward is compared with central differences of the
scalar f = sum(forward(...) * dy) for a random upstream gradient dy: then
df/dinput is exactly what the backward must return for that dy. The rule is
relative_gap < REL_TOL (1e-6) in float64, which a gradient off by 0.1% (gap
1e-3) cannot pass. The key bias, whose true gradient is exactly zero, is the
one output checked against zero instead (see its own test).
"""

import importlib.util
import math
import subprocess
import sys

import numpy as np
import pytest
from numpy.testing import assert_allclose, assert_array_equal

from transformer.activations import gelu_backward, gelu_forward, relu_backward, relu_forward
from transformer.attention import attention_backward, attention_forward, causal_mask
from transformer.block import BLOCK_KEYS, block_backward, block_forward, block_params
from transformer.config import ModelConfig
from transformer.embedding import embedding_backward, embedding_forward
from transformer.gradcheck import REL_TOL, numerical_grad, relative_gap
from transformer.layernorm import layer_norm_backward, layer_norm_forward
from transformer.errors import InputError
from transformer.linear import linear_backward, linear_forward
from transformer.model import param_shapes
from transformer.softmax import (
    cross_entropy_backward,
    cross_entropy_forward,
    softmax_backward,
    softmax_forward,
)

H_STEP = 1e-5
ATTENTION_KEYS = ("wq", "bq", "wk", "bk", "wv", "bv", "wo", "bo")


def assert_grad_matches(analytic, f, x, what):
    """analytic must equal the central-difference gradient of f() w.r.t. x (read in place by f)."""
    numeric = numerical_grad(f, x, H_STEP)
    assert analytic.shape == x.shape, f"{what}: shape {analytic.shape} != {x.shape}"
    assert np.abs(numeric).max() > 1e-3, f"{what}: test is vacuous, numeric gradient ~0"
    gap = relative_gap(analytic, numeric)
    assert gap < REL_TOL, f"{what}: relative gap {gap:.3e} >= {REL_TOL}"


def random_attention_params(rng, d, scale=0.5):
    """Random weights AND biases (all non-zero), so every gradient term is exercised."""
    return {k: scale * rng.standard_normal((d, d) if k.startswith("w") else (d,)) for k in ATTENTION_KEYS}


def random_block_params(rng, cfg):
    shapes = param_shapes(cfg)
    p = {}
    for k in BLOCK_KEYS:
        shape = shapes[f"b0.{k}"]
        if k.endswith("_g"):
            p[k] = 1.0 + 0.3 * rng.standard_normal(shape)
        else:
            p[k] = 0.5 * rng.standard_normal(shape)
    return p


# --------------------------------------------------------------- embedding


def test_embedding_backward_matches_central_differences_for_both_tables():
    rng = np.random.default_rng(0)
    V, T_max, d = 4, 7, 3
    ids = rng.integers(0, V, size=(2, 5))  # 10 ids from 4 values: repeats guaranteed
    assert np.bincount(ids.ravel()).max() >= 2
    tok, pos = rng.standard_normal((V, d)), rng.standard_normal((T_max, d))
    dy = rng.standard_normal((2, 5, d))

    def f():
        return np.sum(embedding_forward(ids, tok, pos)[0] * dy)

    _, cache = embedding_forward(ids, tok, pos)
    dtok, dpos = embedding_backward(dy, cache)
    assert_grad_matches(dtok, f, tok, "dtok_emb")
    assert_grad_matches(dpos, f, pos, "dpos_emb")


@pytest.mark.parametrize("dtype", [np.uint8, np.int16, np.int64])
def test_embedding_backward_takes_ids_of_any_integer_dtype(dtype):
    """The table's gradient indexes entry (id, j) at id * d + j: with uint8 ids that product must not wrap."""
    rng = np.random.default_rng(2)
    V, T, d = 200, 5, 64  # 199 * 64 > 255
    ids = np.array([[199, 3, 199, 150, 0]])
    dy = rng.standard_normal((1, T, d))
    tok, pos = rng.standard_normal((V, d)), rng.standard_normal((T, d))
    want = np.zeros((V, d))
    for t, i in enumerate(ids[0]):
        want[i] += dy[0, t]
    _, cache = embedding_forward(ids.astype(dtype), tok, pos)
    assert_allclose(embedding_backward(dy, cache)[0], want, rtol=1e-12, atol=1e-12)


def test_repeated_ids_accumulate_embedding_gradient():
    """An id used k times receives k contributions (not just the last write)."""
    rng = np.random.default_rng(1)
    V, T_max, d = 3, 6, 4
    ids = np.array([[2, 2, 0, 2, 1, 2], [0, 2, 2, 1, 1, 0]])  # id 2 used 6 times
    tok, pos = rng.standard_normal((V, d)), rng.standard_normal((T_max, d))
    dy = rng.standard_normal((2, 6, d))
    _, cache = embedding_forward(ids, tok, pos)
    dtok, dpos = embedding_backward(dy, cache)

    want_tok = np.zeros((V, d))
    want_pos = np.zeros((T_max, d))
    for b in range(ids.shape[0]):
        for t in range(ids.shape[1]):
            want_tok[ids[b, t]] = want_tok[ids[b, t]] + dy[b, t]
            want_pos[t] = want_pos[t] + dy[b, t]
    assert_allclose(dtok, want_tok, rtol=1e-12, atol=1e-12)
    assert_allclose(dpos, want_pos, rtol=1e-12, atol=1e-12)


# ------------------------------------------------------------------ linear


def test_linear_backward_matches_central_differences_for_dx_dw_db_with_3d_input():
    rng = np.random.default_rng(2)
    x = rng.standard_normal((2, 3, 4))
    w = rng.standard_normal((4, 5))
    b = rng.standard_normal(5)
    dy = rng.standard_normal((2, 3, 5))

    def f():
        return np.sum(linear_forward(x, w, b)[0] * dy)

    y, cache = linear_forward(x, w, b)
    assert y.shape == (2, 3, 5)
    dx, dw, db = linear_backward(dy, cache)
    assert_grad_matches(dx, f, x, "dx")
    assert_grad_matches(dw, f, w, "dw")
    assert_grad_matches(db, f, b, "db")


# ------------------------------------------------------------- activations


def test_relu_backward_matches_central_differences_away_from_zero():
    """Inputs at least 0.1 from the kink, so x +- h never crosses it."""
    rng = np.random.default_rng(3)
    x = rng.uniform(0.1, 2.0, size=(3, 7)) * rng.choice([-1.0, 1.0], size=(3, 7))
    assert (x > 0).any() and (x < 0).any()
    dy = rng.standard_normal((3, 7))

    def f():
        return np.sum(relu_forward(x)[0] * dy)

    _, cache = relu_forward(x)
    assert_grad_matches(relu_backward(dy, cache), f, x, "relu dx")


def test_gelu_backward_matches_central_differences():
    rng = np.random.default_rng(4)
    x = 2.0 * rng.standard_normal((3, 7))
    dy = rng.standard_normal((3, 7))

    def f():
        return np.sum(gelu_forward(x)[0] * dy)

    _, cache = gelu_forward(x)
    assert_grad_matches(gelu_backward(dy, cache), f, x, "gelu dx")


def test_gelu_matches_exact_erf_formula_and_torch():
    """GELU is x * Phi(x) with the exact normal CDF; torch's default gelu is the same function."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(5)
    x = 3.0 * rng.standard_normal(200)
    y, _ = gelu_forward(x)
    by_math = np.array([v * 0.5 * (1.0 + math.erf(v / math.sqrt(2.0))) for v in x])
    assert_allclose(y, by_math, rtol=1e-12, atol=1e-15)
    by_torch = torch.nn.functional.gelu(torch.tensor(x, dtype=torch.float64)).numpy()
    assert_allclose(y, by_torch, rtol=1e-12, atol=1e-15)


def test_scipy_is_imported_only_when_gelu_first_runs():
    """scipy.special takes longer to import than the rest of the package, and only GELU's erf needs it: a
    subprocess that never reaches GELU (most commands the pages run) must not pay for it."""
    probe = ("import sys, numpy as np, transformer; before = 'scipy.special' in sys.modules; "
             "transformer.activations.gelu_forward(np.zeros(2)); print(before, 'scipy.special' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", str(importlib.util.find_spec("scipy") is not None)]


def test_gelu_works_in_float32_and_returns_float32():
    rng = np.random.default_rng(6)
    x64 = 2.0 * rng.standard_normal((4, 9))
    x32 = x64.astype(np.float32)
    dy32 = rng.standard_normal((4, 9)).astype(np.float32)
    y32, cache32 = gelu_forward(x32)
    dx32 = gelu_backward(dy32, cache32)
    assert y32.dtype == np.float32
    assert dx32.dtype == np.float32
    y64, cache64 = gelu_forward(x32.astype(np.float64))
    dx64 = gelu_backward(dy32.astype(np.float64), cache64)
    # float32 carries ~7 significant digits.
    assert_allclose(y32, y64, rtol=1e-5, atol=1e-6)
    assert_allclose(dx32, dx64, rtol=1e-5, atol=1e-6)


# --------------------------------------------------------------- layer norm


def test_layer_norm_backward_matches_central_differences_for_dx_dg_db():
    rng = np.random.default_rng(7)
    d = 5
    x = 3.0 * rng.standard_normal((2, 3, d)) + 1.0
    g = 1.0 + 0.5 * rng.standard_normal(d)  # non-trivial gain and shift
    b = rng.standard_normal(d)
    dy = rng.standard_normal((2, 3, d))
    eps = 1e-5

    def f():
        return np.sum(layer_norm_forward(x, g, b, eps)[0] * dy)

    _, cache = layer_norm_forward(x, g, b, eps)
    dx, dg, db = layer_norm_backward(dy, cache)
    assert_grad_matches(dx, f, x, "ln dx")
    assert_grad_matches(dg, f, g, "ln dg")
    assert_grad_matches(db, f, b, "ln db")


def test_layer_norm_of_constant_row_returns_shift_exactly():
    """A constant row has x - mean = 0, so the normalised row is 0 and y = g*0 + b = b."""
    rng = np.random.default_rng(8)
    d = 6
    x = np.array([[0.1] * d, [-3.7] * d, [2.0] * d, [0.0] * d])
    g = 1.0 + rng.standard_normal(d)
    b = rng.standard_normal(d)
    y, _ = layer_norm_forward(x, g, b, 1e-5)
    assert_allclose(y, np.broadcast_to(b, x.shape), rtol=0, atol=1e-12)


def test_layer_norm_matches_torch_layer_norm():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(9)
    d = 8
    x = 2.0 * rng.standard_normal((3, 4, d)) - 0.5
    g = 1.0 + 0.5 * rng.standard_normal(d)
    b = rng.standard_normal(d)
    eps = 1e-5
    y, _ = layer_norm_forward(x, g, b, eps)
    want = torch.nn.functional.layer_norm(
        torch.tensor(x), (d,), torch.tensor(g), torch.tensor(b), eps
    ).numpy()
    assert_allclose(y, want, rtol=1e-12, atol=1e-12)


# ------------------------------------------------------- softmax, x-entropy


def test_softmax_backward_matches_central_differences():
    rng = np.random.default_rng(10)
    x = 2.0 * rng.standard_normal((2, 3, 5))
    dy = rng.standard_normal((2, 3, 5))

    def f():
        return np.sum(softmax_forward(x)[0] * dy)

    _, cache = softmax_forward(x)
    assert_grad_matches(softmax_backward(dy, cache), f, x, "softmax dx")


def test_softmax_of_huge_logits_is_finite_and_equals_shifted_softmax():
    """Softmax is invariant to a constant shift; exp(10002) overflows unless the max is subtracted."""
    p_big, _ = softmax_forward(np.array([10000.0, 10001.0, 10002.0]))
    p_small, _ = softmax_forward(np.array([0.0, 1.0, 2.0]))
    assert np.isfinite(p_big).all()
    e = np.array([math.exp(0.0), math.exp(1.0), math.exp(2.0)])
    assert_allclose(p_big, e / e.sum(), rtol=1e-14, atol=0)
    assert_allclose(p_big, p_small, rtol=1e-14, atol=0)


def test_cross_entropy_backward_matches_central_differences():
    rng = np.random.default_rng(11)
    logits = 2.0 * rng.standard_normal((2, 3, 5))
    targets = rng.integers(0, 5, size=(2, 3))
    dloss = 1.7  # a random upstream gradient for the scalar loss

    def f():
        return cross_entropy_forward(logits, targets)[0] * dloss

    _, cache = cross_entropy_forward(logits, targets)
    assert_grad_matches(cross_entropy_backward(dloss, cache), f, logits, "xent dlogits")


def test_cross_entropy_of_confident_wrong_logits_is_large_and_finite():
    """loss = logsumexp(z) - z_target = 1000 + log(1 + 2 e^-1000) - 0, i.e. 1000, not log(0) = inf."""
    logits = np.array([[1000.0, 0.0, 0.0]])
    targets = np.array([2])
    loss, cache = cross_entropy_forward(logits, targets)
    assert np.isfinite(loss)
    assert_allclose(loss, 1000.0, rtol=1e-12, atol=0)
    dlogits = cross_entropy_backward(1.0, cache)
    assert np.isfinite(dlogits).all()
    # softmax is (1, 0, 0) to double precision, minus the one-hot of class 2.
    assert_allclose(dlogits, np.array([[1.0, 0.0, -1.0]]), rtol=0, atol=1e-12)


# ---------------------------------------------------------------- attention


def test_attention_backward_matches_central_differences_for_dx_and_all_params():
    rng = np.random.default_rng(12)
    B, T, d, H = 2, 4, 6, 2
    x = rng.standard_normal((B, T, d))
    p = random_attention_params(rng, d)
    dy = rng.standard_normal((B, T, d))

    def f():
        return np.sum(attention_forward(x, p, H)[0] * dy)

    _, cache = attention_forward(x, p, H)
    dx, grads = attention_backward(dy, cache)
    assert set(grads) == set(ATTENTION_KEYS)
    assert_grad_matches(dx, f, x, "attention dx")
    for name in ATTENTION_KEYS:
        if name == "bk":
            continue  # exactly zero: see test_key_bias_gradient_is_zero
        assert_grad_matches(grads[name], f, p[name], f"attention d{name}")


def test_key_bias_gradient_is_zero():
    """Adding bk adds q.bk to every score in a query's row: the same constant for
    every key of that row. Softmax ignores a per-row constant, so the output and
    hence the loss do not depend on bk, and its gradient is zero."""
    rng = np.random.default_rng(13)
    B, T, d, H = 2, 5, 6, 3
    x = rng.standard_normal((B, T, d))
    p = random_attention_params(rng, d)
    dy = rng.standard_normal((B, T, d))
    y, cache = attention_forward(x, p, H)
    _, grads = attention_backward(dy, cache)
    assert_allclose(grads["bk"], np.zeros(d), rtol=0, atol=1e-12)
    # Central differences agree (up to their rounding noise, ~eps*|f|/h).
    numeric = numerical_grad(lambda: np.sum(attention_forward(x, p, H)[0] * dy), p["bk"], H_STEP)
    assert_allclose(numeric, np.zeros(d), rtol=0, atol=1e-9)
    # And directly: a large change of bk leaves the output unchanged.
    p_moved = dict(p, bk=p["bk"] + 3.0 * rng.standard_normal(d))
    y_moved, _ = attention_forward(x, p_moved, H)
    assert_allclose(y_moved, y, rtol=1e-12, atol=1e-12)


def test_attention_probabilities_are_causal_and_rows_sum_to_one():
    """A query at t may only see keys s <= t; each row is a probability distribution."""
    rng = np.random.default_rng(14)
    B, T, d, H = 2, 6, 8, 2
    x = rng.standard_normal((B, T, d))
    p = random_attention_params(rng, d)
    _, cache = attention_forward(x, p, H)
    att = cache.att  # (B, H, T, T)
    assert att.shape == (B, H, T, T)
    above = np.triu(np.ones((T, T), dtype=bool), k=1)
    assert (att[..., above] == 0.0).all()
    assert (att[..., ~above] > 0.0).all()
    assert_allclose(att.sum(axis=-1), np.ones((B, H, T)), rtol=0, atol=1e-12)


def test_attention_stores_each_row_of_scores_down_a_column_and_the_mask_alike():
    """The layout the softmax's row reductions are fast in (attention_forward's comment, tools/bench_kernels.py):
    the probabilities of a query lie down a column of memory, and the mask it adds is stored alike."""
    rng = np.random.default_rng(16)
    B, T, d, H = 2, 6, 8, 2
    x = rng.standard_normal((B, T, d)).astype(np.float32)
    p = {k: v.astype(np.float32) for k, v in random_attention_params(rng, d).items()}
    _, cache = attention_forward(x, p, H)
    assert cache.att.strides[-2] < cache.att.strides[-1]  # the next query's entry is the nearest in memory
    column_major = causal_mask(T, np.dtype(np.float32), column_major=True)
    assert column_major.flags.f_contiguous and causal_mask(T, np.dtype(np.float32)).flags.c_contiguous
    assert np.array_equal(column_major, causal_mask(T, np.dtype(np.float32)))


# -------------------------------------------------------------------- block


@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_block_backward_matches_central_differences_for_dx_and_all_params(activation):
    rng = np.random.default_rng(15)
    cfg = ModelConfig(vocab_size=5, context_len=4, emb_dim=6, num_heads=2, num_layers=1,
                      ff_dim=10, activation=activation)
    B, T = 2, 4
    x = rng.standard_normal((B, T, cfg.emb_dim))
    p = random_block_params(rng, cfg)
    dy = rng.standard_normal((B, T, cfg.emb_dim))

    def f():
        return np.sum(block_forward(x, p, cfg)[0] * dy)

    _, cache = block_forward(x, p, cfg)
    dx, grads = block_backward(dy, cache)
    assert set(grads) == set(BLOCK_KEYS)
    assert len(BLOCK_KEYS) == 16
    assert_grad_matches(dx, f, x, f"block[{activation}] dx")
    for name in BLOCK_KEYS:
        if name == "bk":
            assert_allclose(grads[name], np.zeros(cfg.emb_dim), rtol=0, atol=1e-12)
            continue
        assert_grad_matches(grads[name], f, p[name], f"block[{activation}] d{name}")


def test_block_params_strips_layer_prefix():
    params = {f"b1.{k}": np.full(1, i) for i, k in enumerate(BLOCK_KEYS)}
    p = block_params(params, 1)
    assert list(p) == list(BLOCK_KEYS)
    for i, k in enumerate(BLOCK_KEYS):
        assert p[k] is params[f"b1.{k}"]


# ------------------------------------------------------- backward hygiene


def test_backwards_do_not_modify_or_alias_the_upstream_gradient():
    """Backward functions return new arrays: callers may keep and reuse dy."""
    rng = np.random.default_rng(16)
    x = rng.standard_normal((2, 3, 4)) + 0.05
    dy = rng.standard_normal((2, 3, 4))
    w, b = rng.standard_normal((4, 4)), rng.standard_normal(4)
    g = 1.0 + 0.3 * rng.standard_normal(4)
    cases = {
        "linear": lambda: linear_backward(dy, linear_forward(x, w, b)[1]),
        "relu": lambda: (relu_backward(dy, relu_forward(x)[1]),),
        "gelu": lambda: (gelu_backward(dy, gelu_forward(x)[1]),),
        "layer_norm": lambda: layer_norm_backward(dy, layer_norm_forward(x, g, b, 1e-5)[1]),
        "softmax": lambda: (softmax_backward(dy, softmax_forward(x)[1]),),
        "attention": lambda: (lambda r: (r[0], *r[1].values()))(
            attention_backward(dy, attention_forward(x, random_attention_params(rng, 4), 2)[1])),
    }
    for name, run in cases.items():
        before = dy.copy()
        outputs = run()
        assert_array_equal(dy, before, err_msg=f"{name} modified dy")
        for out in outputs:
            assert not np.shares_memory(out, dy), f"{name} returned a view of dy"


@pytest.mark.parametrize("tile", [0, -2, 1.5, True])
def test_flash_attention_refuses_a_tile_that_is_not_a_positive_integer(tile):
    """Through the library, not ModelConfig (which checks flash_tile too): tile 0 made range() fail inside, and a
    negative one left every row's sum at 0, so the output was NaN without an error."""
    from transformer.flash_attention import flash_attention_forward

    rng = np.random.default_rng(0)
    p = {n: rng.standard_normal((4, 4)) for n in ("wq", "wk", "wv", "wo")}
    p.update({n: rng.standard_normal(4) for n in ("bq", "bk", "bv", "bo")})
    with pytest.raises(InputError, match="tile must be a positive integer"):
        flash_attention_forward(rng.standard_normal((1, 3, 4)), p, 2, tile=tile)
