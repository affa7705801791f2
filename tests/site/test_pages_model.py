"""The Full Model page's generated claims: its traces add up and agree with the AdamW page, its checks fail on
planted mistakes, every exact zero of the gradient is explained, the cache tables and the gradient-flow diagram
are read from the code, and the sentences the prose writes around its values hold for them."""

import re

import numpy as np
import pytest

from site_scripts import depends
from site_scripts.common import ROOT
from site_scripts.examples import tiny
from site_scripts.pages import _model_backward as model_backward
from site_scripts.pages import _model_cache as model_cache
from site_scripts.pages import _model_flow as model_flow
from site_scripts.pages import model, optim
from site_scripts.tiny_backward import tiny_backward
from transformer.model import ModelCache

NUMBER = r"-?\d+\.\d+"


def first_entry(fragment, name):
    """Entry (0, 0) of the first table whose header names `name` and a gradient, as printed; None without one."""
    header = r"^\| `?(?:grad|g of)[^|\n]*" + re.escape(name) + r"[^|\n]*\|.*?(?=\n\n|\Z)"
    for table in re.findall(header, fragment, re.M | re.S):
        row = next(line for line in table.splitlines() if line.startswith("| 0 |"))
        return float(row.split("|")[2])
    return None


def written_sum(math):
    """(the sum of the products written out in an aligned $$ block, the result it prints)."""
    terms = re.search(r"^&= (.+?) \\\\$", math, re.M).group(1)
    factors = re.findall(rf"\(({NUMBER})\)\(({NUMBER})\)|\(({NUMBER})\)", terms)
    total = sum(float(a) * float(b) if a else float(c) for a, b, c in factors)
    return total, float(re.search(rf"^&= ({NUMBER})$", math, re.M).group(1))


def optim_text():
    made = optim.generate({})
    return "\n".join(v for v in made.values() if isinstance(v, str))


def test_the_backward_trace_is_the_gradient_the_optim_page_steps_with():
    value = tiny_backward().grads["head_w"][0, 0]
    math, follow = model_backward.follow_backward()
    theirs = first_entry(optim_text(), "head_w")
    assert theirs is not None, "the AdamW page no longer shows a table of head_w's gradient: update the link"
    assert theirs == pytest.approx(value, abs=5e-5) and follow["value"] == value  # "starts with" the same, 4 places
    assert written_sum(math)[1] == pytest.approx(value, abs=5e-5)
    planted = "| `grad head_w` | 0 | 1 |\n|---|---|---|\n| 0 | 0.1234 | 0.5 |\n"
    assert first_entry(planted, "head_w") != pytest.approx(value, abs=5e-5)  # negative control of the parser
    assert first_entry(planted, "lnf_g") is None


@pytest.mark.parametrize("fragment", [model.follow_forward, model_backward.follow_backward])
def test_a_traced_number_is_the_sum_its_page_writes_out(fragment):
    math, values = fragment()
    total, result = written_sum(math)
    assert total == pytest.approx(values["printed"], abs=5e-6)  # "summed from the factors as printed"
    assert result == pytest.approx(total, abs=5e-3)  # the printed factors are rounded to 4 decimals
    assert values["unrounded"] == pytest.approx(values.get("logit", values.get("value")), abs=1e-12)
    wrong = math.replace(re.search(rf"\(({NUMBER})\)", math).group(0), "(9.9999)", 1)
    assert written_sum(wrong)[0] != pytest.approx(values["printed"], abs=5e-6)  # negative control: a planted factor


def test_the_chain_check_fails_a_wrong_upstream_gradient():
    assert all(row.result == "pass" for row in model_backward.chain_rows())
    steps = dict(tiny_backward().steps)
    steps["dlnf"] = steps["dlnf"] * 1.001
    failed = [row.label for row in model_backward.chain_rows(steps) if row.result == "**FAIL**"]
    assert len(failed) == 1 and "`dlnf`" in failed[0]


def test_every_exact_zero_has_the_reason_the_page_gives_and_a_planted_one_has_none():
    ex, real = tiny(), tiny_backward()
    assert model_backward.unexplained_zeros(ex, real.grads) == []
    assert model_backward.backward_values()["unused"] == [1, 3, 4]
    assert any(model_backward.silent_units(ex).values())  # the page's sentence on the silent hidden units
    grads = {k: v.copy() for k, v in real.grads.items()}
    grads["tok_emb"][2] = 0.0  # a row the ids read, planted zero
    assert model_backward.unexplained_zeros(ex, grads) == ["tok_emb"]


