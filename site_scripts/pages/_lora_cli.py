"""The LoRA page's command-line section, run for real at build time in a temporary folder: a small base trained
by `train`, `finetune` on a second corpus, the adapter file it wrote (read back array by array), `sample
--adapter`, and the refusals. Paths are shown relative to that folder, so two builds show the same text.
Values and tables only: the words are in docs/finetuning/lora.md."""

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
BASE_STEPS = 8  # the base's training steps


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
                  TrainConfig(steps=BASE_STEPS, batch_size=4, seq_len=8, eval_every=8, seed=seed), progress=False)


def adapter_file(root):
    """(table of the adapter file's arrays, values of its description and of the base's hash recomputed: the
    first 16 hex digits of each; tests/site/test_pages_lora.py compares them whole)."""
    with np.load(root / "tuned" / ADAPTER_NAME, allow_pickle=False) as f:
        arrays = {k: f[k] for k in f.files}
    meta = json.loads(str(arrays.pop("meta")))
    rows = [[f"`{k}`", f"`{v.shape}`", v.dtype.name] for k, v in arrays.items()]
    sha = params_sha256(load_checkpoint(root / "base" / "checkpoint.npz").params)
    return md_table(["array", "shape", "dtype"], rows), {
        "lora": json.dumps(meta["lora"]), "quantize": meta["quantize"], "step": meta["step"],
        "sha": meta["base"]["sha256"][:16], "rehash": sha[:16]}


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


def differ(plain, adapted):
    """(characters of the two samples that differ position by position, the prompt's included; the longer length)."""
    return sum(a != b for a, b in zip(plain, adapted)) + abs(len(plain) - len(adapted)), max(len(plain), len(adapted))


def cli():
    """(the adapter file's and the refusals' tables, the values of the run)."""
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        make_files(root)
        code, _, err = run_cli(FINETUNE, root)
        if code != 0:
            raise RuntimeError(f"the page's finetune command failed ({code}): {err}")
        plain = run_cli(SAMPLE, root)
        adapted = run_cli(SAMPLE + ["--adapter", "tuned/adapter.npz"], root)
        files, meta = adapter_file(root)
        refusals = refusals_md(root)
    cfg, (n, chars) = BASE_MODEL, differ(plain[1], adapted[1])
    return {"adapter_file": files, "refusals": refusals}, {
        "d": cfg.emb_dim, "L": cfg.num_layers, "F": cfg.ff_dim, "base_steps": BASE_STEPS, "seed": SEED,
        "finetune": command(FINETUNE), "status": code, "learn_from": int(FINETUNE[FINETUNE.index("--learn-from") + 1]),
        "meta": meta, "sample": command(SAMPLE), "sample_adapter": command(SAMPLE + ["--adapter", "tuned/adapter.npz"]),
        "plain": plain[1].rstrip(), "adapted": adapted[1].rstrip(), "plain_status": plain[0],
        "adapted_status": adapted[0], "differ": n, "chars": chars}
