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
    _, values = ckpt_page.example()
    assert values["differ"] == 0 and values["per_block"] == 2 and values["loss"] == values["loss_ckpt"]
    assert values["entry"] == values["entry_ckpt"]


def test_a_gradient_one_ulp_away_is_counted_as_not_bitwise_equal(monkeypatch):
    """Negative control of the example's comparison: one entry moved to the next float is found."""
    real = ckpt_page.counted_grads

    def planted(cfg, dtype):
        grads, calls, loss = real(cfg, dtype)
        if cfg.checkpoint_blocks:
            grads["b0.wq"] = grads["b0.wq"].copy()
            grads["b0.wq"][0, 0] = np.nextafter(grads["b0.wq"][0, 0], np.inf)
        return grads, calls, loss
    monkeypatch.setattr(ckpt_page, "counted_grads", planted)
    for dtype, n, differ, gap, calls in ckpt_page.bitwise_rows():
        assert differ == ["b0.wq"] and gap > 0, dtype


def test_the_share_of_internals_cut_is_at_least_l_minus_one_over_l(quick, monkeypatch):
    """The page says the share cut between the passes is at least (L - 1)/L at every length measured."""
    _, values = ckpt_page.measured()
    assert values["bound"] <= values["share_lo"] <= values["share_hi"] <= 1
    real = ckpt_page.block_internals
    monkeypatch.setattr(ckpt_page, "block_internals", lambda T: 2 * real(T))  # negative control: twice the bytes
    assert ckpt_page.measured()[1]["share_lo"] < values["bound"]


def test_the_picture_traces_what_its_sentences_say(quick):
    """The traced step: the plain step holds one more block cache after each forward and keeps them through the
    backward; the checkpointed backward's rise is the replayed cache plus the plain one's working memory; the
    peaks are close to the memory tool's step peaks; the peak falls by less than the held memory does."""
    T = memory.lengths()[-1]
    plain, ckpt = (ckpt_page.traced_step(policy, T) for policy in ckpt_page.PICTURED)
    assert [label for label, _, _ in plain] == [label for label, _, _ in ckpt]
    layers = memory.tool.CONFIG.num_layers
    cache = ckpt_page.block_internals(T)
    forwards = [held for label, held, _ in plain if label.endswith(" forward")]
    assert len(forwards) == layers and all(abs(b - a - cache) < 0.05 * cache for a, b in zip(forwards, forwards[1:]))
    backwards = [held for label, held, _ in plain if label.endswith(" backward") and label.startswith("b")]
    assert min(backwards) >= forwards[-1]  # nothing is let go during the plain backward
    for trace in (plain, ckpt):  # the peak comes during a block's backward
        label = max(trace, key=lambda stage: stage[2])[0]
        assert label.startswith("b") and label.endswith(" backward")
    _, values = ckpt_page.picture()
    assert abs(values["extra_ckpt"] - values["cache"] - values["extra"]) < 0.05 * values["extra_ckpt"]
    found = memory.measurements()
    for policy, peak in (("materialized", values["peak_plain"]), ("checkpointed", values["peak_ckpt"])):
        assert peak * memory.MIB == pytest.approx(found[policy, T].step_peak, rel=0.05)  # its step adds clip, AdamW
    assert values["factor"] < values["held_plain"] / values["held_ckpt"]


def test_the_checkpointing_prose_binds_to_its_values(quick):
    from site_scripts import prose
    from site_scripts.common import ROOT

    made = ckpt_page.generate({})
    text = (ROOT / "docs" / "training" / "activation-checkpointing.md").read_text()
    assert prose.typed_numbers(text) == [] and "inventory" not in "".join(made)
    prose.bind(text, prose.plain(made["values"]), "activation_checkpoint")


# ---------------------------------------------------------------- training loop

def test_the_training_paragraph_tabulates_the_measured_step_peaks(quick):
    (tables, _), found = training.policies(), memory.measurements()
    text = tables["policies"]
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
