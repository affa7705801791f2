"""NaN semantics of every element-wise and row-wise op (NaN in, NaN out, forward and backward), and the
refusal of a softmax row that is masked everywhere, in the materialized and the flash attention paths."""

import numpy as np
import pytest

from transformer.activations import ACTIVATION_FUNCTIONS
from transformer.attention import attention_backward, attention_forward, causal_mask
from transformer.embedding import embedding_backward, embedding_forward
from transformer.errors import InputError, MaskedRowError
from transformer.flash_attention import (flash_attention_backward, flash_attention_forward, flash_core_forward,
                                         tile_scores)
from transformer.layernorm import layer_norm_backward, layer_norm_forward
from transformer.linear import linear_backward, linear_forward
from transformer.softmax import (cross_entropy_backward, cross_entropy_forward, cross_entropy_time_range_backward,
                                 cross_entropy_time_range_forward, softmax_backward, softmax_forward)

DTYPES = (np.float32, np.float64)


def with_nan(rng, shape, dtype, where):
    x = rng.standard_normal(shape).astype(dtype)
    x[where] = np.nan
    return x


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", sorted(ACTIVATION_FUNCTIONS))
def test_an_activation_keeps_nan_as_nan_forward_and_backward(name, dtype):
    """A NaN input gives a NaN output and a NaN input gradient; every other entry stays finite. Negative,
    zero and positive inputs sit beside it, so a backward that stops NaN like a negative input fails."""
    forward, backward = ACTIVATION_FUNCTIONS[name]
    x = np.array([[-2.0, np.nan, 0.0, 1.5], [np.nan, -0.5, 3.0, np.nan]], dtype=dtype)
    nan = np.isnan(x)
    y, cache = forward(x)
    dx = backward(np.ones_like(x), cache)
    assert (np.isnan(y) == nan).all() and (np.isnan(dx) == nan).all()
    assert y.dtype == dx.dtype == dtype


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", sorted(ACTIVATION_FUNCTIONS))
def test_an_activation_takes_infinities_to_its_limits(name, dtype):
    """Every activation here tends to 0 with slope 0 as x goes to -inf and to x with slope 1 as x goes to +inf:
    at the infinities themselves it gives those limits, not -inf * 0 = NaN (a diverged model's infinite
    pre-activation is not a NaN, and must not turn into one here)."""
    forward, backward = ACTIVATION_FUNCTIONS[name]
    x = np.array([-np.inf, -1.0, np.inf], dtype=dtype)
    y, cache = forward(x)
    dx = backward(np.ones_like(x), cache)
    assert y[0] == 0 and y[2] == np.inf and dx[0] == 0 and dx[2] == 1 and np.isfinite(y[1])
    assert y.dtype == dx.dtype == dtype


@pytest.mark.parametrize("name", sorted(ACTIVATION_FUNCTIONS))
def test_an_activation_backward_passes_a_nan_upstream_gradient_on(name):
    rng = np.random.default_rng(40)
    forward, backward = ACTIVATION_FUNCTIONS[name]
    x = rng.standard_normal((3, 5))
    x[0, 0] = -1.0  # ReLU's zero derivative times NaN is NaN, not 0
    dy = np.ones_like(x)
    dy[0, 0] = dy[2, 3] = np.nan
    _, cache = forward(x)
    assert (np.isnan(backward(dy, cache)) == np.isnan(dy)).all()


def test_relu_backward_is_still_the_step_function_on_numbers():
    """Away from 0 (the convention there is the mutation run's relu-gradient-one-at-zero)."""
    x = np.array([-1.0, 2.0, -1e-300, 1e-300, np.inf])
    _, cache = ACTIVATION_FUNCTIONS["relu"][0](x)
    dx = ACTIVATION_FUNCTIONS["relu"][1](np.full(5, 3.0), cache)
    np.testing.assert_array_equal(dx, [0.0, 3.0, 0.0, 3.0, 3.0])


@pytest.mark.parametrize("dtype", DTYPES)
def test_softmax_makes_a_row_with_a_nan_all_nan_and_leaves_the_other_rows(dtype):
    rng = np.random.default_rng(41)
    x = with_nan(rng, (3, 4), dtype, (1, 2))
    p, cache = softmax_forward(x)
    dx = softmax_backward(rng.standard_normal((3, 4)).astype(dtype), cache)
    for out in (p, dx):
        assert np.isnan(out[1]).all() and np.isfinite(out[[0, 2]]).all()


