"""Equations (declared in the docs pages' prose) and the code lines that compute them stay tied (the
site's links rest on this)."""

import shutil

import pytest

from site_scripts import equations
from site_scripts.markers import ROOT, check_ties, collect_markers

PROSE = """# A page

### Affine layer {#eq-affine}

$$
Y = X W
$$

??? note "Derivation"

    <!-- eq affine-dx: The gradient to the input -->
    $$
    dX = dY W^\\top
    $$
"""


def test_every_equation_has_code_and_every_marker_an_equation():
    markers = collect_markers()
    assert check_ties(markers) == []
    assert {m.eq_id for m in markers} == set(equations.by_id())


def test_every_marker_sits_on_a_line_of_code_whose_text_is_recorded():
    for m in collect_markers():
        assert m.code.strip(), f"{m.path}:{m.line} is a comment-only line"
        line = (ROOT / m.path).read_text().splitlines()[m.line - 1]
        assert line.startswith(m.code) and f"eq:{m.eq_id}" in line


def test_equations_have_ids_fit_for_anchors_and_non_empty_latex():
    for eq in equations.all_equations():
        assert eq.id == eq.id.lower() and " " not in eq.id and eq.latex.strip() and eq.title


def test_headline_and_step_declarations_are_found_and_rendered_with_their_code():
    found = equations.parse(PROSE, "p")
    assert [(eq.id, eq.title, eq.latex, eq.step) for eq in found] == [
        ("affine", "Affine layer", "Y = X W", False),
        ("affine-dx", "The gradient to the input", "dX = dY W^\\top", True)]
    text = equations.expand(PROSE, lambda eq_id: f"CODE({eq_id})")
    assert "Y = X W\n$$\n\nCODE(affine)\n" in text
    # The step keeps its indentation (it stays inside the collapsible block) and gets a visible anchor.
    assert ("    **The gradient to the input**\n    {: #eq-affine-dx }\n\n    $$\n    dX = dY W^\\top\n    $$"
            "\n\n    CODE(affine-dx)") in text


@pytest.mark.parametrize("wrong", [
    "### Affine layer {#eq-affine}\n$$\nY\n$$\n",  # no blank line after the heading
    "<!-- eq affine Affine layer -->\n$$\nY\n$$\n",  # no colon
    "<!-- eq affine: Affine layer -->\n\nY = X W\n",  # no $$ block
])
def test_a_mistyped_declaration_is_an_error_not_an_equation_without_links(wrong):
    with pytest.raises(RuntimeError, match="declares no equation"):
        equations.parse(wrong, "p")


def test_an_equation_declared_on_two_pages_is_an_error(tmp_path):
    shutil.copytree(ROOT / "docs", tmp_path / "docs")
    softmax = tmp_path / "docs" / "model" / "softmax.md"
    softmax.write_text(softmax.read_text() + "\n### Again {#eq-linear}\n\n$$\nY\n$$\n")
    with pytest.raises(RuntimeError, match="'linear' is declared twice: on the linear and softmax pages"):
        equations.all_equations(tmp_path)


def test_a_broken_marker_is_reported_both_ways(tmp_path):
    """Negative control: rename one marker in a copy of the source."""
    shutil.copytree(ROOT / "transformer", tmp_path / "transformer")
    layernorm = tmp_path / "transformer" / "layernorm.py"
    layernorm.write_text(layernorm.read_text().replace("# eq:ln-grad", "# eq:ln-gard"))
    problems = check_ties(collect_markers(tmp_path))
    assert any("marks eq:ln-gard, which no docs page declares" in p for p in problems)
    assert any("'ln-grad' has no implementing line" in p for p in problems)
