"""What the tape keeps in memory, and whether it lets go: measurements for tools/autograd_memory.py.

Two questions, each answered by counting rather than by reading the resident size of the process (which
depends on the allocator and on what else runs):

- how big is one step's graph? `graph_census` counts its nodes and the bytes of the distinct buffers
  they hold (each node's value and the arrays its rule reads), beside the bytes of the hand-written
  forward's cache, and the most gradient bytes its backward holds at once, with each intermediate
  gradient dropped once passed on (as `backward` does) and with all of them kept;
- is it freed? `train_steps` runs AdamW steps and records, after each, how many Tensors are alive and
  how many bytes numpy holds (tracemalloc), with the graph freed by `backward` or kept.
"""

import gc
import tracemalloc
from dataclasses import dataclass

import numpy as np

from .autograd import backward, live_tensors, topological_order
from .autograd_model import as_leaves, cross_entropy, forward
from .memory import arrays_in
from .model import forward as hand_forward
from .model import init_params
from .optim import AdamWConfig, adamw_init, adamw_update


def distinct_bytes(arrays, exclude=()):
    """Bytes of the distinct buffers behind arrays (a view counts as its base, once), less exclude's."""
    def base(a):
        while isinstance(a.base, np.ndarray):
            a = a.base
        return a

    skip = {id(base(a)) for a in exclude}
    owners = {id(b): b.nbytes for b in map(base, arrays) if id(b) not in skip}
    return sum(owners.values())


def graph_arrays(root):
    """The arrays a graph keeps alive: every node's value and every array its rule's closure holds."""
    for node in topological_order(root):
        yield node.data
        for cell in getattr(node.rule, "__closure__", None) or ():
            yield from arrays_in(cell.cell_contents)


@dataclass(frozen=True)
class Census:
    """One step's graph against the hand-written forward's cache, for the same batch."""
    nodes: int  # Tensors that gradients flow through, parameters included
    parameters: int  # of which leaves (parameters)
    constants: int  # Tensors the graph holds that no gradient flows into (the mask, numbers, the one-hot)
    graph_bytes: int  # distinct buffers the graph holds, the parameters not counted
    cache_bytes: int  # distinct buffers of transformer.model.forward's cache, the parameters not counted
    grads_peak_bytes: int  # the most gradient bytes held at once during backward, as it runs
    grads_kept_peak_bytes: int  # the same with every intermediate gradient kept (keep_grads=True)


def graph_census(params, ids, targets, cfg, fused=()) -> Census:
    """Count one step's graph (before its backward) and the hand-written cache for the same batch.

    Parameters
    ----------
    params : dict
        Parameter name to array.
    ids, targets : ndarray of shape (B, T)
    cfg : ModelConfig
    fused : sequence of str
        See `transformer.autograd_model.forward`.

    Returns
    -------
    Census
    """
    leaves = as_leaves(params, cfg)
    loss = cross_entropy(forward(leaves, ids, cfg, fused), targets)
    order = topological_order(loss)
    constants = {id(p) for node in order for p in node.parents if not p.requires_grad}
    graph = distinct_bytes(graph_arrays(loss), exclude=params.values())
    _, cache = hand_forward(params, ids, cfg)
    cache_bytes = distinct_bytes(arrays_in(cache), exclude=params.values())
    peaks = [gradient_peak(cross_entropy(forward(as_leaves(params, cfg), ids, cfg, fused), targets), keep)
             for keep in (False, True)]
    return Census(len(order), len(leaves), len(constants), graph, cache_bytes, *peaks)


def gradient_peak(root, keep_grads):
    """The most bytes of gradients (distinct buffers, the leaves' included) held at once while
    backward(root) runs: counted each time a rule returns, when the node's own gradient, its parents'
    and what the rule just made are all alive.

    Each rule is wrapped to count, so the numbers are what `backward` itself keeps, not a model of it.
    """
    order, peak = topological_order(root), 0

    def counted(rule):
        def run(g):
            nonlocal peak
            out = rule(g)
            held = [node.grad for node in order if node.grad is not None]
            peak = max(peak, distinct_bytes(held + [a for a in out if a is not None]))
            return out
        return run

    for node in order:
        if node.rule is not None:
            node.rule = counted(node.rule)
    backward(root, keep_grads=keep_grads)
    return peak


def capture_own_output(root):
    """Re-create the reference engine's bug on a built graph: give every node a rule that holds the
    node itself (as a closure that reads `out.grad` does), so each node is a reference cycle that only
    the cyclic garbage collector can free, unless `backward` cuts it."""
    for node in topological_order(root):
        if node.rule is not None:
            node.rule = lambda g, rule=node.rule, out=node: rule(out.grad)


@dataclass(frozen=True)
class StepRecord:
    step: int  # from 1
    loss: float
    live_tensors: int  # Tensors alive after the step
    traced_bytes: int  # bytes numpy (and Python) hold after the step, from tracemalloc
    peak_bytes: int  # the most held at once during the step


def train_steps(cfg, ids, targets, steps, free_graph=True, keep_losses=False, self_capturing=False, seed=0):
    """Take AdamW steps on one batch with the engine's gradients and record memory after each.

    Parameters
    ----------
    cfg : ModelConfig
    ids, targets : ndarray of shape (B, T)
    steps : int
    free_graph : bool
        Passed to `backward`.
    keep_losses : bool
        Keep every step's loss Tensor in a list, as a loop that logs its losses might.
    self_capturing : bool
        Plant the reference's bug (`capture_own_output`) in every step's graph.
    seed : int
        Seed of the parameters.

    Returns
    -------
    list of StepRecord
        The cyclic garbage collector is off while the steps run, so what is freed is what reference
        counting frees: the same on every run.
    """
    params = init_params(cfg, seed=seed)
    state, opt, kept, records = adamw_init(params), AdamWConfig(), [], []
    gc.collect()
    enabled = gc.isenabled()
    gc.disable()
    tracemalloc.start()
    try:
        for step in range(1, steps + 1):
            tracemalloc.reset_peak()
            leaves = as_leaves(params, cfg)
            loss = cross_entropy(forward(leaves, ids, cfg), targets)
            if self_capturing:
                capture_own_output(loss)
            backward(loss, free_graph=free_graph)
            adamw_update(params, {name: t.grad for name, t in leaves.items()}, state, 1e-3, opt)
            value = float(loss.data)
            if keep_losses:
                kept.append(loss)
            del leaves, loss
            current, peak = tracemalloc.get_traced_memory()
            records.append(StepRecord(step, value, live_tensors(), current, peak))
    finally:
        tracemalloc.stop()
        if enabled:
            gc.enable()
        del kept
        gc.collect()
    return records
