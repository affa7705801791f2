"""The claims of the LoRA and QLoRA pages, read as a test would: each check the pages show passes on the real
code and fails when the code it judges is wrong, and each generated sentence follows the numbers behind it."""

import re

import numpy as np
import pytest

from site_scripts import registry, sections
from site_scripts.pages import _lora_checks, _lora_cli, _qlora_memory, lora, qlora
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
    assert ids[0] == "lora" and ids[-1] == "qlora"


@pytest.mark.parametrize("mutant", FINE_TUNING_MUTANTS, ids=lambda m: m.name)
def test_every_fine_tuning_mutant_is_in_a_function_a_page_lists(mutant):
    assert sections.function_page(*mutant.subject) in ("lora", "qlora"), mutant.subject


# ---------------------------------------------------------------- LoRA: the example and the checks

def test_the_example_shows_step_zero_equal_to_the_base_and_only_b_moving_after_one_step():
    text = lora.example_md()
    assert "the same array (`np.array_equal`: True)" in text
    zero, total = (int(n) for n in re.search(r"\((\d+) of the (\d+) `lora_a` gradients are all zeros\)", text).groups())
    assert zero == total == 2 * lora.tiny().cfg.num_layers  # q and v of every block
    assert "before it (`np.array_equal`: True)" in text


def test_every_lora_check_passes_on_the_real_code():
    text = _lora_checks.checks_md()
    cells = result_cells(text)
    assert "pass" in cells and "**FAIL**" not in text and text.rstrip().endswith("Every check above passed.")
    assert text.count("| pass |") == 6 + 2 * 13  # six checks; both factors of the 13 weights


def test_a_merge_that_forgets_the_scale_fails_the_merge_check(monkeypatch):
    real = _lora_checks.merge
    monkeypatch.setattr(_lora_checks, "merge", lambda p, a, cfg: real(p, a, type(cfg)(cfg.rank, cfg.rank,
                                                                                     cfg.targets)))  # scale 1
    text = _lora_checks.checks_md()
    assert re.search(r"\| merged model's logits = the adapted model's \|.*\*\*FAIL\*\* \|", text)
    assert "checks above failed" in text


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
    text = lora.model_gradcheck_md()
    rows = [r for r in text.splitlines() if r.startswith("| `")]
    names = {r.split("`")[1] for r in rows}
    expected = {f"{w}.lora_{f}" for w in lora.param_shapes(lora.tiny().cfg)
                if w.rsplit(".", 1)[-1] in lora.TARGETS.values() for f in "ab"}
    assert names == expected and all(r.endswith("| pass |") for r in rows)


def test_the_adapter_counts_are_the_sizes_adapter_shapes_gives():
    text = lora.targets_md()
    cfg = lora.PRESETS["default"]
    n_a = sum(int(np.prod(s)) for s in lora.adapter_shapes(lora.param_shapes(cfg), lora.LoRAConfig()).values())
    assert f"| `default` | \\(d\\) = {cfg.emb_dim}, \\(L\\) = {cfg.num_layers}, \\(F\\) = {cfg.ff_dim} | q, v | " \
           f"{n_a:,} | {lora.param_count(cfg):,} | {n_a / lora.param_count(cfg):.2%} |" in text


# ---------------------------------------------------------------- LoRA: the command line

def test_the_command_line_section_runs_for_real_and_prints_no_temporary_path():
    text = _lora_cli.cli_md()
    assert "It exited with status 0." in text and "/tmp" not in text and "Hashing `base/checkpoint.npz` again " \
        "gives the same digest" in text
    arrays = re.findall(r"\| `(param|adam_m|adam_v)/([\w.]+)` \|", text)
    by_group = {g: {n for gg, n in arrays if gg == g} for g in ("param", "adam_m", "adam_v")}
    assert by_group["param"] == by_group["adam_m"] == by_group["adam_v"] == {
        f"b0.{w}.lora_{f}" for w in ("wq", "wv", "ff2_w") for f in "ab"}
    refusals = [r for r in text.splitlines() if r.startswith("| ") and "python -m transformer" in r]
    assert len(refusals) == len(_lora_cli.REFUSALS)
    assert all(" | 2 | `error: " in r for r in refusals)
    assert "they differ at" in text


def test_the_samples_sentence_says_when_the_adapter_changed_nothing():
    assert _lora_cli.differ_text("to be", "to be").startswith("**they are the same**")
    assert _lora_cli.differ_text("to be", "to bee") == "they differ at 1 of 6 characters"


# ---------------------------------------------------------------- QLoRA

@pytest.fixture
def small_configs(monkeypatch, tmp_path):
    """The presets only (the larger config takes seconds to quantize and to step), measured into a cache of the
    test's own."""
    monkeypatch.setattr(_qlora_memory, "CACHE", tmp_path)
    monkeypatch.setattr(_qlora_memory, "CONFIGS", {k: v for k, v in _qlora_memory.CONFIGS.items() if k in ("default", "A")})
    monkeypatch.setattr(_qlora_memory, "timed_configs", lambda: ("default",))


def test_the_measured_bytes_equal_their_formula_and_a_wrong_payload_is_reported(small_configs, monkeypatch):
    text = _qlora_memory.bytes_md()
    assert "Every measured number equals its formula to the byte." in text
    rows = [r for r in text.splitlines() if re.match(r"\| (default|A) \| ", r)]
    assert len(rows) == 2 * len(_qlora_memory.METHODS) and all(r.endswith("| equal |") for r in rows)
    qlora_total, full_total = (float(r.split(" | ")[5]) for r in rows[2::-2])
    assert qlora_total < full_total / 5
    monkeypatch.setattr(_qlora_memory, "payload_bytes", lambda n: 4 * n)  # negative control: a float32 base
    assert "**The formula and the arrays disagree** at default QLoRA, A QLoRA." in _qlora_memory.bytes_md()


def test_the_step_table_has_every_method_and_lora_steps_hold_less_than_full(small_configs):
    text = _qlora_memory.peak_md()
    rows = {r.split(" | ")[1]: r.split(" | ") for r in text.splitlines() if r.startswith("| default |")}
    assert set(rows) == set(_qlora_memory.METHODS)
    assert float(rows["LoRA"][2]) < float(rows["full"][2])  # no weight gradients, no dense AdamW update


def test_every_qlora_check_passes_on_the_real_code():
    text = qlora.checks_md()
    assert "**FAIL**" not in text
    assert sum(c == "pass" for c in result_cells(text)) == 5


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
