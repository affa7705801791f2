"""NaN semantics of the autograd engine, the same as the hand-written layers' (tests/unit/test_nonfinite.py):
for every primitive, forward and backward, a NaN reaches exactly the entries computed from it, and a
softmax row that is -inf everywhere is refused with the library's error instead of becoming NaN.

Each case gives its inputs with a NaN in them, an upstream gradient with a NaN elsewhere, and where the
NaNs must come out: in the output, and in each input's gradient. A gradient is NaN where the NaN upstream
gradient flows, and where its local derivative reads a NaN value (ReLU's slope, exp, a product's other
factor); a derivative that reads no value (a sum's 1, the embedding's scatter-add) leaves the rest finite.
"""

import numpy as np
import pytest

from transformer import autograd as ag
from transformer import autograd_functions as agf
from transformer.autograd_model import cross_entropy
from transformer.errors import MaskedRowError

nan = np.nan
X = np.array([[-2.0, nan, 0.0], [1.5, -0.5, -1.0]])  # a NaN beside a negative, a zero and positives
POSITIVE = np.array([[2.0, nan, 0.5], [1.5, 0.3, 1.0]])
OTHER = np.array([[1.0, 2.0, nan], [-1.0, 0.5, 3.0]])  # a second operand, NaN elsewhere
DY = np.array([[1.0, -1.0, 0.5], [2.0, 0.7, nan]])  # the upstream gradient: NaN where X is -1 (ReLU stops it)
ROWS = np.array([[0.3, nan, -1.0], [0.5, 0.2, 1.0], [-0.4, 1.1, 0.0]])
ROWS_DY = np.array([[1.0, 0.5, -1.0], [0.2, 0.3, nan], [0.7, -0.3, 1.2]])
IDS = np.array([[1, 3, 1], [0, 2, 0]])
TABLE = np.arange(12.0).reshape(4, 3) / 10
TABLE[1, 0] = nan  # read at three positions
EMB_DY = np.ones((2, 3, 3))
EMB_DY[1, 1, 2] = nan  # the position that reads id 2


def isnan(a):
    return np.isnan(a)


def nan_terms(a, b):
    """Where a @ b is NaN: entry (i, j) sums row i of a times column j of b, so any NaN in either."""
    return (isnan(a).astype(int) @ np.ones(b.shape) + np.ones(a.shape) @ isnan(b).astype(int)) > 0


def elementwise(op, x=X):
    """A unary op whose derivative reads its input: NaN out where x is NaN; gradient NaN there and where dy is."""
    return op, [x], DY, isnan(x), [isnan(x) | isnan(DY)]


A, B = X, OTHER
W = np.array([[1.0, 0.5], [-1.0, 2.0], [nan, 0.3]])
MDY = np.array([[1.0, 0.5], [-0.2, nan]])
CASES = {
    "add": (ag.add, [A, B], DY, isnan(A) | isnan(B), [isnan(DY), isnan(DY)]),
    "add, broadcast": (ag.add, [np.ones((2, 3)), np.array([1.0, nan, 2.0])], DY,
                       np.array([[False, True, False]] * 2), [isnan(DY), isnan(DY).any(axis=0)]),
    "sub": (ag.sub, [A, B], DY, isnan(A) | isnan(B), [isnan(DY), isnan(DY)]),
    "mul": (ag.mul, [A, B], DY, isnan(A) | isnan(B), [isnan(DY) | isnan(B), isnan(DY) | isnan(A)]),
    "div": (ag.div, [A, B], DY, isnan(A) | isnan(B), [isnan(DY) | isnan(B), isnan(DY) | isnan(A) | isnan(B)]),
    "power": elementwise(lambda a: ag.power(a, -0.5), POSITIVE),
    "square": elementwise(lambda a: ag.power(a, 2)),
    "exp": elementwise(agf.exp),
    "log": elementwise(agf.log, POSITIVE),
    "relu": elementwise(agf.relu),
    "erf": elementwise(agf.erf),
    "gelu": elementwise(agf.gelu),
    "softmax": (agf.softmax, [ROWS], ROWS_DY, np.array([[True] * 3, [False] * 3, [False] * 3]),
                [np.array([[True] * 3, [True] * 3, [False] * 3])]),  # a row with a NaN is NaN all along
    "matmul, a weight": (ag.matmul, [A, W], MDY, nan_terms(A, W), [nan_terms(MDY, W.T), nan_terms(A.T, MDY)]),
    "matmul, batched": (ag.matmul, [A[None], W[None]], MDY[None], nan_terms(A, W)[None],
                        [nan_terms(MDY, W.T)[None], nan_terms(A.T, MDY)[None]]),
    "sum": (lambda a: ag.tensor_sum(a, axis=1), [X], np.array([1.0, nan]), np.array([True, False]),
            [np.array([[False] * 3, [True] * 3])]),  # d sum / dx = 1 reads no value: row 0 stays finite
    "mean": (lambda a: ag.mean(a, axis=1), [X], np.array([1.0, nan]), np.array([True, False]),
             [np.array([[False] * 3, [True] * 3])]),
    "reshape": (lambda a: ag.reshape(a, (3, 2)), [X], DY.reshape(3, 2), isnan(X).reshape(3, 2), [isnan(DY)]),
    "swapaxes": (lambda a: ag.swapaxes(a, 0, 1), [X], DY.T, isnan(X).T, [isnan(DY)]),
    "embedding": (lambda table: agf.embedding(table, IDS), [TABLE], EMB_DY,
                  np.isin(IDS, [1])[..., None] & (np.arange(3) == 0),
                  [np.zeros((4, 3), bool) | ((np.arange(4) == 2)[:, None] & (np.arange(3) == 2))]),
}


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("name", sorted(CASES))
def test_a_nan_reaches_exactly_what_is_computed_from_it_forward_and_backward(name, dtype):
    op, arrays, dy, out_nan, grads_nan = CASES[name]
    leaves = [ag.Tensor(np.array(a, dtype=dtype), requires_grad=True) for a in arrays]
    out = op(*leaves)
    assert out.data.dtype == dtype
    np.testing.assert_array_equal(isnan(out.data), out_nan, err_msg=f"{name}: forward")
    out.backward(np.array(dy, dtype=dtype))
    for position, (leaf, expected) in enumerate(zip(leaves, grads_nan, strict=True)):
        assert leaf.grad.dtype == dtype
        np.testing.assert_array_equal(isnan(leaf.grad), expected, err_msg=f"{name}: gradient of input {position}")


