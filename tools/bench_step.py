"""Benchmark: one float32 training step (forward, backward, AdamW) of the NumPy
reference against the same model in plain PyTorch eager on the CPU.

Both run in one process, alternating in blocks of steps so that both see the
same machine state; we print the median of each and the ratio NumPy / PyTorch.
Both get the same float32 parameters, batch and AdamW settings (decay on
matrices only, as transformer/optim.py).

    python tools/bench_step.py [--steps 40] [--configs A B] [--frameworks numpy torch]
"""

import argparse
import statistics
import time

import numpy as np

from transformer.config import PRESETS
from transformer.model import init_params, loss_and_grads
from transformer.memory import keep_freed_memory
from transformer.optim import AdamWConfig, adamw_init, adamw_update, is_decayed

BATCH = {"A": 32, "B": 12}


def numpy_step(params, state, ids, targets, cfg, opt):
    _, grads = loss_and_grads(params, ids, targets, cfg)
    adamw_update(params, grads, state, opt.lr, opt)


def make_torch_step(params, cfg, opt):
    import torch

    from transformer.torch_mirror import to_torch, torch_loss

    tparams = to_torch(params, dtype=torch.float32)
    decay = [p for n, p in tparams.items() if is_decayed(n)]
    no_decay = [p for n, p in tparams.items() if not is_decayed(n)]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": opt.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=opt.lr, betas=(opt.beta1, opt.beta2), eps=opt.eps)

    def step(ids, targets):
        optimizer.zero_grad(set_to_none=True)
        loss = torch_loss(tparams, ids, targets, cfg)
        loss.backward()
        optimizer.step()

    return step


def bench(name, steps, block, frameworks):
    import torch

    cfg = PRESETS[name]
    B, T = BATCH[name], cfg.context_len
    opt = AdamWConfig()
    params = init_params(cfg, seed=0, dtype=np.float32)
    state = adamw_init(params)
    torch_step = make_torch_step(params, cfg, opt) if "torch" in frameworks else None
    rng = np.random.default_rng(0)
    ids = rng.integers(0, cfg.vocab_size, (B, T))
    targets = rng.integers(0, cfg.vocab_size, (B, T))
    tids, ttargets = torch.as_tensor(ids), torch.as_tensor(targets)
    steps_of = {"numpy": lambda: numpy_step(params, state, ids, targets, cfg, opt),
                "torch": lambda: torch_step(tids, ttargets)}
    steps_of = {k: v for k, v in steps_of.items() if k in frameworks}
    times = {"numpy": [], "torch": []}
    # Alternate in blocks, pausing between them: after a call, OpenBLAS's and
    # OpenMP's worker threads spin for up to ~0.1 s waiting for more work, and
    # on 2 cores a spinning thread of one framework would slow the other.
    # The first step of each block is a warm-up and is not counted.
    for _ in range(-(-steps // (block - 1))):
        for framework, step in steps_of.items():
            time.sleep(0.3)
            for i in range(block):
                t0 = time.perf_counter()
                step()
                if i:
                    times[framework].append(time.perf_counter() - t0)
    medians = {k: statistics.median(v) * 1e3 for k, v in times.items() if v}
    line = ", ".join(f"{k} {v:.1f} ms" for k, v in medians.items())
    if len(medians) == 2:
        line += f", ratio {medians['numpy'] / medians['torch']:.2f}"
    print(f"config {name} (B={B}, T={T}, d={cfg.emb_dim}, H={cfg.num_heads}, L={cfg.num_layers}, "
          f"F={cfg.ff_dim}, V={cfg.vocab_size}): {line}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40, help="timed steps per framework and config")
    parser.add_argument("--block", type=int, default=6, help="consecutive steps of one framework")
    parser.add_argument("--frameworks", nargs="+", default=["numpy", "torch"], choices=["numpy", "torch"])
    parser.add_argument("--default-malloc", action="store_true",
                        help="leave glibc's malloc thresholds alone (to see what transformer/memory.py saves)")
    parser.add_argument("--configs", nargs="+", default=["A", "B"], choices=sorted(BATCH))
    args = parser.parse_args()
    import torch
    # Both frameworks run in this one process, so both get the same allocator
    # setting (see transformer/memory.py); the training command uses it too.
    kept = False if args.default_malloc else keep_freed_memory()
    print(f"numpy {np.__version__}, torch {torch.__version__}, torch threads {torch.get_num_threads()}, "
          f"freed memory kept: {kept}")
    for name in args.configs:
        bench(name, args.steps, args.block, args.frameworks)


if __name__ == "__main__":
    main()
