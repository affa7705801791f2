"""The faults the "What survives a fault" page injects into real training runs, and what each left behind.

Every run is `python -m transformer train` in a subprocess (through tools/fault_inject.py where a fault is
injected), in a scratch folder, on a corpus drawn with SEED, with relative paths, so that what the program
prints reads the same on every machine. site_scripts/pages/faults.py renders the results.
"""

import os
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from transformer.checkpoint import load_checkpoint
from transformer.run_folder import METRICS_NAME, read_metrics

ROOT = Path(__file__).resolve().parent.parent
SEED = 0  # of the corpus and of the kill moments (the runs themselves train with TrainConfig's seed)
SMALL = ["--context-len", "16", "--emb-dim", "16", "--num-layers", "1", "--ff-dim", "32", "--num-heads", "2",
         "--batch-size", "4", "--seq-len", "16"]
SCHEDULE = ["--steps", "40", "--ckpt-every", "10", "--eval-every", "20", "--warmup", "5", "--no-progress"]
STEPS, CKPT_EVERY, EVAL_EVERY = 40, 10, 20  # the values SCHEDULE gives
KILLS = 5


@dataclass
class Ran:
    """One command: what it was, its exit status and what it printed (a run time replaced by `t`)."""
    command: str
    status: int
    stdout: str
    stderr: str


@dataclass
class Kept:
    """What a run's folder holds afterwards."""
    step: int | None  # the checkpoint's step; None when there is none
    files: list = field(default_factory=list)
    loads: bool = False


def write_corpus(folder):
    rng = np.random.default_rng(SEED)
    words = ["to", "be", "or", "not", "that", "is", "the", "question", "\n"]
    (folder / "corpus.txt").write_text(" ".join(rng.choice(words, 1500)))


def run(folder, args, faults=()):
    """`python -m transformer ARGS` in folder, with the faults of tools/fault_inject.py when any."""
    head = ["-m", "tools.fault_inject", *faults, "--"] if faults else ["-m", "transformer"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, *head, *args], cwd=folder, capture_output=True, text=True, timeout=300,
                          env=env)
    shown = ("python -m tools.fault_inject " + " ".join(faults) + " -- " if faults else "python -m transformer ")
    return Ran(shown + " ".join(args), done.returncode, timeless(done.stdout), timeless(done.stderr))


def timeless(text):
    """The one number of a run's output that differs between builds: its wall time."""
    return re.sub(r"\bin \d+ s\b", "in t s", text)


def train_args(out, *extra):
    return ["train", "--corpus", "corpus.txt", "--out", out, *SMALL, *SCHEDULE, *extra]


def kept(folder):
    """The checkpoint of a run's folder (its step, and whether it loads) and the folder's files."""
    folder = Path(folder)
    # A temporary file's name holds random letters (tempfile.mkstemp): shown as *, the same on every build.
    files = sorted(re.sub(r"\.[^.]+\.tmp$", ".*.tmp", p.name) for p in folder.iterdir()) if folder.is_dir() else []
    try:
        return Kept(load_checkpoint(folder / "checkpoint.npz").step, files, True)
    except Exception:  # noqa: BLE001 - what a fault left may be anything; the page says it did not load
        return Kept(None, files, False)


def bitwise_equal(path_a, path_b):
    """(equal, count): whether every parameter and both AdamW moments are equal bit for bit, and how many
    arrays were compared."""
    a, b = load_checkpoint(path_a), load_checkpoint(path_b)
    pairs = [(a.params, b.params), (a.opt_state["m"], b.opt_state["m"]), (a.opt_state["v"], b.opt_state["v"])]
    same = [np.array_equal(x[k], y[k]) and x[k].dtype == y[k].dtype for x, y in pairs for k in x]
    return a.step == b.step and all(same), len(same)


def losses(folder):
    return {r["step"]: r["loss"] for r in read_metrics(Path(folder) / METRICS_NAME) if "loss" in r}


def metric_records(folder, key):
    return [r for r in read_metrics(Path(folder) / METRICS_NAME) if key in r]


