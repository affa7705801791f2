import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from transformer.checkpoint import load_checkpoint
from transformer.config import PRESETS
from transformer.errors import CheckpointError, ConfigError, CorpusError, NonFiniteError
from transformer.step import evaluate
from transformer.train import train
from transformer.train_config import TrainConfig
from transformer.model import init_params
from transformer.softmax import cross_entropy_forward
from transformer.model import forward

MODEL = PRESETS["default"].with_(context_len=16, emb_dim=16, num_layers=1, ff_dim=32, num_heads=2)


@pytest.fixture
def corpus(tmp_path):
    rng = np.random.default_rng(0)
    words = ["to", "be", "or", "not", "that", "is", "the", "question", "\n"]
    path = tmp_path / "corpus.txt"
    path.write_text(" ".join(rng.choice(words, 3000)))
    return path


def read_metrics(out):
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def train_losses(out):
    return {m["step"]: m["loss"] for m in read_metrics(out) if "loss" in m}


def small_config(**changes):
    values = dict(steps=12, batch_size=4, seq_len=8, warmup=3, eval_every=4, ckpt_every=5, lr=1e-2)
    return TrainConfig(**{**values, **changes})


def stop_at(n):
    """An on_step callback that interrupts the run at step n, as a first Ctrl-C would."""
    def on_step(step, stop):
        if step == n:
            stop.reason = "interrupted"
    return on_step


def test_training_lowers_the_loss_and_writes_metrics_and_a_checkpoint(tmp_path, corpus):
    out = tmp_path / "run"
    summary = train(corpus, out, MODEL, small_config(steps=60, eval_every=30), progress=False)
    metrics = read_metrics(out)
    losses = [m["loss"] for m in metrics if "loss" in m]
    vals = [m["val_loss"] for m in metrics if "val_loss" in m]
    assert len(losses) == 60 and len(vals) == 2
    assert np.mean(losses[-10:]) < np.mean(losses[:10]) - 0.5
    assert summary["val_loss"] == vals[-1] and summary["stopped"] is None
    ckpt = load_checkpoint(out / "checkpoint.npz")
    assert ckpt.step == 60 and ckpt.opt_state["step"] == 60
    assert ckpt.cfg.vocab_size == ckpt.tokenizer.vocab_size == len(set(corpus.read_text()))


def test_resume_reproduces_an_uninterrupted_run_exactly(tmp_path, corpus):
    """Stop after step 7 (the last checkpoint is at step 5), resume: every loss equals the straight run."""
    straight, broken = tmp_path / "straight", tmp_path / "broken"
    train(corpus, straight, MODEL, small_config(), progress=False)

    summary = train(corpus, broken, MODEL, small_config(), progress=False, on_step=stop_at(7))
    assert summary["stopped"] == "interrupted" and summary["step"] == 7
    assert load_checkpoint(broken / "checkpoint.npz").step == 7
    train(corpus, broken, MODEL, small_config(), resume=True, progress=False)
    expected, got = train_losses(straight), train_losses(broken)
    assert sorted(got) == list(range(1, 13))  # no step lost or repeated in the metrics
    assert got == expected  # bit-for-bit equal losses
    a, b = load_checkpoint(straight / "checkpoint.npz"), load_checkpoint(broken / "checkpoint.npz")
    for name in a.params:
        np.testing.assert_array_equal(b.params[name], a.params[name])


def test_resume_after_a_crash_drops_the_metrics_of_lost_steps(tmp_path, corpus):
    """A crash at step 7 loses steps 6-7 (checkpoint at 5): their metric lines are redone, not duplicated."""
    out = tmp_path / "run"

    def crash_at_7(step, stop):
        if step == 7:
            raise RuntimeError("simulated crash")

    with pytest.raises(RuntimeError, match="simulated crash"):
        train(corpus, out, MODEL, small_config(), progress=False, on_step=crash_at_7)
    assert load_checkpoint(out / "checkpoint.npz").step == 5
    train(corpus, out, MODEL, small_config(), resume=True, progress=False)
    steps = [m["step"] for m in read_metrics(out) if "loss" in m]
    assert steps == list(range(1, 13))


