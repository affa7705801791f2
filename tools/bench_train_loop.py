"""Benchmark: the training loop of `scripts/demo` against the same recipe in plain PyTorch eager, per step.

The recipe is the demo's: config A on Tiny Shakespeare, batches of 32 windows, AdamW at a peak rate of 6e-3
with 200 warm-up steps and cosine decay, the global-norm clip at 1.0, float32. The NumPy side is `python -m
transformer train` itself, with the demo's settings and fewer steps; each step record of its metrics.jsonl
gives the step's time (drawing the batch, loss and gradients, clip, AdamW). The PyTorch side is
`torch_loop` below, in a process of its own: the run `train` would start (the same tokenizer, initial
parameters and batch sampler, from `new_run`), in torch tensors, with torch.optim.AdamW and
clip_grad_norm_, timed over the same span of each step. The workers alternate over the rounds, and the
report gives each side's median step after the first WARMUP steps, and their ratio (the target: at most
0.8), and the first losses of both, which must agree (the same model, batch and initial parameters).

    python -m tools.bench_train_loop [--steps 300] [--rounds 3]
"""

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


from tools.common import ROOT, positive_int
from tools.common import CORPUS, ensure_corpus  # fetched and verified by scripts/fetch_corpus.py

SETTINGS = {"batch_size": 32, "lr": 6e-3, "warmup": 200}  # scripts/demo's, with its --preset A
RECIPE = ["--preset", "A", *(f"--{k.replace('_', '-')}={v:g}" for k, v in SETTINGS.items())]
WARMUP = 10  # steps left out of the medians: the first steps page in memory and fill caches


def numpy_loop(steps):
    """`python -m transformer train` with the demo's recipe for `steps` steps: (each step's seconds, the first
    step's loss)."""
    ensure_corpus()
    with tempfile.TemporaryDirectory() as out:
        subprocess.run([sys.executable, "-m", "transformer", "train", "--corpus", str(CORPUS), "--out", out,
                        *RECIPE, "--steps", str(steps), "--eval-every", str(steps), "--no-progress"],
                       cwd=ROOT, check=True, capture_output=True)
        records = [json.loads(line) for line in (Path(out) / "metrics.jsonl").read_text().splitlines()]
    from transformer.config import PRESETS

    stepped = [r for r in records if "tokens_per_s" in r]
    # B T: train_step's tokens_per_s is the batch's tokens over the step's time
    tokens = SETTINGS["batch_size"] * PRESETS["A"].context_len
    return [tokens / r["tokens_per_s"] for r in stepped], stepped[0]["loss"]


def torch_loop(steps):
    """The same run's steps in plain PyTorch eager: (each step's seconds, the first step's loss)."""
    import torch

    from tools.bench_step import torch_adamw
    from transformer.config import PRESETS
    from transformer.data import load_corpus, sample_batch, train_val_split
    from transformer.optim import lr_at
    from transformer.torch_mirror import to_torch, torch_loss
    from transformer.run_state import new_run
    from transformer.train_config import TrainConfig

    ensure_corpus()
    tc = TrainConfig(steps=steps, **SETTINGS)
    text = load_corpus(CORPUS)
    run = new_run(text, PRESETS["A"], tc)
    seq_len = run.model_cfg.context_len
    train_ids, _ = train_val_split(run.tokenizer.encode(text), seq_len)
    params = to_torch(run.params, dtype=torch.float32)
    optimizer = torch_adamw(params, tc.adamw())
    times, losses = [], []
    for step in range(steps):
        start = time.perf_counter()
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, tc.lr, tc.warmup, tc.steps, tc.min_lr)
        x, y = sample_batch(train_ids, tc.batch_size, seq_len, run.rng)
        optimizer.zero_grad(set_to_none=True)
        loss = torch_loss(params, torch.as_tensor(x), torch.as_tensor(y), run.model_cfg)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params.values(), tc.grad_clip)
        optimizer.step()
        times.append(time.perf_counter() - start)
        losses.append(loss.item())
    return times, losses[0]


LOOPS = {"numpy": numpy_loop, "torch": torch_loop}


def run_worker(framework, steps):
    """One framework's loop in a fresh process: {"times": [...], "first_loss": ...}."""
    done = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--worker", framework, "--steps",
                           str(steps)], capture_output=True, text=True, check=False)
    if done.returncode:
        sys.exit(f"the {framework} worker failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.splitlines()[-1])


def report(runs):
    """The lines printed for the rounds of both loops."""
    median = {f: statistics.median(t for r in rs for t in r["times"][WARMUP:]) for f, rs in runs.items()}
    lines = [f"  {f}: median step {median[f] * 1e3:.1f} ms over {len(rs)} rounds of {len(rs[0]['times'])} steps "
             f"(the first {WARMUP} of each left out); first loss {rs[0]['first_loss']:.6f}" for f, rs in runs.items()]
    per_round = [statistics.median(a["times"][WARMUP:]) / statistics.median(b["times"][WARMUP:])
                 for a, b in zip(runs["numpy"], runs["torch"])]
    lines.append(f"  ratio numpy / torch: {median['numpy'] / median['torch']:.2f} "
                 f"(rounds {min(per_round):.2f} to {max(per_round):.2f}); target: at most 0.8")
    return lines


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=positive_int, default=300, help="steps per worker")
    parser.add_argument("--rounds", type=positive_int, default=3, help="rounds of one worker per framework")
    parser.add_argument("--worker", choices=sorted(LOOPS), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.steps <= WARMUP:
        parser.error(f"--steps must be more than the {WARMUP} warm-up steps left out of the medians")
    if args.worker:
        times, first_loss = LOOPS[args.worker](args.steps)
        print(json.dumps({"times": times, "first_loss": first_loss}))
        return 0
    ensure_corpus()
    runs = {f: [] for f in LOOPS}
    for r in range(args.rounds):
        for framework in list(LOOPS) if r % 2 == 0 else list(LOOPS)[::-1]:
            runs[framework].append(run_worker(framework, args.steps))
    print(f"the training loop of scripts/demo ({' '.join(RECIPE)}), {args.steps} steps per worker:")
    print("\n".join(report(runs)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
