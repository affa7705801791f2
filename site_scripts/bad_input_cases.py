"""The catalogue of bad inputs the Bad inputs page runs, and the files they name.

Each case is one mistake: a library call (evaluated after SETUP, in a folder that
make_fixtures filled), a command line, or both, with what the error must mention
and the tests that check it. site_scripts/refusals.py runs them and refuses any
that is not refused properly; site_scripts/pages/bad_inputs.py renders the page.
"""

import ast
import contextlib
import io
import json
from pathlib import Path

import numpy as np

from transformer.checkpoint import FORMAT, VERSION, Checkpoint, load_checkpoint, save_checkpoint
from transformer.config import PRESETS, ModelConfig
from transformer.data import CharTokenizer, load_corpus
from transformer.generate import generate
from transformer.model import forward, init_params, loss_and_grads
from transformer.train import TrainConfig, train

from .refusals import Case, working_directory

SEED = 0

# What every library call below is evaluated after; the page shows it, and `python -O` runs it too.
SETUP = f"""\
import numpy as np
from transformer.checkpoint import load_checkpoint
from transformer.config import PRESETS, ModelConfig
from transformer.data import CharTokenizer, load_corpus
from transformer.generate import generate
from transformer.model import forward, init_params, loss_and_grads
from transformer.train import TrainConfig, train
cfg = PRESETS["tiny"]
params = init_params(cfg, seed={SEED})
ids = np.array([0, 1, 2, 3])
"""
# The same objects, named in code: the page's cache key follows names, not strings (see
# site_scripts/depends.py). setup_namespace() checks that SETUP imports exactly these.
KEYED = {"load_checkpoint": load_checkpoint, "PRESETS": PRESETS, "ModelConfig": ModelConfig,
         "CharTokenizer": CharTokenizer, "load_corpus": load_corpus, "generate": generate,
         "forward": forward, "init_params": init_params, "loss_and_grads": loss_and_grads,
         "TrainConfig": TrainConfig, "train": train}

TEXT = "To be, or not to be, that is the question:\nWhether 'tis nobler in the mind to suffer\n" * 8
SAMPLE = ("sample", "--checkpoint", "model.npz", "--prompt", "ab")
TRAIN = ("train", "--corpus", "corpus.txt", "--out", "new")
MODEL = "tests/unit/test_model.py::"
CLI = "tests/unit/test_cli.py::"
TRAIN_TESTS = "tests/unit/test_train.py::"
CKPT = "tests/unit/test_checkpoint.py::"
BAD_IDS, BAD_TARGETS = MODEL + "test_bad_ids_raise_input_error_naming_the_problem", \
    MODEL + "test_bad_targets_raise_input_error_naming_the_problem"
TRAIN_ERRORS, SAMPLE_ERRORS = CLI + "test_train_errors_are_one_line", CLI + "test_sample_errors_are_one_line"
GEN_ERRORS = "tests/unit/test_generate.py::test_bad_generation_arguments_are_named"
CORPUS_ERRORS = "tests/unit/test_data.py::test_load_corpus_names_what_is_wrong"
BAD_CKPT, USAGE = CLI + "test_sample_refuses_bad_checkpoints", CLI + "test_usage_mistakes_are_one_line_too"

