"""The LayerNorm and Embeddings pages' own checks: each passes on the model's code and fails on a planted
mistake, and the backward replays they show are the model's own."""

import dataclasses

import numpy as np
import pytest

from site_scripts.examples import TINY_IDS, TINY_TARGETS, tiny
from site_scripts.pages import embeddings, layernorm
from site_scripts.tiny_backward import tiny_backward
from transformer.embedding import embedding_backward
from transformer.model import loss_and_grads


def without_mean_term(dy, cache):
    """LayerNorm's backward with term 2 (through the mean) left out."""
    xhat, rstd, g = cache.xhat, cache.rstd, cache.g
    dxhat = dy * g
    return rstd * (dxhat - xhat * (dxhat * xhat).mean(axis=-1, keepdims=True)), None, None


def without_variance_term(dy, cache):
    """LayerNorm's backward with term 3 (through the variance) left out."""
    rstd, g = cache.rstd, cache.g
    dxhat = dy * g
    return rstd * (dxhat - dxhat.mean(axis=-1, keepdims=True)), None, None


def test_the_replayed_gradient_at_ln1_is_the_models_own():
    ex = tiny()
    _, du, _ = layernorm.ln1_upstream(ex.params, ex.cfg, ex.ids, np.array([TINY_TARGETS]))
    np.testing.assert_array_equal(du, tiny_backward().steps["b0.dln1"])
    moved = layernorm.moved_params()
    _, grads = loss_and_grads(moved, ex.ids, np.array([TINY_TARGETS]), ex.cfg)
    np.testing.assert_allclose(layernorm.moved_case().dg, grads["b0.ln1_g"], rtol=1e-12, atol=1e-15)


def test_the_moved_case_has_gains_away_from_one_so_u_differs_from_xhat():
    c = layernorm.moved_case()
    assert np.abs(c.g - 1).min() > 0 and np.abs(c.u - c.xhat).max() > 1e-3


def test_the_jacobian_check_passes_on_the_code_and_fails_without_the_variance_term():
    c = layernorm.moved_case()
    right = layernorm.jacobian_check(c.x[0], c.g, c.b, c.eps)
    assert right.of_formula.passed and right.of_code.passed
    wrong = layernorm.jacobian_check(c.x[0], c.g, c.b, c.eps, backward=without_variance_term)
    assert not wrong.of_code.passed and wrong.of_formula.passed


@pytest.mark.parametrize("backward, failing", [(without_mean_term, "sums_pass"),
                                               (without_variance_term, "dots_pass")])
def test_the_row_identities_fail_when_a_term_is_missing(backward, failing):
    c = layernorm.initial_case()
    right = layernorm.row_identities(c)
    assert right.sums_pass and right.dots_pass
    planted = layernorm.case(c.x, c.g, c.b, c.eps, c.du, backward)
    assert not getattr(layernorm.row_identities(planted), failing)


def test_the_repeated_id_check_passes_for_add_at_and_fails_for_fancy_index_assignment():
    dx = tiny_backward().steps["dembedding"][0]
    assert embeddings.repeated_check(TINY_IDS, dx, embedding_backward).passed
    assert not embeddings.repeated_check(TINY_IDS, dx, embeddings.fancy_index_backward).passed


def test_the_order_claims_hold_and_a_contradicting_measurement_is_named():
    """The Embeddings page says what the order table shows (one layer without positions cannot tell the orders
    apart, two can, a repeated token stays the same); these are its claims, held to the numbers."""
    ex = tiny()
    facts = embeddings.order_facts(ex.params, ex.cfg)
    assert facts.problems() == []
    # Planted: results as if the position table had not been zeroed.
    planted = dataclasses.replace(facts, without=facts.with_pos)
    assert planted.problems() == ["one layer without positions cannot tell the two orders apart"]


def test_the_embeddings_pages_sentences_hold_for_its_numbers():
    """The prose says: a repeated id gets the same token row and different rows of X^(0); the rows of the ids and
    positions the window does not read are exactly 0 (and there are some); the planted fancy index is caught."""
    made = embeddings.generate({})
    values = made["values"]
    picture, backward = values["picture"], values["backward"]
    assert len(picture["where"]) >= 2 and picture["tok_gap"] == 0 and picture["x_gap"] > 0
    assert backward["unused_ids"] and backward["unused_ids_max"] == 0
    assert backward["unused_pos"] and backward["unused_pos_max"] == 0
    assert values["repeated"]["planted"] == "caught" and values["repeated"]["verdict"] == "pass"
    assert values["cost"]["refusal"] != "none"  # a window longer than T_max is refused
    f = values["forward"]["follow"]
    assert f["tok"] + f["pos"] == pytest.approx(f["x"], abs=1e-12)


def test_the_embeddings_prose_binds_to_its_values():
    """Every placeholder of docs/model/embeddings.md names a value the generator returns, and every value is shown."""
    from site_scripts import prose
    from site_scripts.common import ROOT

    made = embeddings.generate({})
    text = (ROOT / "docs" / "model" / "embeddings.md").read_text()
    assert prose.typed_numbers(text) == []
    prose.bind(text, prose.plain(made["values"]), "embeddings")
