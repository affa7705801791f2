"""The Linear and Softmax pages' derivation checks and backward examples: they pass on the real code, and each
fails on a planted mistake (a check that cannot fail would be a defect)."""

import dataclasses
import math

import numpy as np
import pytest

from site_scripts.examples import TINY_TARGETS, tiny
from site_scripts.tiny_backward import tiny_backward
from site_scripts.pages import linear, softmax


def tiny_logits():
    return tiny().trace["logits"][0], np.array(TINY_TARGETS)


def test_the_softmax_jacobian_checks_pass_on_the_tiny_row():
    z, targets = tiny_logits()
    formula, numeric, rows = softmax.jacobian_checks(z[0], targets[0], targets.size)
    assert formula.shape == numeric.shape == (z.shape[1],) * 2
    assert all(verdict.startswith("pass") for _, _, verdict in rows), rows


def test_a_jacobian_without_its_outer_product_fails_the_central_differences():
    """Negative control: diag(p) alone (the −p pᵀ term forgotten)."""
    z, targets = tiny_logits()
    _, _, rows = softmax.jacobian_checks(z[0], targets[0], targets.size, jacobian=np.diag)
    assert rows[0][2] == "**FAIL**" and rows[1][2] == "**FAIL**"


def test_the_fused_gradient_equals_the_slow_route_and_a_forgotten_mean_fails():
    z, targets = tiny_logits()
    assert all(verdict == "pass" for _, _, verdict in softmax.fused_rows(z, targets))

    def no_mean(z, t):
        loss, grad = softmax.fused_route(z, t)
        return loss, grad * t.size
    rows = softmax.fused_rows(z, targets, fused=no_mean)
    assert rows[0][2] == "pass" and rows[1][2] == "**FAIL**"


def test_the_slow_route_breaks_down_where_the_fused_one_does_not():
    z, targets = tiny_logits()
    (_, fused_loss, fused_ok, _), (_, slow_loss, slow_ok, _) = softmax.confident_rows(softmax.SCALE * z, targets)
    assert np.isfinite(float(fused_loss)) and fused_ok == "yes"
    assert slow_loss == "inf" and slow_ok.startswith("no")


def test_the_softmax_example_recomputes_the_replays_dlogits_and_the_heads_gradient():
    text = softmax.example_md()
    assert "**FAIL**" not in text and text.count("| pass |") == 3
    assert f"**{tiny_backward().grads['head_w'][0, 0]:.4f}**" in text


def test_the_linear_backward_example_matches_the_replay_and_a_mean_for_the_bias_sum_fails():
    layer = linear.ffn_layer()
    text = linear.backward_md(layer)
    assert "**FAIL**" not in text and text.count("| pass |") == 5
    col = next(i for i in range(layer.dg.shape[1]) if np.all(layer.dg[:, i] != 0))
    assert f"**{linear.num(layer.replay['dw'][0, col], bracket=False)}**" in text
    wrong = dataclasses.replace(layer, db=layer.dg.mean(axis=0))
    assert linear.backward_md(wrong).count("**FAIL**") == 1


def test_relu_central_differences_agree_away_from_0_and_straddle_the_corner_near_it():
    rows = linear.relu_rows()
    verdicts = {float(x): verdict for x, _, _, verdict in rows}
    assert verdicts[-1.0] == verdicts[1.0] == "agree"
    assert verdicts[0.0].startswith("differ") and "0.5000" in [n for x, _, n, _ in rows if float(x) == 0.0]


def test_the_gelu_check_fails_when_the_backward_drops_the_density_term(monkeypatch):
    _, (_, formula), (_, numeric) = linear.gelu_table()
    assert formula == numeric == "pass"

    def cdf_only(dy, cache):  # the product rule's second term forgotten
        return dy * cache.phi_cdf
    monkeypatch.setattr(linear, "gelu_backward", cdf_only)
    _, (_, formula), (_, numeric) = linear.gelu_table()
    assert formula == numeric == "**FAIL**"


def test_gelu_derivative_changes_sign_where_phi_equals_minus_g_times_the_density():
    root, low, low_slope, _ = linear.gelu_root()
    cdf, density = 0.5 * (1 + math.erf(root / math.sqrt(2))), math.exp(-root * root / 2) / math.sqrt(2 * math.pi)
    assert abs(cdf + root * density) < 1e-12  # Φ + G φ, by the formula, is 0 at the root the page reports
    assert low == pytest.approx(-np.sqrt(2), abs=1e-4) and low_slope < 0

