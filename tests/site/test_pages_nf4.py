"""The claims of the NF4 page, read as a test would: each generated table follows the arrays it interprets,
each check the page shows can fail, each sentence of docs/finetuning/nf4.md that interprets a number holds for
the number the generator returns, and the built page shows its sections, tables and figures."""

import re

import numpy as np
import pytest

from site_scripts import build, registry
from site_scripts.pages import _nf4_bnb as bnb_page
from site_scripts.pages import _nf4_layer as layer_page
from site_scripts.pages import _nf4_levels as levels_page
from site_scripts.pages import nf4 as nf4_page
from transformer import nf4

from sitebuild import html_of


# ---------------------------------------------------------------- the code table and the hand example

def test_the_code_table_is_the_equation_evaluated_and_a_wrong_table_is_called_out(monkeypatch):
    rows = nf4_page.code_rows()
    assert [ours for *_, ours, _ in rows] == list(nf4.nf4_code())
    tables, values = nf4_page.code_table()
    assert values["equal"] == values["n"] == 16  # "the same float32 number in 16 of the 16 rows"
    for j, value in enumerate(nf4.nf4_code()):
        assert f"| {j} | " in tables["code_table"] and f"{value:+.7f}" in tables["code_table"]
    nudged = nf4.nf4_code().copy()
    nudged[3] += np.float32(1e-4)  # negative control: a table that is not the equation's
    monkeypatch.setattr(nf4, "nf4_code", lambda: nudged)
    assert nf4_page.code_table()[1]["equal"] == 15


def test_the_dynamic_code_summary_counts_every_value():
    counts = [n for _, n, *_ in nf4_page.dynamic_rows()]
    assert 2 * sum(counts) + 2 == nf4.dynamic_code().size
    positive = nf4.dynamic_code()[nf4.dynamic_code() > 0]
    smallest = [lo for _, _, lo, _, _ in nf4_page.dynamic_rows()]
    np.testing.assert_allclose(smallest[0], positive.min(), rtol=1e-6)


def test_the_hand_example_is_what_the_code_stores_and_a_nibble_swap_is_refused(monkeypatch):
    w = levels_page.normal_weight(nf4_page.EXAMPLE_BLOCK)
    table, values = nf4_page.example()
    q = nf4.quantize(w, nf4_page.EXAMPLE_BLOCK, double=False)
    assert values["packed"] == nf4_page.hexes(q.packed)
    rows = [r for r in table.splitlines() if re.match(r"\| \d+ \| [+-]", r)]
    assert len(rows) == w.size
    back = nf4.dequantize(q)
    assert all(f"{back[i]:+.6f}" in row for i, row in enumerate(rows))
    assert values["error"] <= values["bound"] and values["top_error"] == 0  # "within the bound", "comes back exactly"
    real = nf4.pack
    monkeypatch.setattr(nf4, "pack", lambda codes: (lambda p: (p << 4) | (p >> 4))(real(codes)))  # negative control
    with pytest.raises(RuntimeError, match="by hand disagrees"):
        nf4_page.example()


def test_the_double_quantization_example_shows_the_real_offset_and_stays_within_its_bound():
    tables, values = nf4_page.double()
    q = nf4.quantize(levels_page.normal_weight(nf4_page.DOUBLE_SHAPE))
    assert values["offset"] == pytest.approx(float(q.offset), abs=0)
    assert q.absmax2.size >= 2 and all(f"{a:.6f}" in tables["double_second"] for a in q.absmax2)
    assert values["worst_of_bound"] <= 1  # "every error is within half a gap of ζ times its absmax2"
    assert values["codes_differ"] == 0  # "the weights' codes are the same bytes"


# ---------------------------------------------------------------- the levels

