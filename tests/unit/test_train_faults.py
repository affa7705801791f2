"""What a training run does when something goes wrong while nobody watches: a step that is not finite
commits nothing (and the run stops with its last good step, or skips the batch), a second run into the same
folder is refused while the first is alive, and a run killed with SIGKILL resumes bit for bit."""

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from test_train import MODEL, corpus, read_metrics, small_config, stop_at  # noqa: F401  (corpus: a fixture)

from transformer.checkpoint import load_checkpoint
from transformer.cli import main
from transformer.errors import MaskedRowError, NonFiniteError, RunLockedError
from transformer.run_state import new_run
from transformer.step import train_step
from transformer.train import Hooks, train
from transformer.train_config import MAX_SKIPS_IN_A_ROW


def poisoned(calls, value=np.nan, name="b0.wq"):
    """Hooks under which the gradients of the given batches a run computes (counted from 1) hold `value` in one
    entry of `name`: a fault injected where the model's own arithmetic would produce it."""
    count = [0]

    def gradients(grads):
        count[0] += 1
        if count[0] in calls:
            grads[name] = grads[name].copy()
            grads[name].flat[0] = value
        return grads

    return Hooks(gradients=gradients)


def state_of(run):
    """Copies of everything a step may change."""
    return ({k: p.copy() for k, p in run.params.items()}, {k: m.copy() for k, m in run.opt_state["m"].items()},
            {k: v.copy() for k, v in run.opt_state["v"].items()}, run.opt_state["step"], run.step)


def assert_same_state(a, b):
    for group_a, group_b in zip(a[:3], b[:3]):
        assert group_a.keys() == group_b.keys()
        for k in group_a:
            np.testing.assert_array_equal(group_a[k], group_b[k])
    assert a[3:] == b[3:]


def assert_same_params(path_a, path_b):
    a, b = load_checkpoint(path_a), load_checkpoint(path_b)
    assert a.step == b.step
    for name in a.params:
        np.testing.assert_array_equal(b.params[name], a.params[name])
        np.testing.assert_array_equal(b.opt_state["m"][name], a.opt_state["m"][name])


# ----------------------------------------------------------------- one step: all or nothing


@pytest.mark.parametrize("fault, named", [("nan gradient", "b0.ff1_w"), ("inf gradient", "head_b"),
                                          ("nan loss", "loss")])
def test_a_step_that_is_not_finite_changes_no_parameter_moment_or_step(corpus, fault, named):  # noqa: F811
    run = new_run(corpus.read_text(), MODEL, small_config())
    ids = run.tokenizer.encode(corpus.read_text())
    train_step(run, ids, 8)
    before = state_of(run)
    real = run.loss_and_grads

    def faulty(x, y):
        loss, grads = real(x, y)
        if fault == "nan loss":
            return float("nan"), grads
        grads[named] = grads[named].copy()
        grads[named].flat[-1] = np.inf if fault == "inf gradient" else np.nan
        return loss, grads

    run.loss_and_grads = faulty
    with pytest.raises(NonFiniteError, match=r"^step 2: ") as raised:
        train_step(run, ids, 8)
    assert raised.value.name == named and (named == "loss" or f"the gradient of {named} is not finite"
                                           in str(raised.value))
    assert_same_state(state_of(run), before)


def test_the_first_non_finite_gradient_in_the_models_order_is_named(corpus):  # noqa: F811
    run = new_run(corpus.read_text(), MODEL, small_config())
    real = run.loss_and_grads

    def faulty(x, y):
        loss, grads = real(x, y)
        return loss, {k: g * np.nan if k in ("head_w", "b0.wk") else g for k, g in grads.items()}

    run.loss_and_grads = faulty
    with pytest.raises(NonFiniteError, match="the gradient of b0.wk is not finite"):
        train_step(run, run.tokenizer.encode(corpus.read_text()), 8)


def test_scores_that_overflow_to_minus_inf_are_a_non_finite_step_not_a_bad_input(corpus):  # noqa: F811
    run = new_run(corpus.read_text(), MODEL, small_config())

    def masked(x, y):
        raise MaskedRowError("softmax: 1 row(s) are -inf everywhere")

    run.loss_and_grads = masked
    with pytest.raises(NonFiniteError, match="step 1: the loss is not finite"):
        train_step(run, run.tokenizer.encode(corpus.read_text()), 8)


