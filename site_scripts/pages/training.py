"""Generator of the Training loop & data page's fragments."""

import contextlib
import io
import json
import tempfile
from pathlib import Path

import numpy as np

from transformer.config import PRESETS
from transformer.data import CharTokenizer, sample_batch, train_val_split
from transformer.train import TrainConfig, train

from .. import sections
from ..examples import SEED

TEXT = ("First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak.\n\n"
        "First Citizen:\nYou are all resolved rather to die than to famish?\n\nAll:\nResolved. resolved.\n") * 8
STEPS = 60


def example_md():
    tok = CharTokenizer.from_text(TEXT)
    ids = tok.encode(TEXT)
    train_ids, val_ids = train_val_split(ids, 16)
    x, y = sample_batch(train_ids, 2, 16, np.random.default_rng(SEED))
    rows = [[b, f"`{tok.decode(x[b])!r}`", f"`{tok.decode(y[b])!r}`"] for b in range(2)]
    return (f"A corpus of {len(TEXT)} characters (the opening of Tiny Shakespeare's first speech, repeated; "
            f"V = {tok.vocab_size}) splits into {len(train_ids)} training and {len(val_ids)} validation tokens. "
            f"`sample_batch(train, 2, 16, rng)` with seed {SEED} draws:\n\n"
            + sections.md_table(["row b", "inputs x[b]", "targets y[b]"], rows)
            + "\nEach target is the input shifted left by one character: at every position the model is asked "
              "for the next character.\n")


def run_md():
    cfg = PRESETS["tiny"].with_(vocab_size=len(set(TEXT)), context_len=16, emb_dim=16, ff_dim=64)
    tc = TrainConfig(steps=STEPS, batch_size=8, lr=1e-2, warmup=5, eval_every=20, ckpt_every=STEPS, seed=SEED,
                     dtype="float64")
    with tempfile.TemporaryDirectory() as folder:
        corpus = Path(folder) / "corpus.txt"
        corpus.write_text(TEXT)
        with contextlib.redirect_stdout(io.StringIO()):  # its progress lines belong to a terminal, not the build
            train(corpus, Path(folder) / "run", cfg, tc, progress=False)
        records = [json.loads(line) for line in (Path(folder) / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if "loss" in r]
    evals = [r for r in records if "val_loss" in r]
    shown = [steps[0], *steps[9::10]]
    rows = [[r["step"], f"{r['loss']:.4f}", f"{r['lr']:.5f}", f"{r['grad_norm']:.3f}"] for r in shown]
    val_rows = [[r["step"], f"{r['val_loss']:.4f}"] for r in evals]
    return (f"A real call of `train` at build time: {STEPS} steps of a small model (d = {cfg.emb_dim}, "
            f"L = {cfg.num_layers}, T = {cfg.context_len}, V = {cfg.vocab_size}) on the corpus above, batch "
            f"{tc.batch_size}, learning rate rising linearly over {tc.warmup} warm-up steps to {tc.lr:g} and then "
            f"decaying to {tc.min_lr:g} along a cosine, float64, seed {SEED}. Rows from its `metrics.jsonl` (times "
            "are left out so the page is the same on every machine):\n\n"
            + sections.md_table(["step", "training loss", "lr", "grad norm"], rows)
            + "\nValidation loss over the whole validation split:\n\n"
            + sections.md_table(["step", "validation loss"], val_rows)
            + f"\nThe loss starts near log V = {np.log(cfg.vocab_size):.3f}, a uniform guess. A corpus this small "
              "and repetitive is learned quickly; the real Tiny Shakespeare run is the README's `scripts/demo`.\n")


def symbols_md():
    cfg = PRESETS["default"]
    tc = TrainConfig()
    data = np.arange(10_000)
    x, y = sample_batch(data, tc.batch_size, cfg.context_len, np.random.default_rng(SEED))
    rows = [
        (r"c", "data, train_ids", data.shape),
        (r"\mathrm{id}", "x", x.shape, "a batch of input windows"),
        (r"y", "y", x.shape, "their targets, each window shifted by one"),
        (r"s_w", "starts", (tc.batch_size,)),
    ]
    return sections.symbols_md(rows, f"`sample_batch` on 10000 ids with B = {tc.batch_size}, T = {cfg.context_len}")


def generate(context):
    return {"symbols": symbols_md(), "example": example_md(), "run": run_md()}
