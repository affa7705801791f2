"""The GPT-2 page's own machinery: its rows can fail, its pieces of the block add up to the block, and its
real-weights branch runs on a folder transformers wrote (random weights stand in for GPT-2's: no network)."""

import numpy as np
import pytest

from site_scripts.pages import gpt2 as page
from transformer.config import PRESETS
from transformer.model import init_params, param_shapes


def test_a_row_fails_on_a_gap_above_the_tolerance_and_counts_the_entries_within():
    theirs = np.linspace(1.0, 2.0, 10)
    assert page.row("x", theirs * (1 + 1e-15), theirs)["passed"]
    off = theirs.copy()
    off[:3] += 1e-9
    bad = page.row("x", off, theirs)
    assert not bad["passed"] and bad["share"] == pytest.approx(0.7) and bad["gap"] == pytest.approx(5e-10, rel=1e-3)


def test_the_pieces_the_page_computes_add_up_to_the_blocks_it_traces():
    cfg = PRESETS["gpt2-tiny"]
    params = init_params(cfg, seed=3)
    ids = np.array([[1, 5, 2, 9, 4]])
    ours = page.our_intermediates(params, ids, cfg)
    for l in range(cfg.num_layers):
        x = ours[f"b{l - 1}.out" if l else "embedding"]
        np.testing.assert_allclose(ours[f"b{l}.mid"] + ours[f"b{l}.ffn_out"], ours[f"b{l}.out"], rtol=0, atol=1e-13)
        assert not np.allclose(ours[f"b{l}.mid"], x)  # attention added something


def test_without_weights_the_page_says_so_and_with_a_folder_it_continues_the_text(tmp_path, monkeypatch):
    monkeypatch.delenv(page.CHECKPOINT_ENV, raising=False)
    assert "not on this build machine" in page.real_weights()
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("transformer.bpe").find_files()
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=50257, n_positions=64, n_embd=16, n_layer=1, n_head=2)
    transformers.GPT2LMHeadModel(config).save_pretrained(tmp_path)
    monkeypatch.setenv(page.CHECKPOINT_ENV, str(tmp_path))
    table = page.real_weights()
    assert str(tmp_path) in table and repr(page.TEXT)[:-1] in table


def test_the_cross_checks_table_has_transformers_column_and_shows_a_wrong_gradient(monkeypatch):
    """Every gradient against transformers' within rounding; negative control: one of ours 1e-6 too large, as the
    transformers rows see it, shows in that column alone and fails the device."""
    pytest.importorskip("transformers")
    import transformer.crosscheck_hf as crosscheck_hf

    def cpu_row(table):
        header, _, *rows = table.splitlines()
        cells = dict(zip(header.strip("|").split("|"), next(r for r in rows if r.startswith("| cpu ")).strip("|").split("|")))
        return {k.strip(): v.strip() for k, v in cells.items()}

    table, gradients, _, floor = page.crosscheck_table()
    row = cpu_row(table)
    assert floor == ["b0.bk", "b1.bk"]  # the key biases: softmax ignores a shift shared by a query's scores
    assert gradients == len(param_shapes(PRESETS["default"].with_(**page.GPT2_LAYOUT)))
    assert float(row["NumPy vs transformers"]) < 1e-12 and row["the whole cross-check"].endswith("pass")
    real = crosscheck_hf.loss_and_grads
    monkeypatch.setattr(crosscheck_hf, "loss_and_grads",
                        lambda *a: (lambda loss, g: (loss, {**g, "b0.wv": g["b0.wv"] * (1 + 1e-6)}))(*real(*a)))
    wrong = cpu_row(page.crosscheck_table()[0])
    assert 5e-7 < float(wrong["NumPy vs transformers"]) < 2e-6 and float(wrong["NumPy vs torch"]) < 1e-12
    assert not wrong["the whole cross-check"].endswith("pass")
