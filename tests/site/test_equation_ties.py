"""Equations and the code lines that compute them stay tied (the site's links rest on this)."""

import shutil

from site_scripts.equations import BY_ID, EQUATIONS
from site_scripts.markers import ROOT, check_ties, collect_markers


def test_every_equation_has_code_and_every_marker_an_equation():
    markers = collect_markers()
    assert check_ties(markers) == []
    assert {m.eq_id for m in markers} == set(BY_ID)


def test_every_marker_sits_on_a_line_of_code_whose_text_is_recorded():
    for m in collect_markers():
        assert m.code.strip(), f"{m.path}:{m.line} is a comment-only line"
        line = (ROOT / m.path).read_text().splitlines()[m.line - 1]
        assert line.startswith(m.code) and f"eq:{m.eq_id}" in line


def test_equations_have_ids_fit_for_anchors_and_non_empty_latex():
    for eq in EQUATIONS:
        assert eq.id == eq.id.lower() and " " not in eq.id and eq.latex.strip() and eq.title


def test_a_broken_marker_is_reported_both_ways(tmp_path):
    """Negative control: rename one marker in a copy of the source."""
    shutil.copytree(ROOT / "transformer", tmp_path / "transformer")
    layernorm = tmp_path / "transformer" / "layernorm.py"
    layernorm.write_text(layernorm.read_text().replace("# eq:ln-grad", "# eq:ln-gard"))
    problems = check_ties(collect_markers(tmp_path))
    assert any("marks eq:ln-gard, which site_scripts/equations.py does not declare" in p for p in problems)
    assert any("'ln-grad' has no implementing line" in p for p in problems)