def test_the_key_bias_reading_follows_its_arrays():
    """The page says: the key biases' central differences are exactly 0, the relative gap is 1, and they pass on
    the absolute floor. Other arrays would read otherwise."""
    _, floor = model_backward.side_by_side()
    assert floor["numeric_zero"] and floor["rels"] == [1.0, 1.0] and floor["verdicts"] == ["pass (on the absolute floor)"]
    noise = np.array([1e-16, -2e-17])
    assert not model_backward.floor_values({"b0.bk": (noise, np.array([3e-12, 0.0]))})["numeric_zero"]
    assert model_backward.floor_values({"b0.bk": (noise, np.array([1e-3, 0.0]))})["verdicts"] == ["**FAIL**"]


def test_the_gradient_flow_diagram_fills_every_key_once_in_the_backwards_order():
    calls = model_flow.filled_keys()
    keys = [k for call in calls for k in call[4]]
    assert sorted(keys) == sorted(tiny().params) and len(set(keys)) == len(keys)
    names = [call[1] for call in calls]
    assert names[0] == "linear_backward" and names[-1] == "embedding_backward"
    blocks = [call[4][0].split(".")[0] for call in calls if call[1] == "block_backward"]
    assert blocks == [f"b{l}" for l in reversed(range(tiny().cfg.num_layers))]


def test_the_cache_table_has_the_fields_forward_builds_and_backward_reads():
    described = model_cache.field_descriptions()
    assert list(described) == list(ModelCache._fields)
    fn = depends.module_source("model").defs["backward"]
    assert all(model_cache.read_at(fn, name) for name in ModelCache._fields)  # each field is read by the backward
    forward = depends.module_source("model").defs["forward"]
    assert all(model_cache.made_at(forward, name) for name in ModelCache._fields)
    line = model_cache.built_line(forward)  # the line the page links to makes the ModelCache
    assert f"{ModelCache.__name__}(" in (ROOT / "transformer" / "model.py").read_text().splitlines()[line - 1]


def test_the_cache_changes_show_only_what_another_policy_does_differently():
    """One whole table, for the first policy; for the others only the rows that differ, and every row of the
    first policy's table that a policy does not keep is counted in the row that lists them."""
    tables, values = model_cache.inventory("https://example.invalid/repo")
    base, _ = model_cache.rows_of(model_cache.BASE, "https://example.invalid/repo")
    changes = tables["cache_changes"]
    assert tables["cache_inventory"].count("\n| `") == len(base)
    for policy in model_cache.RUNS[1:]:
        mine, _ = model_cache.rows_of(policy, "https://example.invalid/repo")
        same = [path for path, cells in mine.items() if base.get(path) == cells]
        assert same and all(f"| `{policy}` | holds | {base[p][0]} |" not in changes for p in same)
        gone = [p for p in base if p not in mine]
        assert not gone or all(f"`{p}`" in changes for p in gone)
    assert values["base"] == "materialized"


def test_the_model_pages_cache_key_covers_its_helper_modules():
    from site_scripts import build

    sources = [p.name for p in build.page_sources("model")]
    assert {"_model_backward.py", "_model_cache.py", "_model_flow.py"} <= set(sources)
    assert ("gradcheck", "gradcheck_model") in build.page_units("model")
    assert "attention.py" in [p.name for p in build.page_sources("block")]  # block's generator imports it


def test_the_model_pages_sentences_hold_for_its_numbers():
    """The page's words around its values: the untrained loss is above log n_V; head 0's attention weights sum to
    1 in each row and are 0 above the diagonal; the only other callers of softmax_forward are attention's; the
    batch's gradients are the windows' mean; every count in the parameter table is equal."""
    values = model_backward.backward_values()
    assert values["loss"] > values["log_v"] and values["geo"] < values["uniform"]
    alpha = tiny().trace["b0.attention"][0, 0]
    assert np.allclose(alpha.sum(axis=-1), 1) and not np.triu(alpha, 1).any()
    assert model.other_softmax_callers() == {"attention_forward", "decode_block", "extend_block"}
    assert model.batch_average()["verdict"] == "pass"
    tables, _ = model.params()
    assert "DIFFER" not in tables["param_count"]


def test_a_number_that_rounds_to_zero_prints_no_sign():
    terms, _ = model_backward.products([(-0.00001, 2.0), (0.5, -0.00002)])
    assert terms == "(0.0000)(2.0000) + (0.5000)(0.0000)"
    assert model_backward.small(-0.0) == "0.0000" and model_backward.entry_text(-0.0) == "0.0000000000"


def test_the_diagram_writes_the_stream_symbols_as_mermaid_can_show_them():
    symbols = [model_flow.plain_symbol(s) for _, s, _ in model_backward.stream_labels(2)]
    assert symbols == ["∂ℓ/∂Z", "∂ℓ/∂X_f", "∂ℓ/∂X⁽²⁾", "∂ℓ/∂X⁽¹⁾", "∂ℓ/∂X⁽⁰⁾"]
