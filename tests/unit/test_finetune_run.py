"""The fine-tuning run and its command line: adapter files that name their base, exact resume, sampling
with an adapter, and a clear line for every wrong input."""

import json

import numpy as np
import pytest

from transformer.checkpoint import load_checkpoint
from transformer.cli import main
from transformer.config import PRESETS
from transformer.errors import CheckpointError, ConfigError, InputError
from transformer.finetune_run import ADAPTER_NAME, finetune, load_adapter, save_adapter
from transformer.lora import LoRAConfig, merge
from transformer.runlock import LOCK_NAME
from transformer.generate import generate
from transformer.train import Hooks, train
from transformer.train_config import TrainConfig

MODEL = PRESETS["default"].with_(context_len=16, emb_dim=16, num_layers=1, ff_dim=32, num_heads=2)
LORA = LoRAConfig(rank=2, alpha=4.0, targets=("q", "v", "ff2"))


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """A base trained for a few steps, and a second corpus to fine-tune it on."""
    root = tmp_path_factory.mktemp("finetune")
    rng = np.random.default_rng(0)
    words = ["to", "be", "or", "not", "that", "is", "the", "question", "\n"]
    (root / "corpus.txt").write_text(" ".join(rng.choice(words, 3000)))
    (root / "reply.txt").write_text(" ".join(rng.choice(words[:4] + ["\n"], 2000)))
    train(root / "corpus.txt", root / "base", MODEL, TrainConfig(steps=8, batch_size=4, seq_len=8, eval_every=8),
          progress=False)
    return root


def small(**changes):
    return TrainConfig(**{**dict(steps=10, batch_size=4, seq_len=8, warmup=2, eval_every=5, ckpt_every=4, lr=1e-2),
                          **changes})


def stop_at(n):
    def on_step(step, stop):
        if step == n:
            stop.reason = "interrupted"
    return on_step


@pytest.mark.parametrize("quantize", ["none", "nf4"])
def test_a_resumed_fine_tuning_run_equals_one_that_never_stopped(files, tmp_path, quantize):
    base = files / "base" / "checkpoint.npz"
    whole, broken = tmp_path / "whole", tmp_path / "broken"
    finetune(base, files / "reply.txt", whole, LORA, small(), quantize, learn_from=3, progress=False)
    summary = finetune(base, files / "reply.txt", broken, LORA, small(), quantize, learn_from=3, progress=False,
                       on_step=stop_at(6))
    assert summary["stopped"] == "interrupted" and summary["step"] == 6
    finetune(None, files / "reply.txt", broken, LORA, small(), resume=True, progress=False)
    a, b = load_adapter(whole / ADAPTER_NAME), load_adapter(broken / ADAPTER_NAME)
    assert a.step == b.step == 10 and a.extra["learn_from"] == 3 and a.quantize == quantize
    for name in a.adapters:
        assert np.array_equal(a.adapters[name], b.adapters[name]), name
        assert np.array_equal(a.opt_state["m"][name], b.opt_state["m"][name])
    losses = [[json.loads(line)["loss"] for line in (d / "metrics.jsonl").read_text().splitlines()
               if "loss" in json.loads(line)] for d in (whole, broken)]
    assert losses[0] == losses[1] and len(losses[0]) == 10


def test_the_adapter_file_names_its_base_and_leaves_it_untouched(files, tmp_path):
    base = files / "base" / "checkpoint.npz"
    before = base.read_bytes()
    finetune(base, files / "reply.txt", tmp_path / "run", LORA, small(), progress=False)
    assert base.read_bytes() == before
    f = load_adapter(tmp_path / "run" / ADAPTER_NAME)
    from transformer.finetune import params_sha256

    assert f.base_path == str(base) and f.base_sha256 == params_sha256(load_checkpoint(base).params)
    assert set(f.adapters) == {"b0.wq.lora_a", "b0.wq.lora_b", "b0.wv.lora_a", "b0.wv.lora_b",
                               "b0.ff2_w.lora_a", "b0.ff2_w.lora_b"}
    assert f.lora == LORA and set(f.opt_state["m"]) == set(f.adapters)


