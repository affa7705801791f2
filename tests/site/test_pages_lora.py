"""The claims of the LoRA and QLoRA pages, read as a test would: each check the pages show passes on the real
code and fails when the code it judges is wrong, and each sentence of docs/finetuning/lora.md and qlora.md that
interprets a number holds for the number the generator returns."""

import re

import numpy as np
import pytest

from site_scripts import registry, sections
from site_scripts.pages import _lora_checks, _lora_cli, _lora_example, _qlora_bytes, _qlora_memory, lora, qlora
from tools.mutant_catalogue import MUTANTS

FINE_TUNING_MUTANTS = [m for m in MUTANTS if m.subject[0] in ("transformer/lora.py", "transformer/finetune.py")]


def result_cells(text):
    """The last cell of every row of the markdown tables of a fragment."""
    return [row.rsplit(" | ", 1)[-1].rstrip(" |") for row in text.splitlines()
            if row.startswith("| ") and not row.startswith("| Check ") and "---|" not in row]


# ---------------------------------------------------------------- the registry and the navigation

def test_fine_tuning_sits_between_training_and_generation_with_lora_first_and_qlora_last():
    sections_in_order = [next(iter(entry)) for entry in registry.nav() if isinstance(next(iter(entry.values())), list)]
    assert sections_in_order.index("Training") + 1 == sections_in_order.index("Fine-tuning")
    assert sections_in_order.index("Fine-tuning") + 1 == sections_in_order.index("Generation")
    ids = [p.id for p in registry.PAGES if p.section == "Fine-tuning"]
    assert ids[0] == "lora" and ids[-2:] == ["qlora", "quiz_finetuning"]  # the chapter ends with its quiz


@pytest.mark.parametrize("mutant", FINE_TUNING_MUTANTS, ids=lambda m: m.name)
def test_every_fine_tuning_mutant_is_in_a_function_a_page_lists(mutant):
    assert sections.function_page(*mutant.subject) in ("lora", "qlora"), mutant.subject


# ---------------------------------------------------------------- LoRA: the picture, the example and the checks

def test_the_pictured_update_has_the_adapters_rank_and_training_lowered_the_loss():
    png, values = lora.figure()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    assert values["rank"] == lora.FIGURE_LORA.rank < min(values["shape"])
    assert values["sv_next"] < 1e-12 * values["sv_r"]  # "the next one ..., rounding"
    assert values["loss1"] < values["loss0"]  # "the steps took the loss on that batch from ... to ..."


def test_the_example_shows_step_zero_equal_to_the_base_and_only_b_moving_after_one_step():
    tables, values = _lora_example.tiny_example()
    assert values["step0_equal"] and values["a_unchanged"] and not values["a_decayed"]
    assert values["zero_a"] == values["lora_a"] == 2 * lora.tiny().cfg.num_layers  # q and v of every block
    assert values["dxa_max"] == values["da_max"] == 0  # W_B = 0 at step 0: "zero in every entry"
    assert values["moved_gap"] < 1e-6  # "every |W_B| is the learning rate"
    assert values["y1_gap"] < 1e-12
    assert {"x", "w", "a", "bm", "y0", "dy", "xa", "dbm", "bm1", "correction", "y1"} == set(tables)


def test_the_layers_upstream_gradient_is_the_models_and_gives_the_adapters_gradient():
    ex, lora_cfg = lora.tiny(), _lora_example.EXAMPLE_LORA
    adapters = lora.init_adapters(lora.param_shapes(ex.cfg), lora_cfg, seed=lora.SEED)
    bw = _lora_example.layer_backward(ex, adapters)
    np.testing.assert_allclose(bw.dbm, lora_cfg.scale * bw.xa.T @ bw.dy, rtol=1e-12, atol=1e-15)
    np.testing.assert_array_equal(bw.dbm, bw.grads["b0.wq.lora_b"])
    assert not bw.dy[0].any() and bw.dy[1:].any()  # "Row 0 of ∂ℓ/∂Y is zero": position 0 attends to itself alone


def test_a_gradient_of_w_b_the_arithmetic_does_not_give_is_refused():
    ex, lora_cfg = lora.tiny(), _lora_example.EXAMPLE_LORA
    bw = _lora_example.layer_backward(ex, lora.init_adapters(lora.param_shapes(ex.cfg), lora_cfg, seed=lora.SEED))
    entry = _lora_example.db_entry(bw, 1, 1)
    assert entry["value"] == pytest.approx(entry["returned"], abs=1e-15)
    wrong = _lora_example.LayerBackward(bw.dy, bw.xa, bw.dxa, bw.da, 2 * bw.dbm, bw.grads)  # negative control
    with pytest.raises(RuntimeError, match="by hand disagrees"):
        _lora_example.db_entry(wrong, 1, 1)


