"""The code facts the pages print are read correctly from the code."""

import subprocess
import sys

from site_scripts import code_facts
from site_scripts.code_facts import ROOT, called_by, enclosing_function, named_function


def test_named_function_spans_the_whole_definition():
    name, start, end = named_function("transformer/layernorm.py", "layer_norm_backward")
    lines = (ROOT / "transformer/layernorm.py").read_text().splitlines()
    assert lines[start - 1].startswith("def layer_norm_backward(")
    assert lines[end - 1].strip().startswith("return dx, dg, db")


def test_called_by_finds_every_call_site_with_its_function():
    places = called_by("layer_norm_backward")
    assert {(p.path, p.function) for p in places} == {("transformer/block.py", "block_backward"),
                                                      ("transformer/model.py", "backward")}
    for p in places:
        assert "layer_norm_backward(" in (ROOT / p.path).read_text().splitlines()[p.line - 1]
    assert len([p for p in places if p.function == "block_backward"]) == 2  # LN1 and LN2


def test_the_tests_that_name_a_function_are_found_as_runnable_ids():
    """What a page lists where "checked by" was not measured: the unit tests that name the function."""
    places = code_facts.test_mentions("layer_norm_backward", folder="tests/unit")
    tests = [f"{p.path}::{p.function}" for p in places]
    assert "tests/unit/test_layers.py::test_layer_norm_backward_matches_central_differences_for_dx_dg_db" in tests
    for p in places:
        assert "layer_norm_backward" in (ROOT / p.path).read_text().splitlines()[p.line - 1]
    # Each id is a command that works: run one and see it pass.
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", tests[0]],
                            cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout[-500:]


def test_enclosing_function_of_a_marker():
    lines = (ROOT / "transformer/layernorm.py").read_text().splitlines()
    line = next(i for i, text in enumerate(lines, 1) if "# eq:ln-grad" in text)
    assert enclosing_function("transformer/layernorm.py", line) == "layer_norm_backward"