def test_the_levels_picture_and_the_shares_follow_the_codes_and_the_shares_are_unequal():
    png, table, values = levels_page.levels()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    assert table.count("\n") == 2 + 16
    for kind in ("normal", "heavy", "real"):
        assert values[kind]["lo"] < values["equal"] < values[kind]["hi"]  # "The shares are not equal"
    assert values["spread"] < values["assumed"]  # "narrower than the ... the levels are spaced for"
    shares = levels_page.shares(levels_page.normal_weight(levels_page.ERROR_SHAPE))
    assert shares.sum() == pytest.approx(1) and shares.argmin() == values["normal"]["lo_j"]
    mid, ends = shares[5:10].min(), max(shares[0], shares[15])
    assert mid > values["equal"] > ends  # "the middle levels take more than their share, the outer ones less"
    real = levels_page.shares(levels_page.weights()[f"default model's `{levels_page.REAL}`"])
    assert real[[0, 1, 14, 15]].min() > values["equal"]  # "there the outer levels take more than their share"
    assert values["ideal_hi"] - values["ideal_lo"] < (values["normal"]["hi"] - values["normal"]["lo"]) / 3


# ---------------------------------------------------------------- bytes

def test_every_byte_row_compares_the_real_arrays_with_the_formula_and_a_wrong_formula_fails(monkeypatch):
    monkeypatch.setattr(nf4_page, "LARGE", (300, 70))  # a short last block, and fast
    rows = nf4_page.payload_rows()
    assert rows and all(ok for *_, ok in rows)
    assert all(s == sf and d == df for _, _, _, _, s, sf, d, df, _ in rows)
    real = nf4.payload_bytes
    monkeypatch.setattr(nf4, "payload_bytes", lambda n, **kw: real(n, **kw) + 1)  # negative control
    table, values = nf4_page.payload()
    assert "**FAIL**" in table and values["passed"] < values["rows"]


def test_the_byte_table_covers_the_models_weight_shapes():
    shapes = {shape for _, shape in nf4_page.weight_shapes()}
    assert {(32, 32), (32, 128), (128, 32), nf4_page.LARGE} <= shapes


# ---------------------------------------------------------------- the error

def test_nf4_beats_the_uniform_code_on_normal_weights_and_the_table_prints_the_errors():
    runs = levels_page.error_runs()
    rms = {k: {name: float(np.sqrt(np.mean(e ** 2))) for name, e in errs.items()} for k, errs in runs.items()}
    assert rms["normal"]["NF4"] < rms["normal"]["uniform 4-bit"]
    table, values = levels_page.error_table(runs)
    for kind, by_code in rms.items():
        for name, value in by_code.items():
            assert f"| {kind} | {name} | {value:.4f} |" in table
    assert values["worst_nf4"] > values["worst_uniform"] and values["gap_nf4"] > values["gap_uniform"]
    assert levels_page.error_png(runs)[:8] == b"\x89PNG\r\n\x1a\n"


# ---------------------------------------------------------------- bitsandbytes

def test_the_bitsandbytes_rows_pass_and_an_unexplained_difference_fails(monkeypatch):
    pytest.importorskip("bitsandbytes.functional", reason="bitsandbytes is not installed")
    monkeypatch.setattr(bnb_page, "SHAPES", ((37, 129),))
    table, values = bnb_page.comparison(levels_page.normal_weight)
    rows = [r for r in table.splitlines() if r.startswith("| cpu |")]
    assert len(rows) == 2 + 8 and all(r.endswith("| pass |") for r in rows)
    assert values["single_differ"] == 0 and values["single_elements"] > 0  # "equal bit for bit"
    assert "cpu" in values["devices"]
    real = nf4.dequantize
    monkeypatch.setattr(nf4, "dequantize", lambda q: real(q) * np.float32(1.0001))  # negative control
    table, values = bnb_page.comparison(levels_page.normal_weight)
    assert "**FAIL**" in table and values["single_differ"] > 0


def test_without_bitsandbytes_the_page_says_so_instead_of_failing(monkeypatch):
    monkeypatch.setattr(bnb_page, "functional", lambda: None)
    table, values = bnb_page.comparison(levels_page.normal_weight)
    assert "bitsandbytes is not installed on the machine that built this page" in table
    assert values["version"] == "not installed" and values["devices"] == []


