"""Benchmark: the memory and time of one training step under each memory policy.

The four policies are the combinations of `ModelConfig(attention="materialized" | "flash")` and
`ModelConfig(checkpoint_blocks=False | True)`. For each, and each sequence length T, we measure:

- step peak: the most memory numpy held at once during one whole float32 training step (forward,
  backward, clipping, AdamW), above what the parameters and the AdamW moments already hold. It is read
  with tracemalloc, which sees every array numpy allocates; the count is of bytes, so it is the same on
  every run and every machine with the same numpy.
- retained: the bytes of the arrays the forward's cache keeps alive for the backward (each buffer counted
  once, however many views of it the cache holds).
- attention peak: the peak of one attention layer's forward and backward alone.
- time per step: the median wall-clock time of a few steps, without tracemalloc running (tracemalloc
  slows every allocation). Unlike the bytes, it depends on the machine and its load.

    python -m tools.memory_policies [--lengths 64 128 256 512 1024] [--steps 3] [--json out.json]

The site's Flash attention and Activation checkpointing pages import `measure` and `CONFIG` from here.
"""

import argparse
import json
import statistics
import time
import tracemalloc
from dataclasses import asdict, dataclass

import numpy as np

from transformer.attention import attention_backward, attention_forward
from transformer.block import block_params
from transformer.config import ModelConfig
from transformer.flash_attention import flash_attention_backward, flash_attention_forward
from transformer.layernorm import layer_norm_forward
from transformer.memory import arrays_in
from transformer.model import forward, init_params, loss_and_grads
from transformer.optim import AdamWConfig, adamw_init, adamw_update, clip_grads

# Small enough for two cores at T = 1024, with L = 4 so that checkpointing's (L - 1)/L shows.
CONFIG = ModelConfig(vocab_size=65, context_len=1024, emb_dim=64, num_heads=4, num_layers=4, ff_dim=256)
BATCH = 2
LENGTHS = (64, 128, 256, 512, 1024)
POLICIES = {  # name: the config fields it sets
    "materialized": {},
    "flash": {"attention": "flash"},
    "checkpointed": {"checkpoint_blocks": True},
    "flash + checkpointed": {"attention": "flash", "checkpoint_blocks": True},
}
SEED = 0


@dataclass(frozen=True)
class Measurement:
    policy: str
    T: int
    step_peak: int  # bytes
    retained: int  # bytes
    attention_peak: int  # bytes
    seconds: float | None  # median time per step; None when not timed


def owned_bytes(obj, exclude=()):
    """Bytes of the distinct buffers behind the arrays of obj: a view counts as its base, once.

    exclude: arrays whose buffers are not to be counted (the parameters, which a cache references but
    does not own)."""
    skip = {id(a.base if a.base is not None else a) for a in exclude}
    seen = {}
    for a in arrays_in(obj):
        base = a
        while base.base is not None and isinstance(base.base, np.ndarray):
            base = base.base
        if id(base) not in skip:
            seen[id(base)] = base.nbytes
    return sum(seen.values())


def batch(T, seed=SEED):
    rng = np.random.default_rng(seed)
    return rng.integers(0, CONFIG.vocab_size, (BATCH, T)), rng.integers(0, CONFIG.vocab_size, (BATCH, T))


def traced_peak(run):
    """The most bytes traced at once while run() runs, above what was traced when it started."""
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        run()
        return tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()


def measure(policy, T, steps=0, cfg=CONFIG, dtype=np.float32):
    """One Measurement of a policy at sequence length T; `steps` timed steps (0: no timing)."""
    cfg = cfg.with_(**POLICIES[policy])
    params = init_params(cfg, SEED, dtype)
    state = adamw_init(params)
    opt = AdamWConfig()
    ids, targets = batch(T)

    def step():
        _, grads = loss_and_grads(params, ids, targets, cfg)
        grads, _ = clip_grads(grads, 1.0)
        adamw_update(params, grads, state, opt.lr, opt)

    step_peak = traced_peak(step)
    _, cache = forward(params, ids, cfg)
    retained = owned_bytes(cache, exclude=params.values())
    del cache
    p = block_params(params, 0)
    x, _ = layer_norm_forward(np.random.default_rng(SEED).standard_normal((BATCH, T, cfg.emb_dim)).astype(dtype),
                              p["ln1_g"], p["ln1_b"], cfg.ln_eps)
    dy = np.ones_like(x)
    if cfg.attention == "flash":
        attention = lambda: flash_attention_backward(dy, flash_attention_forward(x, p, cfg.num_heads, cfg.flash_tile)[1])
    else:
        attention = lambda: attention_backward(dy, attention_forward(x, p, cfg.num_heads)[1])
    attention_peak = traced_peak(attention)
    seconds = None
    if steps:
        times = []
        for _ in range(steps):
            start = time.perf_counter()
            step()
            times.append(time.perf_counter() - start)
        seconds = statistics.median(times)
    return Measurement(policy, T, step_peak, retained, attention_peak, seconds)


def measure_all(lengths=LENGTHS, steps=0, policies=tuple(POLICIES), log=None):
    out = []
    for T in lengths:
        for policy in policies:
            out.append(measure(policy, T, steps))
            if log:
                log(out[-1])
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=list(LENGTHS))
    parser.add_argument("--steps", type=int, default=3, help="timed steps per policy and length (default: 3)")
    parser.add_argument("--json", help="also write the measurements to this file")
    args = parser.parse_args(argv)
    mib = 1 << 20
    print(f"model: {CONFIG}, batch {BATCH}, float32")
    print(f"{'T':>5} {'policy':<22} {'step peak':>10} {'retained':>10} {'attention':>10} {'s/step':>8}")

    def log(m):
        print(f"{m.T:>5} {m.policy:<22} {m.step_peak / mib:>9.1f}M {m.retained / mib:>9.1f}M "
              f"{m.attention_peak / mib:>9.2f}M {m.seconds:>8.3f}", flush=True)

    results = measure_all(args.lengths, args.steps, log=log)
    if args.json:
        with open(args.json, "w") as f:
            json.dump([asdict(m) for m in results], f, indent=1)


if __name__ == "__main__":
    main()
