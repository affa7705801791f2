"""Benchmark: one float32 training step (forward, backward, clip, AdamW) of the NumPy
reference against the same model in plain PyTorch eager on the CPU.

Each framework runs in its own fresh process, as a user runs it: a worker
process builds one framework's model, takes a few untimed warm-up steps, then
times `--steps` steps and reports them. The parent starts the workers in
alternating rounds (numpy then torch, then torch then numpy, ...), so a slow
moment of the machine falls on both sides, and prints for each config the
median step of each framework over all rounds, the ratio NumPy / PyTorch with
its range over the rounds, and the matmul-only floor: the step's matmul FLOPs
divided by numpy's own float32 matmul rate on this machine (2048 x 2048,
measured in the numpy worker). Each worker also reports its BLAS libraries
and thread counts (threadpoolctl).

Both sides get the same float32 parameters, batch, global-norm clip and AdamW
settings (decay on matrices only, as transformer/optim.py). The NumPy worker
takes the step `python -m transformer train` takes: it keeps freed memory
mapped (transformer/memory.py) and computes the batch in shards, one per core,
every shard but the first in a worker process on Linux, with BLAS on one
thread per call (transformer/parallel.py; `numpy-threads`: the shards in
threads instead); the torch worker is plain torch with its default threads.

    python -m tools.bench_step [--steps 40] [--rounds 3] [--configs A B] [--frameworks numpy torch]
    python -m tools.bench_step --frameworks numpy numpy-threads torch   # shards in processes and in threads
    python -m tools.bench_step --in-process ...   # both in one process, for profiling one of them
    python -m tools.bench_step --phases [--configs B]   # where the NumPy step's time goes, part by part

In one process each framework's spinning threads and heap slow the other, so
the in-process ratios are not what a user sees; they are kept for profiling.

`--phases` times the parts of the NumPy step one by one, in fresh workers too:
the batch's loss and gradients (its shards at once), the clip, AdamW; and the
first shard's `loss_and_grads` alone, the work this process does itself in the
first part. What the first part adds to it is the price of computing shards at
once: handing the parameters over, waiting for the slower shard, adding the
gradients, and two cores sharing the caches and memory.
"""

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from transformer.config import PRESETS
from transformer.memory import keep_freed_memory
from transformer.model import init_params, loss_and_grads
from transformer.optim import AdamWConfig, adamw_init, adamw_update, clip_grads, is_decayed
from transformer.parallel import shard_rows, sharded

BATCH = {"A": 32, "B": 12}
CLIP = 1.0  # the global-norm clip of both sides, train's default
WARMUP = 3
PEAK_SIZE = 2048


