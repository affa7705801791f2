"""LoRA: a frozen linear layer plus a trained low-rank correction, `y = x W + b + (alpha / r) (x A) B`.

Fine-tuning every entry of W (in, out) needs a gradient and two AdamW moments per entry. LoRA freezes W and
the bias and trains two thin matrices instead, A (in, r) and B (r, out) with a small rank r: r (in + out)
numbers per layer. B starts at zero, so at step 0 the adapted layer computes exactly what the base layer
does, and training moves it from there. `merge` folds the trained correction into W for inference.

The base weight may be a dense array or an `NF4Weight` (QLoRA): the backward never needs a gradient of it.
"""

import math
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from .config import is_finite_number, is_int
from .errors import ConfigError
from .nf4 import NF4Weight
from .quantized_linear import ROWS, nf4_linear_backward, nf4_linear_forward

# What a target names: the weight of each projection, in every block (the head once).
TARGETS = {"q": "wq", "k": "wk", "v": "wv", "o": "wo", "ff1": "ff1_w", "ff2": "ff2_w", "head": "head_w"}


@dataclass(frozen=True)
class LoRAConfig:
    """Rank, scale and targets of the adapters, checked when made.

    The correction x A B is scaled by alpha / r, or by alpha / sqrt(r) with `rank_stabilized` (rsLoRA,
    Kalajdzievski 2023, arXiv:2312.03732): with alpha / r a larger rank learns more slowly, since the
    correction's size shrinks like 1/sqrt(r) at the start of training; alpha / sqrt(r) keeps it the same."""
    rank: int = 8
    alpha: float = 16.0
    targets: tuple = ("q", "v")
    rank_stabilized: bool = False

    def __post_init__(self):
        if not (is_int(self.rank) and self.rank >= 1):
            raise ConfigError(f"lora rank must be a positive integer, got {self.rank!r}")
        object.__setattr__(self, "rank", int(self.rank))  # a numpy integer becomes a plain int (adapter files are JSON)
        if not (is_finite_number(self.alpha) and self.alpha > 0):
            raise ConfigError(f"lora alpha must be a positive finite number, got {self.alpha!r}")
        # A bare string is refused: "qv" would otherwise be read as the targets q and v.
        if not (isinstance(self.targets, (tuple, list)) and all(isinstance(t, str) for t in self.targets)):
            raise ConfigError(f"lora targets must be a list of names, got {self.targets!r}")
        unknown = [t for t in self.targets if t not in TARGETS]
        if unknown or not self.targets:
            raise ConfigError(f"lora targets must be some of {', '.join(TARGETS)}, got {', '.join(self.targets) or 'none'}")
        object.__setattr__(self, "targets", tuple(self.targets))  # a list would make the config unhashable
        if not isinstance(self.rank_stabilized, bool):
            raise ConfigError(f"lora rank_stabilized must be True or False, got {self.rank_stabilized!r}")

    @property
    def scale(self):
        """alpha / r, or alpha / sqrt(r) for rank-stabilized LoRA."""
        return self.alpha / (math.sqrt(self.rank) if self.rank_stabilized else self.rank)  # eq:lora-forward


def present_targets(param_shapes):
    """The targets that name a weight of a model with these parameters: all of TARGETS, but "head" where the
    head is tied to the token table (GPT-2's layout has no head_w)."""
    suffixes = {name.rsplit(".", 1)[-1] for name in param_shapes}
    return tuple(t for t, weight in TARGETS.items() if weight in suffixes)


def adapter_shapes(param_shapes, lora: LoRAConfig):
    """The adapters of every targeted weight: `<weight>.lora_a` (in, r) and `<weight>.lora_b` (r, out).

    Raises
    ------
    ConfigError
        If the rank exceeds a targeted weight's smaller side (the correction could not be low-rank), or a
        target names no weight of the model (the head of GPT-2's layout is the token table, not a head_w).
    """
    shapes = {}
    for name, shape in param_shapes.items():
        if name.rsplit(".", 1)[-1] in {TARGETS[t] for t in lora.targets}:
            if lora.rank > min(shape):
                raise ConfigError(f"lora rank {lora.rank} is larger than {name}'s smaller side {min(shape)}")
            shapes[f"{name}.lora_a"], shapes[f"{name}.lora_b"] = (shape[0], lora.rank), (lora.rank, shape[1])
    absent = [t for t in lora.targets if t not in present_targets(param_shapes)]
    if absent:
        raise ConfigError(f"lora target {', '.join(absent)} names no weight of this model"
                          + (" (its head is tied to the token table)" if "head" in absent else ""))
    return shapes


