"""The prose binds to the generators' values (site_scripts/prose.py): each placeholder shows its value as
formatted, every mistake stops the build, and no measured number can be typed into a page by hand."""

import numpy as np
import pytest

from site_scripts import prose
from site_scripts.common import ROOT


def test_a_placeholder_shows_its_value_formatted():
    values = {"gap": 2.4e-16, "zero": 0.0, "gamma": [1.0, -0.25], "shape": [2, 16, 32], "name": "dxhat",
              "split": {"train": 0.9}, "count": 3}
    text = ("{{ gap:.0e }} {{ zero:gap }} {{ gamma:num }} {{ shape:shape }} {{name:code}} {{ split.train:.0% }} "
            "{{ count }}")
    assert prose.bind(text, values, "p.md") == "2e-16 0 1.0000, (−0.2500) `(2, 16, 32)` `dxhat` 90% 3"


def test_every_mistake_of_binding_stops_the_build():
    with pytest.raises(ValueError, match="returned no value 'missing'"):
        prose.bind("{{ missing:.2f }}", {}, "p.md")
    with pytest.raises(ValueError, match="give it a format"):
        prose.bind("{{ x }}", {"x": 0.5}, "p.md")
    with pytest.raises(ValueError, match="not a placeholder"):
        prose.bind("{{ x y }}", {}, "p.md")
    with pytest.raises(ValueError, match="returned unused, which the prose never shows"):
        prose.bind("{{ x:.1f }}", {"x": 0.5, "unused": 1}, "p.md")


def test_a_measured_number_typed_into_prose_is_found_and_a_count_is_not():
    text = ("Two heads, 2 heads and Section 3 are fine; 1.84 is not, nor is 3.8x, nor 12%, nor 2e-16, nor "
            "\\(\\sigma = 0.997\\).\n\n$$\nu = 0.044715\\,x^3\n$$\n\n`0.5` and [a](b/1.5.md) and "
            "{{ x:.2f }} and <!-- 4.5 --> and arXiv:2106.09685 and a 4×4 matrix.\n")
    assert [found for _, found in prose.typed_numbers(text)] == ["1.84", "3.8x", "12%", "2e-16", "0.997"]


def test_no_page_of_the_site_has_a_measured_number_typed_into_its_prose():
    found = {str(p.relative_to(ROOT)): prose.typed_numbers(p.read_text()) for p in (ROOT / "docs").rglob("*.md")}
    assert {page: numbers for page, numbers in found.items() if numbers} == {}


def test_values_are_stored_as_json_keeps_them():
    values = {"a": np.float32(0.5), "b": np.arange(3), "c": (1, 2), "d": {"e": np.int64(4)}}
    assert prose.dumps(values) == prose.dumps({"a": 0.5, "b": [0, 1, 2], "c": [1, 2], "d": {"e": 4}})


def test_a_table_cell_shows_a_bar_in_code_as_it_is_and_escapes_one_outside():
    """A `|` inside a code span needs no escape (a table does not split a row there), and a backslash there would
    show; outside code it must be escaped. Watched failing with every `|` escaped."""
    import markdown

    from site_scripts.common import md_table

    html = markdown.markdown(md_table(["a", "b"], [["`x | y`", "mean |error|"]]), extensions=["tables"])
    assert "<td><code>x | y</code></td>" in html and "<td>mean |error|</td>" in html


def test_a_notebooks_prose_is_its_markdown_cells_and_its_outputs_are_not_checked(tmp_path):
    """The numbers a notebook prints are computed; the ones typed into its markdown cells are not. Negative
    control: a typed decimal in a markdown cell is found, the same number in code is not."""
    from site_scripts import notebooks

    (tmp_path / "nb.py").write_text('# %% [markdown]\n# The loss fell to 1.84.\n\n# %%\nprint(3.25)\n')
    cells = notebooks.markdown_cells("nb", folder=tmp_path)
    assert "1.84" in cells and "3.25" not in cells
    assert [text for _, text in prose.typed_numbers(cells)] == ["1.84"]