def test_evaluate_is_the_token_weighted_mean_over_the_whole_split():
    cfg = MODEL.with_(vocab_size=7)
    params = init_params(cfg, seed=0)
    data = np.random.default_rng(1).integers(0, 7, 45)
    # The same non-overlapping windows built by hand, one sequence at a time,
    # each window's mean loss weighted by its number of targets.
    hand, count = 0.0, 0
    for start in range(0, len(data) - 1, 8):
        x = data[start:min(start + 8, len(data) - 1)]
        y = data[start + 1:start + 1 + len(x)]
        hand += cross_entropy_forward(forward(params, x, cfg)[0], y)[0] * len(y)
        count += len(y)
    assert count == len(data) - 1
    np.testing.assert_allclose(evaluate(params, cfg, data, 8, batch_size=2), hand / count, rtol=1e-12)


def test_training_refuses_bad_settings(tmp_path, corpus):
    with pytest.raises(ConfigError, match="seq_len=32 is longer than context_len=16"):
        train(corpus, tmp_path / "a", MODEL, small_config(seq_len=32), progress=False)
    with pytest.raises(ConfigError, match="steps must be a positive integer"):
        small_config(steps=0)
    with pytest.raises(ConfigError, match="beta2 must lie in"):
        small_config(beta2=1.0)
    with pytest.raises(CorpusError, match="does not exist"):
        train(tmp_path / "nope.txt", tmp_path / "b", MODEL, small_config(), progress=False)
    short = tmp_path / "short.txt"
    short.write_text("abc")
    with pytest.raises(CorpusError, match="has 3 tokens; windows of 8 tokens need at least"):
        train(short, tmp_path / "c", MODEL, small_config(), progress=False)
    with pytest.raises(CheckpointError, match="does not exist"):
        train(corpus, tmp_path / "never-ran", MODEL, small_config(), resume=True, progress=False)


def test_an_out_dir_that_is_a_file_is_refused_and_left_alone(tmp_path, corpus):
    blocker = tmp_path / "notes.txt"
    blocker.write_text("a file, not a folder\n")
    with pytest.raises(ConfigError, match="notes.txt is a file"):
        train(corpus, blocker, MODEL, small_config(), progress=False)
    assert blocker.read_text() == "a file, not a folder\n"


@pytest.mark.parametrize("changes", [{"beta1": "0.9"}, {"beta2": None}, {"lr": "0.1"}, {"steps": 2.5},
                                     # bool is a subclass of int: True would otherwise pass as 1
                                     {"steps": True}, {"warmup": False}, {"grad_clip": True}, {"beta1": False}])
def test_a_setting_of_the_wrong_type_is_a_config_error(changes):
    with pytest.raises(ConfigError, match=f"{next(iter(changes))} must"):
        small_config(**changes)


@pytest.mark.parametrize("part, value", [("train", {"beta1": "0.9"}), ("train", [1, 2]),
                                         ("sampler_state", {"bit_generator": "PCG64"})])
def test_resume_refuses_a_checkpoint_with_an_invalid_training_state(tmp_path, corpus, part, value):
    """load_checkpoint checks the model's part of a checkpoint; resuming checks the run's part, as a
    CheckpointError the command line prints as one line, not a TypeError or a KeyError."""
    out = tmp_path / "run"

    train(corpus, out, MODEL, small_config(), progress=False, on_step=stop_at(2))
    with np.load(out / "checkpoint.npz") as npz:
        arrays = {k: npz[k] for k in npz.files}
    meta = json.loads(str(arrays["meta"]))
    meta["extra"][part] = value
    np.savez(out / "checkpoint.npz", **{**arrays, "meta": np.array(json.dumps(meta))})
    with pytest.raises(CheckpointError, match="holds an invalid training state"):
        train(corpus, out, MODEL, small_config(), resume=True, progress=False)


def test_divergence_is_reported_not_trained_through(tmp_path, corpus):
    with pytest.raises(NonFiniteError, match=r"step 2: the loss became nan.*keeping the last good step, 1,"):
        train(corpus, tmp_path / "run", MODEL, small_config(lr=1e30, grad_clip=0.0, warmup=0, weight_decay=0.0),
              progress=False)
    assert load_checkpoint(tmp_path / "run" / "checkpoint.npz").step == 1