def init_adapters(param_shapes, lora: LoRAConfig, seed=0, dtype=np.float64):
    """A uniform in +-1/sqrt(in), B zero: the adapted model starts equal to the base model."""
    rng = np.random.default_rng(seed)
    adapters = {}
    for name, shape in adapter_shapes(param_shapes, lora).items():
        if name.endswith(".lora_a"):
            limit = 1.0 / np.sqrt(shape[0])
            adapters[name] = rng.uniform(-limit, limit, size=shape).astype(dtype)  # eq:lora-init
        else:
            adapters[name] = np.zeros(shape, dtype=dtype)  # eq:lora-init
    return adapters


@dataclass(frozen=True)
class Frozen:
    """A weight fine-tuning leaves alone, and the LoRA adapters trained beside it, if its layer has any.

    It wraps the base layer: `linear.linear_forward` hands a weight that is not an array its input, so a Frozen
    weight runs `frozen_linear_forward` in its place; the bias beside it is frozen too.

    Attributes
    ----------
    base : ndarray of shape (in, out), or an NF4Weight
        The frozen weight W.
    a : ndarray of shape (in, r), optional
        The adapter A; None for a layer without adapters.
    bm : ndarray of shape (r, out), optional
        The adapter B (named bm beside the bias b).
    scale : float
        alpha / r.
    """
    base: object
    a: np.ndarray | None = None
    bm: np.ndarray | None = None
    scale: float = 0.0

    @property
    def shape(self):
        return tuple(self.base.shape)

    def linear_forward(self, x, b):
        """What `linear.linear_forward` runs for this weight: `frozen_linear_forward`."""
        return frozen_linear_forward(x, self, b)


class FrozenCache(NamedTuple):
    """What `frozen_linear_forward` keeps: the input only where adapters need it (dA = x^T dxa), and the
    input times A (dB = scale (x A)^T dy). A frozen layer without adapters keeps no input at all."""
    x: np.ndarray | None
    weight: Frozen
    xa: np.ndarray | None

    def linear_backward(self, dy):
        """What `linear.linear_backward` runs for this cache: dx and the adapters' gradients (dA, dB) in the
        place of dW (None without adapters), and None for the frozen bias."""
        return (*frozen_linear_backward(dy, self), None)


def rows_matmul(x, w):
    """x (..., in) @ w (in, out) as one 2-D product over all rows, which numpy runs faster than a stacked one."""
    return (x.reshape(-1, x.shape[-1]) @ w).reshape(*x.shape[:-1], w.shape[1])


def frozen_linear_forward(x, w: Frozen, b):
    """y = x W + b + scale (x A) B, with W and b frozen; without adapters, y = x W + b.

    Parameters
    ----------
    x : ndarray of shape (..., in)
    w : Frozen
        The frozen weight (dense or NF4) and its adapters.
    b : ndarray of shape (out,)
        The frozen bias.

    Returns
    -------
    y : ndarray of shape (..., out)
    cache : FrozenCache
    """
    if isinstance(w.base, NF4Weight):
        y, _ = nf4_linear_forward(x, w.base, b)
    else:
        y = rows_matmul(x, w.base) + b  # eq:lora-forward
    if w.a is None:
        return y, FrozenCache(None, w, None)
    xa = rows_matmul(x, w.a)  # (..., r)  eq:lora-forward
    y += w.scale * rows_matmul(xa, w.bm)  # eq:lora-forward
    return y, FrozenCache(x, w, xa)


def frozen_linear_backward(dy, cache: FrozenCache):
    """Gradients of `frozen_linear_forward` for x and the adapters; W and b get none, and none is formed.

    Returns
    -------
    dx : ndarray of shape (..., in)
    adapter_grads : (dA (in, r), dB (r, out)), or None for a layer without adapters
    """
    x, w, xa = cache
    if isinstance(w.base, NF4Weight):
        dx = nf4_linear_backward(dy, (w.base, ROWS))
    else:
        dx = rows_matmul(dy, w.base.T)  # eq:lora-grad-x
    if w.a is None:
        return dx, None
    dxa = w.scale * rows_matmul(dy, w.bm.T)  # (..., r)  eq:lora-grad-xa
    dbm = w.scale * xa.reshape(-1, xa.shape[-1]).T @ dy.reshape(-1, dy.shape[-1])  # eq:lora-grad-b
    da = x.reshape(-1, x.shape[-1]).T @ dxa.reshape(-1, dxa.shape[-1])  # eq:lora-grad-a
    dx += rows_matmul(dxa, w.a.T)  # eq:lora-grad-x
    return dx, (da, dbm)


def merge(params, adapters, lora: LoRAConfig):
    """The parameters with every adapter folded in, W + scale A B: a plain model computing what the
    adapted one does."""
    merged = dict(params)
    for name in adapters:
        if name.endswith(".lora_a"):
            weight = name[: -len(".lora_a")]
            merged[weight] = params[weight] + lora.scale * adapters[name] @ adapters[f"{weight}.lora_b"]  # eq:lora-merge
    return merged
