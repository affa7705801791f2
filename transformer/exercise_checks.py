"""The checks a reader's function must pass, and the properties they name.

A check is a function of the reader's module that returns nothing when the property holds and raises Failed,
with a sentence that says what was seen, when it does not. The common ones are built here for a pair of a
forward and its backward (`Pair`): shapes and dtypes, the tiny example's numbers, central differences and
PyTorch; each exercise adds the properties its unit tests state (transformer/exercise_layers.py, exercise_systems.py).
"""

import inspect
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from .gradcheck import check_passes, numerical_grad, relative_gap

# The reader's numbers against the reference's, both float64 on the same input: different but correct orders of
# the same sums differ by rounding, a few units of 1e-16 relative; any mistake in a formula by far more.
SAME = 1e-10
# Entries that are zero in exact arithmetic (the key bias's gradient: softmax ignores a constant added to a row)
# come out as rounding noise, about 1e-16 of the other entries' size; below this absolute gap two arrays agree.
FLOOR = 1e-12
H = 1e-6  # central differences' step (transformer/gradcheck.py explains the choice of step and tolerance)


class Failed(Exception):
    """A property that does not hold; the message says what was seen, and `read` (when given) where to read
    instead of the check's own place: "forward" or "backward"."""

    def __init__(self, message, read=None):
        super().__init__(message)
        self.read = read


class Skipped(Exception):
    """A check that could not run here (torch is not installed); the message says why."""


@dataclass(frozen=True)
class Check:
    property: str  # what must hold, in a few words; the grader prints it
    run: Callable  # run(reader module, reference module): None, or raises Failed
    read: str = ""  # where the property is explained: "forward" or "backward" (their equations), or an anchor


def same(what, got, want, tol=SAME, floor=FLOOR):
    """Raise Failed unless `got` equals `want` up to rounding (relative gap below tol, or largest gap below
    floor), naming the largest gap."""
    got, want = np.asarray(got, dtype=float), np.asarray(want, dtype=float)
    if got.shape != want.shape:
        raise Failed(f"{what} has shape {got.shape}, expected {want.shape}")
    if not np.array_equal(np.isnan(got), np.isnan(want)):
        raise Failed(f"{what} is NaN where it should not be, or a number where it should be NaN")
    finite = np.isfinite(want)
    gap = relative_gap(got[finite], want[finite]) if finite.any() else 0.0
    worst = float(np.abs(got[finite] - want[finite]).max()) if finite.any() else 0.0
    if (gap > tol and worst > floor) or not np.array_equal(got[~finite], want[~finite]):
        at = np.unravel_index(np.argmax(np.where(finite, np.abs(got - want), 0)), got.shape)
        raise Failed(f"{what} differs from the expected values: relative gap {gap:.1e} (largest at index "
                     f"{tuple(int(i) for i in at)}: {got[at]:.6g}, expected {want[at]:.6g})")


def layout(what, got, want):
    """Raise Failed unless `got` has the shape and dtype of `want`."""
    got, want = np.asarray(got), np.asarray(want)
    if got.shape != want.shape or got.dtype != want.dtype:
        raise Failed(f"{what} is {got.dtype} of shape {got.shape}, expected {want.dtype} of shape {want.shape}")


@dataclass(frozen=True)
class Pair:
    """A forward and its backward, and how to feed them.

    make(rng, dtype) gives the forward's positional arguments; `wrt` names the arrays the backward returns
    gradients of, as paths into those arguments: an index, or (index, key) for a dict of parameters;
    `grads(output)` lists the backward's gradients in the order of `wrt`; `torch` (optional) computes the
    forward in torch from the same arguments as tensors. The arrays have the tiny model's sizes, so that a reader
    who prints them can follow every number: the checks call them the tiny example.
    """
    forward: str
    backward: str
    make: Callable
    wrt: tuple
    grads: Callable = lambda out: out if isinstance(out, tuple) else (out,)
    torch: Callable | None = None
    dtypes: tuple = (np.float32, np.float64)
    extra: dict = field(default_factory=dict)  # fixed keyword arguments of the forward


def leaf(args, path):
    """The array at a path of `wrt` (modified in place by central differences)."""
    return args[path] if isinstance(path, int) else args[path[0]][path[1]]


