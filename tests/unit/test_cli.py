import subprocess
import sys

import numpy as np
import pytest

from transformer.checkpoint import Checkpoint, save_checkpoint
from transformer.cli import main
from transformer.config import PRESETS
from transformer.data import CharTokenizer
from transformer.model import init_params

SMALL = ["--context-len", "16", "--emb-dim", "16", "--num-layers", "1", "--ff-dim", "32",
         "--num-heads", "2", "--batch-size", "4", "--seq-len", "8", "--warmup", "1", "--no-progress"]


@pytest.fixture
def corpus(tmp_path):
    path = tmp_path / "corpus.txt"
    path.write_text("the quick brown fox jumps over the lazy dog\n" * 40)
    return path


@pytest.fixture
def checkpoint(tmp_path):
    cfg = PRESETS["tiny"]
    path = tmp_path / "tiny.npz"
    save_checkpoint(path, Checkpoint(init_params(cfg, seed=0), cfg, CharTokenizer("abcde")))
    return path


def run_cli(args, capsys):
    code = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


def assert_one_line_error(code, err, message):
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert message in lines[0], lines[0]


def test_train_then_sample_from_the_command_line(tmp_path, corpus, capsys):
    out = tmp_path / "run"
    code, stdout, _ = run_cli(["train", "--corpus", corpus, "--out", out, "--steps", "30",
                               "--eval-every", "10", *SMALL], capsys)
    assert code == 0 and "done: 30 steps" in stdout and "validation loss" in stdout
    code, stdout, _ = run_cli(["sample", "--checkpoint", out / "checkpoint.npz", "--prompt", "the ",
                               "--tokens", "40", "--seed", "1"], capsys)
    assert code == 0
    text = stdout.rstrip("\n")
    assert text.startswith("the ") and len(text) == len("the ") + 40
    assert set(text) <= set(corpus.read_text())


def test_gradcheck_command_passes_every_parameter(capsys):
    code, stdout, _ = run_cli(["gradcheck"], capsys)
    assert code == 0
    assert stdout.strip().endswith("38 of 38 parameters pass")
    assert "FAIL" not in stdout


def test_gradcheck_command_fails_on_a_wrong_backward(capsys, monkeypatch):
    """Negative control: scale the LayerNorm gain gradient by 1.001 and the command must fail."""
    import transformer.block as block
    import transformer.layernorm as layernorm

    original = layernorm.layer_norm_backward

    def wrong(dy, cache):
        dx, dg, db = original(dy, cache)
        return dx, dg * 1.001, db

    monkeypatch.setattr(block, "layer_norm_backward", wrong)
    code, stdout, _ = run_cli(["gradcheck"], capsys)
    assert code == 1
    assert "b0.ln1_g" in stdout and "FAIL" in stdout


MODEL = ["--context-len", "16", "--emb-dim", "16", "--num-layers", "1", "--ff-dim", "32", "--num-heads", "2"]


@pytest.mark.parametrize("make, args, message", [
    (None, ["--corpus", "{tmp}/missing.txt", *MODEL], "missing.txt does not exist"),
    (b"", ["--corpus", "{tmp}/c.txt", *MODEL], "is empty"),
    (b"abc\xfe", ["--corpus", "{tmp}/c.txt", *MODEL], "byte 0xfe at byte offset 3"),
    (b"abc", ["--corpus", "{tmp}/c.txt", *MODEL, "--seq-len", "8"], "has 3 tokens; windows of 8 tokens need at least"),
    (b"x" * 500, ["--corpus", "{tmp}/c.txt", "--emb-dim", "10", "--num-heads", "3"],
     "num_heads=3 does not divide emb_dim=10"),
    (b"x" * 500, ["--corpus", "{tmp}/c.txt", *MODEL, "--seq-len", "64"], "seq_len=64 is longer than context_len=16"),
    (b"x" * 500, ["--corpus", "{tmp}/c.txt", "--resume"], "checkpoint.npz does not exist"),
    (b"x" * 500, ["--corpus", "{tmp}/c.txt", "--resume", "--lr", "0.1"], "drop --lr"),
    (b"x" * 500, ["--corpus", "{tmp}/c.txt", *MODEL, "--steps", "0"], "steps must be a positive integer"),
    (b"x" * 500, ["--corpus", "{tmp}/c.txt", "--context-len", "0"], "context_len must be a positive integer"),
    (None, ["--corpus", "{tmp}", *MODEL], "is a directory, not a text file"),
])
def test_train_errors_are_one_line(tmp_path, capsys, make, args, message):
    if make is not None:
        (tmp_path / "c.txt").write_bytes(make)
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    code, _, err = run_cli(["train", "--out", tmp_path / "out", *args, "--no-progress"], capsys)
    assert_one_line_error(code, err, message)
    assert not (tmp_path / "out").exists()  # a refused run leaves nothing behind, no half-written checkpoint


