"""One training step on several cores: the batch cut into shards that threads compute at once.

numpy runs every element-wise operation (the exponentials of the softmax, LayerNorm, ReLU, the additions
of the residual stream) as one loop on one core; only matrix products use several cores, inside the BLAS
library. On a machine with two cores, one of them waits through most of a step. Threads can run numpy at
the same time, because numpy lets go of Python's global lock inside its loops and its BLAS calls. So the
batch of B windows is cut into k shards, one per core, each computed by `loss_and_grads` in a thread of its
own, and BLAS runs one thread per call, so that the shards do not fight over the cores.

The loss is a mean over the N positions of the batch, so with shard ξ holding N^(ξ) of them

    L = sum_ξ (N^(ξ) / N) L^(ξ)        dL/dθ = sum_ξ (N^(ξ) / N) dL^(ξ)/dθ

which are the numbers of one pass over the whole batch, up to rounding (the sums are taken in another
order). The split and the order of the sum are fixed, so a run is reproducible for a given number of shards.
"""

import os
from concurrent.futures import ThreadPoolExecutor
from functools import lru_cache

import numpy as np


def cores():
    """The number of cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS has no affinity mask
        return os.cpu_count() or 1


def resolve(threads):
    """The number of threads a setting asks for: itself, or one per core for 0."""
    return threads or cores()


@lru_cache(maxsize=None)
def sharded(threads):
    """The process's `Sharded` for this many threads (0: one per core), made once and kept: its threads
    wait between steps."""
    return Sharded(resolve(threads))


def shard_rows(batch, shards):
    """The row ranges (start, stop) of the shards: as equal as can be, never empty."""
    k = min(shards, batch)
    edges = [batch * i // k for i in range(k + 1)]
    return list(zip(edges[:-1], edges[1:]))


def one_blas_thread():
    """Make BLAS run one thread per call from now on, in this whole process (threadpoolctl); False when
    threadpoolctl is not installed, and then the shards share the cores with BLAS's own threads."""
    try:
        from threadpoolctl import ThreadpoolController
    except ImportError:
        return False
    ThreadpoolController().limit(limits=1, user_api="blas")
    return True


class Sharded:
    """`loss_and_grads` over a batch, computed in shards by `threads` threads.

    Parameters
    ----------
    threads : int
        Shards per batch, computed at once; 1 computes the batch in one pass, in the calling thread.
    """

    def __init__(self, threads):
        self.threads = threads
        self.pool = ThreadPoolExecutor(threads) if threads > 1 else None
        if self.pool is not None:
            one_blas_thread()

    def __call__(self, loss_and_grads, params, x, y, cfg):
        """The loss and gradients of the batch (x, y), each (B, T), as `loss_and_grads` would return them."""
        if self.pool is None or len(x) == 1:
            return loss_and_grads(params, x, y, cfg)
        rows = shard_rows(len(x), self.threads)
        parts = [self.pool.submit(loss_and_grads, params, x[a:b], y[a:b], cfg) for a, b in rows]
        parts = [p.result() for p in parts]
        weights = [(b - a) / len(x) for a, b in rows]  # eq:shard-mean  N^(ξ) / N: every window has length T
        loss = sum(w * shard_loss for w, (shard_loss, _) in zip(weights, parts))  # eq:shard-mean
        grads = {}
        for name, first in parts[0][1].items():
            total = first * np.asarray(weights[0], dtype=first.dtype)  # eq:shard-mean
            for w, (_, shard_grads) in zip(weights[1:], parts[1:]):
                total += shard_grads[name] * np.asarray(w, dtype=first.dtype)  # eq:shard-mean
            grads[name] = total
        return float(loss), grads

    def map(self, f, items):
        """[f(item) for item in items], computed by the threads (in order)."""
        if self.pool is None:
            return [f(item) for item in items]
        return list(self.pool.map(f, items))
