"""The catalogue of bad inputs the Bad inputs page runs, and the files they name.

Each case is one mistake: a library call (evaluated after setup(), in a folder that make_fixtures
filled), a command line, or both, with what the error must mention and the tests that check it, named
by their function only (the page finds their files under tests/). tools/refusals.py runs them and
refuses any that is not refused properly; site_scripts/pages/bad_inputs.py renders the page.
"""

import argparse
import contextlib
import inspect
import io
import json
import sys
import tempfile
import textwrap
from pathlib import Path

import numpy as np


from transformer.checkpoint import FORMAT, VERSION, Checkpoint, save_checkpoint
from transformer.config import PRESETS
from transformer.data import CharTokenizer
from transformer.finetune_run import finetune
from transformer.lora import LoRAConfig
from transformer.model import init_params
from transformer.train import train
from transformer.train_config import TrainConfig

from .common import parse

from tools.refusals import Case, run_all, working_directory

SEED = 0  # of setup()'s parameters and of the fixtures' runs (the page's provenance names it)


def setup():
    """What every library call below is evaluated after. The page shows its body, the `python -O` check runs
    that text (setup_text), and the build calls it; its imports are real, so the page's cache key follows them."""
    import numpy as np
    from transformer.checkpoint import load_checkpoint
    from transformer.config import PRESETS, ModelConfig
    from transformer.data import CharTokenizer, load_corpus
    from transformer.generate import generate
    from transformer.kv_cache import PagePool
    from transformer.lora import LoRAConfig
    from transformer.model import forward, init_params, loss_and_grads
    from transformer.scheduler import Request, Scheduler
    from transformer.train import train
    from transformer.train_config import TrainConfig
    cfg = PRESETS["tiny"]
    params = init_params(cfg, seed=0)
    ids = np.array([0, 1, 2, 3])
    return locals()


def setup_text():
    """setup()'s body as a script: dedented, without its docstring and its `return locals()`."""
    source = textwrap.dedent(inspect.getsource(setup))
    body = parse(source).body[0].body
    lines = source.splitlines(keepends=True)[body[1].lineno - 1:body[-2].end_lineno]
    return textwrap.dedent("".join(lines))


TEXT = "To be, or not to be, that is the question:\nWhether 'tis nobler in the mind to suffer\n" * 8
# The tests that check several cases.
BAD_IDS = "test_bad_ids_raise_input_error_naming_the_problem"
BAD_TARGETS = "test_bad_targets_raise_input_error_naming_the_problem"
BAD_SETTINGS = "test_training_refuses_bad_settings"
TRAIN_ERRORS = "test_train_errors_are_one_line"
SAMPLE_ERRORS = "test_sample_errors_are_one_line"
GENERATION_ERRORS = "test_bad_generation_arguments_are_named"
CORPUS_ERRORS = "test_load_corpus_names_what_is_wrong"
BAD_CHECKPOINTS = "test_sample_refuses_bad_checkpoints"
USAGE_ERRORS = "test_more_usage_mistakes_are_one_line"
BAD_FINETUNE = "test_bad_fine_tuning_settings_are_one_clear_line"
FINETUNE = "finetune --checkpoint done/checkpoint.npz --corpus corpus.txt --out new"