def test_train_without_a_corpus_says_how_to_give_one(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("TRANSFORMER_CORPUS", raising=False)
    code, _, err = run_cli(["train", "--out", tmp_path], capsys)
    assert_one_line_error(code, err, "pass --corpus PATH or set TRANSFORMER_CORPUS")


def test_resume_where_no_run_is_names_the_missing_checkpoint(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("TRANSFORMER_CORPUS", raising=False)
    code, _, err = run_cli(["train", "--resume", "--out", tmp_path / "no-run"], capsys)
    assert_one_line_error(code, err, f"checkpoint {tmp_path / 'no-run' / 'checkpoint.npz'} does not exist")


def test_corpus_can_come_from_the_environment(tmp_path, corpus, capsys, monkeypatch):
    monkeypatch.setenv("TRANSFORMER_CORPUS", str(corpus))
    code, stdout, _ = run_cli(["train", "--out", tmp_path / "run", "--steps", "2", *SMALL], capsys)
    assert code == 0 and "done: 2 steps" in stdout


@pytest.mark.parametrize("args, message", [
    (["--prompt", "abz"], "'z' (U+007A) is not in this tokenizer's vocabulary"),
    (["--temperature", "-1"], "temperature must be a finite number >= 0"),
    (["--top-k", "9"], "top_k must be an integer in [1, 5]"),
    (["--tokens", "-1"], "number of tokens must be a non-negative integer"),
    (["--prompt", ""], "prompt must be a non-empty sequence"),
    (["--temperature", "nan"], "temperature must be a finite number >= 0, got nan"),
    (["--top-k", "0"], "top_k must be an integer in [1, 5], got 0"),
])
def test_sample_errors_are_one_line(checkpoint, capsys, args, message):
    code, _, err = run_cli(["sample", "--checkpoint", checkpoint, "--prompt", "ab", *args], capsys)
    assert_one_line_error(code, err, message)


def test_sample_default_prompt_falls_back_when_the_vocabulary_has_no_newline(checkpoint, capsys):
    code, stdout, _ = run_cli(["sample", "--checkpoint", checkpoint, "--tokens", "5"], capsys)
    assert code == 0 and len(stdout.rstrip("\n")) == 6 and set(stdout.rstrip("\n")) <= set("abcde")


def test_sample_refuses_bad_checkpoints(tmp_path, checkpoint, capsys):
    truncated = tmp_path / "truncated.npz"
    truncated.write_bytes(checkpoint.read_bytes()[:200])
    foreign = tmp_path / "foreign.npz"
    np.savez(foreign, w=np.ones(2))
    for path, message in [(tmp_path / "none.npz", "does not exist"),
                          (truncated, "truncated or not an .npz file"),
                          (foreign, "not a checkpoint of this project")]:
        code, _, err = run_cli(["sample", "--checkpoint", path], capsys)
        assert_one_line_error(code, err, message)


def test_the_real_command_prints_no_traceback_for_a_user_mistake(tmp_path):
    result = subprocess.run([sys.executable, "-m", "transformer", "train", "--corpus", str(tmp_path / "x.txt"),
                             "--out", str(tmp_path / "o")], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert result.stderr.strip() == f"error: corpus {tmp_path / 'x.txt'} does not exist"
    assert result.stdout == ""


def test_usage_mistakes_are_one_line_too(capsys):
    with pytest.raises(SystemExit) as stop:
        main(["sample", "--checkpoint", "x.npz", "--seed", "-1"])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and len(err.strip().splitlines()) == 1
    assert err.startswith("error: ") and "must be >= 0, got -1" in err
    with pytest.raises(SystemExit):
        main(["train", "--out", "x", "--activation", "tanh"])
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "invalid choice: 'tanh'" in err


@pytest.mark.parametrize("args, message", [
    ([], "the following arguments are required: command"),
    (["train", "--corpus", "c.txt"], "the following arguments are required: --out"),
    (["train", "--out", "x", "--learning-rate", "0.1"], "unrecognized arguments: --learning-rate 0.1"),
    (["train", "--out", "x", "--steps", "ten"], "argument --steps: invalid int value: 'ten'"),
    (["gradcheck", "--preset", "B"], "argument --preset: invalid choice: 'B'"),
])
def test_more_usage_mistakes_are_one_line(capsys, args, message):
    with pytest.raises(SystemExit) as stop:
        main(args)
    err = capsys.readouterr().err
    assert stop.value.code == 2 and len(err.strip().splitlines()) == 1
    assert err.startswith("error: python -m transformer") and message in err and err.rstrip().endswith("(see --help)")


def test_gradcheck_refuses_an_empty_batch(capsys):
    code, out, err = run_cli(["gradcheck", "--batch", "0"], capsys)
    assert_one_line_error(code, err, "--batch must be at least 1, got 0")
    assert out == ""


def test_an_unwritable_out_folder_is_one_line(tmp_path, corpus, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    code, _, err = run_cli(["train", "--corpus", corpus, "--out", blocker, *SMALL, "--steps", "2"], capsys)
    assert_one_line_error(code, err, "a-file")


def test_resume_needs_only_the_out_folder(tmp_path, corpus, capsys, monkeypatch):
    monkeypatch.delenv("TRANSFORMER_CORPUS", raising=False)
    out = tmp_path / "run"
    code, _, _ = run_cli(["train", "--corpus", corpus, "--out", out, *SMALL, "--steps", "4",
                          "--max-minutes", "1e-9"], capsys)
    assert code == 0
    code, stdout, _ = run_cli(["train", "--resume", "--out", out, "--no-progress"], capsys)
    assert code == 0 and "done: 4 steps" in stdout
    code, _, err = run_cli(["train", "--resume", "--out", out, "--preset", "B"], capsys)
    assert_one_line_error(code, err, "drop --preset")


def test_a_refused_resume_leaves_the_run_as_it_was(tmp_path, corpus, capsys):
    out = tmp_path / "run"
    code, _, _ = run_cli(["train", "--corpus", corpus, "--out", out, *SMALL, "--steps", "4",
                          "--max-minutes", "1e-9"], capsys)
    assert code == 0  # stopped after its first step: resumable

    def files():
        return {p.name: p.read_bytes() for p in out.iterdir()}

    other = tmp_path / "other.txt"
    other.write_text(corpus.read_text().upper())
    before = files()
    code, _, err = run_cli(["train", "--resume", "--out", out, "--corpus", other], capsys)
    assert_one_line_error(code, err, "the corpus differs from the one this run was trained on")
    assert files() == before
    whole = before["checkpoint.npz"]
    (out / "checkpoint.npz").write_bytes(whole[: len(whole) // 2])
    before = files()
    code, _, err = run_cli(["train", "--resume", "--out", out], capsys)
    assert_one_line_error(code, err, "truncated or not an .npz file")
    assert files() == before


def test_a_second_train_into_the_same_folder_is_refused(tmp_path, corpus, capsys):
    out = tmp_path / "run"
    args = ["train", "--corpus", corpus, "--out", out, *SMALL, "--steps", "2"]
    assert run_cli(args, capsys)[0] == 0
    code, _, err = run_cli(args, capsys)
    assert_one_line_error(code, err, "already holds a run")
    assert run_cli(args + ["--overwrite"], capsys)[0] == 0


def test_a_vanishing_temperature_is_greedy_not_a_crash(checkpoint, capsys):
    code, out1, _ = run_cli(["sample", "--checkpoint", checkpoint, "--prompt", "ab", "--temperature", "1e-320",
                             "--tokens", "8"], capsys)
    code0, out0, _ = run_cli(["sample", "--checkpoint", checkpoint, "--prompt", "ab", "--temperature", "0",
                              "--tokens", "8"], capsys)
    assert code == code0 == 0 and out1 == out0


def test_crosscheck_refuses_an_unwritable_json_path_before_running(tmp_path, capsys):
    pytest.importorskip("torch")
    code, out, err = run_cli(["crosscheck", "--devices", "cpu", "--json", tmp_path / "no" / "r.json"], capsys)
    assert_one_line_error(code, err, "r.json")
    assert out == ""


def test_crosscheck_with_no_device_present_is_an_error_not_a_pass(capsys):
    pytest.importorskip("torch")
    from transformer.crosscheck import DEVICES, discover_devices

    missing = [name for name, device, _, _ in discover_devices(DEVICES) if device is None]
    if not missing:
        pytest.skip("every device is present here")
    code, out, err = run_cli(["crosscheck", "--devices", *missing], capsys)
    assert "NOTHING CHECKED" in out
    assert_one_line_error(code, err, "nothing was checked")


def test_several_prompts_are_decoded_together(tmp_path, checkpoint, capsys):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("ab\nc\nddd\n")
    code, out, _ = run_cli(["sample", "--checkpoint", checkpoint, "--prompts-file", prompts, "--tokens", "6",
                            "--page-size", "3", "--seed", "2"], capsys)
    assert code == 0
    headers = [line for line in out.splitlines() if line.startswith("==> request")]
    texts = [line for line in out.splitlines() if not line.startswith("==> request")]
    assert headers == [f"==> request {i} of 3 <==" for i in (1, 2, 3)]
    assert [t[:len(p)] for t, p in zip(texts, ("ab", "c", "ddd"))] == ["ab", "c", "ddd"]
    assert [len(t) for t in texts] == [2 + 6, 1 + 6, 3 + 6]
    # Request i draws with seed + i: alone, the second prompt with seed 3 continues the same way.
    code, alone, _ = run_cli(["sample", "--checkpoint", checkpoint, "--prompt", "c", "--tokens", "6",
                              "--page-size", "3", "--seed", "3"], capsys)
    assert alone.strip() == texts[1]


def test_the_serving_policies_change_no_text(tmp_path, checkpoint, capsys):
    """Prefix cache, a budget of ids per step and preemption over a small pool: the same continuations."""
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("abab\nabac\nab\n")
    common = ["sample", "--checkpoint", checkpoint, "--prompts-file", prompts, "--tokens", "5", "--page-size", "2"]
    code, plain, _ = run_cli(common, capsys)
    code_policies, policies, _ = run_cli(common + ["--prefix-cache", "--budget", "3", "--max-batch", "3",
                                                   "--preempt", "--pool-pages", "8"], capsys)
    assert code == code_policies == 0 and policies == plain


@pytest.mark.parametrize("content,args,message", [
    ("ab\n", ["--page-size", "0"], "page_size must be a positive integer, got 0"),
    ("ab\n", ["--pool-pages", "1", "--page-size", "1"], "the pool has 1"),
    ("", [], "holds no prompt"),
    ("ab\n\nc\n", [], "line 2 of the prompts file"),
    ("ab\n", ["--prompt", "a"], "not both"),
    ("ab\n", ["--keep", "0"], "keep must be an integer"),
    ("ab\n", ["--budget", "2", "--max-batch", "3"], "budget must be an integer of at least max_batch = 3"),
])
def test_bad_serving_options_are_one_line(tmp_path, checkpoint, capsys, content, args, message):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text(content)
    code, _, err = run_cli(["sample", "--checkpoint", checkpoint, "--prompts-file", prompts, *args], capsys)
    assert_one_line_error(code, err, message)


def test_help_names_the_command_the_user_typed():
    """The installed console command says `transformer`; `python -m transformer` says that."""
    from pathlib import Path

    script = Path(sys.executable).with_name("transformer")
    if not script.exists():
        pytest.skip(f"the console command is not installed beside {sys.executable}")
    for command, name in (([str(script)], "transformer"), ([sys.executable, "-m", "transformer"], "python -m transformer")):
        usage = subprocess.run([*command, "--help"], capture_output=True, text=True, check=True).stdout
        assert usage.startswith(f"usage: {name} ["), usage[:80]
