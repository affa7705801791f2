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
    made = softmax.generate({})
    assert "**FAIL**" not in made["replay"] and made["replay"].count("| pass |") == 3
    assert made["values"]["backward"]["dw"] == pytest.approx(tiny_backward().grads["head_w"][0, 0], abs=1e-15)


def test_the_linear_backward_example_matches_the_replay_and_a_mean_for_the_bias_sum_fails():
    layer = linear.ffn_layer()
    verdicts = [row[-1] for row in linear.replay_rows(layer)]
    assert verdicts == ["pass"] * 5
    col = linear.backward_values(layer)[1]["col"]
    assert linear.backward_values(layer)[1]["dw"] == linear.num(layer.replay["dw"][0, col], bracket=False)
    wrong = dataclasses.replace(layer, db=layer.dg.mean(axis=0))
    assert [row[-1] for row in linear.replay_rows(wrong)].count("**FAIL**") == 1


def test_the_linear_pages_sentences_hold_for_its_numbers():
    """The prose says: the bias is zero at initialisation, the tiny model uses ReLU, the listed columns get no
    gradient because G <= 0 there at every position, and every largest |W| lies below its limit."""
    layer = linear.ffn_layer()
    _, forward = linear.forward_values(layer)
    _, backward = linear.backward_values(layer)
    assert forward["bias_max"] == 0 and forward["activation"] == "ReLU"
    assert backward["closed"] and all((layer.g[:, i] <= 0).all() for i in backward["closed"])
    assert not layer.replay["dw"][:, backward["closed"]].any() and not layer.replay["db"][backward["closed"]].any()
    _, init = linear.xavier()
    assert init["worst_max"] < 1
    spread = linear.variance_factors()
    assert spread["forward"] < 1 < spread["backward"]  # "the forward shrinks the spread ... the backward grows it"


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

