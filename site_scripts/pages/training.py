"""Generator of the Training loop & data page: the values its prose shows (docs/training/loop.md binds them), its
tables and its pictures. A real `train` runs at build time on a small corpus; its metrics are the page's."""

import contextlib
import io
import json
import tempfile
from pathlib import Path

import numpy as np

from transformer.config import PRESETS
from transformer.data import TRAIN_FRACTION, CharTokenizer, eval_windows, sample_batch, train_val_split
from transformer.model import forward, init_params, loss_and_grads
from transformer.parallel import Sharded, shard_rows
from transformer.run_state import new_run
from transformer.train import train
from transformer.train_config import TrainConfig

from .. import memory, sections
from ..common import md_table, verdict_text
from ..examples import SEED
from ..figures import new_figure, png

PASSAGE = ("First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak.\n\n"
           "First Citizen:\nYou are all resolved rather to die than to famish?\n\nAll:\nResolved. resolved.\n")
REPEATS = 8
TEXT = PASSAGE * REPEATS
STEPS = 60
WINDOW = 16
EXAMPLE_BATCH = 2  # windows of the sampling example
SHOWN_EVERY = 10  # the run's table shows its first step and every SHOWN_EVERY-th


# ---------------------------------------------------------------- the corpus, its split, one batch

def example():
    """The corpus split and one batch of EXAMPLE_BATCH windows, with the starts sample_batch drew."""
    tok = CharTokenizer.from_text(TEXT)
    ids = tok.encode(TEXT)
    train_ids, val_ids = train_val_split(ids, WINDOW)
    x, y = sample_batch(train_ids, EXAMPLE_BATCH, WINDOW, np.random.default_rng(SEED))
    starts = np.random.default_rng(SEED).integers(0, len(train_ids) - WINDOW, size=EXAMPLE_BATCH)  # its own draw
    if not np.array_equal(x, train_ids[starts[:, None] + np.arange(WINDOW)]):
        raise RuntimeError("the starts shown are not those sample_batch drew")
    rows = [[w, starts[w], f"`{tok.decode(x[w])!r}`", f"`{tok.decode(y[w])!r}`"] for w in range(EXAMPLE_BATCH)]
    table = md_table(["window \\(w\\)", "start \\(s_w\\)", "inputs \\(\\mathrm{id}_w\\)", "targets \\(y_w\\)"], rows)
    return table, {"n_c": len(ids), "repeats": REPEATS, "n_v": tok.vocab_size, "fraction": TRAIN_FRACTION, "cut": len(train_ids),
                   "train": len(train_ids), "val": len(val_ids), "batch": EXAMPLE_BATCH, "window": WINDOW,
                   "last_start": len(train_ids) - WINDOW - 1, "val_windows": len(list(eval_windows(val_ids, WINDOW))),
                   "val_targets": sum(y.size for _, y in eval_windows(val_ids, WINDOW))}


def windows_png(cfg, tc):
    """Where the first step's training windows and the validation windows lie in the corpus."""
    run = new_run(TEXT, cfg, tc)
    train_ids, val_ids = train_val_split(run.tokenizer.encode(TEXT), WINDOW)
    starts = run.rng.integers(0, len(train_ids) - WINDOW, size=tc.batch_size)  # the first batch's draw
    fig, ax = new_figure(figsize=(10, 2.6))
    for w, s in enumerate(starts):
        ax.plot([s, s + WINDOW], [w + 1, w + 1], color="tab:blue", linewidth=4,
                label="the first step's training windows" if w == 0 else None)
    cut = len(train_ids)
    for k, (x, _) in enumerate(eval_windows(val_ids, WINDOW)):
        ax.plot([cut + k * WINDOW, cut + k * WINDOW + len(x)], [0, 0], color="tab:orange" if k % 2 else "tab:red",
                linewidth=4, label="validation windows, one after another" if k == 0 else None)
    ax.axvline(cut, color="k", linestyle="--", label="the split")
    ax.set_yticks(range(tc.batch_size + 1), ["validation"] + [f"w = {w}" for w in range(tc.batch_size)])
    ax.set_xlabel("position in the corpus (token index)")
    ax.set_ylabel("window")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize="small")
    return png(fig)


# ---------------------------------------------------------------- a real run

def run_config():
    cfg = PRESETS["tiny"].with_(vocab_size=len(set(TEXT)), context_len=WINDOW, emb_dim=16, ff_dim=64)
    tc = TrainConfig(steps=STEPS, batch_size=8, lr=1e-2, warmup=5, eval_every=20, ckpt_every=STEPS, seed=SEED,
                     dtype="float64")
    return cfg, tc


def run_records(cfg, tc):
    """The records of `metrics.jsonl` of a real call of `train`: (steps, validations)."""
    with tempfile.TemporaryDirectory() as folder:
        corpus = Path(folder) / "corpus.txt"
        corpus.write_text(TEXT)
        with contextlib.redirect_stdout(io.StringIO()):  # its progress lines belong to a terminal, not the build
            train(corpus, Path(folder) / "run", cfg, tc, progress=False)
        records = [json.loads(line) for line in (Path(folder) / "run" / "metrics.jsonl").read_text().splitlines()]
    return [r for r in records if "loss" in r], [r for r in records if "val_loss" in r]