def test_the_update_shrinks_about_as_the_square_root_of_the_rank_and_alpha_over_root_r_holds_it():
    """The wording of 'The scale and the rank': the first step's W_B entries are the learning rate, the update
    with alpha / r shrinks by about sqrt(r_hi / r_lo), and alpha / sqrt(r) keeps it within a narrower band."""
    _, values = _lora_example.ranks()
    assert 0.99 < values["moved_lo"] <= values["moved_hi"] < 1.0 + 1e-9
    assert 0.7 * values["sqrt"] < values["shrink"] < 1.3 * values["sqrt"]
    assert values["stable_hi"] / values["stable_lo"] < values["shrink"] / 2


def test_every_lora_check_passes_on_the_real_code():
    tables, values = _lora_checks.checks()
    assert values["failed"] == 0 and "**FAIL**" not in tables["checks"] + tables["chain"]
    assert values["total"] == 6 + 2 * 13  # six checks; both factors of the 13 weights
    assert tables["checks"].count("| pass |") == 6 and tables["chain"].count("| pass |") == 2 * 13
    assert values["moved"] > values["moved_at_least"]


def test_a_merge_that_forgets_the_scale_fails_the_merge_check(monkeypatch):
    real = _lora_checks.merge
    monkeypatch.setattr(_lora_checks, "merge", lambda p, a, cfg: real(p, a, type(cfg)(cfg.rank, cfg.rank,
                                                                                     cfg.targets)))  # scale 1
    tables, values = _lora_checks.checks()
    assert re.search(r"\| merged model's logits = the adapted model's \|.*\*\*FAIL\*\* \|", tables["checks"])
    assert values["failed"] >= 1


def test_adapter_gradients_without_the_scale_fail_the_chain_rule(monkeypatch):
    real = _lora_checks.adapter_loss_and_grads

    def unscaled(*args, **kwargs):
        loss, grads = real(*args, **kwargs)
        return loss, {k: g / _lora_checks.CHECK_LORA.scale for k, g in grads.items()}

    monkeypatch.setattr(_lora_checks, "adapter_loss_and_grads", unscaled)
    rows, _ = _lora_checks.chain_rows(*_lora_checks.setting())
    assert all(row[2] == row[4] == "**FAIL**" for row in rows)


def test_a_time_range_gradient_that_leaks_into_the_context_fails(monkeypatch):
    real = _lora_checks.cross_entropy_time_range_backward
    monkeypatch.setattr(_lora_checks, "cross_entropy_time_range_backward", lambda d, cache: real(d, cache) + 1e-3)
    _, rows = _lora_checks.time_range_rows(*_lora_checks.setting())
    assert rows[0][-1] == "**FAIL**" and rows[0][2] != "0"


def test_the_step_zero_check_fails_when_b_starts_random(monkeypatch):
    real = _lora_checks.init_adapters
    monkeypatch.setattr(_lora_checks, "init_adapters", lambda *a, **k: {
        n: v + 0.1 for n, v in real(*a, **k).items()})
    rows = _lora_checks.step0_row(_lora_checks.default_run())
    assert rows[0][-1] == "**FAIL**" and rows[0][2] == "False"


def test_the_model_gradient_check_moves_every_adapter_of_every_target():
    table, values = lora.model_gradcheck()
    rows = [r for r in table.splitlines() if r.startswith("| `")]
    names = {r.split("`")[1] for r in rows}
    expected = {f"{w}.lora_{f}" for w in lora.param_shapes(lora.tiny().cfg)
                if w.rsplit(".", 1)[-1] in lora.TARGETS.values() for f in "ab"}
    assert names == expected and all(r.endswith("| pass |") for r in rows)
    assert values["entries"] == sum(int(np.prod(s)) for s in lora.adapter_shapes(
        lora.param_shapes(lora.tiny().cfg), lora.ALL_TARGETS).values())


def test_the_adapter_counts_are_the_sizes_adapter_shapes_gives():
    tables, _ = lora.targets()
    cfg = lora.PRESETS["default"]
    n_a = sum(int(np.prod(s)) for s in lora.adapter_shapes(lora.param_shapes(cfg), lora.LoRAConfig()).values())
    assert f"| `default` | \\(d\\) = {cfg.emb_dim}, \\(L\\) = {cfg.num_layers}, \\(F\\) = {cfg.ff_dim} | q, v | " \
           f"{n_a:,} | {lora.param_count(cfg):,} | {n_a / lora.param_count(cfg):.2%} |" in tables["fraction"]


# ---------------------------------------------------------------- LoRA: the command line

