"""The tape-based engine: each primitive against central differences, the composed model against the
hand-written one, the custom-gradient seam, and the graph being freed.

Primitives pass when the relative gap to central differences (h = 1e-5, float64) is below
gradcheck.REL_TOL = 1e-6, as the hand-written layers do (tests/unit/test_layers.py). The model is held
to far more: the engine and the hand-written backward compute the same sums in a different order, so
in float64 they agree to rounding, and MODEL_TOL = 1e-12 leaves a margin of about 1e3 over the gaps
seen (1e-16 to 1e-15) while any wrong gradient term is off by far more than 1e-12.
"""

import math

import numpy as np
import pytest

from transformer import autograd as ag
from transformer import autograd_functions as agf
from transformer.autograd_model import cross_entropy, fused_layer_norm, layer_norm
from transformer.autograd_model import logits as ag_logits
from transformer.autograd_model import loss_and_grads as ag_loss_and_grads
from transformer.config import PRESETS
from transformer.custom_gradient import CustomGradientError, custom_op
from transformer.errors import ConfigError
from transformer.gradcheck import REL_TOL, numerical_grad, relative_gap
from transformer.model import forward, init_params, loss_and_grads

H_STEP = 1e-5
MODEL_TOL = 1e-12
# The key bias's gradient is exactly zero (softmax ignores a constant added to a row of scores); both
# engines return rounding noise for it, about eps * |gradients| ~ 1e-17 here. It is checked to be
# that small instead of relatively equal.
ZERO_GRAD_FLOOR = 1e-14


def check_op(op, *shapes, seed=0, positive=False):
    """Every input gradient of op (Tensors in, one Tensor out) must match central differences of
    f = sum(op(inputs) * dy) for a random upstream gradient dy."""
    rng = np.random.default_rng(seed)
    arrays = [rng.standard_normal(s) for s in shapes]
    if positive:
        arrays = [np.abs(a) + 0.5 for a in arrays]
    leaves = [ag.Tensor(a, requires_grad=True) for a in arrays]
    out = op(*leaves)
    dy = rng.standard_normal(out.shape)
    out.backward(dy)
    for position, (leaf, a) in enumerate(zip(leaves, arrays)):
        numeric = numerical_grad(lambda: float((op(*map(ag.Tensor, arrays)).data * dy).sum()), a, H_STEP)
        assert leaf.grad.shape == a.shape, f"input {position}: gradient shape {leaf.grad.shape} != {a.shape}"
        assert np.abs(numeric).max() > 1e-3, f"input {position}: vacuous check, numeric gradient ~0"
        gap = relative_gap(leaf.grad, numeric)
        assert gap < REL_TOL, f"input {position}: relative gap {gap:.2e}"


@pytest.mark.parametrize("op, shapes", [
    (ag.add, [(2, 3), (3,)]),  # broadcast along a new leading axis
    (ag.add, [(2, 1, 4), (3, 1)]),  # broadcast along size-1 axes of both operands
    (ag.sub, [(2, 3), (2, 1)]),
    (ag.mul, [(2, 3, 4), (4,)]),
    (ag.mul, [(2, 1), (1, 3)]),
    (ag.div, [(2, 3), (3,)]),
    (ag.neg, [(3, 2)]),
    (lambda a, b: ag.matmul(a, b), [(2, 3, 4), (2, 4, 5)]),  # batched
    (lambda a, b: ag.matmul(a, b), [(2, 3, 4), (4, 5)]),  # a weight shared by the batch
    (lambda a, b: ag.matmul(a, b), [(2, 2, 3, 4), (2, 2, 4, 3)]),  # (B, H, T, dh) heads
    (lambda a, b: ag.matmul(a, b), [(3, 4), (1, 4, 2)]),  # the matrix broadcast up to the batch
    (agf.exp, [(2, 3)]),
    (agf.relu, [(3, 4)]),
    (agf.erf, [(3, 4)]),
    (agf.gelu, [(3, 4)]),
    (lambda a: ag.tensor_sum(a), [(2, 3)]),
    (lambda a: ag.tensor_sum(a, axis=1), [(2, 3, 4)]),
    (lambda a: ag.tensor_sum(a, axis=(0, 2), keepdims=True), [(2, 3, 4)]),
    (lambda a: ag.mean(a, axis=-1, keepdims=True), [(2, 3, 4)]),
    (lambda a: ag.reshape(a, (3, 4)), [(2, 6)]),
    (lambda a: ag.swapaxes(a, 1, 2), [(2, 3, 4)]),
    (lambda a: ag.power(a * a + 0.5, -0.5), [(2, 3)]),  # on positive numbers
    (lambda a: agf.softmax(a), [(3, 5)]),
    (lambda a: layer_norm(a, ag.Tensor(np.array([1.5, 0.5, 2.0])), ag.Tensor(np.zeros(3)), 1e-5), [(4, 3)]),
    (lambda x, g, b: layer_norm(x, g, b, 1e-5), [(2, 4, 3), (3,), (3,)]),
])
def test_primitive_gradient_matches_central_differences(op, shapes):
    check_op(op, *shapes)