def matmul_flops(cfg, B):
    """FLOPs of every matmul in one training step: the forward's, and twice as many in the backward (each
    product A @ W needs dA = dY Wᵀ and dW = Aᵀ dY)."""
    T, d, F, V, H = cfg.context_len, cfg.emb_dim, cfg.ff_dim, cfg.vocab_size, cfg.num_heads
    n = B * T
    per_block = 2 * n * d * (3 * d) + 2 * n * d * d + 2 * (2 * n * d * F) + 2 * (2 * B * H * T * T * (d // H))
    forward = cfg.num_layers * per_block + 2 * n * d * V
    return 3 * forward


def numpy_matmul_rate():
    """numpy's float32 matmul rate in FLOP/s, the best of five 2048 x 2048 products."""
    a = np.random.default_rng(0).standard_normal((PEAK_SIZE, PEAK_SIZE)).astype(np.float32)
    a @ a
    best = min(_seconds(lambda: a @ a) for _ in range(5))
    return 2 * PEAK_SIZE ** 3 / best


def _seconds(f):
    t0 = time.perf_counter()
    f()
    return time.perf_counter() - t0


def setup(name):
    cfg = PRESETS[name]
    params = init_params(cfg, seed=0, dtype=np.float32)
    rng = np.random.default_rng(0)
    ids = rng.integers(0, cfg.vocab_size, (BATCH[name], cfg.context_len))
    targets = rng.integers(0, cfg.vocab_size, (BATCH[name], cfg.context_len))
    return cfg, params, ids, targets


def numpy_parts(name, threads=0, processes=None):
    """`numpy_step`'s step, which returns the seconds of each of its parts, and a function that computes the
    first shard's loss and gradients alone, as this process does in a step."""
    cfg, params, ids, targets = setup(name)
    opt, state = AdamWConfig(), adamw_init(params)
    shards = sharded(threads, processes)
    first = slice(*shard_rows(len(ids), shards.threads)[0])

    def step():
        t0 = time.perf_counter()
        _, grads = shards(loss_and_grads, params, ids, targets, cfg)
        t1 = time.perf_counter()
        grads, _ = clip_grads(grads, CLIP)
        t2 = time.perf_counter()
        adamw_update(params, grads, state, opt.lr, opt)
        return {"shards": t1 - t0, "clip": t2 - t1, "AdamW": time.perf_counter() - t2}

    return step, lambda: loss_and_grads(params, ids[first], targets[first], cfg)


def numpy_step(name, threads=0, processes=None):
    """The step `python -m transformer train` takes: the batch's loss and gradients in `threads` shards at
    once (transformer/parallel.py; 0: one per core), every shard but the first in a worker process where
    that is supported (processes=False: in threads), the global-norm clip, AdamW."""
    return numpy_parts(name, threads, processes)[0]


def torch_adamw(tparams, opt):
    """torch.optim.AdamW with our settings: decay on the matrices only, as transformer/optim.py."""
    import torch

    decay = [p for n, p in tparams.items() if is_decayed(n)]
    no_decay = [p for n, p in tparams.items() if not is_decayed(n)]
    return torch.optim.AdamW(
        [{"params": decay, "weight_decay": opt.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=opt.lr, betas=(opt.beta1, opt.beta2), eps=opt.eps)


def torch_step(name):
    import torch

    from transformer.torch_mirror import to_torch, torch_loss

    cfg, params, ids, targets = setup(name)
    opt = AdamWConfig()
    tparams = to_torch(params, dtype=torch.float32)
    optimizer = torch_adamw(tparams, opt)
    tids, ttargets = torch.as_tensor(ids), torch.as_tensor(targets)

    def step():
        optimizer.zero_grad(set_to_none=True)
        torch_loss(tparams, tids, ttargets, cfg).backward()
        torch.nn.utils.clip_grad_norm_(tparams.values(), CLIP)
        optimizer.step()

    return step


def phases_worker(name, steps, default_malloc=False):
    """Run in a fresh process: the parts of `steps` NumPy steps, then `steps` first shards alone; one JSON line."""
    if not default_malloc:
        keep_freed_memory()
    step, first_shard = numpy_parts(name)
    for _ in range(WARMUP):
        step()
    parts = [step() for _ in range(steps)]
    alone = [_seconds(first_shard) for _ in range(steps)]
    print(json.dumps({"parts": {k: [p[k] for p in parts] for k in parts[0]}, "first shard alone": alone}))


def phases_summary(name, runs):
    """The lines printed for one config's `--phases` rounds: each part's median and share of their sum."""
    parts = {k: statistics.median(t for r in runs for t in r["parts"][k]) for k in runs[0]["parts"]}
    total = sum(parts.values())
    alone = statistics.median(t for r in runs for t in r["first shard alone"])
    count, steps = len(runs), len(runs[0]["first shard alone"])
    lines = [f"config {name}, the NumPy step part by part (medians over {count} rounds of {steps} steps, "
             f"{total * 1e3:.1f} ms together):"]
    for k, t in parts.items():
        lines.append(f"  {k:<7} {t * 1e3:6.2f} ms  {t / total:4.0%}")
    lines.append(f"  the first shard alone, the other cores idle: {alone * 1e3:.2f} ms; the "
                 f"shards' {parts['shards'] * 1e3:.2f} ms add {(parts['shards'] - alone) * 1e3:.2f} ms to it (handing "
                 "the parameters over, waiting for the slower shard, adding the gradients, two cores sharing memory)")
    return lines


STEPS = {"numpy": numpy_step, "numpy-threads": lambda name: numpy_step(name, processes=False),
         "torch": torch_step}


def thread_pools():
    """Each BLAS or OpenMP library loaded in this process: its API, version and thread count."""
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return ["threadpoolctl not installed"]
    return [f"{p.get('prefix')} {p.get('version')} ({p.get('internal_api')}), {p.get('num_threads')} threads"
            for p in threadpool_info()]


def worker(framework, name, steps, default_malloc=False):
    """Run in a fresh process: time `steps` steps of one framework and print one JSON line."""
    if framework.startswith("numpy") and not default_malloc:
        keep_freed_memory()
    # numpy's matmul rate with BLAS on every core, before the sharded step makes BLAS use one thread per call.
    rate = numpy_matmul_rate() if framework.startswith("numpy") else None
    step = STEPS[framework](name)
    for _ in range(WARMUP):
        step()
    times = [_seconds(step) for _ in range(steps)]
    report = {"times": times, "pools": thread_pools()}
    if framework.startswith("numpy"):
        report["matmul_rate"] = rate
        shards = sharded(0, False if framework == "numpy-threads" else None)
        where = "worker processes and this one" if shards.workers else "threads"
        report["pools"].append(f"{shards.threads} shards at once in {where} (transformer/parallel.py)")
    else:
        import torch
        report["pools"].append(f"torch {torch.__version__}: {torch.get_num_threads()} intra-op threads")
    print(json.dumps(report))


def run_worker(framework, name, steps, default_malloc=False):
    """One fresh worker process for `framework` (or "phases"); its JSON line."""
    command = [sys.executable, str(Path(__file__).resolve()), "--worker", framework, "--configs", name,
               "--steps", str(steps)] + (["--default-malloc"] if default_malloc else [])
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode:
        sys.exit(f"the {framework} worker for config {name} failed:\n{done.stderr}")
    return json.loads(done.stdout.splitlines()[-1])


def rounds(name, steps, count, frameworks, default_malloc=False):
    """`count` rounds of one fresh worker per framework, the order flipped every round."""
    out = {f: [] for f in frameworks}
    for r in range(count):
        for framework in frameworks if r % 2 == 0 else frameworks[::-1]:
            time.sleep(0.3)  # let the previous worker's threads and memory go
            out[framework].append(run_worker(framework, name, steps, default_malloc))
    return out


def summary(name, runs):
    """The lines printed for one config, from each framework's rounds."""
    cfg = PRESETS[name]
    flops = matmul_flops(cfg, BATCH[name])
    median = {f: statistics.median(t for r in rs for t in r["times"]) for f, rs in runs.items()}
    head = (f"config {name} (B={BATCH[name]}, T={cfg.context_len}, d={cfg.emb_dim}, H={cfg.num_heads}, "
            f"L={cfg.num_layers}, F={cfg.ff_dim}, V={cfg.vocab_size}), {flops / 1e9:.2f} GFLOP of matmuls per step:")
    lines = [head]
    for f, rs in runs.items():
        lines.append(f"  {f}: median {median[f] * 1e3:.1f} ms over {len(rs)} rounds of {len(rs[0]['times'])} steps; "
                     + "; ".join(rs[0]["pools"]))
    numpys = [f for f in runs if f.startswith("numpy")]
    if numpys:
        rate = max(r["matmul_rate"] for f in numpys for r in runs[f])
        floor = flops / rate
        lines.append(f"  matmul floor: {floor * 1e3:.1f} ms at numpy's {rate / 1e9:.0f} GFLOP/s "
                     f"({PEAK_SIZE}² float32); "
                     + "; ".join(f"{f} reaches {floor / median[f]:.0%} of it, {median[f] / floor:.2f}x the floor"
                                 for f in numpys))
    for f in numpys if "torch" in runs else ():
        per_round = [statistics.median(a["times"]) / statistics.median(b["times"])
                     for a, b in zip(runs[f], runs["torch"])]
        lines.append(f"  ratio {f} / torch: {median[f] / median['torch']:.2f} "
                     f"(rounds {min(per_round):.2f} to {max(per_round):.2f})")
    return lines


def in_process(name, steps, frameworks):
    """Both frameworks in this process, alternating in blocks of 6 steps (for profiling; see above)."""
    keep_freed_memory()
    step_of = {f: STEPS[f](name) for f in frameworks}
    times = {f: [] for f in frameworks}
    for _ in range(-(-steps // 5)):
        for f, step in step_of.items():
            time.sleep(0.3)  # a spinning BLAS or OpenMP thread of one side would slow the other
            step()
            times[f] += [_seconds(step) for _ in range(5)]
    line = ", ".join(f"{f} {statistics.median(t) * 1e3:.1f} ms" for f, t in times.items())
    print(f"config {name}, in one process: {line}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40, help="timed steps per worker (after 3 warm-up steps)")
    parser.add_argument("--rounds", type=int, default=3, help="fresh workers per framework and config")
    parser.add_argument("--frameworks", nargs="+", default=["numpy", "torch"], choices=sorted(STEPS))
    parser.add_argument("--configs", nargs="+", default=["A", "B"], choices=sorted(BATCH))
    parser.add_argument("--default-malloc", action="store_true",
                        help="leave glibc's malloc thresholds alone in the numpy worker (see transformer/memory.py)")
    parser.add_argument("--in-process", action="store_true", help="both frameworks in this process")
    parser.add_argument("--phases", action="store_true",
                        help="time the parts of the NumPy step instead (shards, clip, AdamW), in fresh workers")
    parser.add_argument("--worker", choices=sorted(STEPS) + ["phases"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.steps < 1 or args.rounds < 1:
        parser.error("--steps and --rounds must be at least 1")
    if args.worker == "phases":
        return phases_worker(args.configs[0], args.steps, args.default_malloc)
    if args.worker:
        return worker(args.worker, args.configs[0], args.steps, args.default_malloc)
    print(f"numpy {np.__version__}, {sys.executable}")
    for name in args.configs:
        if args.phases:
            runs = [run_worker("phases", name, args.steps, args.default_malloc) for _ in range(args.rounds)]
            print("\n".join(phases_summary(name, runs)), flush=True)
            continue
        if args.in_process:
            in_process(name, args.steps, args.frameworks)
            continue
        for line in summary(name, rounds(name, args.steps, args.rounds, args.frameworks, args.default_malloc)):
            print(line, flush=True)
    return None


if __name__ == "__main__":
    main()
