"""One meaning per symbol: the symbol tables of the pages take theirs from the Notation page."""

import pytest

from site_scripts import sections
from site_scripts.common import ROOT


def test_a_symbol_table_takes_meaning_and_shape_from_the_notation_page():
    text = sections.symbols_md([("W", "w", (4, 5), "`b0.ff1_w`"), (r"\partial\ell/\partial W", "dw", (4, 5))], "a note")
    assert ("| \\(W\\) | a linear layer's weights, stored (in, out); here `b0.ff1_w` | `w` | (n_in, n_out) "
            "| `(4, 5)` |") in text
    assert ("| \\(\\partial\\ell/\\partial W\\) | the gradient of \\(\\ell\\) with respect to a linear layer's weights, "
            "stored (in, out) | `dw` | (n_in, n_out) |") in text


@pytest.mark.parametrize("symbol", ["Q_h", r"\partial\ell/\partial Q_h", r"\partial\mathcal{L}/\partial Z"])
def test_a_symbol_the_notation_page_does_not_give_stops_the_build(symbol):
    """Negative control: a page that names a symbol of its own (or a gradient of one) cannot give it a meaning
    of its own either."""
    with pytest.raises(LookupError, match="is not on the Notation page"):
        sections.symbols_md([(symbol, "q", (2, 3))], "a note")


def test_the_notation_page_gives_each_symbol_one_meaning(tmp_path):
    table = sections.notation()
    assert len(table) > 80 and table["Z"][0].startswith("logits") and table["n_V"][0] == "vocabulary size"
    (tmp_path / "docs" / "reference").mkdir(parents=True)
    page = (ROOT / "docs" / sections.NOTATION).read_text()
    (tmp_path / "docs" / sections.NOTATION).write_text(page + "| \\(Z\\) | the FFN pre-activation | (B, T, F) |\n")
    with pytest.raises(LookupError, match="gives Z more than one meaning"):
        sections.notation(tmp_path)