def test_log_gradient_matches_central_differences():
    check_op(agf.log, (3, 4), positive=True)


def test_embedding_scatter_adds_every_use_of_a_repeated_id():
    ids = np.array([[1, 3, 1], [1, 0, 3]])  # row 1 read three times
    check_op(lambda table: agf.embedding(table, ids), (4, 5))
    table = ag.Tensor(np.zeros((4, 2)), requires_grad=True)
    agf.embedding(table, ids).backward(np.ones((2, 3, 2)))
    assert table.grad[:, 0].tolist() == [1.0, 3.0, 0.0, 2.0]  # the counts of ids 0..3; id 2 unused


def test_softmax_gives_masked_scores_zero_weight_and_zero_gradient():
    rng = np.random.default_rng(1)
    scores = ag.Tensor(rng.standard_normal((3, 3)), requires_grad=True)
    mask = np.triu(np.full((3, 3), -np.inf), k=1)
    probs = agf.softmax(scores + mask)
    probs.backward(rng.standard_normal((3, 3)))
    above = np.triu(np.ones((3, 3), bool), k=1)
    assert np.all(probs.data[above] == 0) and np.all(scores.grad[above] == 0)
    assert np.all(np.isfinite(scores.grad))
    np.testing.assert_allclose(probs.data.sum(axis=-1), 1.0, rtol=1e-15)


def test_cross_entropy_matches_central_differences():
    targets = np.array([2, 0, 2, 4])
    check_op(lambda z: cross_entropy(z, targets), (4, 5))


def test_unbroadcast_sums_each_entry_over_its_uses():
    grad = np.arange(6.0).reshape(2, 3)  # the gradient of a (2, 3) result
    assert ag.unbroadcast(grad, (3,)).tolist() == [3.0, 5.0, 7.0]  # broadcast over the rows
    assert ag.unbroadcast(grad, (2, 1)).tolist() == [[3.0], [12.0]]  # stretched along the columns
    assert ag.unbroadcast(grad, ()).item() == 15.0  # a scalar used six times


def test_a_node_used_twice_accumulates_both_gradients():
    x = ag.Tensor(np.array([3.0]), requires_grad=True)
    (x * x + x).backward(np.array([1.0]))  # d/dx (x^2 + x) = 2x + 1
    assert x.grad.tolist() == [7.0]


def perturbed_params(cfg, seed=0):
    """init_params with the gains and biases moved off 1 and 0, so every gradient term is non-zero."""
    params = init_params(cfg, seed=seed, dtype=np.float64)
    rng = np.random.default_rng(seed + 1)
    for value in params.values():
        if value.ndim == 1:
            value += 0.1 * rng.standard_normal(value.shape)
    return params


