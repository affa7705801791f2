"""LoRA: a frozen linear layer plus a trained low-rank correction, `y = x W + b + (alpha / r) (x A) B`.

Fine-tuning every entry of W (in, out) needs a gradient and two AdamW moments per entry. LoRA freezes W and
the bias and trains two thin matrices instead, A (in, r) and B (r, out) with a small rank r: r (in + out)
numbers per layer. B starts at zero, so at step 0 the adapted layer computes exactly what the base layer
does, and training moves it from there. `merge` folds the trained correction into W for inference.

The base weight may be a dense array or an `NF4Weight` (QLoRA): the backward never needs a gradient of it.
"""

from dataclasses import dataclass

import numpy as np

from .config import is_int
from .errors import ConfigError
from .linear import linear_forward
from .nf4 import NF4Weight
from .quantized_linear import nf4_linear_backward, nf4_linear_forward

# What a target names: the weight of each projection, in every block (the head once).
TARGETS = {"q": "wq", "k": "wk", "v": "wv", "o": "wo", "ff1": "ff1_w", "ff2": "ff2_w", "head": "head_w"}


@dataclass(frozen=True)
class LoRAConfig:
    """Rank, scale and targets of the adapters, checked when made."""
    rank: int = 8
    alpha: float = 16.0
    targets: tuple = ("q", "v")

    def __post_init__(self):
        if not (is_int(self.rank) and self.rank >= 1):
            raise ConfigError(f"lora rank must be a positive integer, got {self.rank!r}")
        if isinstance(self.alpha, bool) or not (isinstance(self.alpha, (int, float)) and self.alpha > 0):
            raise ConfigError(f"lora alpha must be a positive number, got {self.alpha!r}")
        unknown = [t for t in self.targets if t not in TARGETS]
        if unknown or not self.targets:
            raise ConfigError(f"lora targets must be some of {', '.join(TARGETS)}, got {', '.join(self.targets) or 'none'}")

    @property
    def scale(self):
        return self.alpha / self.rank


def adapter_shapes(param_shapes, lora: LoRAConfig):
    """The adapters of every targeted weight: `<weight>.lora_a` (in, r) and `<weight>.lora_b` (r, out).

    Raises
    ------
    ConfigError
        If the rank exceeds a targeted weight's smaller side (the correction could not be low-rank).
    """
    shapes = {}
    for name, shape in param_shapes.items():
        if name.rsplit(".", 1)[-1] in {TARGETS[t] for t in lora.targets}:
            if lora.rank > min(shape):
                raise ConfigError(f"lora rank {lora.rank} is larger than {name}'s smaller side {min(shape)}")
            shapes[f"{name}.lora_a"], shapes[f"{name}.lora_b"] = (shape[0], lora.rank), (lora.rank, shape[1])
    return shapes


def init_adapters(param_shapes, lora: LoRAConfig, seed=0, dtype=np.float64):
    """A uniform in +-1/sqrt(in), B zero: the adapted model starts equal to the base model."""
    rng = np.random.default_rng(seed)
    adapters = {}
    for name, shape in adapter_shapes(param_shapes, lora).items():
        if name.endswith(".lora_a"):
            limit = 1.0 / np.sqrt(shape[0])
            adapters[name] = rng.uniform(-limit, limit, size=shape).astype(dtype)
        else:
            adapters[name] = np.zeros(shape, dtype=dtype)
    return adapters


def lora_linear_forward(x, w, b, a, bm, scale):
    """y = x W + b + scale (x A) B, with W and b frozen.

    Parameters
    ----------
    x : ndarray of shape (..., in)
    w : ndarray of shape (in, out), or an NF4Weight
    b : ndarray of shape (out,)
    a : ndarray of shape (in, r)
    bm : ndarray of shape (r, out)
        The adapter B (named bm beside the bias b).
    scale : float
        alpha / r.

    Returns
    -------
    y : ndarray of shape (..., out)
    cache : (x, base_cache, a, bm, xa, scale)
    """
    if isinstance(w, NF4Weight):
        y, base_cache = nf4_linear_forward(x, w, b)
    else:
        y, base_cache = linear_forward(x, w, b)
    xa = x @ a  # (..., r)
    return y + scale * (xa @ bm), (x, base_cache, a, bm, xa, scale)


def lora_linear_backward(dy, cache):
    """Gradients of `lora_linear_forward` for x and the adapters; none for the frozen W and b.

    Returns
    -------
    dx : ndarray of shape (..., in)
    da : ndarray of shape (in, r)
    dbm : ndarray of shape (r, out)
    """
    x, base_cache, a, bm, xa, scale = cache
    dxa = scale * (dy @ bm.T)  # (..., r)
    dbm = scale * xa.reshape(-1, xa.shape[-1]).T @ dy.reshape(-1, dy.shape[-1])
    da = x.reshape(-1, x.shape[-1]).T @ dxa.reshape(-1, dxa.shape[-1])
    if isinstance(base_cache[0], NF4Weight):
        dx_base, _ = nf4_linear_backward(dy, base_cache)
    else:
        dx_base = dy @ base_cache[1].T  # the frozen weight's gradient is never formed
    return dx_base + dxa @ a.T, da, dbm


def merge(params, adapters, lora: LoRAConfig):
    """The parameters with every adapter folded in, W + scale A B: a plain model computing what the
    adapted one does."""
    merged = dict(params)
    for name in adapters:
        if name.endswith(".lora_a"):
            weight = name[: -len(".lora_a")]
            merged[weight] = params[weight] + lora.scale * adapters[name] @ adapters[f"{weight}.lora_b"]
    return merged
