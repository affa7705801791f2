"""The gradient check's own arithmetic: the relative gap on values worked out by hand, and gradcheck_model on a
backward made wrong by a known factor."""

import numpy as np
import pytest

import transformer.gradcheck as gradcheck
from transformer.config import PRESETS
from transformer.gradcheck import gradcheck_model, relative_gap

CFG = PRESETS["tiny"].with_(emb_dim=8, num_heads=2, ff_dim=16, context_len=4)


@pytest.mark.parametrize("analytic,numeric,gap", [
    ([1.0, 2.0], [1.0, 2.5], 0.5 / 2.5),  # the largest difference over the largest magnitude of either
    ([[3.0, -4.0]], [[3.0, 4.0]], 8.0 / 4.0),
    ([0.0, 0.0], [0.0, 0.0], 0.0),  # both zero: no gap, not 0 / 0
    ([1e-300, 0.0], [0.0, 0.0], 1.0),
])
def test_the_relative_gap_is_the_largest_difference_over_the_largest_magnitude(analytic, numeric, gap):
    assert relative_gap(np.array(analytic), np.array(numeric)) == pytest.approx(gap, rel=1e-15, abs=0)


def test_a_gradient_one_and_a_half_times_too_large_shows_a_gap_of_one_third(monkeypatch):
    """|1.5 g - g| / max(|1.5 g|, |g|) = 0.5 / 1.5 for the final LayerNorm gain's gradient, whatever g is;
    central differences are exact to about 1e-10 here, and every other parameter stays within tolerance."""
    real = gradcheck.loss_and_grads

    def wrong(params, ids, targets, cfg):
        loss, grads = real(params, ids, targets, cfg)
        return loss, {**grads, "lnf_g": 1.5 * grads["lnf_g"]}

    monkeypatch.setattr(gradcheck, "loss_and_grads", wrong)
    ids = np.random.default_rng(0).integers(0, CFG.vocab_size, (2, CFG.context_len))
    report = gradcheck_model(CFG, ids, np.roll(ids, -1, axis=1), perturb=0.1)
    abs_gap, rel_gap = report["lnf_g"]
    assert rel_gap == pytest.approx(1 / 3, abs=1e-8)
    assert abs_gap > 0
    assert all(gradcheck.check_passes(*gaps) for name, gaps in report.items() if name != "lnf_g")
    assert not gradcheck.check_passes(abs_gap, rel_gap)