def run_values(cfg, tc, steps, evals):
    shown = [steps[0], *steps[SHOWN_EVERY - 1::SHOWN_EVERY]]
    rows = [[r["step"], r["step"] - 1, f"{r['loss']:.4f}", f"{r['lr']:.5f}", f"{r['grad_norm']:.3f}",
             "yes" if r["grad_norm"] > tc.grad_clip else "no"] for r in shown]
    tables = {"run": md_table(["`step`", "\\(s\\)", "training loss", "\\(\\eta_s\\)", "\\(\\lVert g \\rVert\\)",
                               "clipped?"], rows),
              "validation": md_table(["`step`", "validation loss"], [[r["step"], f"{r['val_loss']:.4f}"] for r in evals])}
    return tables, {"steps": STEPS, "d": cfg.emb_dim, "l": cfg.num_layers, "t": cfg.context_len, "n_v": cfg.vocab_size,
                    "batch": tc.batch_size, "warmup": tc.warmup, "lr": tc.lr, "min_lr": tc.min_lr, "clip": tc.grad_clip,
                    "dtype": tc.dtype, "seed": SEED, "every": SHOWN_EVERY, "eval_every": tc.eval_every,
                    "clipped": sum(r["grad_norm"] > tc.grad_clip for r in steps), "tokens": tc.batch_size * cfg.context_len,
                    "first_val": evals[0]["val_loss"], "last_val": evals[-1]["val_loss"]}


def run_png(steps, evals, tc):
    """The run's training loss at every step and its validation losses, with the learning rate beside them."""
    fig, ax = new_figure(figsize=(10, 3.4))
    ax.plot([r["step"] for r in steps], [r["loss"] for r in steps], label="training loss (one batch)")
    ax.plot([r["step"] for r in evals], [r["val_loss"] for r in evals], "o", label="validation loss (whole split)")
    ax.set_xlabel("step (updates made)")
    ax.set_ylabel("loss (nats per token)")
    lr = ax.twinx()
    lr.plot([r["step"] for r in steps], [r["lr"] for r in steps], color="grey", linestyle=":",
            label="learning rate of the step")
    lr.set_ylabel("learning rate")
    lines = ax.get_legend_handles_labels(), lr.get_legend_handles_labels()
    ax.legend(lines[0][0] + lines[1][0], lines[0][1] + lines[1][1], loc="upper right", fontsize="small")
    return png(fig)


def first_batch_loss_parts(cfg, tc):
    """The first step's loss recomputed from what `train` starts with (the same parameters, the same sampler),
    split as log n_V + spread − lead: spread = mean over positions of log((1/n_V) Σ_j exp(z_j − z̄)) ≥ 0, and
    lead = mean of z_y − z̄, the target's logit above its row's mean. Also the logits' spread σ within a row."""
    run = new_run(TEXT, cfg, tc)
    train_ids, _ = train_val_split(run.tokenizer.encode(TEXT), cfg.context_len)
    x, y = sample_batch(train_ids, tc.batch_size, cfg.context_len, run.rng)
    z = forward(run.params, x, run.model_cfg)[0].reshape(-1, run.model_cfg.vocab_size)
    centred = z - z.mean(axis=-1, keepdims=True)
    spread = float(np.log(np.exp(centred).mean(axis=-1)).mean())
    lead = float(centred[np.arange(len(z)), y.reshape(-1)].mean())
    sigma = float(np.sqrt(centred.var(axis=-1).mean()))
    return np.log(run.model_cfg.vocab_size) + spread - lead, spread, lead, sigma


def initial_loss(cfg, tc, first_loss):
    loss, spread, lead, sigma = first_batch_loss_parts(cfg, tc)
    return {"first": first_loss, "log_v": float(np.log(cfg.vocab_size)), "diff": abs(loss - first_loss),
            "spread": spread, "lead": lead, "net": spread - lead, "sigma": sigma, "half_var": sigma ** 2 / 2}


# ---------------------------------------------------------------- memory policies and shards

POLICY_LENGTHS = (64, 256)  # measured by the quick and the full build alike, so this page is the same in both


def policies():
    """The step peaks of the four memory policies at two lengths (bytes: the same on every run), and the
    materialized peak divided by each."""
    if not set(POLICY_LENGTHS) <= set(memory.QUICK_LENGTHS) & set(memory.tool.LENGTHS):
        raise RuntimeError(f"{POLICY_LENGTHS} must be measured in both builds")
    found, cfg, names = memory.measurements(), memory.tool.CONFIG, list(memory.tool.POLICIES)
    peaks = md_table(["\\(T\\)", *(f"`{p}`" for p in names)],
                     [[T] + [memory.mib(found[p, T].step_peak) for p in names] for T in POLICY_LENGTHS])
    gains = md_table(["\\(T\\)", *(f"`{p}`" for p in names[1:])],
                     [[T] + [f"{found['materialized', T].step_peak / found[p, T].step_peak:.1f}" for p in names[1:]]
                      for T in POLICY_LENGTHS])
    return {"policies": peaks, "policy_gains": gains}, {"batch": memory.tool.BATCH, "d": cfg.emb_dim,
                                                         "l": cfg.num_layers}