def test_full_fine_tuning_trains_every_parameter_into_a_checkpoint(files, tmp_path):
    base = load_checkpoint(files / "base" / "checkpoint.npz")
    finetune(files / "base" / "checkpoint.npz", files / "reply.txt", tmp_path / "full", None, small(), progress=False)
    tuned = load_checkpoint(tmp_path / "full" / "checkpoint.npz")
    assert tuned.step == 10 and set(tuned.opt_state["m"]) == set(base.params)
    assert all(not np.array_equal(tuned.params[k], base.params[k]) for k in ("tok_emb", "b0.wk", "head_w"))


def test_sample_with_an_adapter_is_the_merged_model(files, tmp_path, capsys):
    base_path = files / "base" / "checkpoint.npz"
    finetune(base_path, files / "reply.txt", tmp_path / "run", LORA, small(), progress=False)
    capsys.readouterr()
    assert main(["sample", "--checkpoint", str(base_path), "--adapter", str(tmp_path / "run" / ADAPTER_NAME),
                 "--prompt", "to", "--tokens", "30", "--seed", "3"]) == 0
    printed = capsys.readouterr().out
    base, f = load_checkpoint(base_path), load_adapter(tmp_path / "run" / ADAPTER_NAME)
    merged = {k: v.astype(np.float32) for k, v in merge(base.params, f.adapters, f.lora).items()}
    new = generate(merged, base.cfg, base.tokenizer.encode("to"), 30, seed=3)
    assert printed == "to" + base.tokenizer.decode(new) + "\n"
    plain = generate(base.params, base.cfg, base.tokenizer.encode("to"), 30, seed=3)
    assert not np.array_equal(new, plain)  # the adapter changed what the model says


def cli(args, capsys):
    code = main(args)
    return code, capsys.readouterr().err.strip()


def test_the_command_line_fine_tunes_and_resumes(files, tmp_path, capsys):
    out = tmp_path / "cli"
    base = str(files / "base" / "checkpoint.npz")
    code, _ = cli(["finetune", "--checkpoint", base, "--corpus", str(files / "reply.txt"), "--out", str(out),
                   "--lora-rank", "2", "--lora-targets", "q,v,head", "--quantize", "nf4", "--steps", "6",
                   "--batch-size", "2", "--seq-len", "8", "--eval-every", "3", "--no-progress"], capsys)
    assert code == 0 and load_adapter(out / ADAPTER_NAME).quantize == "nf4"
    assert not load_adapter(out / ADAPTER_NAME).lora.rank_stabilized
    code, err = cli(["finetune", "--resume", "--out", str(out)], capsys)
    assert code == 2 and "already finished (6 of 6 steps)" in err


def test_rank_stabilized_lora_is_kept_in_the_adapter_file_and_refused_on_resume(files, tmp_path, capsys):
    out, base = tmp_path / "rs", str(files / "base" / "checkpoint.npz")
    code, _ = cli(["finetune", "--checkpoint", base, "--corpus", str(files / "reply.txt"), "--out", str(out),
                   "--lora-rank", "4", "--lora-rank-stabilized", "--steps", "2", "--batch-size", "2", "--seq-len", "8",
                   "--no-progress"], capsys)
    lora = load_adapter(out / ADAPTER_NAME).lora
    assert code == 0 and lora.rank_stabilized and lora.scale == lora.alpha / 2
    code, err = cli(["finetune", "--resume", "--out", str(out), "--lora-rank-stabilized"], capsys)
    assert code == 2 and "--lora-rank-stabilized" in err