def kill_moments():
    """KILLS (step, moment) pairs drawn with SEED, in the order a run meets them, at distinct steps after the
    first checkpoint (before it there is nothing to resume): two at steps with a save (there the kill lands
    halfway through writing the checkpoint, or during the validation before it where one is due), the others
    just after a step."""
    rng = np.random.default_rng(SEED)
    saves = np.arange(2 * CKPT_EVERY, STEPS + 1, CKPT_EVERY)
    others = np.setdiff1d(np.arange(CKPT_EVERY + 1, STEPS + 1), saves)
    moments = [(int(s), "after-step") for s in rng.choice(others, KILLS - 2, replace=False)]
    for step in rng.choice(saves, 2, replace=False):
        choices = ["mid-save"] + (["validation"] if step % EVAL_EVERY == 0 else [])
        moments.append((int(step), str(rng.choice(choices))))
    return sorted(moments)


def straight_run(folder):
    """The uninterrupted run every fault's outcome is compared with."""
    return run(folder, train_args("straight"))


@dataclass
class KillRound:
    step: int
    moment: str
    ran: Ran
    kept: Kept


def kill_case(folder):
    """A run killed at each of kill_moments(), resumed after each kill, then to its end.

    Returns
    -------
    (list of KillRound, Ran of the last resume, (equal, count) against the straight run, losses equal)
    """
    rounds, args = [], train_args("killed")
    for step, moment in kill_moments():
        ran = run(folder, args, ["--kill", f"{step}:{moment}"])
        rounds.append(KillRound(step, moment, ran, kept(folder / "killed")))
        args = ["train", "--resume", "--out", "killed", "--no-progress"]
    last = run(folder, args)
    equal = bitwise_equal(folder / "straight" / "checkpoint.npz", folder / "killed" / "checkpoint.npz")
    return rounds, last, equal, losses(folder / "straight") == losses(folder / "killed")


def try_mount(mount_point, size_bytes):
    """Mount a tmpfs of size_bytes at mount_point; the reason as text when that is refused, else None."""
    mount_point.mkdir()
    try:
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_bytes}", "tmpfs", str(mount_point)],
                              capture_output=True, text=True, timeout=30)
    except OSError as e:
        return f"mount could not run: {e.strerror}"
    if done.returncode:
        return (done.stderr.strip() or f"mount exited with status {done.returncode}").splitlines()[0]
    return None


@dataclass
class DiskCase:
    skipped: str | None  # why it did not run
    size: int = 0  # bytes of the tmpfs
    checkpoint_bytes: int = 0
    ran: Ran | None = None
    kept: Kept | None = None
    resumed: Ran | None = None
    equal: tuple = ()