SHARD_BATCH = 7  # windows of the shards example: 7 does not split evenly, so the weights differ
ROUNDING = 1e-12  # a relative gap below this is rounding
EQUAL_WEIGHTS_OFF = 1e-6  # equal weights must be off by more than this, or the example shows nothing


def processes_agree(n, params, x, y, cfg, reference):
    """The shards computed by worker processes against the same shards in threads: True when bit for bit the
    same, None where worker processes cannot run (not Linux, or no threadpoolctl)."""
    in_processes = Sharded(n, processes=True)
    if not in_processes.processes:
        return None
    loss, grads = in_processes(loss_and_grads, params, x, y, cfg)
    if in_processes.workers is None:
        raise RuntimeError("the shards meant for worker processes ran in threads")
    in_processes.close()
    return loss == reference[0] and all(np.array_equal(grads[k], g) for k, g in reference[1].items())


def shards():
    """One pass over a batch against the same batch in 2 and 3 shards, float64: the weights and the gaps, and
    what equal weights would get wrong."""
    cfg = PRESETS["tiny"]
    params = init_params(cfg, seed=SEED)
    x, y = np.random.default_rng(SEED).integers(0, cfg.vocab_size, (2, SHARD_BATCH, cfg.context_len))
    loss, grads = loss_and_grads(params, x, y, cfg)
    rows, same_bits = [], []
    for n in (2, 3):
        shard_loss, shard_grads = Sharded(n, processes=False)(loss_and_grads, params, x, y, cfg)
        same_bits.append(processes_agree(n, params, x, y, cfg, (shard_loss, shard_grads)))
        # b_k's gradient is zero in exact arithmetic (its entries are rounding noise), so it is left out
        gap = max(np.abs(shard_grads[k] - g).max() / np.abs(g).max() for k, g in grads.items() if not k.endswith(".bk"))
        parts = shard_rows(SHARD_BATCH, n)
        plain = np.mean([loss_and_grads(params, x[a:b], y[a:b], cfg)[0] for a, b in parts])  # equal weights
        rel, plain_rel = abs(shard_loss - loss) / loss, abs(plain - loss) / loss
        if gap > ROUNDING or rel > ROUNDING or plain_rel < EQUAL_WEIGHTS_OFF:
            raise RuntimeError(f"{n} shards differ from one pass by more than rounding, or equal weights do not")
        rows.append([n, " + ".join(f"{b - a}/{SHARD_BATCH}" for a, b in parts), f"{rel:.1e}", f"{gap:.1e}",
                     f"{plain_rel:.1e}"])
    if False in same_bits:
        raise RuntimeError("shards computed by worker processes differ from the same shards computed by threads")
    table = md_table(["\\(n_{\\mathrm{sh}}\\)", "weights \\(N^{(\\xi)}/N\\)", "relative gap of \\(\\mathcal{L}\\)",
                      "largest relative gap of a gradient", "relative gap with equal weights"], rows)
    processes = ("not run: worker processes are not available where this page was built" if None in same_bits
                 else verdict_text(True, False, ""))
    return table, {"batch": SHARD_BATCH, "loss": loss, "processes": processes}


def symbols_md():
    cfg = PRESETS["default"]
    tc = TrainConfig()
    data = np.arange(10_000)
    x, y = sample_batch(data, tc.batch_size, cfg.context_len, np.random.default_rng(SEED))
    rows = [
        (r"c", "data, train_ids", data.shape, "the training split `sample_batch` draws from"),
        (r"N_c", "len(ids)", f"{len(data)}"),
        (r"B", "batch_size", f"{tc.batch_size}"),
        (r"T", "seq_len", f"{cfg.context_len}"),
        (r"w", "x[w]", "index"),
        (r"s_w", "starts", (tc.batch_size,)),
        (r"\mathrm{id}", "x", x.shape, "a batch of input windows"),
        (r"y", "y", y.shape, "their targets, each window shifted by one"),
    ]
    return sections.symbols_md(rows, f"`sample_batch` on 10000 ids with B = {tc.batch_size}, T = {cfg.context_len}")


def generate(context):
    cfg, tc = run_config()
    example_table, corpus = example()
    steps, evals = run_records(cfg, tc)
    run_tables, run = run_values(cfg, tc, steps, evals)
    policy_tables, policy = policies()
    shard_table, shard = shards()
    values = {"split": {"train": TRAIN_FRACTION, "val": 1 - TRAIN_FRACTION}, "corpus": corpus, "run": run,
              "first": initial_loss(cfg, tc, steps[0]["loss"]), "policy": policy, "shards": shard}
    return {"values": values, "batch": example_table, **run_tables, **policy_tables, "shards": shard_table,
            "windows.png": windows_png(cfg, tc), "run.png": run_png(steps, evals, tc), "symbols": symbols_md()}