@pytest.mark.parametrize("extra,message", [
    (["--lora-rank", "0"], "lora rank must be a positive integer, got 0"),
    (["--lora-rank", "17"], "lora rank 17 is larger than b0.wq's smaller side 16"),
    (["--lora-targets", "q,attn"], "lora targets must be some of q, k, v, o, ff1, ff2, head, got q, attn"),
    (["--full", "--quantize", "nf4"], "--full trains every parameter; drop --quantize"),
    (["--learn-from", "8", "--seq-len", "8"], "learn_from must lie in [0, 8)"),
])
def test_bad_fine_tuning_settings_are_one_clear_line(files, tmp_path, capsys, extra, message):
    code, err = cli(["finetune", "--checkpoint", str(files / "base" / "checkpoint.npz"), "--corpus",
                     str(files / "reply.txt"), "--out", str(tmp_path / "x"), "--no-progress", *extra], capsys)
    assert code == 2 and err.startswith(f"error: {message}") and "\n" not in err, err


def test_lora_with_the_autograd_engine_is_refused_before_anything_is_written(files, tmp_path):
    """The adapters' backward is hand-written only: engine="autograd" must not be ignored in silence."""
    with pytest.raises(ConfigError, match="LoRA fine-tuning runs the hand-written backward only, got engine 'autograd'"):
        finetune(files / "base" / "checkpoint.npz", files / "reply.txt", tmp_path / "run", LORA,
                 small(steps=2, engine="autograd"), progress=False)
    assert not (tmp_path / "run").exists()


def test_an_adapter_for_another_base_is_refused(files, tmp_path, capsys):
    finetune(files / "base" / "checkpoint.npz", files / "reply.txt", tmp_path / "run", LORA, small(steps=2),
             progress=False)
    adapter = str(tmp_path / "run" / ADAPTER_NAME)
    other = tmp_path / "other"
    train(files / "corpus.txt", other, MODEL, TrainConfig(steps=2, batch_size=2, seq_len=8, seed=1), progress=False)
    code, err = cli(["sample", "--checkpoint", str(other / "checkpoint.npz"), "--adapter", adapter], capsys)
    assert code == 2 and "the adapter was trained on another base" in err
    wider = tmp_path / "wider"
    train(files / "corpus.txt", wider, MODEL.with_(ff_dim=48), TrainConfig(steps=2, batch_size=2, seq_len=8),
          progress=False)
    code, err = cli(["sample", "--checkpoint", str(wider / "checkpoint.npz"), "--adapter", adapter], capsys)
    assert code == 2 and "trained on a base of another shape" in err
    code, err = cli(["sample", "--checkpoint", str(wider / "checkpoint.npz"), "--adapter",
                     str(wider / "checkpoint.npz")], capsys)
    assert code == 2 and "is not an adapter file" in err


def test_a_corpus_the_base_cannot_spell_is_refused(files, tmp_path):
    (tmp_path / "greek.txt").write_text("αβγ " * 500)
    with pytest.raises(InputError, match="character 'α' .* is not in this tokenizer's vocabulary"):
        finetune(files / "base" / "checkpoint.npz", tmp_path / "greek.txt", tmp_path / "g", LORA, small(),
                 progress=False)