@pytest.mark.skipif(os.name != "posix", reason="sends SIGINT")
def test_ctrl_c_writes_a_checkpoint_and_exits_cleanly_then_resume_matches(tmp_path, corpus):
    """A real SIGINT to the command line: one line of output, status 130, a resumable checkpoint."""
    out = tmp_path / "run"
    args = [sys.executable, "-m", "transformer", "train", "--corpus", str(corpus), "--out", str(out),
            "--context-len", "16", "--emb-dim", "16", "--num-layers", "1", "--ff-dim", "32",
            "--num-heads", "2", "--steps", "100000", "--batch-size", "4", "--seq-len", "8",
            "--ckpt-every", "100000", "--eval-every", "100000", "--no-progress"]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    metrics = out / "metrics.jsonl"
    deadline = time.time() + 60
    while time.time() < deadline and (not metrics.exists() or len(metrics.read_text().splitlines()) < 20):
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr
    assert "Traceback" not in stderr
    assert "stopped (interrupted) after step" in stdout and "--resume" in stdout
    ckpt = load_checkpoint(out / "checkpoint.npz")
    logged = [json.loads(line)["step"] for line in metrics.read_text().splitlines()]
    assert ckpt.step == logged[-1] >= 20  # the checkpoint holds the last finished step


def test_resuming_a_finished_run_says_there_is_nothing_to_do(tmp_path, corpus):
    out = tmp_path / "run"
    train(corpus, out, MODEL, small_config(steps=3), progress=False)
    with pytest.raises(ConfigError, match=r"already finished \(3 of 3 steps\); there is nothing to resume"):
        train(corpus, out, MODEL, small_config(steps=3), resume=True, progress=False)


def test_time_limit_stops_with_a_checkpoint_and_a_validation_loss(tmp_path, corpus):
    out = tmp_path / "run"
    summary = train(corpus, out, MODEL, small_config(steps=10_000, eval_every=10_000), max_minutes=1e-9,
                    progress=False)
    assert summary["stopped"] == "time limit" and summary["step"] == 1
    assert summary["val_loss"] is not None and np.isfinite(summary["val_loss"])
    assert load_checkpoint(out / "checkpoint.npz").step == 1
    assert read_metrics(out)[-1] == {"step": 1, "val_loss": summary["val_loss"],
                                     "time_s": read_metrics(out)[-1]["time_s"]}


def test_stopping_on_the_last_step_is_just_the_end_of_the_run(tmp_path, corpus):
    """A time limit or Ctrl-C that lands on the final step must not claim the run can be resumed."""
    out = tmp_path / "run"
    summary = train(corpus, out, MODEL, small_config(steps=1, eval_every=1), max_minutes=1e-9, progress=False)
    assert summary["stopped"] is None and summary["step"] == 1
    assert [m["step"] for m in read_metrics(out) if "val_loss" in m] == [1]  # evaluated once, not twice


def test_a_new_run_never_overwrites_an_existing_one_by_accident(tmp_path, corpus):
    out = tmp_path / "run"
    train(corpus, out, MODEL, small_config(steps=3), progress=False)
    before = (out / "checkpoint.npz").read_bytes()
    with pytest.raises(ConfigError, match="already holds a run; continue it with --resume"):
        train(corpus, out, MODEL, small_config(steps=5), progress=False)
    assert (out / "checkpoint.npz").read_bytes() == before
    train(corpus, out, MODEL, small_config(steps=5), overwrite=True, progress=False)
    assert load_checkpoint(out / "checkpoint.npz").step == 5


def test_an_overwriting_run_that_fails_leaves_no_checkpoint_of_the_old_run(tmp_path, corpus):
    """Otherwise --resume would continue the old run with the failed run's metrics: the checkpoint left is the
    new run's own last good step, beside its own metrics."""
    out = tmp_path / "run"

    train(corpus, out, MODEL, small_config(), progress=False, on_step=stop_at(2))
    diverging = small_config(lr=1e30, grad_clip=0.0, warmup=0, weight_decay=0.0)
    with pytest.raises(NonFiniteError, match="the loss became"):
        train(corpus, out, MODEL, diverging, overwrite=True, progress=False)
    ckpt = load_checkpoint(out / "checkpoint.npz")
    assert ckpt.step == 1 and ckpt.extra["train"]["lr"] == 1e30
    assert [m["step"] for m in read_metrics(out)] == [1, 2] and "nonfinite" in read_metrics(out)[1]


