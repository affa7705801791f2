"""The LoRA page's command-line section, run for real at build time in a temporary folder: a small base trained
by `train`, `finetune` on a second corpus, the adapter file it wrote (read back array by array), `sample
--adapter`, and the refusals. Paths are printed relative to that folder, so two builds print the same text."""

import contextlib
import io
import json
import tempfile
from pathlib import Path

import numpy as np

from transformer.checkpoint import load_checkpoint
from transformer.cli import main
from transformer.config import PRESETS
from transformer.finetune import params_sha256
from transformer.finetune_run import ADAPTER_NAME
from transformer.train import train
from transformer.train_config import TrainConfig

from ..common import md_table
from ..examples import SEED

BASE_MODEL = PRESETS["default"].with_(context_len=16, emb_dim=16, num_layers=1, ff_dim=32, num_heads=2)
WORDS = ["to", "be", "or", "not", "that", "is", "the", "question", "\n"]
FINETUNE = ["finetune", "--checkpoint", "base/checkpoint.npz", "--corpus", "reply.txt", "--out", "tuned",
            "--lora-rank", "4", "--lora-alpha", "8", "--lora-targets", "q,v,ff2", "--learn-from", "2",
            "--steps", "30", "--lr", "0.02", "--batch-size", "4", "--seq-len", "8", "--eval-every", "10", "--no-progress"]
SAMPLE = ["sample", "--checkpoint", "base/checkpoint.npz", "--prompt", "to", "--tokens", "40", "--seed", "0"]


def run_cli(args, root):
    """(exit status, stdout, stderr) of `python -m transformer ARGS` run in `root`, with root's path removed."""
    out, err = io.StringIO(), io.StringIO()
    full = [str(root / a) if (root / a).exists() or a in ("tuned", "x") else a for a in args]
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(full)
    prefix = str(root) + "/"
    return code, out.getvalue().replace(prefix, ""), err.getvalue().replace(prefix, "").strip()


def command(args):
    return "python -m transformer " + " ".join(a if a.strip() else repr(a) for a in args)


def make_files(root):
    """The two corpora and the base (and a second base trained with another seed)."""
    rng = np.random.default_rng(SEED)
    (root / "corpus.txt").write_text(" ".join(rng.choice(WORDS, 3000)))
    (root / "reply.txt").write_text(" ".join(rng.choice(WORDS[:4] + ["\n"], 2000)))
    for name, seed in (("base", SEED), ("other", SEED + 1)):
        with contextlib.redirect_stdout(io.StringIO()):  # its progress lines
            train(root / "corpus.txt", root / name, BASE_MODEL,
                  TrainConfig(steps=8, batch_size=4, seq_len=8, eval_every=8, seed=seed), progress=False)


def adapter_md(root):
    """The arrays of the adapter file, and its description's base hash against the base's parameters."""
    with np.load(root / "tuned" / ADAPTER_NAME, allow_pickle=False) as f:
        arrays = {k: f[k] for k in f.files}
    meta = json.loads(str(arrays.pop("meta")))
    rows = [[f"`{k}`", f"`{v.shape}`", v.dtype.name] for k, v in arrays.items()]
    sha = params_sha256(load_checkpoint(root / "base" / "checkpoint.npz").params)
    same = "the same" if sha == meta["base"]["sha256"] else "**different (FAIL)**"
    return (md_table(["array", "shape", "dtype"], rows)
            + f"\nBeside the arrays, the `meta` entry (JSON) holds the format and its version, the LoRA settings "
              f"(`{json.dumps(meta['lora'])}`), the quantization (`{meta['quantize']}`), the steps trained "
              f"({meta['step']}), the training settings and sampler state, and the base: its path, its "
              f"configuration and `params_sha256` of its parameters, `{meta['base']['sha256'][:16]}…`. Hashing "
              f"`base/checkpoint.npz` again gives {same} digest.\n")


REFUSALS = (
    ("an adapter for another base", ["sample", "--checkpoint", "other/checkpoint.npz", "--adapter",
                                     "tuned/adapter.npz"]),
    ("rank 0", FINETUNE[:6] + ["x", "--lora-rank", "0", "--no-progress"]),
    ("a rank larger than the width", FINETUNE[:6] + ["x", "--lora-rank", str(BASE_MODEL.emb_dim + 1),
                                                     "--no-progress"]),
    ("an unknown target", FINETUNE[:6] + ["x", "--lora-targets", "q,attn", "--no-progress"]),
)


def refusals_md(root):
    rows = []
    for what, args in REFUSALS:
        code, _, err = run_cli(args, root)
        rows.append([what, f"`{command(args)}`", code, f"`{err}`"])
    return md_table(["input", "command", "exit status", "stderr"], rows)


def differ_text(plain, adapted):
    """How many characters of the two samples differ, position by position (the prompt's included)."""
    n = sum(a != b for a, b in zip(plain, adapted)) + abs(len(plain) - len(adapted))
    return (f"they differ at {n} of {max(len(plain), len(adapted))} characters" if n else
            "**they are the same** (the adapter changed nothing that this sample shows)")


def cli_md():
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        make_files(root)
        code, _, err = run_cli(FINETUNE, root)
        if code != 0:
            raise RuntimeError(f"the page's finetune command failed ({code}): {err}")
        plain = run_cli(SAMPLE, root)
        adapted = run_cli(SAMPLE + ["--adapter", "tuned/adapter.npz"], root)
        files = adapter_md(root)
        refusals = refusals_md(root)
    cfg = BASE_MODEL
    return (f"Run in a fresh folder when this page was built: a base of \\(d\\) = {cfg.emb_dim}, \\(L\\) = "
            f"{cfg.num_layers}, \\(F\\) = {cfg.ff_dim} trained by `train` for 8 steps on `corpus.txt` (random "
            f"words, seed {SEED}), then fine-tuned on `reply.txt` (a smaller vocabulary of the same words):\n\n"
            f"```text\n{command(FINETUNE)}\n```\n\n"
            f"It exited with status {code}. `--learn-from 2` makes the first two positions of every window "
            "context only ([the loss over part of a window](#eq-time-range-loss)); `--quantize nf4` would store "
            "the base in NF4 ([QLoRA](qlora.md)); `--full` trains every parameter instead, into a checkpoint.npz. "
            "`finetune --resume --out tuned` continues a stopped run exactly, after checking the base's hash.\n\n"
            "**The adapter file**, `tuned/adapter.npz`, read back with `np.load`: the adapters (`param/`) and their "
            "AdamW moments (`adam_m/`, `adam_v/`), and nothing of the base.\n\n" + files
            + "\n**Sampling with the adapter.** `sample --adapter` checks the base's hash, merges the adapters into "
              f"the weights ([merge](#eq-lora-merge)) and samples from the merged model:\n\n"
              f"```text\n$ {command(SAMPLE)}\n{plain[1].rstrip()}\n"
              f"$ {command(SAMPLE + ['--adapter', 'tuned/adapter.npz'])}\n{adapted[1].rstrip()}\n```\n\n"
              f"Exit statuses {plain[0]} and {adapted[0]}. With the same seed, the two samples differ only by the "
              f"adapter: {differ_text(plain[1], adapted[1])}.\n\n"
              "**Refusals.** Each wrong input is one line on stderr and a non-zero exit, before anything is "
              "trained or written:\n\n" + refusals)