@pytest.mark.parametrize("dtype", DTYPES)
def test_layer_norm_makes_a_row_with_a_nan_all_nan_and_leaves_the_other_rows(dtype):
    rng = np.random.default_rng(42)
    x = with_nan(rng, (3, 4), dtype, (2, 0))
    g, b = np.ones(4, dtype=dtype), np.zeros(4, dtype=dtype)
    y, cache = layer_norm_forward(x, g, b, 1e-5)
    dx, dg, db = layer_norm_backward(rng.standard_normal((3, 4)).astype(dtype), cache)
    for out in (y, dx):
        assert np.isnan(out[2]).all() and np.isfinite(out[:2]).all()
    assert np.isnan(dg).all() and np.isfinite(db).all()  # the NaN row's xhat reaches every gain; db is dy only


def test_linear_carries_a_nan_into_its_row_and_its_gradients():
    rng = np.random.default_rng(43)
    x = with_nan(rng, (3, 4), np.float64, (0, 1))
    w, b = rng.standard_normal((4, 2)), rng.standard_normal(2)
    y, cache = linear_forward(x, w, b)
    _, dw, db = linear_backward(np.ones((3, 2)), cache)
    assert np.isnan(y[0]).all() and np.isfinite(y[1:]).all()
    assert np.isnan(dw[1]).all() and np.isfinite(dw[[0, 2, 3]]).all() and np.isfinite(db).all()


@pytest.mark.parametrize("dtype", DTYPES)
def test_linear_keeps_nan_in_both_dtypes(dtype):
    rng = np.random.default_rng(46)
    x = with_nan(rng, (2, 3, 4), dtype, (1, 2, 0))
    y, cache = linear_forward(x, rng.standard_normal((4, 5)).astype(dtype), np.zeros(5, dtype=dtype))
    dx, dw, _ = linear_backward(with_nan(rng, (2, 3, 5), dtype, (0, 0, 1)), cache)
    assert (np.isnan(y).any(axis=-1) == np.isnan(x).any(axis=-1)).all()
    assert np.isnan(dx[0, 0]).all() and np.isfinite(dx[1]).all() and np.isnan(dw).any()


@pytest.mark.parametrize("dtype", DTYPES)
def test_cross_entropy_of_a_row_with_a_nan_is_nan_and_so_is_that_rows_gradient(dtype):
    """The loss is a mean, so one NaN logit makes it NaN; the gradient is NaN in that row only (the others
    are (P - e_y)/N times the upstream 1, which does not involve the NaN row)."""
    rng = np.random.default_rng(47)
    logits = with_nan(rng, (2, 3, 5), dtype, (1, 0, 4))
    targets = rng.integers(0, 5, (2, 3))
    loss, cache = cross_entropy_forward(logits, targets)
    dlogits = cross_entropy_backward(1.0, cache)
    assert np.isnan(loss) and dlogits.dtype == dtype
    assert np.isnan(dlogits[1, 0]).all() and np.isfinite(np.delete(dlogits.reshape(6, 5), 3, axis=0)).all()
    loss, cache = cross_entropy_time_range_forward(logits, targets, 1, 2)  # the NaN position is not counted
    assert np.isfinite(loss) and np.isfinite(cross_entropy_time_range_backward(1.0, cache)).all()
    loss, cache = cross_entropy_time_range_forward(logits, targets, 0, 2)
    assert np.isnan(loss) and np.isnan(cross_entropy_time_range_backward(1.0, cache)[1, 0]).all()


def test_the_embedding_gradient_carries_a_nan_into_the_rows_that_position_used():
    rng = np.random.default_rng(48)
    ids = np.array([[2, 0, 2], [1, 1, 0]])
    _, cache = embedding_forward(ids, rng.standard_normal((4, 3)), rng.standard_normal((5, 3)))
    dx = with_nan(rng, (2, 3, 3), np.float64, (1, 0, 2))  # sequence 1, position 0: token 1
    dtok, dpos = embedding_backward(dx, cache)
    assert np.isnan(dtok[1, 2]) and np.isfinite(np.delete(dtok, 1, axis=0)).all()
    assert np.isnan(dpos[0, 2]) and np.isfinite(dpos[1:]).all()


