"""Training through the command line with `--engine autograd`: the tape's gradients drive the same AdamW
steps as the hand-written ones, so in float64 the losses agree step for step."""

import json
import os
from pathlib import Path

import numpy as np
import pytest

from transformer import run_state
from transformer.checkpoint import load_checkpoint
from transformer.cli import main
from transformer.config import PRESETS
from transformer.errors import ConfigError
from transformer.model import init_params
from transformer.parallel import resolve, shard_rows
from transformer.train_config import TrainConfig

ROOT = Path(__file__).resolve().parents[2]
SHAKESPEARE = Path(os.environ.get("TRANSFORMER_CORPUS", ROOT / "data" / "tinyshakespeare" / "input.txt"))
SLICE = 10_000  # characters: 90% to train on, and a validation split of some fifteen windows of 64
# Config A in float64, three steps: both engines compute the same sums in another order (relative gaps of
# ~1e-15 in every gradient), and three AdamW steps carry that into the loss at about the same size.
A_LOSS_TOL = 1e-12

STEPS = 8
# Both engines compute the same gradients to ~1e-15 relative; eight AdamW steps carry that into the
# parameters, and the losses stay within ~1e-14. 1e-11 is a margin of about 1e3; a wrong gradient
# changes the loss after one step by far more (a learning rate of 1e-2 moves it by ~1e-2).
LOSS_TOL = 1e-11


@pytest.fixture
def corpus(tmp_path):
    rng = np.random.default_rng(0)
    words = ["to", "be", "or", "not", "that", "is", "the", "question", "\n"]
    path = tmp_path / "corpus.txt"
    path.write_text(" ".join(rng.choice(words, 2000)))
    return path


def cli_losses(tmp_path, corpus, engine):
    out = tmp_path / engine
    code = main(["train", "--corpus", str(corpus), "--out", str(out), "--no-progress", "--engine", engine,
                 "--dtype", "float64", "--steps", str(STEPS), "--batch-size", "4", "--seq-len", "8",
                 "--warmup", "2", "--lr", "1e-2", "--eval-every", "100", "--ckpt-every", "100",
                 "--context-len", "8", "--emb-dim", "16", "--num-heads", "2", "--num-layers", "2",
                 "--ff-dim", "24", "--activation", "gelu"])
    assert code == 0
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [r["loss"] for r in records if "loss" in r]


def test_autograd_engine_trains_to_the_same_losses_step_for_step(tmp_path, corpus, monkeypatch):
    calls = []

    def counted(*args, **kwargs):
        calls.append(1)
        return engine(*args, **kwargs)

    engine = run_state.autograd_loss_and_grads
    monkeypatch.setattr(run_state, "autograd_loss_and_grads", counted)
    handwritten = cli_losses(tmp_path, corpus, "handwritten")
    assert not calls
    autograd = cli_losses(tmp_path, corpus, "autograd")
    # the tape computed every step's gradients, in as many shards as train cuts a batch of 4 into
    assert len(calls) == STEPS * len(shard_rows(4, resolve(0)))
    assert len(handwritten) == len(autograd) == STEPS
    assert handwritten[-1] < handwritten[0]  # the run trained: the comparison is not of a frozen model
    gaps = [abs(a - h) / abs(h) for a, h in zip(autograd, handwritten)]
    assert max(gaps) < LOSS_TOL, gaps


def test_an_unknown_engine_is_refused():
    with pytest.raises(ConfigError, match="engine must be one of handwritten, autograd"):
        TrainConfig(engine="torch")


@pytest.fixture
def text_slice(tmp_path, corpus):
    """The first SLICE characters of Tiny Shakespeare where it is in place (scripts/fetch_corpus.py puts it
    there), else the made-up corpus above: a copy of the project without data/ (the mutation run's) has
    only that."""
    text = SHAKESPEARE.read_text(encoding="utf-8")[:SLICE] if SHAKESPEARE.is_file() else corpus.read_text()
    path = tmp_path / "slice.txt"
    path.write_text(text, encoding="utf-8")
    return path


def test_config_a_trains_to_the_same_losses_by_both_engines_in_float64(tmp_path, text_slice):
    """Item 5 of the issue at the real shape: preset A (T = 64, d = 64, H = 4, L = 3, F = 256) through the
    command line, three float64 steps on a slice of Tiny Shakespeare, losses equal step for step."""
    losses = {}
    for engine in ("handwritten", "autograd"):
        out = tmp_path / engine
        code = main(["train", "--corpus", str(text_slice), "--out", str(out), "--no-progress", "--engine", engine,
                     "--preset", "A", "--dtype", "float64", "--steps", "3", "--batch-size", "4", "--warmup", "1",
                     "--lr", "1e-2", "--eval-every", "100", "--ckpt-every", "100"])
        assert code == 0
        records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
        losses[engine] = [r["loss"] for r in records if "loss" in r]
        ckpt = load_checkpoint(out / "checkpoint.npz")
        assert ckpt.cfg.with_(vocab_size=PRESETS["A"].vocab_size) == PRESETS["A"]  # A's shape, its own vocabulary
        start = init_params(ckpt.cfg, seed=TrainConfig().seed, dtype=np.float64)
        assert max(np.abs(ckpt.params[k] - start[k]).max() for k in start) > 1e-3  # it trained: not a frozen model
    handwritten, autograd = losses["handwritten"], losses["autograd"]
    assert len(handwritten) == len(autograd) == 3
    gaps = [abs(a - h) / abs(h) for a, h in zip(autograd, handwritten)]
    assert max(gaps) < A_LOSS_TOL, gaps