# ---------------------------------------------------------------- the NF4 linear layer

def test_the_layer_equals_the_dense_one_and_a_planted_error_fails(monkeypatch):
    table, _ = layer_page.equality()
    rows = [r for r in table.splitlines() if re.match(r"\| \d+ \| \d+ \|", r)]
    assert len(rows) == len(layer_page.EQUAL_ROWS) and all(r.endswith("| pass |") for r in rows)
    real = layer_page.nf4_linear_forward
    monkeypatch.setattr(layer_page, "nf4_linear_forward",  # negative control: off by one part in 10^10
                        lambda *a: (lambda y, c: (y * (1 + 1e-10), c))(*real(*a)))
    assert "**FAIL**" in layer_page.equality()[0]


def test_the_tiny_layer_works_group_by_group_and_its_arithmetic_is_checked(monkeypatch):
    tables, values = layer_page.tiny_layer()
    assert values["groups"] == 2 and values["blocks"] == 1  # "fit 1 block", "so in 2 groups"
    assert {"layer_group0", "layer_group1"} <= set(tables)
    assert values["dx_gap"] < 1e-15 and values["y_gap"] < 1e-15 and values["float_gap"] > 0
    assert 0 < values["dy_zeros"] < values["dy_entries"]  # "N of its M entries are exactly zero"
    assert values["bias_max"] == 0  # "its bias is zero at initialisation"
    real = layer_page.nf4_linear_backward
    monkeypatch.setattr(layer_page, "nf4_linear_backward", lambda dy, cache: real(dy, cache) * 1.01)  # negative control
    with pytest.raises(RuntimeError, match="by hand disagrees"):
        layer_page.tiny_layer()


def test_grouped_decoding_of_a_tall_weight_peaks_below_its_float32_bytes():
    dense, whole, grouped = layer_page.measure((1024, 512))
    assert max(grouped.forward, grouped.backward) < dense.stored < max(whole.forward, whole.backward)
    assert grouped.stored == whole.stored == nf4.payload_bytes(1024 * 512)


def test_the_gradient_check_passes():
    table, _ = layer_page.gradcheck()
    assert "| pass |" in table and "**FAIL**" not in table


def test_the_memory_sentence_sorts_every_shape_below_or_above_the_dense_bytes():
    _, values = layer_page.memory()
    assert len(values["below"]) + len(values["above"]) == len(layer_page.memory_shapes())
    assert "1024 × 512" in values["below"]  # the tall weight: grouped decoding stays below its float32 bytes


# ---------------------------------------------------------------- the registry and the built page

def test_the_fine_tuning_section_comes_after_training_and_before_generation():
    sections = [next(iter(entry)) for entry in registry.nav()]
    assert sections.index("Training") + 1 == sections.index("Fine-tuning") == sections.index("Generation") - 1


def test_the_built_page_shows_its_sections_tables_and_figure(built_site, built_mode):
    html = html_of(built_site, "finetuning/nf4.md")
    for anchor in ("eq-nf4-code", "eq-nf4-scales", "eq-qlinear-dx", "code-table", "tiny-numerical-example",
                   "double-quantization-worked", "bytes", "quantization-error", "checked-against-bitsandbytes",
                   "the-nf4-linear-layer", "code-and-math", "gradient-check", "where-is-it-used"):
        assert f'id="{anchor}"' in html, anchor
    assert 'src="error.png"' in html  # nf4/error.png beside finetuning/nf4.md, served at finetuning/nf4/
    assert 'src="levels.png"' in html
    assert (built_site / "finetuning" / "nf4" / "error.png").is_file()
    assert "**FAIL**" not in html and "<strong>FAIL</strong>" not in html
    assert "test_two_codes_share_a_byte_the_first_in_the_high_nibble" in html
    assert "test_the_nf4_layer_equals_a_dense_layer_holding_the_decoded_weight" in html
    assert dict(build.figure_files()).get("finetuning/nf4/error.png") is not None
