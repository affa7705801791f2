"""The Cross-check on devices page's sentences hold for the report it shows: the rows that pass on the absolute
tolerance are the key biases, the rows with a bound of their own are the key biases of the whole training steps,
and the prose binds to the values the generator returns."""

import pytest

from site_scripts import prose
from site_scripts.common import ROOT
from site_scripts.pages import crosscheck
from site_scripts.results import crosscheck_report
from transformer.crosscheck_rows import TOLERANCES


@pytest.fixture(scope="module")
def report():
    return crosscheck_report()


def test_only_the_key_biases_pass_on_the_absolute_tolerance(report):
    """The page: the crosses above the line are tensors zero in exact arithmetic, the key biases."""
    floor = {r.tensor for r in report["rows"] if r.on_floor}
    assert floor and all(name.endswith(".bk") for name in floor)


def test_the_one_exception_is_the_key_biases_of_the_whole_training_steps(report):
    _, values = crosscheck.tolerances(report)
    assert values["checks"] == ["train step"] and all(name.endswith(".bk") for name in values["tensors"])
    special = [r for r in report["rows"] if (r.tol_rel, r.tol_abs) != (TOLERANCES[r.dtype].rel, TOLERANCES[r.dtype].abs)]
    assert all(r.tol_abs == pytest.approx(values["bound_lo"] * r.step) for r in special)  # grows with the step


def test_every_comparison_passes_and_the_closest_stays_under_its_tolerance(report):
    """The page says the dots sit under the line; a failing row would say otherwise."""
    assert all(r.passed for r in report["rows"])
    _, values = crosscheck.gaps_png(report)
    assert values["margin"] > 1


def test_the_crosscheck_prose_binds_to_its_values(report):
    text = (ROOT / "docs" / "verification" / "crosscheck.md").read_text()
    assert prose.typed_numbers(text) == []
    prose.bind(text, prose.plain(crosscheck.generate({})["values"]), "crosscheck")