FLASH_TILE = 2
ATTENTION_PATHS = {"materialized": (attention_forward, attention_backward),
                   "flash": (lambda x, p, h: flash_attention_forward(x, p, h, tile=FLASH_TILE),
                             flash_attention_backward)}


@pytest.mark.parametrize("path", sorted(ATTENTION_PATHS))
@pytest.mark.parametrize("at", [2, 3])  # with tiles of 2 keys: the first key of a tile, and the one inside it
def test_attention_keeps_a_nan_inside_its_own_window(path, at):
    """A NaN in window 0's input at position `at` reaches that window's outputs at `at` and later (they attend
    to it), and never window 1, forward or backward. Earlier positions differ by path: the materialized path
    adds the mask, and NaN + (-inf) is NaN, so the NaN key's score poisons every row of the window. Flash
    attention never computes a tile above the diagonal, so the rows before the NaN's tile of keys stay finite;
    inside that tile the mask is added as in the materialized path (and a masked weight of 0 times a NaN value
    is NaN too), so the tile's rows before `at` are NaN: the NaN on a tile's boundary and inside it."""
    forward, backward = ATTENTION_PATHS[path]
    rng = np.random.default_rng(49)
    d, H = 4, 2
    p = {name: rng.standard_normal((d, d)) for name in ("wq", "wk", "wv", "wo")}
    p.update({name: rng.standard_normal(d) for name in ("bq", "bk", "bv", "bo")})
    x = with_nan(rng, (2, 5, d), np.float64, (0, at, 1))
    with np.errstate(invalid="ignore"):
        y, cache = forward(x, p, H)
        dx, grads = backward(np.ones_like(y), cache)
    reached = 0 if path == "materialized" else at - at % FLASH_TILE  # the first row the NaN reaches
    assert np.isnan(y[0, reached:]).all() and np.isfinite(y[0, :reached]).all() and np.isfinite(y[1]).all()
    assert np.isnan(dx[0]).any() and np.isfinite(dx[1]).all() and np.isnan(grads["wq"]).any()


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_fully_masked_softmax_row_is_refused_with_the_librarys_error(dtype):
    x = np.zeros((2, 3, 4), dtype=dtype)
    x[1, 2] = -np.inf
    with pytest.raises(MaskedRowError, match=r"1 row\(s\) are -inf everywhere .* first at index \(1, 2, 0\)"):
        softmax_forward(x)
    assert issubclass(MaskedRowError, InputError)
    with pytest.raises(MaskedRowError, match="cross-entropy"):
        cross_entropy_forward(x, np.zeros((2, 3), dtype=int))


def test_a_partly_masked_row_is_an_ordinary_softmax():
    p, _ = softmax_forward(np.array([0.0, -np.inf, 0.0]))
    np.testing.assert_array_equal(p, [0.5, 0.0, 0.5])


@pytest.mark.parametrize("T", [1, 2, 7, 16])
def test_the_causal_mask_leaves_every_row_a_key(T):
    assert (causal_mask(T, np.dtype(np.float64)).max(axis=-1) == 0.0).all()


@pytest.mark.parametrize("tile", [1, 3, 8])
def test_every_flash_tile_row_sees_at_least_one_key(tile):
    """Each query row of each key tile has a finite score, so no tile masks a row everywhere either."""
    rng = np.random.default_rng(44)
    q, k = rng.standard_normal((2, 1, 7, 4)), rng.standard_normal((2, 1, 7, 4))
    for start in range(0, 7, tile):
        s = tile_scores(q, k, start, min(start + tile, 7))
        assert np.isfinite(s.max(axis=-1)).all()


def test_flash_attention_refuses_a_row_of_minus_inf_scores_as_softmax_does():
    """Scores that are -inf themselves (keys at -inf): both paths raise the same error class."""
    rng = np.random.default_rng(45)
    q = np.abs(rng.standard_normal((1, 1, 4, 2))) + 1.0
    k = np.full((1, 1, 4, 2), -np.inf)
    with pytest.raises(MaskedRowError, match="flash attention"), np.errstate(invalid="ignore"):
        flash_core_forward(q, k, rng.standard_normal((1, 1, 4, 2)), tile=2)
    with pytest.raises(MaskedRowError, match="softmax"), np.errstate(invalid="ignore"):
        softmax_forward(q @ k.transpose(0, 1, 3, 2) + causal_mask(4, np.dtype(np.float64)))
