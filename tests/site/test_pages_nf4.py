"""The claims of the NF4 page, read as a test would: each generated table follows the arrays it interprets,
each check the page shows can fail, and the built page shows its sections, tables and figure."""

import re

import numpy as np
import pytest

from site_scripts import build, registry
from site_scripts.pages import _nf4_layer as layer_page
from site_scripts.pages import nf4 as nf4_page
from transformer import nf4

from sitebuild import html_of


# ---------------------------------------------------------------- the code table and the hand example

def test_the_code_table_is_the_equation_evaluated_and_a_wrong_table_is_called_out(monkeypatch):
    rows = nf4_page.code_rows()
    assert [ours for *_, ours, _ in rows] == list(nf4.nf4_code())
    text = nf4_page.code_table_md()
    assert "are the same float32 numbers" in text
    for j, value in enumerate(nf4.nf4_code()):
        assert f"| {j} | " in text and f"{value:+.7f}" in text
    nudged = nf4.nf4_code().copy()
    nudged[3] += np.float32(1e-4)  # negative control: a table that is not the equation's
    monkeypatch.setattr(nf4, "nf4_code", lambda: nudged)
    assert "**not the same**" in nf4_page.code_table_md()


def test_the_dynamic_code_summary_counts_every_value():
    counts = [n for _, n, *_ in nf4_page.dynamic_rows()]
    assert 2 * sum(counts) + 2 == nf4.dynamic_code().size
    positive = nf4.dynamic_code()[nf4.dynamic_code() > 0]
    smallest = [lo for _, _, lo, _, _ in nf4_page.dynamic_rows()]
    np.testing.assert_allclose(smallest[0], positive.min(), rtol=1e-6)


def test_the_hand_example_is_what_the_code_stores_and_a_nibble_swap_is_called_out(monkeypatch):
    w = nf4_page.normal_weight(nf4_page.EXAMPLE_BLOCK)
    text = nf4_page.example_md()
    q = nf4.quantize(w, nf4_page.EXAMPLE_BLOCK, double=False)
    assert "Every step by hand agrees with the code." in text
    assert f"`q.packed` holds {nf4_page.hexes(q.packed)}" in text
    rows = [r for r in text.splitlines() if re.match(r"\| \d+ \| [+-]", r)]
    assert len(rows) == w.size
    back = nf4.dequantize(q)
    assert all(f"{back[i]:+.6f}" in row for i, row in enumerate(rows))
    real = nf4.pack
    monkeypatch.setattr(nf4, "pack", lambda codes: (lambda p: (p << 4) | (p >> 4))(real(codes)))  # negative control
    assert "**The hand computation and the code disagree.**" in nf4_page.example_md()


def test_the_double_quantization_example_shows_the_real_offset_and_stays_within_its_bound():
    text = nf4_page.double_md()
    q = nf4.quantize(nf4_page.normal_weight(nf4_page.DOUBLE_SHAPE))
    assert f"The offset is their mean, {float(q.offset):.7f}" in text
    assert q.absmax2.size >= 2 and all(f"{a:.6f}" in text for a in q.absmax2)
    assert "times its \\(\\operatorname{absmax}^{(2)}\\): yes" in text and "same bytes (yes)" in text


# ---------------------------------------------------------------- bytes

def test_every_byte_row_compares_the_real_arrays_with_the_formula_and_a_wrong_formula_fails(monkeypatch):
    monkeypatch.setattr(nf4_page, "LARGE", (300, 70))  # a short last block, and fast
    rows = nf4_page.payload_rows()
    assert rows and all(ok for *_, ok in rows)
    assert all(s == sf and d == df for _, _, _, _, s, sf, d, df, _ in rows)
    real = nf4.payload_bytes
    monkeypatch.setattr(nf4, "payload_bytes", lambda n, **kw: real(n, **kw) + 1)  # negative control
    assert "**FAIL**" in nf4_page.payload_md()


def test_the_byte_table_covers_the_models_weight_shapes():
    shapes = {shape for _, shape in nf4_page.weight_shapes()}
    assert {(32, 32), (32, 128), (128, 32), nf4_page.LARGE} <= shapes


# ---------------------------------------------------------------- the error