# ----------------------------------------------------------------- a run: stop or skip


def test_stop_keeps_the_last_good_step_and_a_skip_resume_equals_a_run_that_skipped(tmp_path, corpus):  # noqa: F811
    """Stop at the poisoned step 4: the checkpoint is step 3 exactly (the sampler too: resuming draws the
    same batch again). Resumed with skip, past it, the run equals one that skipped from the start."""
    skipped = train(corpus, tmp_path / "skip", MODEL, small_config(on_nonfinite="skip"), progress=False,
                    hooks=poisoned({4}))
    assert skipped["step"] == 12 and skipped["skipped"] == 1
    refused = [m for m in read_metrics(tmp_path / "skip") if "nonfinite" in m]
    assert [(m["step"], m["nonfinite"], m["skipped_batches"]) for m in refused] == [(4, "b0.wq", 1)]

    hooks = poisoned({4, 5})  # call 5 is the resumed run's first: the same batch drawn again
    with pytest.raises(NonFiniteError, match=r"step 4: the gradient of b0.wq is not finite \(loss [0-9.]+\); "
                                             r"stopped, keeping the last good step, 3, in .*checkpoint.npz"):
        train(corpus, tmp_path / "stop", MODEL, small_config(), progress=False, hooks=hooks)
    assert load_checkpoint(tmp_path / "stop" / "checkpoint.npz").step == 3
    summary = train(corpus, tmp_path / "stop", MODEL, small_config(), resume=True, progress=False,
                    on_nonfinite="skip", hooks=hooks)
    assert summary["skipped"] == 1
    assert_same_params(tmp_path / "skip" / "checkpoint.npz", tmp_path / "stop" / "checkpoint.npz")
    losses = {m["step"]: m["loss"] for m in read_metrics(tmp_path / "stop") if "loss" in m}
    assert losses == {m["step"]: m["loss"] for m in read_metrics(tmp_path / "skip") if "loss" in m}


def test_a_run_stopped_after_a_skip_resumes_with_its_count_bit_for_bit(tmp_path, corpus):  # noqa: F811
    train(corpus, tmp_path / "straight", MODEL, small_config(on_nonfinite="skip"), progress=False,
          hooks=poisoned({2}))
    train(corpus, tmp_path / "broken", MODEL, small_config(on_nonfinite="skip"), progress=False,
          on_step=stop_at(6), hooks=poisoned({2}))
    summary = train(corpus, tmp_path / "broken", MODEL, small_config(), resume=True, progress=False)
    assert summary["skipped"] == 1
    assert_same_params(tmp_path / "straight" / "checkpoint.npz", tmp_path / "broken" / "checkpoint.npz")


def test_skipping_gives_up_when_every_batch_fails(tmp_path, corpus):  # noqa: F811
    with pytest.raises(NonFiniteError, match=f"after {MAX_SKIPS_IN_A_ROW} such batches in a row, keeping the last "
                                             "good step, 2,"):
        train(corpus, tmp_path / "run", MODEL, small_config(on_nonfinite="skip"), progress=False,
              hooks=poisoned(set(range(3, 100))))
    assert load_checkpoint(tmp_path / "run" / "checkpoint.npz").step == 2


def test_the_command_line_reports_a_non_finite_step_on_one_line(tmp_path, corpus, capsys):  # noqa: F811
    from test_cli import SMALL, assert_one_line_error

    hooks, out = poisoned({3}), tmp_path / "run"
    code = main(["train", "--corpus", str(corpus), "--out", str(out), *SMALL, "--steps", "5"], hooks=hooks)
    _, err = capsys.readouterr()
    assert_one_line_error(code, err, "step 3: the gradient of b0.wq is not finite")
    assert "keeping the last good step, 2" in err and "--on-nonfinite skip" in err
    code = main(["train", "--resume", "--out", str(out), "--on-nonfinite", "skip", "--no-progress"], hooks=hooks)
    printed, err = capsys.readouterr()
    assert code == 0 and err == ""  # the replayed batch is finite now (call 4): nothing skipped
    assert "done: 5 steps" in printed and "skipped" not in printed