def test_the_command_line_section_runs_for_real_and_shows_no_temporary_path():
    tables, values = _lora_cli.cli()
    assert values["status"] == values["plain_status"] == values["adapted_status"] == 0
    assert "/tmp" not in " ".join(map(str, [*tables.values(), *values.values()]))
    assert values["meta"]["sha"] == values["meta"]["rehash"]  # "Hashing base/checkpoint.npz again gives" the same
    arrays = re.findall(r"\| `(param|adam_m|adam_v)/([\w.]+)` \|", tables["adapter_file"])
    by_group = {g: {n for gg, n in arrays if gg == g} for g in ("param", "adam_m", "adam_v")}
    assert by_group["param"] == by_group["adam_m"] == by_group["adam_v"] == {
        f"b0.{w}.lora_{f}" for w in ("wq", "wv", "ff2_w") for f in "ab"}
    refusals = [r for r in tables["refusals"].splitlines() if r.startswith("| ") and "python -m transformer" in r]
    assert len(refusals) == len(_lora_cli.REFUSALS)
    assert all(" | 2 | `error: " in r for r in refusals)
    assert 0 < values["differ"] <= values["chars"]  # "they differ at N of M characters"
    assert values["learn_from"] == 2  # "makes the first N positions of every window context only"


def test_the_samples_are_compared_character_by_character():
    assert _lora_cli.differ("to be", "to be") == (0, 5)
    assert _lora_cli.differ("to be", "to bee") == (1, 6)


# ---------------------------------------------------------------- QLoRA

@pytest.fixture
def small_configs(monkeypatch, tmp_path):
    """The presets only (the larger config takes seconds to quantize and to step), measured into a cache of the
    test's own."""
    monkeypatch.setattr(_qlora_memory, "CACHE", tmp_path)
    monkeypatch.setattr(_qlora_memory, "CONFIGS", {k: v for k, v in _qlora_memory.CONFIGS.items() if k in ("default", "A")})
    monkeypatch.setattr(_qlora_memory, "timed_configs", lambda: ("default",))


def test_the_measured_bytes_equal_their_formula_and_a_wrong_payload_is_reported(small_configs, monkeypatch):
    tables, values, found = _qlora_memory.bytes_held()
    assert values["equal"] == values["rows"] == 2 * len(_qlora_memory.METHODS)  # "In N of the N rows ... equal"
    rows = [r for r in tables["bytes"].splitlines() if re.match(r"\| (default|A) \| ", r)]
    assert len(rows) == values["rows"] and all(r.endswith("| equal |") for r in rows)
    assert found["default", "QLoRA"].total < found["default", "full"].total / 5
    assert all(found[n, "LoRA"].weights > found[n, "LoRA"].total / 2 for n in ("default", "A"))  # "most of what it holds"
    assert _qlora_memory.bytes_png(found)[:8] == b"\x89PNG\r\n\x1a\n"
    monkeypatch.setattr(_qlora_bytes, "payload_bytes", lambda n: 4 * n)  # negative control: a float32 base
    tables, values, _ = _qlora_memory.bytes_held()
    assert values["equal"] == values["rows"] - 2
    assert len(re.findall(r"\| (default|A) \| QLoRA \|.*\*\*differs\*\*", tables["bytes"])) == 2


def test_the_step_table_has_every_method_and_lora_steps_hold_less_than_full(small_configs):
    table, values = _qlora_memory.steps()
    rows = {r.split(" | ")[1]: r.split(" | ") for r in table.splitlines() if r.startswith("| default |")}
    assert set(rows) == set(_qlora_memory.METHODS)
    assert float(rows["LoRA"][2]) < float(rows["full"][2])  # no weight gradients, no dense AdamW update
    assert values["timed"] == ["default"] and values["untimed"] == ["A"]


def test_the_tiny_example_fits_one_block_and_costs_fewer_bytes_than_float32():
    tables, values = qlora.example()
    assert values["blocks"] == 1  # "so 1 block of 64 holds them all"
    assert values["nbytes"] == values["packed"] + values["codes8"] + values["absmax2"] + 4 < values["float32"]
    assert "| a dense layer holding \\(W_{\\mathrm{NF4}}\\) | 0 |" in tables["gaps"] or \
        re.search(r"\| a dense layer holding .* \| \de-1[5-7] \|", tables["gaps"])  # "by rounding only"


def test_every_qlora_check_passes_on_the_real_code():
    table, _ = qlora.checks()
    assert "**FAIL**" not in table
    assert sum(c == "pass" for c in result_cells(table)) == 5


def test_qlora_gradients_against_an_undecoded_base_fail(monkeypatch):
    ex = qlora.default_run()
    monkeypatch.setattr(qlora, "dense_base", lambda base: ex.params)  # negative control: the float base, not NF4's
    targets = np.random.default_rng(1).integers(0, ex.cfg.vocab_size, ex.ids.shape)
    adapters = qlora.trained(qlora.init_adapters(qlora.param_shapes(ex.cfg), qlora.CHECK_LORA))
    assert qlora.gradients_row(ex, targets, adapters)[-1] == "**FAIL**"


def test_a_training_step_that_writes_into_the_base_fails_the_base_check(monkeypatch):
    real = qlora.train_step

    def writes(run, ids, seq_len):
        run.base["lnf_b"] += 1e-3  # negative control: the frozen base moves
        return real(run, ids, seq_len)

    monkeypatch.setattr(qlora, "train_step", writes)
    rows = qlora.training_rows()
    assert rows[0][-1] == "**FAIL**" and rows[0][2] == "1"
