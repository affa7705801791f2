"""The claims of the Flash attention and Activation checkpointing pages and of the Training loop page's memory
paragraph, read as a test would: each generated sentence follows the arrays it interprets, and the checks the
pages show can fail."""

import re

import numpy as np
import pytest

from site_scripts import build, memory, registry, results
from site_scripts.pages import activation_checkpoint as ckpt_page
from site_scripts.pages import flash_attention as flash_page
from site_scripts.pages import training
from transformer.flash_attention import flash_core_forward


@pytest.fixture
def quick(monkeypatch):
    """The quick build's lengths, so that a test measures in seconds."""
    monkeypatch.setenv("SITE_QUICK", "1")


# ---------------------------------------------------------------- flash attention

def test_the_pages_recurrence_ends_where_flash_core_forward_does_for_every_row():
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, 1, 10, 3)) for _ in range(3))
    out, row_max, row_sum = flash_core_forward(q, k, v, 4)
    for t in range(10):
        records, o = flash_page.online_row(q[0, 0, t] @ k[0, 0, :t + 1].T, v[0, 0, :t + 1], 4)
        assert records[-1][3] == pytest.approx(row_max[0, 0, t]) and records[-1][5] == pytest.approx(row_sum[0, 0, t])
        np.testing.assert_allclose(o, out[0, 0, t], rtol=1e-12)


def test_the_example_shows_a_tile_that_rescales_and_counts_none_where_no_tile_does(monkeypatch):
    """The page says (under its picture and in the example) that the second of the three tiles raises the
    maximum, so that omega < 1 there, and that the last one does not (omega = 1)."""
    tables, values = flash_page.example()
    omegas = [float(row.split(" | ")[4]) for row in tables["online"].splitlines()
              if re.match(r"\| \d+ to \d+ \|", row)]
    assert len(omegas) == 3 and omegas[0] == 0 and 0 < omegas[1] < 1 and omegas[2] == 1  # the first is e^-inf
    assert values["raises"] == 1
    monkeypatch.setattr(flash_page, "EXAMPLE_TILE", flash_page.EXAMPLE_T)  # one tile: nothing to rescale
    assert flash_page.example()[1]["raises"] == 0


def test_the_row_term_d_equals_the_sum_over_the_whole_row_and_the_figure_is_drawn():
    table, values = flash_page.d_trick()
    assert values["gap"] < 1e-14 and len(re.findall(r"(?m)^\| \d+ \|", table)) == flash_page.EXAMPLE_T
    assert flash_page.tiles_png()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_tile_as_wide_as_the_window_makes_the_whole_square_and_a_narrower_one_does_not():
    """The page's correction: no (T, T) array only while the tile is narrower than the window."""
    shapes = flash_page.tile_shapes()
    T = shapes["T"]
    assert shapes["tile"] < T and shapes["scores"][-2:] == (T, shapes["tile"])
    assert shapes["wide"] >= T and shapes["wide_scores"][-2:] == (T, T)
    assert shapes["rows_bytes"] < shapes["att_bytes"]


def test_the_flash_prose_binds_to_its_values(quick):
    from site_scripts import prose
    from site_scripts.common import ROOT

    made = flash_page.generate({})
    text = (ROOT / "docs" / "model" / "flash-attention.md").read_text()
    assert prose.typed_numbers(text) == []
    prose.bind(text, prose.plain(made["values"]), "flash_attention")


def test_flash_equals_materialized_within_the_bar_and_a_planted_error_fails_it(monkeypatch):
    text = flash_page.equality_md()
    rows = [r for r in text.splitlines() if re.match(r"\| \d+ \| \d+ \|", r)]
    assert len(rows) == len(flash_page.EQUAL_T) * len(flash_page.EQUAL_TILES)
    assert all(r.endswith("| pass |") for r in rows)
    real = flash_page.flash_attention_forward
    monkeypatch.setattr(flash_page, "flash_attention_forward",  # negative control: off by one part in 10^10
                        lambda *a: (lambda y, c: (y * (1 + 1e-10), c))(*real(*a)))
    assert "**FAIL**" in flash_page.equality_md()