def test_every_case_has_a_nan_to_carry_and_finite_entries_beside_it():
    """No case is vacuous: each puts a NaN in and expects finite entries too, forward and backward."""
    for name, (_, arrays, dy, out_nan, grads_nan) in CASES.items():
        assert any(isnan(a).any() for a in arrays) and isnan(dy).any(), name
        for mask in (out_nan, *grads_nan):
            assert mask.any() and not mask.all(), name


def test_relu_is_still_the_step_function_on_numbers():
    x = ag.Tensor(np.array([-1.0, 2.0, -1e-300, 1e-300, 0.0, np.inf]), requires_grad=True)
    y = agf.relu(x)
    y.backward(np.full(6, 3.0))
    np.testing.assert_array_equal(y.data, [0.0, 2.0, 0.0, 1e-300, 0.0, np.inf])
    np.testing.assert_array_equal(x.grad, [0.0, 3.0, 0.0, 3.0, 0.0, 3.0])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_fully_masked_softmax_row_is_refused_with_the_librarys_error(dtype):
    scores = np.zeros((2, 3, 4), dtype=dtype)
    scores[1, 2] = -np.inf
    with pytest.raises(MaskedRowError, match=r"softmax: 1 row\(s\) are -inf everywhere .* first at index \(1, 2, 0\)"):
        agf.softmax(ag.Tensor(scores, requires_grad=True))
    with pytest.raises(MaskedRowError, match="cross-entropy"):
        cross_entropy(ag.Tensor(scores, requires_grad=True), np.zeros((2, 3), dtype=int))


def test_a_partly_masked_row_is_an_ordinary_softmax():
    p = agf.softmax(ag.Tensor(np.array([0.0, -np.inf, 0.0])))
    np.testing.assert_array_equal(p.data, [0.5, 0.0, 0.5])


def test_a_minus_infinity_logit_of_another_class_leaves_the_loss_finite_as_by_hand():
    """A class the model rules out entirely (logit -inf) is no target here: its log-probability is -inf, and
    picking the target's log-probability by multiplying with a one-hot array would make 0 * -inf = NaN. The
    tape's loss and gradient equal the hand-written cross-entropy's, which picks by index."""
    from transformer.autograd import Tensor
    from transformer.autograd_model import cross_entropy as tape_cross_entropy
    from transformer.softmax import cross_entropy_backward, cross_entropy_forward

    logits = np.array([[[0.5, -np.inf, 1.0], [2.0, 0.0, -1.0]]])
    targets = np.array([[0, 2]])
    loss, cache = cross_entropy_forward(logits, targets)
    leaf = Tensor(logits.copy(), requires_grad=True)
    tape = tape_cross_entropy(leaf, targets)
    tape.backward()
    assert np.isfinite(loss) and float(tape.data) == pytest.approx(loss, rel=1e-15)
    np.testing.assert_allclose(leaf.grad, cross_entropy_backward(1.0, cache), rtol=1e-14, atol=1e-16)