def test_nf4_beats_the_uniform_code_on_normal_weights_and_the_table_prints_the_errors():
    runs = nf4_page.error_runs()
    rms = {k: {name: float(np.sqrt(np.mean(e ** 2))) for name, e in errs.items()} for k, errs in runs.items()}
    assert rms["normal"]["NF4"] < rms["normal"]["uniform 4-bit"]
    text = nf4_page.error_md(runs)
    for kind, by_code in rms.items():
        for name, value in by_code.items():
            assert f"| {kind} | {name} | {value:.4f} |" in text
    assert nf4_page.figure_png(runs)[:8] == b"\x89PNG\r\n\x1a\n"


# ---------------------------------------------------------------- bitsandbytes

def test_the_bitsandbytes_rows_pass_and_an_unexplained_difference_fails(monkeypatch):
    pytest.importorskip("bitsandbytes.functional", reason="bitsandbytes is not installed")
    monkeypatch.setattr(nf4_page, "BNB_SHAPES", (((37, 129), 64),))
    text = nf4_page.bitsandbytes_md()
    rows = [r for r in text.splitlines() if r.startswith("| cpu |")]
    assert len(rows) == 2 + 8 and all(r.endswith("| pass |") for r in rows)
    real = nf4.dequantize
    monkeypatch.setattr(nf4, "dequantize", lambda q: real(q) * np.float32(1.0001))  # negative control
    assert "**FAIL**" in nf4_page.bitsandbytes_md()


def test_without_bitsandbytes_the_page_says_so_instead_of_failing(monkeypatch):
    monkeypatch.setattr(nf4_page, "functional", lambda: None)
    assert nf4_page.bitsandbytes_md().startswith("bitsandbytes is not installed on the machine that built this page")


# ---------------------------------------------------------------- the NF4 linear layer

def test_the_layer_equals_the_dense_one_and_a_planted_error_fails(monkeypatch):
    text = layer_page.equality_md()
    rows = [r for r in text.splitlines() if re.match(r"\| \d+ \| \d+ \|", r)]
    assert len(rows) == len(layer_page.EQUAL_ROWS) and all(r.endswith("| pass |") for r in rows)
    real = layer_page.nf4_linear_forward
    monkeypatch.setattr(layer_page, "nf4_linear_forward",  # negative control: off by one part in 10^10
                        lambda *a: (lambda y, c: (y * (1 + 1e-10), c))(*real(*a)))
    assert "**FAIL**" in layer_page.equality_md()


def test_grouped_decoding_of_a_tall_weight_peaks_below_its_float32_bytes():
    dense, whole, grouped = layer_page.measure((1024, 512))
    assert max(grouped.forward, grouped.backward) < dense.stored < max(whole.forward, whole.backward)
    assert grouped.stored == whole.stored == nf4.payload_bytes(1024 * 512)


def test_the_gradient_check_passes():
    assert "| pass |" in layer_page.gradcheck_md() and "**FAIL**" not in layer_page.gradcheck_md()


# ---------------------------------------------------------------- the registry and the built page

def test_the_fine_tuning_section_comes_after_training_and_before_generation():
    sections = [next(iter(entry)) for entry in registry.nav()]
    assert sections.index("Training") + 1 == sections.index("Fine-tuning") == sections.index("Generation") - 1


def test_the_built_page_shows_its_sections_tables_and_figure(built_site, monkeypatch):
    monkeypatch.setenv("SITE_QUICK", "1")  # built_site's mode, whose figures figure_files lists
    html = html_of(built_site, "finetuning/nf4.md")
    for anchor in ("eq-nf4-code", "eq-nf4-scales", "eq-qlinear-dx", "code-table", "tiny-numerical-example",
                   "double-quantization-worked", "bytes", "quantization-error", "checked-against-bitsandbytes",
                   "the-nf4-linear-layer", "code-and-math", "gradient-check", "where-is-it-used"):
        assert f'id="{anchor}"' in html, anchor
    assert 'src="error.png"' in html  # nf4/error.png beside finetuning/nf4.md, served at finetuning/nf4/
    assert (built_site / "finetuning" / "nf4" / "error.png").is_file()
    assert "**FAIL**" not in html and "<strong>FAIL</strong>" not in html
    assert "test_two_codes_share_a_byte_the_first_in_the_high_nibble" in html
    assert "test_the_nf4_layer_equals_a_dense_layer_holding_the_decoded_weight" in html
    assert dict(build.figure_files()).get("finetuning/nf4/error.png") is not None