GROUPS = {
    "Token ids, targets and parameters": (
        Case("id-too-large", "An id equal to V",
             call="forward(params, np.array([0, cfg.vocab_size]), cfg)", names=("must lie in", "found"),
             tests=(BAD_IDS,)),
        Case("negative-id", "A negative id",
             call="forward(params, np.array([3, -1]), cfg)", names=("found -1",), tests=(BAD_IDS,)),
        Case("too-long", "More tokens than the position table has rows",
             call="forward(params, np.zeros(cfg.context_len + 1, dtype=np.int64), cfg)",
             names=("longer than the position table",), tests=(BAD_IDS,)),
        Case("float-ids", "Ids that are not integers",
             call="forward(params, np.array([0.0, 1.0]), cfg)", names=("must be integers", "float64"),
             tests=(BAD_IDS,)),
        Case("bool-ids", "Booleans as ids",
             call="forward(params, np.array([True, False]), cfg)", names=("must be integers", "bool"),
             tests=(BAD_IDS,)),
        Case("empty-ids", "No ids at all",
             call="forward(params, [], cfg)", names=("empty",),
             tests=(BAD_IDS, "test_empty_ids_and_targets_raise_input_error_in_loss")),
        Case("ids-3d", "Ids with three axes",
             call="forward(params, np.zeros((1, 2, 3), dtype=np.int64), cfg)", names=("(T,) or (B, T)",),
             tests=(BAD_IDS,)),
        Case("targets-shape", "Targets of another shape",
             call="loss_and_grads(params, ids, ids[:3], cfg)", names=("targets have shape",), tests=(BAD_TARGETS,)),
        Case("target-too-large", "A target outside the vocabulary",
             call="loss_and_grads(params, ids, np.array([0, 1, cfg.vocab_size, 2]), cfg)",
             names=("targets must lie in",), tests=(BAD_TARGETS,)),
        Case("negative-target", "A negative target",
             call="loss_and_grads(params, ids, np.array([0, -1, 2, 3]), cfg)", names=("found -1",),
             tests=(BAD_TARGETS,)),
        Case("params-mismatch", "Parameters of another size",
             call='forward({**params, "head_w": np.zeros((cfg.emb_dim, cfg.emb_dim))}, ids, cfg)',
             names=("'head_w' has shape",), tests=("test_parameters_that_do_not_fit_the_config_are_named",)),
    ),
    "Model and training settings": (
        Case("heads", "Heads that do not divide the width",
             call="ModelConfig(emb_dim=10, num_heads=3)",
             cli="train --corpus corpus.txt --out new --emb-dim 10 --num-heads 3",
             names=("num_heads=3 does not divide emb_dim=10",),
             tests=("test_num_heads_not_dividing_emb_dim_raises_config_error", TRAIN_ERRORS)),
        Case("zero-size", "A size of zero",
             call="ModelConfig(context_len=0)", cli="train --corpus corpus.txt --out new --context-len 0",
             names=("context_len must be a positive integer",),
             tests=("test_sizes_must_be_positive_integers", TRAIN_ERRORS)),
        Case("window-too-long", "Training windows longer than the context",
             call='train("corpus.txt", "new", cfg, TrainConfig(seq_len=cfg.context_len + 1))',
             cli="train --corpus corpus.txt --out new --seq-len 64", names=("is longer than context_len",),
             tests=(BAD_SETTINGS, TRAIN_ERRORS)),
        Case("flash-tile-zero", "Flash attention with tiles of no keys",
             call="ModelConfig(attention='flash', flash_tile=0)",
             cli="train --corpus corpus.txt --out new --attention flash --flash-tile 0",
             names=("flash_tile must be a positive integer",),
             tests=("test_bad_memory_policy_settings_are_refused_by_name",)),
        Case("attention-unknown", "An attention that does not exist",
             call="ModelConfig(attention='sparse')", names=("attention must be one of",),
             tests=("test_bad_memory_policy_settings_are_refused_by_name",)),
        Case("zero-steps", "A run of zero steps",
             call="TrainConfig(steps=0)", cli="train --corpus corpus.txt --out new --steps 0",
             names=("steps must be a positive integer",), tests=(BAD_SETTINGS, TRAIN_ERRORS)),
        Case("setting-type", "A training setting of the wrong type",
             call='TrainConfig(beta1="0.9")', names=("beta1 must lie in [0, 1)",),
             tests=("test_a_setting_of_the_wrong_type_is_a_config_error",)),
        Case("setting-bool", "True or False where a number belongs",
             call="TrainConfig(steps=True)", names=("steps must be a positive integer, got True",),
             tests=("test_a_setting_of_the_wrong_type_is_a_config_error",)),
        Case("zero-minutes", "A time limit of zero minutes",
             call='train("corpus.txt", "new", cfg, TrainConfig(), max_minutes=0)',
             cli="train --corpus corpus.txt --out new --max-minutes 0",
             names=("max_minutes must be a positive number",), tests=("test_max_minutes_must_be_positive",)),
    ),
    "Corpus": (
        Case("corpus-missing", "A corpus that does not exist",
             call='load_corpus("missing.txt")', cli="train --corpus missing.txt --out new",
             names=("missing.txt does not exist",),
             tests=(CORPUS_ERRORS, TRAIN_ERRORS, "test_the_real_command_prints_no_traceback_for_a_user_mistake")),
        Case("corpus-empty", "An empty corpus",
             call='load_corpus("empty.txt")', cli="train --corpus empty.txt --out new", names=("is empty",),
             tests=(CORPUS_ERRORS, TRAIN_ERRORS)),
        Case("corpus-short", "A corpus too short for one window",
             call='train("short.txt", "new", cfg, TrainConfig())', cli="train --corpus short.txt --out new",
             names=("short.txt has 3 tokens",), tests=(BAD_SETTINGS, TRAIN_ERRORS)),
        Case("corpus-not-utf8", "A corpus that is not UTF-8",
             call='load_corpus("latin1.txt")', cli="train --corpus latin1.txt --out new",
             names=("not UTF-8", "at byte offset"), tests=(CORPUS_ERRORS, TRAIN_ERRORS)),
        Case("corpus-folder", "A folder given as the corpus",
             call='load_corpus("texts")', cli="train --corpus texts --out new", names=("is a directory",),
             tests=("test_load_corpus_refuses_a_directory", TRAIN_ERRORS)),
        Case("no-corpus", "No corpus at all",
             cli="train --out new", names=("no corpus",), tests=("test_train_without_a_corpus_says_how_to_give_one",)),
    ),
    "Checkpoints": (
        Case("checkpoint-missing", "A checkpoint that does not exist",
             call='load_checkpoint("none.npz")', cli="sample --checkpoint none.npz", names=("does not exist",),
             tests=("test_missing_checkpoint", BAD_CHECKPOINTS)),
        Case("checkpoint-truncated", "A truncated checkpoint",
             call='load_checkpoint("truncated.npz")', cli="sample --checkpoint truncated.npz", names=("truncated",),
             tests=("test_truncated_checkpoint", BAD_CHECKPOINTS)),
        Case("checkpoint-foreign", "Another program's .npz",
             call='load_checkpoint("foreign.npz")', cli="sample --checkpoint foreign.npz",
             names=("not a checkpoint of this project",), tests=("test_foreign_npz_is_refused", BAD_CHECKPOINTS)),
        Case("checkpoint-version", "A checkpoint of a newer format",
             call='load_checkpoint("newer.npz")', cli="sample --checkpoint newer.npz",
             names=(f"format version {VERSION + 1}",), tests=("test_other_format_name_or_version_is_refused",)),
        Case("checkpoint-mismatch", "A checkpoint whose parameters do not match its configuration",
             call='load_checkpoint("mismatched.npz")', cli="sample --checkpoint mismatched.npz",
             names=("its config needs",), tests=("test_parameters_that_do_not_match_the_config_are_refused",)),
        Case("checkpoint-pickle", "A checkpoint holding a pickled object",
             call='load_checkpoint("pickled.npz")', cli="sample --checkpoint pickled.npz", names=("pickled objects",),
             tests=("test_pickled_objects_are_refused_not_executed",)),
    ),
    "Runs in --out": (
        Case("out-holds-run", "An --out that already holds a run",
             call='train("corpus.txt", "run", cfg, TrainConfig())', cli="train --corpus corpus.txt --out run",
             names=("already holds a run",),
             tests=("test_a_new_run_never_overwrites_an_existing_one_by_accident",
                    "test_a_second_train_into_the_same_folder_is_refused")),
        Case("resume-other-corpus", "Resuming on a different corpus",
             call='train("other.txt", "run", cfg, TrainConfig(), resume=True)',
             cli="train --resume --out run --corpus other.txt", names=("the corpus differs",),
             tests=("test_resume_refuses_a_different_corpus", "test_a_refused_resume_leaves_the_run_as_it_was")),
        Case("resume-truncated", "Resuming from a truncated checkpoint",
             call='train("corpus.txt", "broken", cfg, TrainConfig(), resume=True)', cli="train --resume --out broken",
             names=("truncated",),
             tests=("test_truncated_checkpoint", "test_a_refused_resume_leaves_the_run_as_it_was")),
        Case("resume-tampered", "Resuming from a checkpoint with an invalid training state",
             call='train("corpus.txt", "tampered", cfg, TrainConfig(), resume=True)',
             cli="train --resume --out tampered", names=("invalid training state",),
             tests=("test_resume_refuses_a_checkpoint_with_an_invalid_training_state",)),
        Case("resume-finished", "Resuming a run that finished",
             call='train("corpus.txt", "done", cfg, TrainConfig(), resume=True)', cli="train --resume --out done",
             names=("already finished",), tests=("test_resuming_a_finished_run_says_there_is_nothing_to_do",)),
        Case("resume-nothing", "Resuming where no run is",
             call='train("corpus.txt", "new", cfg, TrainConfig(), resume=True)', cli="train --resume --out new",
             names=("does not exist",),
             tests=(BAD_SETTINGS, TRAIN_ERRORS, "test_resume_where_no_run_is_names_the_missing_checkpoint")),
        Case("resume-options", "Resuming with new settings",
             cli="train --resume --out run --lr 0.1", names=("drop --lr",),
             tests=(TRAIN_ERRORS, "test_resume_needs_only_the_out_folder")),
        Case("out-is-a-file", "An --out that is a file",
             call='train("corpus.txt", "notes.txt", cfg, TrainConfig())',
             cli="train --corpus corpus.txt --out notes.txt", names=("notes.txt is a file",),
             tests=("test_an_out_dir_that_is_a_file_is_refused_and_left_alone",
                    "test_an_unwritable_out_folder_is_one_line")),
    ),
    "Sampling": (
        Case("temperature-negative", "A negative temperature",
             call="generate(params, cfg, [0, 1], 10, temperature=-1.0)",
             cli="sample --checkpoint model.npz --prompt ab --temperature -1", names=("temperature must be",),
             tests=(GENERATION_ERRORS, SAMPLE_ERRORS)),
        Case("temperature-nan", "A temperature that is not a number",
             call='generate(params, cfg, [0, 1], 10, temperature=float("nan"))',
             cli="sample --checkpoint model.npz --prompt ab --temperature nan", names=("temperature must be",),
             tests=(GENERATION_ERRORS, SAMPLE_ERRORS)),
        Case("top-k", "A top-k of zero",
             call="generate(params, cfg, [0, 1], 10, top_k=0)",
             cli="sample --checkpoint model.npz --prompt ab --top-k 0", names=("top_k must be",),
             tests=(GENERATION_ERRORS, SAMPLE_ERRORS)),
        Case("tokens-negative", "A negative number of tokens",
             call="generate(params, cfg, [0, 1], -1)", cli="sample --checkpoint model.npz --prompt ab --tokens -1",
             names=("number of tokens",), tests=(GENERATION_ERRORS, SAMPLE_ERRORS)),
        Case("prompt-unknown", "A prompt with a character outside the vocabulary",
             call='CharTokenizer("abcde").encode("abz")', cli="sample --checkpoint model.npz --prompt abz",
             names=("'z' (U+007A)",), tests=("test_char_tokenizer_rejects_a_character_it_has_not_seen", SAMPLE_ERRORS)),
        Case("prompt-empty", "An empty prompt",
             call="generate(params, cfg, [], 10)", cli="sample --checkpoint model.npz --prompt ''",
             names=("non-empty",), tests=(GENERATION_ERRORS, SAMPLE_ERRORS)),
        Case("page-size-zero", "KV pages of zero positions",
             call="PagePool(cfg, 4, 0, np.float64)",
             cli="sample --checkpoint model.npz --prompts-file prompts.txt --page-size 0",
             names=("page_size must be a positive integer",),
             tests=("test_bad_pool_sizes_are_refused_by_name", "test_bad_serving_options_are_one_line")),
        Case("pool-too-small", "A pool too small for one request",
             call="Scheduler(params, cfg, PagePool(cfg, 1, 1, np.float64)).submit(Request([0, 1], 4))",
             cli="sample --checkpoint model.npz --prompts-file prompts.txt --pool-pages 1 --page-size 1",
             names=("the pool has 1",),
             tests=("test_a_request_the_pool_could_never_hold_is_refused_at_submission",
                    "test_bad_serving_options_are_one_line")),
        Case("prompts-file-empty", "A prompts file with no prompt",
             cli="sample --checkpoint model.npz --prompts-file empty.txt", names=("holds no prompt",),
             tests=("test_bad_serving_options_are_one_line",)),
    ),
    "Fine-tuning": (
        Case("lora-rank-zero", "Adapters of rank zero",
             call="LoRAConfig(rank=0)", cli=f"{FINETUNE} --lora-rank 0",
             names=("lora rank must be a positive integer",),
             tests=("test_bad_lora_settings_are_refused_by_name", BAD_FINETUNE)),
        Case("lora-rank-too-large", "A rank larger than the model's width",
             cli=f"{FINETUNE} --lora-rank 5", names=("is larger than", "smaller side 4"),
             tests=("test_a_rank_larger_than_the_width_is_refused", BAD_FINETUNE)),
        Case("lora-target-unknown", "A target that is no projection",
             call='LoRAConfig(targets=("q", "attn"))', cli=f"{FINETUNE} --lora-targets q,attn",
             names=("lora targets must be some of",), tests=("test_bad_lora_settings_are_refused_by_name", BAD_FINETUNE)),
        Case("full-and-quantize", "Full fine-tuning of a quantized base",
             cli=f"{FINETUNE} --full --quantize nf4", names=("--full trains every parameter",), tests=(BAD_FINETUNE,)),
        Case("adapter-other-base", "An adapter applied to another base",
             cli="sample --checkpoint run/checkpoint.npz --adapter tuned/adapter.npz",
             names=("trained on another base",), tests=("test_an_adapter_for_another_base_is_refused",)),
        Case("adapter-other-shape", "An adapter for a base of another shape",
             cli="sample --checkpoint model.npz --adapter tuned/adapter.npz",
             names=("a base of another shape",), tests=("test_an_adapter_for_another_base_is_refused",)),
        Case("adapter-not-adapter", "A checkpoint given as the adapter",
             cli="sample --checkpoint done/checkpoint.npz --adapter done/checkpoint.npz",
             names=("is not an adapter file",), tests=("test_an_adapter_for_another_base_is_refused",)),
    ),
    "Checking commands": (
        Case("gradcheck-batch", "A gradient check on no sequences",
             cli="gradcheck --batch 0", names=("--batch must be at least 1",),
             tests=("test_gradcheck_refuses_an_empty_batch",)),
        Case("crosscheck-json", "A report path in a folder that does not exist",
             cli="crosscheck --devices cpu --json missing/report.json", names=("missing/report.json",),
             tests=("test_crosscheck_refuses_an_unwritable_json_path_before_running",)),
    ),
    "Usage": (
        Case("no-command", "No command",
             cli="", names=("required: command",), tests=(USAGE_ERRORS,)),
        Case("no-out", "A required option left out",
             cli="train --corpus corpus.txt", names=("required: --out",), tests=(USAGE_ERRORS,)),
        Case("unknown-option", "An option that does not exist",
             cli="train --out new --learning-rate 0.1", names=("unrecognized arguments",), tests=(USAGE_ERRORS,)),
        Case("not-a-number", "A word where a number belongs",
             cli="train --out new --steps ten", names=("invalid int value: 'ten'",), tests=(USAGE_ERRORS,)),
        Case("bad-choice", "A choice that is not offered",
             cli="train --out new --activation tanh", names=("invalid choice: 'tanh'",),
             tests=("test_usage_mistakes_are_one_line_too",)),
        Case("negative-seed", "A negative seed",
             cli="sample --checkpoint model.npz --seed -1", names=("must be >= 0",),
             tests=("test_usage_mistakes_are_one_line_too",)),
    ),

}
CASES = [case for cases in GROUPS.values() for case in cases]