def test_resume_refuses_a_different_corpus(tmp_path, corpus):
    out = tmp_path / "run"

    train(corpus, out, MODEL, small_config(), progress=False, on_step=stop_at(2))
    other = tmp_path / "other.txt"
    other.write_text(corpus.read_text()[:-50])
    with pytest.raises(ConfigError, match="the corpus differs from the one this run was trained on"):
        train(other, out, MODEL, small_config(), resume=True, progress=False)


def test_resume_survives_a_metrics_line_torn_by_a_crash(tmp_path, corpus):
    out = tmp_path / "run"

    train(corpus, out, MODEL, small_config(), progress=False, on_step=stop_at(5))
    with open(out / "metrics.jsonl", "a") as f:
        f.write('{"step": 6, "loss": 2.3')  # half a line, as a crash mid-write leaves it
    train(corpus, out, MODEL, small_config(), resume=True, progress=False)
    assert [m["step"] for m in read_metrics(out) if "loss" in m] == list(range(1, 13))


def test_max_minutes_must_be_positive(tmp_path, corpus):
    for bad in (0.0, -1.0, float("nan"), True, "5"):
        with pytest.raises(ConfigError, match="max_minutes must be a positive number"):
            train(corpus, tmp_path / "run", MODEL, small_config(), max_minutes=bad, progress=False)


def sigterm_then_resume(args, out, tmp_path):
    """Run the command line, send SIGTERM two seconds in (as `timeout`, schedulers and container runtimes stop a
    job), then resume it to the end; the stopped run's output and the final checkpoint's arrays."""
    proc = subprocess.Popen([sys.executable, "-m", "transformer", *args, "--out", str(out), "--no-progress"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(2)
    assert proc.poll() is None, "the run ended within two seconds: give it more steps, or SIGTERM tests nothing"
    proc.send_signal(signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=120)
    resumed = subprocess.run([sys.executable, "-m", "transformer", args[0], "--resume", "--out", str(out),
                              "--no-progress"], capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    return proc.returncode, stdout, stderr


def arrays_of(path):
    with np.load(path) as npz:
        return {k: npz[k] for k in npz.files if k != "meta"}


@pytest.mark.skipif(os.name != "posix", reason="sends SIGTERM")
def test_sigterm_stops_like_ctrl_c_and_the_resumed_run_ends_bit_identical(tmp_path, corpus):
    """SIGTERM used to kill the run at once, losing the steps since the last periodic checkpoint. Now it is
    Ctrl-C's first press: the step finishes, its checkpoint is written, one line says so, the status is 143
    (128 + SIGTERM); resuming then ends with the same bits as a run never stopped."""
    args = ["train", "--corpus", str(corpus), "--context-len", "16", "--emb-dim", "16", "--num-layers", "1",
            "--ff-dim", "32", "--num-heads", "2", "--steps", "3000", "--batch-size", "4", "--seq-len", "8",
            "--ckpt-every", "100000", "--eval-every", "1000"]
    code, stdout, stderr = sigterm_then_resume(args, tmp_path / "stopped", tmp_path)
    assert code == 143 and "Traceback" not in stderr, stderr
    assert "stopped (terminated) after step" in stdout and "--resume" in stdout
    never = subprocess.run([sys.executable, "-m", "transformer", *args, "--out", str(tmp_path / "never"),
                            "--no-progress"], capture_output=True, text=True, timeout=300)
    assert never.returncode == 0, never.stderr
    stopped, whole = arrays_of(tmp_path / "stopped" / "checkpoint.npz"), arrays_of(tmp_path / "never" / "checkpoint.npz")
    assert stopped.keys() == whole.keys() and all(np.array_equal(stopped[k], whole[k]) for k in whole)
