"""The Full Model page's generated claims: its traces add up and agree with the AdamW page, its checks fail on
planted mistakes, every exact zero of the gradient is explained, and the cache table and the gradient-flow
diagram are read from the code."""

import ast
import re

import numpy as np
import pytest

from site_scripts import depends
from site_scripts.examples import tiny
from site_scripts.pages import _model_backward as model_backward
from site_scripts.pages import model, optim
from site_scripts.tiny_backward import tiny_backward

NUMBER = r"-?\d+\.\d+"


def first_entry(fragment, name):
    """Entry (0, 0) of the first table whose header names `name` and a gradient, as printed; None without one."""
    header = r"^\| `?(?:grad|g of)[^|\n]*" + re.escape(name) + r"[^|\n]*\|.*?(?=\n\n|\Z)"
    for table in re.findall(header, fragment, re.M | re.S):
        row = next(line for line in table.splitlines() if line.startswith("| 0 |"))
        return float(row.split("|")[2])
    return None


def written_sum(fragment):
    """(the sum of the products written out in the fragment's aligned $$ block, the result it prints, the sum the
    sentence says the printed factors give)."""
    terms = re.search(r"^&= (.+?) \\\\$", fragment, re.M).group(1)
    factors = re.findall(rf"\(({NUMBER})\)\(({NUMBER})\)|\(({NUMBER})\)", terms)
    total = sum(float(a) * float(b) if a else float(c) for a, b, c in factors)
    result = float(re.search(rf"^&= ({NUMBER})$", fragment, re.M).group(1))
    said = float(re.search(rf"the products give ({NUMBER})", fragment).group(1))
    return total, result, said


def test_the_backward_trace_is_the_gradient_the_optim_page_steps_with():
    value = tiny_backward().grads["head_w"][0, 0]
    ours = model_backward.follow_backward_md()
    theirs = first_entry(optim.generate({})["example"], "head_w")
    assert theirs is not None, "the AdamW page no longer shows a table of head_w's gradient: update the link"
    assert theirs == pytest.approx(value, abs=5e-5) and f"starts with {theirs:.4f}" in ours
    assert written_sum(ours)[1] == pytest.approx(value, abs=5e-5)
    planted = "| `grad head_w` | 0 | 1 |\n|---|---|---|\n| 0 | 0.1234 | 0.5 |\n"
    assert first_entry(planted, "head_w") != pytest.approx(value, abs=5e-5)  # negative control of the parser
    assert first_entry(planted, "lnf_g") is None


@pytest.mark.parametrize("fragment", [model.follow_forward_md, model_backward.follow_backward_md])
def test_a_traced_number_is_the_sum_its_page_writes_out(fragment):
    text = fragment()
    total, result, said = written_sum(text)
    assert total == pytest.approx(said, abs=5e-6)
    assert result == pytest.approx(total, abs=5e-3)  # the printed factors are rounded to 4 decimals
    wrong = text.replace(re.search(rf"\(({NUMBER})\)", text).group(0), "(9.9999)", 1)
    assert written_sum(wrong)[0] != pytest.approx(said, abs=5e-6)  # negative control: one factor planted wrong


def test_the_chain_check_fails_a_wrong_upstream_gradient():
    assert "FAIL" not in model_backward.chain_check_md()
    steps = dict(tiny_backward().steps)
    steps["dlnf"] = steps["dlnf"] * 1.001
    rows = [line for line in model_backward.chain_check_md(steps).splitlines() if "FAIL" in line]
    assert len(rows) == 1 and "`dlnf`" in rows[0]


def test_an_exact_zero_the_page_cannot_explain_stops_the_build(monkeypatch):
    assert "Rows 1, 3 and 4 of `tok_emb`" in model_backward.dictionary_md()
    real = tiny_backward()
    grads = {k: v.copy() for k, v in real.grads.items()}
    grads["tok_emb"][2] = 0.0  # a row the ids read, planted zero
    monkeypatch.setattr(model_backward, "tiny_backward", lambda: type(real)(real.loss, real.steps, grads))
    with pytest.raises(RuntimeError, match="not the unread ones"):
        model_backward.dictionary_md()


def test_the_key_bias_reading_follows_its_arrays():
    noise = np.array([1e-16, -2e-17])
    text = model_backward.floor_text({"b0.bk": (noise, np.zeros(2))})
    assert "exactly 0 in every entry" in text and "itself: 1.0" in text and "pass (on the absolute floor)" in text
    assert "both sides are rounding noise" in model_backward.floor_text({"b0.bk": (noise, np.array([3e-12, 0.0]))})
    assert "**FAIL**" in model_backward.floor_text({"b0.bk": (noise, np.array([1e-3, 0.0]))})


def test_the_gradient_flow_diagram_fills_every_key_once_in_the_backwards_order():
    calls = model_backward.filled_keys()
    keys = [k for call in calls for k in call[4]]
    assert sorted(keys) == sorted(tiny().params) and len(set(keys)) == len(keys)
    names = [call[1] for call in calls]
    assert names[0] == "linear_backward" and names[-1] == "embedding_backward"
    blocks = [call[4][0].split(".")[0] for call in calls if call[1] == "block_backward"]
    assert blocks == [f"b{l}" for l in reversed(range(tiny().cfg.num_layers))]


def test_the_cache_table_has_the_fields_forward_builds_and_backward_unpacks():
    _, fields = model.cache_fields()
    fn = depends.module_source("model").defs["backward"]
    unpack = next(n for n in ast.walk(fn) if isinstance(n, ast.Assign) and ast.unparse(n.value) == "cache")
    assert [name for name, _ in fields] == [t.id for t in unpack.targets[0].elts]
    assert all(model.read_at(fn, name) for name, _ in fields)  # each field is read by the backward


def test_the_model_pages_cache_key_covers_its_helper_module():
    from site_scripts import build

    sources = [p.name for p in build.page_sources("model")]
    assert "_model_backward.py" in sources and ("gradcheck", "gradcheck_model") in build.page_units("model")
    assert "attention.py" in [p.name for p in build.page_sources("block")]  # block's generator imports it


def test_a_number_that_rounds_to_zero_prints_no_sign():
    terms, _ = model_backward.products([(-0.00001, 2.0), (0.5, -0.00002)])
    assert terms == "(0.0000)(2.0000) + (0.5000)(0.0000)"
    assert model_backward.small(-0.0) == "0.0000" and model_backward.entry_text(-0.0) == "0.0000000000"


def test_the_diagram_writes_the_stream_symbols_as_mermaid_can_show_them():
    symbols = [model_backward.plain_symbol(s) for _, s, _ in model_backward.stream_labels(2)]
    assert symbols == ["∂ℓ/∂Z", "∂ℓ/∂X_f", "∂ℓ/∂X⁽²⁾", "∂ℓ/∂X⁽¹⁾", "∂ℓ/∂X⁽⁰⁾"]