def test_the_figure_is_a_png_served_beside_the_page_and_the_memory_text_follows_the_bytes(quick):
    found, lengths = memory.measurements(), memory.lengths()
    assert flash_page.figure_png(found, lengths)[:8] == b"\x89PNG\r\n\x1a\n"
    _, values = flash_page.memory_part()
    assert values["growth_materialized"] > 1.4 and values["growth_flash"] < 1.1  # the (T, T) weights against one tile
    hi = lengths[-1]
    assert values["hi"] == hi and values["lengths"] == list(lengths)
    assert values["ratio"] == found["materialized", hi].attention_peak / found["flash", hi].attention_peak
    served = dict(build.figure_files())
    assert "model/flash_attention/memory.png" in served or not (build.fragments_dir() / "flash_attention").exists()


def test_a_cross_check_selection_that_matches_no_row_fails():
    entry = registry.BY_ID["flash_attention"].crosscheck
    with pytest.raises(RuntimeError, match="no cross-check row matches"):
        results.devices_md("flash_attention", registry.Rows(entry.what, {"no such check": ("*",)}))


# ---------------------------------------------------------------- activation checkpointing

def test_checkpointed_gradients_are_bitwise_equal_with_two_block_forwards_per_block():
    layers = ckpt_page.tiny().cfg.num_layers
    for dtype, n, differ, gap, calls in ckpt_page.bitwise_rows():
        assert differ == [] and gap == 0 and calls == 2 * layers, dtype


def test_the_bitwise_sentence_says_when_a_gradient_changed():
    planted = [("float64", 38, [], 0.0, 4), ("float32", 38, ["b0.wq"], 1e-7, 4)]  # negative control
    assert ckpt_page.same_text(planted).startswith("**Checkpointing changed** b0.wq in float32")
    assert ckpt_page.per_block_text(planted, 2) == "twice" and ckpt_page.per_block_text(planted, 4) == "once"


def test_the_share_of_internals_cut_is_checked_against_l_minus_one_over_l(quick, monkeypatch):
    text = ckpt_page.measured_md()
    assert "at least that at every length measured" in text
    low, high = (float(v) for v in re.search(r"\((\d\.\d+) to (\d\.\d+)\)", text).groups())
    L = memory.tool.CONFIG.num_layers
    assert (L - 1) / L <= low <= high <= 1
    real = ckpt_page.block_internals
    monkeypatch.setattr(ckpt_page, "block_internals", lambda T: 2 * real(T))  # negative control: twice the bytes
    assert "**below it**" in ckpt_page.measured_md()


# ---------------------------------------------------------------- training loop

def test_the_training_paragraph_tabulates_the_measured_step_peaks(quick):
    text, found = training.policies_md(), memory.measurements()
    for T in training.POLICY_LENGTHS:
        cells = " | ".join(memory.mib(found[p, T].step_peak) for p in memory.tool.POLICIES)
        assert f"| {T} | {cells} |" in text


def test_the_comparison_table_says_slower_and_smaller_only_where_the_measurements_do():
    m = memory.tool.Measurement
    fields = {f: 0 for f in m.__dataclass_fields__}
    found = {("flash", 64): m(**{**fields, "seconds": 0.9, "step_peak": 5}),
             ("materialized", 64): m(**{**fields, "seconds": 1.0, "step_peak": 4}),
             ("flash", 128): m(**{**fields, "seconds": 1.3, "step_peak": 3}),
             ("materialized", 128): m(**{**fields, "seconds": 1.0, "step_peak": 4})}
    rows = flash_page.compare_rows(found, (64, 128))
    assert [r[2] for r in rows] == ["not slower", "slower"] and [r[4] for r in rows] == ["not smaller", "smaller"]