def stop_after_first_step(step, stop):
    stop.reason = "interrupted"  # as Ctrl-C would: the run writes a checkpoint and can be resumed


def rewrite_meta(source, target, edit):
    """Copy a checkpoint, changing its JSON description with edit(meta)."""
    with np.load(source) as npz:
        arrays = {k: npz[k] for k in npz.files}
    meta = json.loads(str(arrays["meta"]))
    edit(meta)
    np.savez(target, **{**arrays, "meta": np.array(json.dumps(meta))})


def make_fixtures(folder):
    """The files the bad inputs name, written by the real library wherever a real file is needed."""
    Path(folder).mkdir(parents=True)
    with working_directory(folder), contextlib.redirect_stdout(io.StringIO()):  # train prints its losses
        Path("corpus.txt").write_text(TEXT)
        Path("other.txt").write_text(TEXT.upper())
        Path("empty.txt").write_bytes(b"")
        Path("short.txt").write_text("abc")
        Path("latin1.txt").write_bytes("café au lait\n".encode("latin-1"))
        Path("notes.txt").write_text("a file, not a folder\n")
        Path("prompts.txt").write_text("ab\ncab\n")
        Path("texts").mkdir()
        cfg, chars = PRESETS["tiny"], CharTokenizer("abcde")
        save_checkpoint("model.npz", Checkpoint(init_params(cfg, seed=SEED), cfg, chars))
        whole = Path("model.npz").read_bytes()
        Path("truncated.npz").write_bytes(whole[: len(whole) // 2])
        np.savez("foreign.npz", weights=np.zeros(3))
        wider = init_params(cfg.with_(emb_dim=2 * cfg.emb_dim), seed=SEED)
        save_checkpoint("mismatched.npz", Checkpoint(wider, cfg, chars))
        rewrite_meta("model.npz", "newer.npz", lambda meta: meta.update(version=VERSION + 1))
        np.savez("pickled.npz", meta=np.array([{"format": FORMAT}], dtype=object))
        small = TrainConfig(steps=2, batch_size=2, warmup=0, seed=SEED)
        train("corpus.txt", "run", cfg, small, progress=False, on_step=stop_after_first_step)  # resumable
        train("corpus.txt", "done", cfg, small, progress=False)  # finished
        Path("tampered").mkdir()
        rewrite_meta("run/checkpoint.npz", "tampered/checkpoint.npz",
                     lambda meta: meta["extra"].update(sampler_state={"bit_generator": "PCG64"}))
        train("corpus.txt", "broken", cfg, small, progress=False, on_step=stop_after_first_step)
        whole = Path("broken/checkpoint.npz").read_bytes()
        Path("broken/checkpoint.npz").write_bytes(whole[: len(whole) // 2])
        finetune("done/checkpoint.npz", "corpus.txt", "tuned", LoRAConfig(2, 4.0, ("q", "v")), small, progress=False)


def run_every_case(workdir):
    """Every case through the library and through the command line, each in its own copy of the fixtures
    made in workdir: {slug: (library Ran or None, command Ran or None)}. Raises RuntimeError at the first
    bad input that was not refused properly."""
    workdir = Path(workdir)
    make_fixtures(workdir / "fixtures")
    return run_all(CASES, setup(), workdir / "fixtures", workdir / "runs")


def main(argv=None):
    """python -m tools.bad_input_cases: the Bad inputs page's check without the site; exit 1 if one fails."""
    argparse.ArgumentParser(description="Run every bad input of the Bad inputs page through the library and the "
                                        "command line; exit 1 if one is not refused properly.").parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        try:
            results = run_every_case(tmp)
        except RuntimeError as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
    calls = sum(call is not None for call, _ in results.values())
    commands = sum(command is not None for _, command in results.values())
    print(f"{len(results)} bad inputs, each refused properly: {calls} library calls and {commands} commands")
    return 0


if __name__ == "__main__":
    sys.exit(main())