def test_a_torn_adapter_file_is_refused_and_a_failed_save_keeps_the_previous_one(files, tmp_path):
    finetune(files / "base" / "checkpoint.npz", files / "reply.txt", tmp_path / "run", LORA, small(steps=4),
             progress=False)
    path = tmp_path / "run" / ADAPTER_NAME
    good = path.read_bytes()
    (tmp_path / "torn.npz").write_bytes(good[: len(good) // 2])
    with pytest.raises(CheckpointError, match="truncated or not an .npz file"):
        load_adapter(tmp_path / "torn.npz")

    def crash(f, arrays):
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        save_adapter(path, load_adapter(path), write=crash)
    assert path.read_bytes() == good and sorted(p.name for p in path.parent.iterdir()) == [ADAPTER_NAME,
                                                                                           "metrics.jsonl", LOCK_NAME]


def test_a_folder_holding_either_kind_of_run_is_refused_and_overwrite_removes_both(files, tmp_path):
    base = files / "base" / "checkpoint.npz"
    out = tmp_path / "run"
    finetune(base, files / "reply.txt", out, LORA, small(steps=2), progress=False)
    with pytest.raises(ConfigError, match="already holds a run"):
        finetune(base, files / "reply.txt", out, None, small(steps=2), progress=False)  # full into an adapter run
    with pytest.raises(ConfigError, match="already holds a run"):
        train(files / "corpus.txt", out, MODEL, small(steps=2), progress=False)
    finetune(base, files / "reply.txt", out, None, small(steps=2), overwrite=True, progress=False)
    assert sorted(p.name for p in out.iterdir()) == ["checkpoint.npz", "metrics.jsonl", LOCK_NAME]


def test_fine_tuning_stops_at_a_non_finite_step_with_its_last_good_adapters_and_skips_on_resume(files, tmp_path,
                                                                                               capsys):
    """The same all-or-nothing step as train's: the adapter file keeps step 2, and a resume with
    --on-nonfinite skip goes on past the batch, counting it."""
    count = [0]

    def poisoned(grads):
        count[0] += 1
        if count[0] in (3, 4):  # step 3, then the same batch again after the resume
            grads = {k: g * np.nan if k.endswith("lora_b") else g for k, g in grads.items()}
        return grads

    hooks, out = Hooks(gradients=poisoned), tmp_path / "run"
    args = ["finetune", "--checkpoint", files / "base" / "checkpoint.npz", "--corpus", files / "reply.txt",
            "--out", out, "--steps", "6", "--batch-size", "4", "--seq-len", "8", "--lora-rank", "2", "--no-progress"]
    assert main([str(a) for a in args], hooks=hooks) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: step 3: the gradient of b0.wq.lora_b is not finite") and err.count("\n") == 1
    assert load_adapter(out / ADAPTER_NAME).step == 2
    assert main(["finetune", "--resume", "--out", str(out), "--on-nonfinite", "skip", "--no-progress"],
                hooks=hooks) == 0
    printed = capsys.readouterr().out
    assert "done: 6 steps" in printed and "1 batch skipped" in printed
    f = load_adapter(out / ADAPTER_NAME)
    assert f.step == 6 and f.extra["skipped_batches"] == 1


@pytest.mark.skipif(__import__("os").name != "posix", reason="sends SIGTERM")
def test_a_fine_tuning_run_stopped_by_sigterm_resumes_to_the_same_adapters(files, tmp_path):
    """As a training run (tests/unit/test_train.py): SIGTERM two seconds in finishes the step, writes the adapters
    and exits with 143; resumed, the run ends with the bits of one never stopped."""
    import signal
    import subprocess
    import sys
    import time

    def command(out, *extra):
        return [sys.executable, "-m", "transformer", "finetune", *extra, "--out", str(out), "--no-progress"]
    args = ("--checkpoint", str(files / "base" / "checkpoint.npz"), "--corpus", str(files / "reply.txt"),
            "--lora-rank", "2", "--steps", "4000", "--batch-size", "4", "--seq-len", "8", "--ckpt-every", "100000",
            "--eval-every", "2000")
    proc = subprocess.Popen(command(tmp_path / "stopped", *args), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    time.sleep(2)
    assert proc.poll() is None, "the run ended within two seconds: give it more steps, or SIGTERM tests nothing"
    proc.send_signal(signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 143 and "stopped (terminated) after step" in stdout, stderr
    for out, extra in ((tmp_path / "stopped", ("--resume",)), (tmp_path / "never", args)):
        done = subprocess.run(command(out, *extra), capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
    stopped, never = (load_adapter(tmp_path / name / ADAPTER_NAME).adapters for name in ("stopped", "never"))
    assert stopped.keys() == never.keys() and all(np.array_equal(stopped[k], never[k]) for k in never)