def run_pair(space, pair, args, dy_rng):
    """The forward on args, then the backward of a random dy; (output, gradients, dy)."""
    y, cache = getattr(space, pair.forward)(*args, **pair.extra)
    dy = dy_rng.standard_normal(np.shape(y)).astype(np.asarray(y).dtype)
    out = getattr(space, pair.backward)(dy, cache)
    return y, list(pair.grads(out)), dy


def names(pair, ref):
    """The names of the arrays in `wrt`: the forward's argument names, or the keys of a dict argument."""
    arguments = list(inspect.signature(getattr(ref, pair.forward)).parameters)
    return [arguments[path] if isinstance(path, int) else path[1] for path in pair.wrt]


def pair_checks(pair):
    """The checks every forward and backward pair gets."""
    def shapes(reader, ref):
        for dtype in pair.dtypes:
            args = pair.make(np.random.default_rng(0), dtype)
            mine = run_pair(reader, pair, args, np.random.default_rng(1))
            theirs = run_pair(ref, pair, pair.make(np.random.default_rng(0), dtype), np.random.default_rng(1))
            layout(f"{pair.forward}'s output for {np.dtype(dtype).name} input", mine[0], theirs[0])
            if len(mine[1]) != len(theirs[1]):
                raise Failed(f"{pair.backward} returns {len(mine[1])} gradients, expected {len(theirs[1])}")
            for n, a, b in zip(names(pair, ref), mine[1], theirs[1]):
                layout(f"{pair.backward}'s gradient of {n} for {np.dtype(dtype).name} input", a, b)

    def numbers(reader, ref):
        mine = run_pair(reader, pair, pair.make(np.random.default_rng(0), np.float64), np.random.default_rng(1))
        theirs = run_pair(ref, pair, pair.make(np.random.default_rng(0), np.float64), np.random.default_rng(1))
        same(f"{pair.forward}'s output", mine[0], theirs[0])
        for n, a, b in zip(names(pair, ref), mine[1], theirs[1]):
            try:
                same(f"{pair.backward}'s gradient of {n}", a, b)
            except Failed as e:
                raise Failed(str(e), read="backward") from None

    def central(reader, ref):
        args = pair.make(np.random.default_rng(2), np.float64)
        y, grads, dy = run_pair(reader, pair, args, np.random.default_rng(3))
        forward = getattr(reader, pair.forward)

        def loss():
            return float(np.sum(np.asarray(forward(*args, **pair.extra)[0]) * dy))
        for n, path, analytic in zip(names(pair, ref), pair.wrt, grads):
            numeric = numerical_grad(loss, leaf(args, path), H)
            gap = relative_gap(np.asarray(analytic, dtype=float), numeric)
            if not check_passes(float(np.abs(np.asarray(analytic) - numeric).max()), gap):
                raise Failed(f"the gradient of {n} from {pair.backward} is not the derivative of {pair.forward}: "
                             f"relative gap {gap:.1e} to central differences")

    of = pair.forward.removesuffix("_forward")
    checks = [Check(f"shapes and dtypes ({of})", shapes, "backward"),
              Check(f"the tiny example's numbers ({of})", numbers, "forward"),
              Check(f"central differences ({of})", central, "backward")]
    if pair.torch is not None:
        checks.append(Check(f"PyTorch ({of})", lambda reader, ref: torch_check(reader, ref, pair), "backward"))
    return checks


def torch_check(reader, ref, pair):
    """The forward and every gradient against torch's autograd on the same float64 input; skipped where torch
    is not installed."""
    try:
        import torch
    except ImportError:
        raise Skipped("torch is not installed") from None
    args = pair.make(np.random.default_rng(4), np.float64)
    y, grads, dy = run_pair(reader, pair, args, np.random.default_rng(5))
    leaves = {}

    def tensor(value, path):
        t = torch.tensor(value, dtype=torch.float64) if np.issubdtype(np.asarray(value).dtype, np.floating) \
            else torch.tensor(value)
        if path in pair.wrt:
            t.requires_grad_(True)
            leaves[path] = t
        return t
    targs = [({k: tensor(v, (i, k)) for k, v in a.items()} if isinstance(a, dict) else tensor(a, i))
             for i, a in enumerate(args)]
    ty = pair.torch(*targs)
    (ty * torch.tensor(dy, dtype=torch.float64)).sum().backward()
    same(f"{pair.forward}'s output against torch", y, ty.detach().numpy())
    for n, path, g in zip(names(pair, ref), pair.wrt, grads):
        same(f"the gradient of {n} against torch's autograd", g, leaves[path].grad.numpy())
