"""Measure the autograd engine's memory: one step's graph against the hand-written cache, and whether
memory stays flat over many training steps with the graph freed, kept, or caught in reference cycles.

    python -m tools.autograd_memory [--steps 300] [--preset default] [--batch 4] [--seq-len 16]

Bytes are counted, not sampled: tracemalloc sees every array numpy allocates, and the cyclic garbage
collector is off during the steps, so two runs print the same numbers (see transformer/autograd_memory.py).
"""

import argparse

import numpy as np

from transformer.autograd_memory import graph_census, train_steps
from transformer.config import preset
from transformer.model import init_params

VARIANTS = {  # name: (free_graph, keep_losses, self_capturing)
    "freed": (True, False, False),
    "freed, losses kept": (True, True, False),
    "freed, self-capturing rules": (True, False, True),
    "not freed, losses kept": (False, True, False),
    "not freed, self-capturing rules": (False, False, True),
}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--preset", default="default")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=16)
    args = parser.parse_args(argv)
    cfg = preset(args.preset)
    rng = np.random.default_rng(0)
    ids, targets = (rng.integers(0, cfg.vocab_size, (args.batch, args.seq_len)) for _ in range(2))
    mib = 2 ** 20
    print(f"preset {args.preset}, batch {args.batch} x {args.seq_len}, float64")
    for fused in ((), ("layer_norm",), ("layer_norm", "attention")):
        c = graph_census(init_params(cfg), ids, targets, cfg, fused)
        print(f"  graph, fused {', '.join(fused) or 'nothing'}: {c.nodes} nodes ({c.parameters} parameters) and "
              f"{c.constants} constants, holding {c.graph_bytes / mib:.2f} MiB; the hand-written cache "
              f"holds {c.cache_bytes / mib:.2f} MiB; gradients during backward, at most {c.grads_peak_bytes / mib:.2f} "
              f"MiB (each dropped once passed on), {c.grads_kept_peak_bytes / mib:.2f} MiB with every one kept")
    print(f"\n{'variant':<32} {'live Tensors':>12} {'held after step 10':>19} {'held at the end':>16} "
          f"{'peak at the end':>16}")
    for name, (free_graph, keep_losses, self_capturing) in VARIANTS.items():
        records = train_steps(cfg, ids, targets, args.steps, free_graph, keep_losses, self_capturing)
        tenth, last = records[min(9, len(records) - 1)], records[-1]
        print(f"{name:<32} {last.live_tensors:>12} {tenth.traced_bytes / mib:>17.2f}M "
              f"{last.traced_bytes / mib:>15.2f}M {last.peak_bytes / mib:>15.2f}M")


if __name__ == "__main__":
    main()