def assert_same_gradients(grads, reference):
    assert grads.keys() == reference.keys()
    for name, ref in reference.items():
        assert grads[name].shape == ref.shape and grads[name].dtype == ref.dtype, name
        if name.endswith(".bk"):
            assert np.abs(ref).max() < ZERO_GRAD_FLOOR and np.abs(grads[name]).max() < ZERO_GRAD_FLOOR, name
            continue
        gap = relative_gap(grads[name], ref)
        assert gap < MODEL_TOL, f"{name}: relative gap {gap:.2e}"


@pytest.mark.parametrize("activation", ["relu", "gelu"])
@pytest.mark.parametrize("batched", [True, False])
def test_composed_model_equals_hand_written_model(activation, batched):
    cfg = PRESETS["default"].with_(activation=activation)
    params = perturbed_params(cfg)
    rng = np.random.default_rng(2)
    shape = (3, 16) if batched else (16,)
    ids, targets = rng.integers(0, cfg.vocab_size, shape), rng.integers(0, cfg.vocab_size, shape)
    logits, _ = forward(params, ids, cfg)
    ours = ag_logits(params, ids, cfg)
    assert ours.shape == logits.shape and relative_gap(ours, logits) < MODEL_TOL
    loss, grads = loss_and_grads(params, ids, targets, cfg)
    ag_loss, ag_grads = ag_loss_and_grads(params, ids, targets, cfg)
    assert abs(ag_loss - loss) <= MODEL_TOL * abs(loss)
    assert_same_gradients(ag_grads, grads)


@pytest.mark.parametrize("fused, attention", [
    (("layer_norm",), "materialized"),
    (("layer_norm", "attention"), "materialized"),
    (("attention",), "flash"),
])
def test_fused_operations_through_the_seam_equal_the_composition(fused, attention):
    cfg = PRESETS["default"].with_(activation="gelu", attention=attention, flash_tile=5)
    params = perturbed_params(cfg, seed=3)
    rng = np.random.default_rng(3)
    ids, targets = rng.integers(0, cfg.vocab_size, (2, 13)), rng.integers(0, cfg.vocab_size, (2, 13))
    loss, grads = ag_loss_and_grads(params, ids, targets, cfg)
    fused_loss, fused_grads = ag_loss_and_grads(params, ids, targets, cfg, fused=fused)
    assert abs(fused_loss - loss) <= MODEL_TOL * abs(loss)
    assert_same_gradients(fused_grads, grads)


def test_fused_layer_norm_node_equals_composed_layer_norm():
    rng = np.random.default_rng(4)
    arrays = [rng.standard_normal((2, 3, 6)), 1 + 0.3 * rng.standard_normal(6), rng.standard_normal(6)]
    dy = rng.standard_normal((2, 3, 6))
    results = []
    for norm in (layer_norm, fused_layer_norm):
        leaves = [ag.Tensor(a, requires_grad=True) for a in arrays]
        out = norm(*leaves, 1e-5)
        out.backward(dy)
        results.append([out.data] + [leaf.grad for leaf in leaves])
    assert ag.topological_order(fused_layer_norm(*map(ag.Tensor, arrays), 1e-5)) != []
    for composed, fused in zip(*results):
        assert relative_gap(fused, composed) < MODEL_TOL


def wrong_vjp_op(x, w, vjp):
    """A linear map x @ w as a custom op, with the given VJP."""
    return custom_op("linear", lambda x, w: (x @ w, (x, w)), vjp, x, w)


def test_seam_refuses_a_vjp_of_the_wrong_shape():
    x, w = ag.Tensor(np.ones((2, 3)), requires_grad=True), ag.Tensor(np.ones((3, 4)), requires_grad=True)
    transposed = wrong_vjp_op(x, w, lambda g, s: (g @ s[1].T, g.T @ s[0]))  # dW as (4, 3)
    with pytest.raises(CustomGradientError, match=r"'linear'.*input 1 has shape \(4, 3\).*\(3, 4\)"):
        transposed.sum().backward()