# ----------------------------------------------------------------- one run per folder


def test_a_second_run_into_a_live_runs_folder_is_refused_and_changes_nothing(tmp_path, corpus):  # noqa: F811
    out, seen = tmp_path / "run", {}

    def second_run(step, stop):
        if step == 6:  # after the checkpoint of step 5, so that a resume gets as far as the lock
            metrics = (out / "metrics.jsonl").read_text()
            for kwargs in ({"overwrite": True}, {"resume": True}):
                with pytest.raises(RunLockedError, match=rf"{out} is in use by another run \(process {os.getpid()}\)"):
                    train(corpus, out, MODEL, small_config(), progress=False, **kwargs)
            seen["metrics unchanged"] = (out / "metrics.jsonl").read_text() == metrics

    train(corpus, out, MODEL, small_config(), progress=False, on_step=second_run)
    assert seen == {"metrics unchanged": True}
    assert [m["step"] for m in read_metrics(out) if "loss" in m] == list(range(1, 13))
    train(corpus, out, MODEL, small_config(), overwrite=True, progress=False)  # the lock went with the run


def cli_args(corpus, out, *extra):  # noqa: F811
    return [sys.executable, "-m", "transformer", "train", "--corpus", str(corpus), "--out", str(out),
            "--context-len", "16", "--emb-dim", "16", "--num-layers", "1", "--ff-dim", "32", "--num-heads", "2",
            "--batch-size", "4", "--seq-len", "8", "--no-progress", *extra]


@pytest.mark.skipif(os.name != "posix", reason="the folder lock is fcntl's")
def test_two_runs_started_at_once_into_one_folder_exactly_one_proceeds(tmp_path, corpus):  # noqa: F811
    out = tmp_path / "run"
    args = cli_args(corpus, out, "--steps", "100000", "--eval-every", "100000", "--ckpt-every", "100000",
                    "--max-minutes", "0.03")
    procs = [subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    results = [(p, *p.communicate(timeout=120)) for p in procs]
    ran = [r for r in results if r[0].returncode == 0]
    refused = [r for r in results if r[0].returncode != 0]
    assert len(ran) == 1 and len(refused) == 1, [r[1:] for r in results]
    winner, (loser, stdout, stderr) = ran[0][0], refused[0]
    assert loser.returncode == 2 and stdout == ""
    assert stderr.splitlines() == [f"error: {out} is in use by another run (process {winner.pid}); "
                                   "wait for it to end, or choose another --out"]
    assert "stopped (time limit)" in ran[0][1]


@pytest.mark.skipif(os.name != "posix", reason="sends SIGKILL")
def test_a_run_killed_with_sigkill_resumes_at_once_and_ends_bit_identical(tmp_path, corpus):  # noqa: F811
    """kill -9 leaves the lock file with a dead PID in it: --resume is not blocked, and it ends where a run that
    never stopped ends."""
    steps = ["--steps", "300", "--eval-every", "100", "--ckpt-every", "10", "--warmup", "3", "--lr", "0.01"]
    out = tmp_path / "killed"
    proc = subprocess.Popen(cli_args(corpus, out, *steps), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    metrics, deadline = out / "metrics.jsonl", time.time() + 60
    while time.time() < deadline and (not metrics.exists() or len(metrics.read_text().splitlines()) < 25):
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    killed_at = load_checkpoint(out / "checkpoint.npz").step
    assert 20 <= killed_at < 300 and (out / "run.lock").read_text().strip() == str(proc.pid)
    resumed = subprocess.run(cli_args(corpus, out, "--resume")[:8] + ["--resume", "--no-progress"],
                             capture_output=True, text=True, timeout=120)
    assert resumed.returncode == 0, resumed.stderr
    assert main(["train", "--corpus", str(corpus), "--out", str(tmp_path / "straight"), *cli_args(corpus, out)[8:],
                 *steps]) == 0
    assert_same_params(tmp_path / "straight" / "checkpoint.npz", out / "checkpoint.npz")
    steps_logged = [json.loads(line)["step"] for line in metrics.read_text().splitlines() if '"loss"' in line]
    assert steps_logged == list(range(1, 301))