GROUPS = {
    "Token ids, targets and parameters": [
        Case("id-too-large", "An id equal to V", "The embedding table has rows 0 to V − 1; id V names no token.",
             "forward(params, np.array([0, cfg.vocab_size]), cfg)", names=("must lie in", "found"),
             tests=(BAD_IDS,)),
        Case("negative-id", "A negative id", "A negative id names no token.",
             "forward(params, np.array([3, -1]), cfg)", names=("found -1",), tests=(BAD_IDS,)),
        Case("too-long", "More tokens than the position table has rows",
             "Position T_max has no row in the position table.",
             "forward(params, np.zeros(cfg.context_len + 1, dtype=np.int64), cfg)",
             names=("longer than the position table",), tests=(BAD_IDS,)),
        Case("float-ids", "Ids that are not integers", "Floating-point ids are not token ids, even when they "
             "hold whole numbers.", "forward(params, np.array([0.0, 1.0]), cfg)",
             names=("must be integers", "float64"), tests=(BAD_IDS,)),
        Case("bool-ids", "Booleans as ids", "Booleans are not token ids, although numpy counts them as 0 and 1.",
             "forward(params, np.array([True, False]), cfg)", names=("must be integers", "bool"),
             tests=(BAD_IDS,)),
        Case("empty-ids", "No ids at all", "An empty sequence has no position to predict.",
             "forward(params, [], cfg)", names=("empty",),
             tests=(BAD_IDS, MODEL + "test_empty_ids_and_targets_raise_input_error_in_loss")),
        Case("ids-3d", "Ids with three axes", "Ids are one sequence (T,) or a batch (B, T), nothing else.",
             "forward(params, np.zeros((1, 2, 3), dtype=np.int64), cfg)", names=("(T,) or (B, T)",),
             tests=(BAD_IDS,)),
        Case("targets-shape", "Targets of another shape", "Each input position needs exactly one target.",
             "loss_and_grads(params, ids, ids[:3], cfg)", names=("targets have shape",), tests=(BAD_TARGETS,)),
        Case("target-too-large", "A target outside the vocabulary", "Target V is no class of the softmax.",
             "loss_and_grads(params, ids, np.array([0, 1, cfg.vocab_size, 2]), cfg)",
             names=("targets must lie in",), tests=(BAD_TARGETS,)),
        Case("negative-target", "A negative target", "Numpy would pick the probability of class V − 1 for "
             "target −1 without complaint.", "loss_and_grads(params, ids, np.array([0, -1, 2, 3]), cfg)",
             names=("found -1",), tests=(BAD_TARGETS,)),
        Case("params-mismatch", "Parameters of another size", "The output head's shape does not fit the "
             "configuration's width and vocabulary.",
             'forward({**params, "head_w": np.zeros((cfg.emb_dim, cfg.emb_dim))}, ids, cfg)',
             names=("'head_w' has shape",),
             tests=("tests/unit/test_generate.py::test_parameters_that_do_not_fit_the_config_are_named",)),
    ],
    "Model and training settings": [
        Case("heads", "Heads that do not divide the width", "Each head needs an equal, whole share d / H.",
             "ModelConfig(emb_dim=10, num_heads=3)", TRAIN + ("--emb-dim", "10", "--num-heads", "3"),
             names=("num_heads=3 does not divide emb_dim=10",),
             tests=(MODEL + "test_num_heads_not_dividing_emb_dim_raises_config_error", TRAIN_ERRORS)),
        Case("zero-size", "A size of zero", "Every size of the model must be at least 1: a context of 0 "
             "positions could read no token.",
             "ModelConfig(context_len=0)", TRAIN + ("--context-len", "0"),
             names=("context_len must be a positive integer",),
             tests=(MODEL + "test_sizes_must_be_positive_integers", TRAIN_ERRORS)),
        Case("window-too-long", "Training windows longer than the context",
             "The model cannot read a window longer than its position table.",
             'train("corpus.txt", "new", cfg, TrainConfig(seq_len=cfg.context_len + 1))',
             TRAIN + ("--seq-len", "64"), names=("is longer than context_len",),
             tests=(TRAIN_TESTS + "test_training_refuses_bad_settings", TRAIN_ERRORS)),
        Case("zero-steps", "A run of zero steps", "There would be nothing to train.", "TrainConfig(steps=0)",
             TRAIN + ("--steps", "0"), names=("steps must be a positive integer",),
             tests=(TRAIN_TESTS + "test_training_refuses_bad_settings", TRAIN_ERRORS)),
        Case("setting-type", "A training setting of the wrong type", "A β of Adam is a number; the string "
             "\"0.9\" is not one. (The command line reads --beta1 as a number first, so only Python can pass it.)",
             'TrainConfig(beta1="0.9")', names=("beta1 must lie in [0, 1)",),
             tests=(TRAIN_TESTS + "test_a_setting_of_the_wrong_type_is_a_config_error",)),
        Case("setting-bool", "True or False where a number belongs", "Python counts True as the integer 1, "
             "so without a test of its own steps=True would train for one step. (The command line reads --steps "
             "as an integer, so only Python can pass it.)", "TrainConfig(steps=True)",
             names=("steps must be a positive integer, got True",),
             tests=(TRAIN_TESTS + "test_a_setting_of_the_wrong_type_is_a_config_error",)),
        Case("zero-minutes", "A time limit of zero minutes", "The run would stop before its first step.",
             'train("corpus.txt", "new", cfg, TrainConfig(), max_minutes=0)', TRAIN + ("--max-minutes", "0"),
             names=("max_minutes must be a positive number",),
             tests=(TRAIN_TESTS + "test_max_minutes_must_be_positive",)),
        Case("diverged", "A learning rate so large that training diverges",
             "The loss overflows to a value that is not a number; training on it would be meaningless.",
             'train("corpus.txt", "diverged", cfg, TrainConfig(lr=1e30, grad_clip=0.0, warmup=0), progress=False)',
             ("train", "--corpus", "corpus.txt", "--out", "diverged", "--lr", "1e30", "--grad-clip", "0",
              "--warmup", "0"), names=("training diverged",),
             tests=(TRAIN_TESTS + "test_divergence_is_reported_not_trained_through",)),
    ],
    "Corpus": [
        Case("corpus-missing", "A corpus that does not exist", "The path names no file.",
             'load_corpus("missing.txt")', ("train", "--corpus", "missing.txt", "--out", "new"),
             names=("missing.txt does not exist",),
             tests=(CORPUS_ERRORS, TRAIN_ERRORS, CLI + "test_the_real_command_prints_no_traceback_for_a_user_mistake")),
        Case("corpus-empty", "An empty corpus", "There is no text to learn from.", 'load_corpus("empty.txt")',
             ("train", "--corpus", "empty.txt", "--out", "new"), names=("is empty",),
             tests=(CORPUS_ERRORS, TRAIN_ERRORS)),
        Case("corpus-short", "A corpus too short for one window", "The training split must hold one window "
             "and its next-token targets, and the validation split two tokens.",
             'train("short.txt", "new", cfg, TrainConfig())', ("train", "--corpus", "short.txt", "--out", "new"),
             names=("short.txt has 3 tokens",), tests=(TRAIN_TESTS + "test_training_refuses_bad_settings",
                                                      TRAIN_ERRORS)),
        Case("corpus-not-utf8", "A corpus that is not UTF-8", "The file is Latin-1: its é is a single byte that "
             "UTF-8 cannot decode.", 'load_corpus("latin1.txt")', ("train", "--corpus", "latin1.txt", "--out", "new"),
             names=("not UTF-8", "at byte offset"), tests=(CORPUS_ERRORS, TRAIN_ERRORS)),
        Case("corpus-folder", "A folder given as the corpus", "A folder is not a text file.", 'load_corpus("texts")',
             ("train", "--corpus", "texts", "--out", "new"), names=("is a directory",),
             tests=("tests/unit/test_data.py::test_load_corpus_refuses_a_directory", TRAIN_ERRORS)),
        Case("no-corpus", "No corpus at all", "Neither --corpus nor $TRANSFORMER_CORPUS names one.",
             argv=("train", "--out", "new"), names=("no corpus",),
             tests=(CLI + "test_train_without_a_corpus_says_how_to_give_one",)),
    ],
    "Checkpoints": [
        Case("checkpoint-missing", "A checkpoint that does not exist", "The path names no file.",
             'load_checkpoint("none.npz")', ("sample", "--checkpoint", "none.npz"), names=("does not exist",),
             tests=(CKPT + "test_missing_checkpoint", BAD_CKPT)),
        Case("checkpoint-truncated", "A truncated checkpoint", "The file holds only the first half of a real "
             "checkpoint, as a copy cut short leaves it.", 'load_checkpoint("truncated.npz")',
             ("sample", "--checkpoint", "truncated.npz"), names=("truncated",),
             tests=(CKPT + "test_truncated_checkpoint", BAD_CKPT)),
        Case("checkpoint-foreign", "Another program's .npz", "A valid .npz file, but not a checkpoint of this "
             "project.", 'load_checkpoint("foreign.npz")', ("sample", "--checkpoint", "foreign.npz"),
             names=("not a checkpoint of this project",), tests=(CKPT + "test_foreign_npz_is_refused", BAD_CKPT)),
        Case("checkpoint-version", "A checkpoint of a newer format", f"Its description says format version "
             f"{VERSION + 1}; this code reads version {VERSION} only.", 'load_checkpoint("newer.npz")',
             ("sample", "--checkpoint", "newer.npz"), names=(f"format version {VERSION + 1}",),
             tests=(CKPT + "test_other_format_name_or_version_is_refused",)),
        Case("checkpoint-mismatch", "A checkpoint whose parameters do not match its configuration",
             "The parameters were made for a wider model than the configuration stored beside them.",
             'load_checkpoint("mismatched.npz")', ("sample", "--checkpoint", "mismatched.npz"),
             names=("its config needs",), tests=(CKPT + "test_parameters_that_do_not_match_the_config_are_refused",)),
        Case("checkpoint-pickle", "A checkpoint holding a pickled object", "Loading a pickle can run code, so "
             "object arrays are refused, never unpickled.", 'load_checkpoint("pickled.npz")',
             ("sample", "--checkpoint", "pickled.npz"), names=("pickled objects",),
             tests=(CKPT + "test_pickled_objects_are_refused_not_executed",)),
    ],
    "Runs in --out": [
        Case("out-holds-run", "An --out that already holds a run", "Starting again there would overwrite its "
             "checkpoint and metrics.", 'train("corpus.txt", "run", cfg, TrainConfig())',
             ("train", "--corpus", "corpus.txt", "--out", "run"), names=("already holds a run",),
             tests=(TRAIN_TESTS + "test_a_new_run_never_overwrites_an_existing_one_by_accident",
                    CLI + "test_a_second_train_into_the_same_folder_is_refused")),
        Case("resume-other-corpus", "Resuming on a different corpus", "The run was trained on corpus.txt; "
             "continuing on other text would mix two runs.",
             'train("other.txt", "run", cfg, TrainConfig(), resume=True)',
             ("train", "--resume", "--out", "run", "--corpus", "other.txt"), names=("the corpus differs",),
             tests=(TRAIN_TESTS + "test_resume_refuses_a_different_corpus",
                    CLI + "test_a_refused_resume_leaves_the_run_as_it_was")),
        Case("resume-truncated", "Resuming from a truncated checkpoint", "The run's checkpoint was cut short "
             "(by a copy, say); resuming from it is impossible.",
             'train("corpus.txt", "broken", cfg, TrainConfig(), resume=True)', ("train", "--resume", "--out", "broken"),
             names=("truncated",), tests=(CKPT + "test_truncated_checkpoint",
                                          CLI + "test_a_refused_resume_leaves_the_run_as_it_was")),
        Case("resume-tampered", "Resuming from a checkpoint with an invalid training state", "The state of "
             "the batch sampler stored in the checkpoint was edited by hand and no longer describes a generator.",
             'train("corpus.txt", "tampered", cfg, TrainConfig(), resume=True)',
             ("train", "--resume", "--out", "tampered"), names=("invalid training state",),
             tests=(TRAIN_TESTS + "test_resume_refuses_a_checkpoint_with_an_invalid_training_state",)),
        Case("resume-finished", "Resuming a run that finished", "Every step of the run is done.",
             'train("corpus.txt", "done", cfg, TrainConfig(), resume=True)', ("train", "--resume", "--out", "done"),
             names=("already finished",),
             tests=(TRAIN_TESTS + "test_resuming_a_finished_run_says_there_is_nothing_to_do",)),
        Case("resume-nothing", "Resuming where no run is", "The --out folder holds no checkpoint.",
             'train("corpus.txt", "new", cfg, TrainConfig(), resume=True)', ("train", "--resume", "--out", "new"),
             names=("does not exist",), tests=(TRAIN_TESTS + "test_training_refuses_bad_settings", TRAIN_ERRORS,
                                               CLI + "test_resume_where_no_run_is_names_the_missing_checkpoint")),
        Case("resume-options", "Resuming with new settings", "A resumed run takes its settings from its "
             "checkpoint; changing them midway would make it a different run.",
             argv=("train", "--resume", "--out", "run", "--lr", "0.1"), names=("drop --lr",),
             tests=(TRAIN_ERRORS, CLI + "test_resume_needs_only_the_out_folder")),
        Case("out-is-a-file", "An --out that is a file", "The run's folder cannot be created where a file is.",
             'train("corpus.txt", "notes.txt", cfg, TrainConfig())',
             ("train", "--corpus", "corpus.txt", "--out", "notes.txt"), names=("notes.txt is a file",),
             tests=(TRAIN_TESTS + "test_an_out_dir_that_is_a_file_is_refused_and_left_alone",
                    CLI + "test_an_unwritable_out_folder_is_one_line")),
    ],
    "Sampling": [
        Case("temperature-negative", "A negative temperature", "Dividing the logits by a negative number "
             "would favour the least likely tokens.", "generate(params, cfg, [0, 1], 10, temperature=-1.0)",
             SAMPLE + ("--temperature", "-1"), names=("temperature must be",), tests=(GEN_ERRORS, SAMPLE_ERRORS)),
        Case("temperature-nan", "A temperature that is not a number", "NaN logits give no probabilities.",
             'generate(params, cfg, [0, 1], 10, temperature=float("nan"))', SAMPLE + ("--temperature", "nan"),
             names=("temperature must be",), tests=(GEN_ERRORS, SAMPLE_ERRORS)),
        Case("top-k", "A top-k of zero", "Keeping the zero most likely tokens leaves nothing to draw.",
             "generate(params, cfg, [0, 1], 10, top_k=0)", SAMPLE + ("--top-k", "0"), names=("top_k must be",),
             tests=(GEN_ERRORS, SAMPLE_ERRORS)),
        Case("tokens-negative", "A negative number of tokens", "A count of tokens to add cannot be negative.",
             "generate(params, cfg, [0, 1], -1)", SAMPLE + ("--tokens", "-1"), names=("number of tokens",),
             tests=(GEN_ERRORS, SAMPLE_ERRORS)),
        Case("prompt-unknown", "A prompt with a character outside the vocabulary", "The model has no id for z.",
             'CharTokenizer("abcde").encode("abz")', SAMPLE[:-1] + ("abz",), names=("'z' (U+007A)",),
             tests=("tests/unit/test_data.py::test_char_tokenizer_rejects_a_character_it_has_not_seen", SAMPLE_ERRORS)),
        Case("prompt-empty", "An empty prompt", "The first token is drawn from the logits after the prompt.",
             "generate(params, cfg, [], 10)", SAMPLE[:-1] + ("",), names=("non-empty",),
             tests=(GEN_ERRORS, SAMPLE_ERRORS)),
    ],
    "Checking commands": [
        Case("gradcheck-batch", "A gradient check on no sequences", "--batch 0 leaves nothing to check.",
             argv=("gradcheck", "--batch", "0"), names=("--batch must be at least 1",),
             tests=(CLI + "test_gradcheck_refuses_an_empty_batch",)),
        Case("crosscheck-json", "A report path in a folder that does not exist", "The report could not be "
             "written, so the cross-check refuses to start.",
             argv=("crosscheck", "--devices", "cpu", "--json", "missing/report.json"), names=("missing/report.json",),
             tests=(CLI + "test_crosscheck_refuses_an_unwritable_json_path_before_running",)),
    ],
    "Usage": [
        Case("no-command", "No command", "The command line needs one of train, sample, gradcheck or crosscheck.",
             argv=(), names=("required: command",), tests=(CLI + "test_more_usage_mistakes_are_one_line",)),
        Case("no-out", "A required option left out", "train needs an --out folder.",
             argv=("train", "--corpus", "corpus.txt"), names=("required: --out",),
             tests=(CLI + "test_more_usage_mistakes_are_one_line",)),
        Case("unknown-option", "An option that does not exist", "The learning rate is --lr.",
             argv=("train", "--out", "new", "--learning-rate", "0.1"), names=("unrecognized arguments",),
             tests=(CLI + "test_more_usage_mistakes_are_one_line",)),
        Case("not-a-number", "A word where a number belongs", "--steps takes an integer.",
             argv=("train", "--out", "new", "--steps", "ten"), names=("invalid int value: 'ten'",),
             tests=(CLI + "test_more_usage_mistakes_are_one_line",)),
        Case("bad-choice", "A choice that is not offered", "The activations are relu and gelu.",
             argv=("train", "--out", "new", "--activation", "tanh"), names=("invalid choice: 'tanh'",),
             tests=(USAGE,)),
        Case("negative-seed", "A negative seed", "Seeds are non-negative integers.",
             argv=("sample", "--checkpoint", "model.npz", "--seed", "-1"), names=("must be >= 0",),
             tests=(USAGE,)),
    ],
}
CASES = [case for cases in GROUPS.values() for case in cases]
GROUP_NOTES = {
    "Token ids, targets and parameters": "The command line makes ids, targets and parameters itself, from a "
                                         "corpus or a checkpoint, so these mistakes can only be made from Python.",
    "Usage": "Mistakes in the command line itself, caught by its parser before anything runs.",
}


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


def setup_namespace():
    """Run SETUP; check that it imports exactly the objects of KEYED."""
    namespace = {}
    exec(SETUP, namespace)  # noqa: S102 - this module's own source
    imported = {a.asname or a.name for node in ast.parse(SETUP).body if isinstance(node, ast.ImportFrom)
                for a in node.names}
    if imported != set(KEYED) or any(namespace[name] is not obj for name, obj in KEYED.items()):
        raise RuntimeError("SETUP and KEYED must name the same transformer objects: the cache key follows KEYED")
    return namespace