def test_seam_refuses_a_missing_gradient_and_a_wrong_dtype():
    x, w = ag.Tensor(np.ones((2, 3)), requires_grad=True), ag.Tensor(np.ones((3, 4)), requires_grad=True)
    with pytest.raises(CustomGradientError, match="returned 1 gradients for 2 inputs"):
        wrong_vjp_op(x, w, lambda g, s: (g @ s[1].T,)).sum().backward()
    with pytest.raises(CustomGradientError, match="input 0 has dtype float32"):
        wrong_vjp_op(x, w, lambda g, s: ((g @ s[1].T).astype(np.float32), s[0].T @ g)).sum().backward()


def test_seam_accepts_a_correct_vjp():
    check_op(lambda x, w: wrong_vjp_op(x, w, lambda g, s: (g @ s[1].T, s[0].T @ g)), (2, 3), (3, 4))


def test_unknown_fused_name_and_frozen_weights_are_refused():
    cfg = PRESETS["tiny"]
    params = init_params(cfg)
    with pytest.raises(ConfigError, match="cannot fuse layernorm"):
        ag_loss_and_grads(params, [0, 1], [1, 2], cfg, fused=("layernorm",))
    params["head_w"] = params["head_w"].tolist()
    with pytest.raises(ConfigError, match="'head_w' is a list"):
        ag_loss_and_grads(params, [0, 1], [1, 2], cfg)


def test_backward_frees_the_graph():
    x = ag.Tensor(np.arange(3.0), requires_grad=True)
    y = agf.exp(x * 2.0).sum()
    y.backward()
    assert y.parents == () and y.rule is None
    np.testing.assert_allclose(x.grad, 2 * np.exp(2 * np.arange(3.0)), rtol=1e-15)
    kept = agf.exp(x * 2.0).sum()
    kept.backward(free_graph=False)
    assert len(ag.topological_order(kept)) == 4  # x, x * 2, exp, sum: still there to draw


def test_a_second_backward_through_a_freed_graph_is_refused_and_changes_nothing():
    """PyTorch refuses it too; silently passing no gradient would leave the leaves' grads as they were."""
    x = ag.Tensor(np.arange(3.0), requires_grad=True)
    y = (x * x).sum()
    y.backward()
    first = x.grad.copy()
    with pytest.raises(ag.BackwardError, match=r"freed by an earlier backward.*free_graph=False"):
        y.backward()
    np.testing.assert_array_equal(x.grad, first)
    h = x * 2.0
    h.sum().backward()  # frees h as well
    with pytest.raises(ag.BackwardError, match=r"1 node\(s\) of this graph, the first a 'mul' of shape \(3,\)"):
        (h * 3.0).sum().backward()  # a new graph built on the freed node


def test_backward_from_a_tensor_that_requires_no_gradient_is_refused():
    with pytest.raises(ag.BackwardError, match="requires no gradient"):
        ag.Tensor(np.ones(2)).sum().backward()


def test_a_kept_graph_passed_twice_adds_up_in_the_leaves_and_not_in_between():
    """The seed starts each pass: a leaf accumulates over passes (as in PyTorch), an intermediate node's
    gradient is the pass's own, and the root's is the seed, not the sum of two seeds."""
    x = ag.Tensor(np.array([1.0, 2.0, 3.0]), requires_grad=True)
    h = x * x
    y = (h * 2.0).sum()
    y.backward(free_graph=False, keep_grads=True)
    once_x, once_h = x.grad.copy(), h.grad.copy()
    np.testing.assert_array_equal(once_x, 4 * x.data)
    y.backward(keep_grads=True)
    np.testing.assert_array_equal(x.grad, 2 * once_x)
    np.testing.assert_array_equal(h.grad, once_h)
    assert y.grad == 1.0
    leaf = ag.Tensor(np.ones(2), requires_grad=True)  # a leaf root adds the seed to what it holds
    leaf.backward(np.array([1.0, 2.0]))
    leaf.backward(np.array([1.0, 2.0]))
    np.testing.assert_array_equal(leaf.grad, [2.0, 4.0])


