"""The autograd page's own checks: each passes on the engine and fails on a planted mistake, and the numbers
its tables show are recomputed here another way."""

import numpy as np
import pytest

from site_scripts.pages import _autograd_anatomy as anatomy
from transformer import autograd as ag
from transformer.config import PRESETS
from transformer.gradcheck import check_passes


def test_every_primitive_passes_its_gradient_check():
    rows = anatomy.primitive_rows()
    assert len(rows) >= len(anatomy.PRIMITIVES) and all(check_passes(r.gap, r.rel) for r in rows)
    assert {label.split(",")[0].split(":")[0] for label, *_ in anatomy.PRIMITIVES} >= {
        "add", "sub", "mul", "div", "power −½", "exp", "log", "relu", "erf", "gelu", "softmax", "matmul", "sum",
        "mean", "reshape", "swapaxes", "embedding", "layer_norm through the seam"}


def exp_with_the_identity_rule(a):
    return ag.Tensor(np.exp(a.data), parents=(a,), op="exp", rule=lambda g: (g,))


def relu_with_the_mask_reversed(a):
    out = np.maximum(a.data, 0)
    return ag.Tensor(out, parents=(a,), op="relu", rule=lambda g: (g * (a.data <= 0),))


@pytest.mark.parametrize("wrong", [exp_with_the_identity_rule, relu_with_the_mask_reversed])
def test_a_primitive_with_a_wrong_rule_fails_the_pages_check(wrong):
    rows = anatomy.primitive_rows([("planted", wrong, [(3, 4)], False)])
    assert len(rows) == 1 and not check_passes(rows[0].gap, rows[0].rel) and "FAIL" in rows[0].result


def test_the_tiny_tape_equals_the_hand_written_backward():
    c = anatomy.tiny_comparison()
    assert c.passed() and len(c.rows()) == len(c.grads_hand)
    assert c.tape.loss.grad == 1.0  # the seed, shown on the page
    np.testing.assert_allclose(c.dlogits_tape(), c.dlogits_hand, rtol=1e-12, atol=1e-15)


def test_a_broadcast_not_undone_makes_the_tiny_example_fail(monkeypatch):
    """Planted: unbroadcast sums only the leading axes (the mutant autograd-broadcast-not-undone)."""
    def leading_axes_only(grad, shape):
        extra = grad.ndim - len(shape)
        return grad.sum(axis=tuple(range(extra))) if extra else grad

    monkeypatch.setattr(ag, "unbroadcast", leading_axes_only)
    c = anatomy.tiny_comparison()
    assert not c.passed()
    tables, values = anatomy.tiny_part(c)
    assert "**FAIL**" in tables["tiny_grads"] and values["passed"] < values["total"]


def nodes_by_walking(root):
    """Every node that wants a gradient, found by a plain walk over parents (no topological order)."""
    found, todo = {}, [root]
    while todo:
        node = todo.pop()
        if id(node) not in found and node.requires_grad:
            found[id(node)] = node
            todo += list(node.parents)
    return found


def test_the_symbol_table_counts_the_graph_it_describes():
    cfg, t = anatomy.default_tape()
    walked = nodes_by_walking(t.loss)
    assert len(walked) == len(t.order) == len(t.leaves) + sum(not n.is_leaf for n in walked.values())
    text, values = anatomy.symbols_md()
    assert f"| `len(topological_order(loss))` | scalar | {len(walked)} |" in text
    assert values["constants"] == len(t.constants())
    operations = sum(not n.is_leaf for n in walked.values())
    table = text[text.index("| Operation | Nodes |"):].splitlines()[2:]
    counted = [int(line.split("|")[2]) for line in table if line.startswith("| `")]
    assert len(counted) == len({n.op for n in walked.values() if not n.is_leaf}) and sum(counted) == operations


def test_the_recorded_shapes_refuse_sizes_that_coincide():
    """Negative control: with B = 2 windows of T = 16, N = B T = 32 = d, and a shape could not name its axes."""
    with pytest.raises(RuntimeError, match="coincide"):
        anatomy.symbol_names(PRESETS["default"], (2, 16))
    names = anatomy.symbol_names(PRESETS["default"], anatomy.SYMBOL_BATCH)
    assert anatomy.symbolic((3, 4, 16, 8), names) == "(B, H, T, d_h)" and anatomy.symbolic((32,), names) == "(d,)"


def engine_report(monkeypatch=None):
    """A report's "autograd" entry for the tiny model with its gains and biases moved, as run_crosscheck makes it;
    with monkeypatch, one engine gradient is planted 1e-9 too large."""
    from transformer import crosscheck
    from transformer.model import init_params

    cfg = PRESETS["tiny"]
    rng = np.random.default_rng(0)
    params = {k: v + 0.1 * rng.standard_normal(v.shape) if v.ndim == 1 else v
              for k, v in init_params(cfg, dtype=np.float64).items()}
    if monkeypatch:
        real = crosscheck.autograd_loss_and_grads

        def one_gradient_wrong(*args, **kwargs):
            loss, grads = real(*args, **kwargs)
            grads["b1.ff1_w"] = grads["b1.ff1_w"] * (1 + 1e-9)
            return loss, grads

        monkeypatch.setattr(crosscheck, "autograd_loss_and_grads", one_gradient_wrong)
    entry = crosscheck.autograd_against_numpy(cfg, params, np.array([[2, 0, 2, 1]]), np.array([[0, 2, 1, 4]]))
    return {"autograd": entry, "rows": []}


def test_the_engine_against_numpy_table_lists_every_gradient_and_shows_a_wrong_one(monkeypatch):
    text, values = anatomy.engine_against_numpy(engine_report())
    rows = [line for line in text.splitlines() if line.strip().startswith("| `")]
    assert len(rows) == len(engine_report()["autograd"]["gaps"]) and values["verdict"] == "all pass"
    assert "FAIL" not in text
    assert sum("held to the absolute bound" in row for row in rows) == 2  # the key biases, b0.bk and b1.bk
    assert values["on_floor"] == ["b0.bk", "b1.bk"] and values["floor_count"] == 2
    planted, planted_values = anatomy.engine_against_numpy(engine_report(monkeypatch))
    assert planted_values["verdict"] == "**1 FAIL**"
    assert [row for row in planted.splitlines() if "**FAIL**" in row][0].strip().startswith("| `b1.ff1_w`")


def test_a_graph_of_self_capturing_rules_waits_for_the_collector_and_the_engines_own_does_not():
    """The page's measurement: with the cyclic collector off, a graph whose rules hold their own nodes stays
    alive after its last name is dropped, and gc.collect() frees it; the engine's own rules are freed at once."""
    from site_scripts.pages import autograd

    found = autograd.cycles()
    assert found["built"] > 0 and found["left"] == found["built"]
    assert found["after_collect"] == 0 and found["own_left"] == 0


def test_the_autograd_prose_shows_no_typed_number_and_names_its_sources():
    """Every engine the page names is one a reader can open: micrograd, PyTorch's and JAX's own pages."""
    from site_scripts import prose
    from site_scripts.common import ROOT

    text = (ROOT / "docs" / "verification" / "autograd.md").read_text()
    assert prose.typed_numbers(text) == []
    for source in ("https://github.com/karpathy/micrograd", "https://pytorch.org/docs/stable/notes/autograd.html",
                   "https://docs.jax.dev/en/latest/jaxpr.html"):
        assert source in text
    assert "reference engine" not in text and "micrograd-style" not in text