def disk_case(folder):
    """A run whose --out is a tmpfs with room for one checkpoint and a half: the first save fits, the second
    (a temporary file beside the first) fills the disk. Then the folder is copied to a roomy disk and resumed."""
    import shutil

    # In whole KiB: the exact size varies by a few bytes between builds (the run time is in its description).
    checkpoint_bytes = round((folder / "straight" / "checkpoint.npz").stat().st_size / 1024) * 1024
    size = -(-(checkpoint_bytes * 3 // 2 + 16384) // 4096) * 4096
    disk = folder / "small-disk"
    reason = try_mount(disk, size)
    if reason is not None:
        return DiskCase(reason, size, checkpoint_bytes)
    try:
        ran = run(folder, train_args("small-disk/run"))
        left = kept(disk / "run")
        shutil.copytree(disk / "run", folder / "moved")
    finally:
        subprocess.run(["umount", str(disk)], capture_output=True, timeout=30)
    resumed = run(folder, ["train", "--resume", "--out", "moved", "--corpus", "corpus.txt", "--no-progress"])
    equal = bitwise_equal(folder / "straight" / "checkpoint.npz", folder / "moved" / "checkpoint.npz")
    return DiskCase(None, size, checkpoint_bytes, ran, left, resumed, equal)


@dataclass
class LockCase:
    winner: Ran
    loser: Ran
    pid_named: bool  # the loser's line names the winner's PID
    one_run: bool  # metrics.jsonl holds each step once


def lock_case(folder):
    """Two identical runs started at the same moment into one --out; each stops after a few seconds."""
    args = [sys.executable, "-m", "transformer", "train", "--corpus", "corpus.txt", "--out", "shared", *SMALL,
            "--steps", "100000", "--max-minutes", "0.05", "--no-progress"]
    procs = [subprocess.Popen(args, cwd=folder, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    outs = [p.communicate(timeout=300) for p in procs]
    ran = [Ran("python -m transformer " + " ".join(args[3:]), p.returncode, timeless(o), timeless(e))
           for p, (o, e) in zip(procs, outs)]
    if sorted(r.status for r in ran) != [0, 2]:
        raise RuntimeError(f"two runs into one folder: exit statuses {[r.status for r in ran]}, not one 0 and one 2")
    w = [r.status for r in ran].index(0)
    winner, loser = ran[w], ran[1 - w]
    pid = str(procs[w].pid)
    named = f"(process {pid})" in loser.stderr
    loser.stderr = loser.stderr.replace(pid, "P")
    steps = [r["step"] for r in metric_records(folder / "shared", "loss")]
    return LockCase(winner, loser, named, steps == list(range(1, len(steps) + 1)))


POISONED_BATCH = 13  # the batch whose gradient the non-finite cases poison


@dataclass
class NonFiniteCase:
    stopped: Ran  # the default, --on-nonfinite stop
    stopped_kept: Kept
    resumed: Ran  # --resume --on-nonfinite skip, the same batch poisoned again
    skipped: Ran  # --on-nonfinite skip from the start
    skip_records: list  # metrics.jsonl's records of the skipped batch
    equal: tuple  # the stopped-then-resumed run against the skipping one, bit for bit
    same_losses: bool  # the stopped run's losses before the poisoned batch are the straight run's


def nonfinite_case(folder):
    """A NaN in one gradient of batch POISONED_BATCH: the default stops, keeping step POISONED_BATCH - 1; a
    resume that skips goes on, and ends equal to a run that skipped from the start."""
    poison = ["--poison", f"{POISONED_BATCH}:nan"]
    stopped = run(folder, train_args("stop"), poison)
    stopped_kept = kept(folder / "stop")
    same_losses = all(losses(folder / "stop")[k] == v for k, v in losses(folder / "straight").items()
                      if k < POISONED_BATCH)
    resumed = run(folder, ["train", "--resume", "--out", "stop", "--on-nonfinite", "skip", "--no-progress"],
                  ["--poison", "1:nan"])  # the resumed run's first batch is the poisoned one again
    skipped = run(folder, train_args("skip", "--on-nonfinite", "skip"), poison)
    equal = bitwise_equal(folder / "skip" / "checkpoint.npz", folder / "stop" / "checkpoint.npz")
    return NonFiniteCase(stopped, stopped_kept, resumed, skipped, metric_records(folder / "skip", "nonfinite"),
                         equal, same_losses)


@dataclass
class OverflowRow:
    dtype: str
    factor: float
    ran: Ran
    norm: float  # the grad_norm metrics.jsonl records for the scaled batch
    committed: bool  # that step was taken (a loss record, no refusal)
    finite: bool  # every parameter of the final checkpoint is finite


# Factors that make the squares of a batch's gradients overflow the dtype (float32's largest number is about
# 3.4e38, float64's 1.8e308), while the gradients themselves stay finite.
OVERFLOW_FACTORS = {"float64": 1e200, "float32": 1e21}


def overflow_case(folder):
    """Batch POISONED_BATCH's gradients multiplied by a factor whose squares overflow the dtype, in each dtype."""
    rows = []
    for dtype, factor in OVERFLOW_FACTORS.items():
        out = f"scaled-{dtype}"
        ran = run(folder, train_args(out, "--dtype", dtype), ["--scale", f"{POISONED_BATCH}:{factor:g}"])
        record = next(r for r in metric_records(folder / out, "loss") if r["step"] == POISONED_BATCH)
        params = load_checkpoint(folder / out / "checkpoint.npz").params
        rows.append(OverflowRow(dtype, factor, ran, record["grad_norm"],
                                not metric_records(folder / out, "nonfinite"),
                                all(np.isfinite(p).all() for p in params.values())))
    return rows