def test_intermediate_gradients_are_dropped_unless_kept():
    x = ag.Tensor(np.array([1.0, -2.0]), requires_grad=True)
    h = x * 3.0
    y = (h * h).sum()
    y.backward(free_graph=False)
    assert h.grad is None and y.grad is None and x.grad is not None
    y.backward(keep_grads=True)
    np.testing.assert_array_equal(h.grad, 2 * h.data)


@pytest.mark.parametrize("op, shapes", [
    (ag.add, [(2, 3), (2, 3)]), (ag.sub, [(2, 3), (3,)]), (ag.mul, [(2, 3), (2, 3)]), (ag.div, [(2, 3), (2, 3)]),
    (ag.matmul, [(2, 3), (3, 3)]), (ag.matmul, [(2, 2, 3), (2, 3, 3)]),
])
def test_a_rule_computes_nothing_for_a_constant_operand(op, shapes):
    """The causal mask, the one-hot targets, a number: their gradient would be computed only to be thrown away."""
    rng = np.random.default_rng(5)
    a, b = (rng.standard_normal(s) + 3.0 for s in shapes)
    for out, constant in ((op(ag.Tensor(a, requires_grad=True), b), 1), (op(a, ag.Tensor(b, requires_grad=True)), 0)):
        grads = out.rule(np.ones(out.shape))
        assert grads[constant] is None and grads[1 - constant].shape == shapes[1 - constant]


def test_erf_is_scipys_where_scipy_is_installed():
    special = pytest.importorskip("scipy.special")
    from transformer.activations import _erf_function

    assert _erf_function() is special.erf
    x = np.linspace(-3, 3, 13)
    np.testing.assert_allclose(agf.erf(ag.Tensor(x)).data, [math.erf(v) for v in x], rtol=1e-15, atol=1e-16)


def test_reversed_order_would_miss_gradient():
    """The order matters: a node's rule may only run once all its users have added their gradient."""
    x = ag.Tensor(np.array([2.0]), requires_grad=True)
    h = x * 3.0
    y = h * h + h  # h has two users
    order = ag.topological_order(y)
    assert order.index(x) < order.index(h) < order.index(y)
    y.backward(np.array([1.0]))
    assert x.grad.tolist() == [3.0 * (2 * 6.0 + 1)]


def test_float32_stays_float32():
    cfg = PRESETS["tiny"]
    params = init_params(cfg, dtype=np.float32)
    loss, grads = ag_loss_and_grads(params, [[0, 1, 2]], [[1, 2, 3]], cfg, fused=())
    assert all(g.dtype == np.float32 for g in grads.values()) and math.isfinite(loss)


def test_crosscheck_entry_compares_the_engine_with_the_hand_written_gradients(monkeypatch):
    from transformer import crosscheck

    cfg = PRESETS["tiny"]
    params = perturbed_params(cfg)
    ids, targets = np.array([[2, 0, 2, 1]]), np.array([[0, 2, 1, 4]])
    entry = crosscheck.autograd_against_numpy(cfg, params, ids, targets)
    assert entry["passed"] and entry["max_rel"] < MODEL_TOL
    assert set(entry["on_floor"]) == {"b0.bk", "b1.bk"}

    def one_gradient_wrong(*args, **kwargs):  # negative control: a gradient 1e-9 too large
        loss, grads = ag_loss_and_grads(*args, **kwargs)
        grads["b1.ff1_w"] = grads["b1.ff1_w"] * (1 + 1e-9)
        return loss, grads

    monkeypatch.setattr(crosscheck, "autograd_loss_and_grads", one_gradient_wrong)
    entry = crosscheck.autograd_against_numpy(cfg, params, ids, targets)
    assert not entry["passed"] and entry["worst"] == "b1.ff1_w"
