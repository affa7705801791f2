"""Training through the command line with `--engine autograd`: the tape's gradients drive the same AdamW
steps as the hand-written ones, so in float64 the losses agree step for step."""

import json

import numpy as np
import pytest

from transformer import train as train_module
from transformer.cli import main
from transformer.errors import ConfigError
from transformer.train import TrainConfig

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

    engine = train_module.autograd_loss_and_grads
    monkeypatch.setattr(train_module, "autograd_loss_and_grads", counted)
    handwritten = cli_losses(tmp_path, corpus, "handwritten")
    assert not calls
    autograd = cli_losses(tmp_path, corpus, "autograd")
    assert len(calls) == STEPS  # the tape computed every step's gradients
    assert len(handwritten) == len(autograd) == STEPS
    assert handwritten[-1] < handwritten[0]  # the run trained: the comparison is not of a frozen model
    gaps = [abs(a - h) / abs(h) for a, h in zip(autograd, handwritten)]
    assert max(gaps) < LOSS_TOL, gaps


def test_an_unknown_engine_is_refused():
    with pytest.raises(ConfigError, match="engine must be one of handwritten, autograd"):
        TrainConfig(engine="torch")
