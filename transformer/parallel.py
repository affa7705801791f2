"""One training step on several cores: the batch cut into shards that are computed at once.

numpy runs every element-wise operation (the exponentials of the softmax, LayerNorm, ReLU, the additions
of the residual stream) as one loop on one core; only matrix products use several cores, inside the BLAS
library. On a machine with two cores, one of them waits through most of a step. So the batch of B windows is
cut into k shards, one per core, each computed by `loss_and_grads` at the same time as the others, and BLAS
runs one thread per call, so that the shards do not fight over the cores.

On Linux, every shard but the first of a function a worker process can import (`model.loss_and_grads`, not a
closure) is computed by a worker process (transformer/shard_processes.py), the first by the calling thread:
threads of one process would wait on each other at Python's global lock. Elsewhere, and for other functions,
the shards are threads, which numpy lets run its loops and BLAS calls at once. Both give the same bits.

The loss is a mean over the N positions of the batch, so with shard ξ holding N^(ξ) of them

    L = sum_ξ (N^(ξ) / N) L^(ξ)        dL/dθ = sum_ξ (N^(ξ) / N) dL^(ξ)/dθ

which are the numbers of one pass over the whole batch, up to rounding (the sums are taken in another
order). The split and the order of the sum are fixed, so a run is reproducible for a given number of shards.
"""

import os
import threading
from concurrent.futures import ThreadPoolExecutor
from functools import lru_cache

import numpy as np

from . import shard_processes
from .shard_processes import one_blas_thread


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
def sharded(threads, processes=None):
    """The process's `Sharded` for this many shards (0: one per core), made once and kept: its threads and
    worker processes wait between steps."""
    return Sharded(resolve(threads), processes)


def shard_rows(batch, shards):
    """The row ranges (start, stop) of the shards: as equal as can be, never empty."""
    k = min(shards, batch)
    edges = [batch * i // k for i in range(k + 1)]
    return list(zip(edges[:-1], edges[1:]))


class Sharded:
    """`loss_and_grads` over a batch, computed in shards at once by worker processes or threads.

    Parameters
    ----------
    threads : int
        Shards per batch, computed at once; 1 computes the batch in one pass, in the calling thread.
    processes : bool, optional
        Compute the shards of an importable function in worker processes (`shard_processes`) instead of
        threads; by default wherever that is supported (Linux). Only where BLAS can be held to one thread per
        call (threadpoolctl), as in the workers: otherwise the first shard's matmuls would round differently.
    """

    def __init__(self, threads, processes=None):
        self.threads = threads
        self.pool = ThreadPoolExecutor(threads) if threads > 1 else None
        one_blas = one_blas_thread() if self.pool is not None else False
        wanted = shard_processes.supported() if processes is None else processes
        self.processes = bool(wanted and one_blas)
        self.workers = None  # started at the first step that uses them
        self.starting = threading.Lock()

    def __call__(self, loss_and_grads, params, x, y, cfg):
        """The loss and gradients of the batch (x, y), each (B, T), as `loss_and_grads` would return them."""
        if self.pool is None or len(x) == 1:
            return loss_and_grads(params, x, y, cfg)
        rows = shard_rows(len(x), self.threads)
        workers = self.idle_workers(loss_and_grads)
        try:
            if workers is None:
                parts = [self.pool.submit(loss_and_grads, params, x[a:b], y[a:b], cfg) for a, b in rows]
                parts = [p.result() for p in parts]
            else:
                (a0, b0), rest = rows[0], rows[1:]
                parts = workers(shard_processes.by_name(loss_and_grads), params, cfg,
                                [(x[a:b], y[a:b]) for a, b in rest],
                                lambda: loss_and_grads(params, x[a0:b0], y[a0:b0], cfg))
            weights = [(b - a) / len(x) for a, b in rows]  # eq:shard-mean  N^(ξ) / N: every window has length T
            loss = sum(w * shard_loss for w, (shard_loss, _) in zip(weights, parts))  # eq:shard-mean
            grads = {}
            for name, first in parts[0][1].items():
                total = first * np.asarray(weights[0], dtype=first.dtype)  # eq:shard-mean
                for w, (_, shard_grads) in zip(weights[1:], parts[1:]):
                    total += shard_grads[name] * np.asarray(w, dtype=first.dtype)  # eq:shard-mean
                grads[name] = total
        finally:
            if workers is not None:  # released once the sums are made: they read the workers' block
                workers.lock.release()
        return float(loss), grads

    def idle_workers(self, loss_and_grads):
        """The worker processes, locked for this step (started anew after a step that ended them); None when
        the function cannot go to them, or another thread's step holds them."""
        if not self.processes or shard_processes.by_name(loss_and_grads) is None:
            return None
        with self.starting:
            if self.workers is None or self.workers.closed:
                self.workers = shard_processes.ShardWorkers(self.threads - 1)
            workers = self.workers
        return workers if workers.lock.acquire(blocking=False) else None

    def close(self):
        """End the worker processes now (a later step starts new ones); the threads stay."""
        if self.workers is not None:
            self.workers.close()

    def map(self, f, items):
        """[f(item) for item in items], computed by the threads (in order)."""
        if self.pool is None:
            return [f(item) for item in items]
        return list(self.pool.map(f, items))
