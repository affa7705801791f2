"""Benchmark: one float32 training step (forward, backward, AdamW) by the hand-written backward, by the
autograd engine, and by PyTorch eager on the CPU, on the same parameters and batch.

The three alternate in blocks of steps in one process (as tools/bench_step.py --in-process; its step
functions, parameters and batch are the ones used here), so all see the same machine state; we print the median of each and its ratio to the hand-written step.

    python -m tools.autograd_speed [--steps 20] [--configs A] [--frameworks handwritten autograd torch]
"""

import argparse
import statistics
import time

import numpy as np


from tools.bench_step import BATCH, numpy_step, setup, torch_step
from transformer.autograd_model import loss_and_grads as autograd_loss_and_grads
from transformer.config import PRESETS
from transformer.memory import keep_freed_memory
from transformer.optim import AdamWConfig, adamw_init, adamw_update

FRAMEWORKS = ("handwritten", "autograd", "torch")


def autograd_step(name):
    """A step function of the autograd engine, on bench_step's parameters and batch of preset `name`."""
    cfg, params, ids, targets = setup(name)
    opt, state = AdamWConfig(), adamw_init(params)

    def step():
        _, grads = autograd_loss_and_grads(params, ids, targets, cfg)
        adamw_update(params, grads, state, opt.lr, opt)

    return step


STEPS = {"handwritten": numpy_step, "autograd": autograd_step, "torch": torch_step}


def bench(name, steps, block, frameworks):
    """Median milliseconds per step of each framework on preset name."""
    times = {framework: [] for framework in frameworks}
    for _ in range(-(-steps // (block - 1))):
        for framework in frameworks:
            step = STEPS[framework](name)  # each block on a fresh copy of the same float32 parameters
            time.sleep(0.3)  # let the previous framework's BLAS threads stop spinning
            for i in range(block):
                t0 = time.perf_counter()
                step()
                if i:  # the first step of a block is a warm-up
                    times[framework].append(time.perf_counter() - t0)
    return {framework: statistics.median(t) * 1e3 for framework, t in times.items()}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20, help="timed steps per framework and config")
    parser.add_argument("--block", type=int, default=6, help="consecutive steps of one framework")
    parser.add_argument("--frameworks", nargs="+", default=list(FRAMEWORKS), choices=FRAMEWORKS)
    parser.add_argument("--configs", nargs="+", default=["A"], choices=sorted(BATCH))
    args = parser.parse_args(argv)
    print(f"numpy {np.__version__}, freed memory kept: {keep_freed_memory()}")
    for name in args.configs:
        medians = bench(name, args.steps, args.block, args.frameworks)
        base = medians.get("handwritten")
        cells = [f"{k} {v:.1f} ms" + (f" ({v / base:.2f}x)" if base else "") for k, v in medians.items()]
        print(f"config {name} (B={BATCH[name]}, T={PRESETS[name].context_len}): {', '.join(cells)}")


if __name__ == "__main__":
    main()
