"""The tiny example's real backward, with every gradient it hands from step to step, for the pages' backward
examples.

A module of its own, apart from site_scripts/examples.py: a page's cache key follows the site_scripts
files it imports, and only the pages that show a backward example should rerun when a backward changes.
"""

from dataclasses import dataclass

import numpy as np

from transformer.model import backward, forward
from transformer.softmax import cross_entropy_backward, cross_entropy_forward

from .examples import TINY_TARGETS, tiny


@dataclass(frozen=True)
class Backward:
    """The tiny example's real backward (the mean cross-entropy against TINY_TARGETS): the loss, the gradient
    each step hands on (`steps`, by the names of `model.backward`'s trace, each of shape (1, T, ...)), and
    every parameter's gradient."""
    loss: float
    steps: dict
    grads: dict


def tiny_backward():
    """`steps` holds, in order: `dlogits` (∂ℓ/∂Z), `dlnf` (∂ℓ/∂X_f, from the head), then for each block l from
    the last: `b{l}.dout` (∂ℓ/∂X^(l+1)), `b{l}.dhidden` (∂ℓ/∂φ(G), from W_2), `b{l}.dpre` (∂ℓ/∂G), `b{l}.dln2`
    (∂ℓ/∂U_2, from W_1), `b{l}.dmid` (∂ℓ/∂M: the residual's dY plus LN2's), `b{l}.dln1` (∂ℓ/∂U_1, from
    attention), and `b{l}.din` (∂ℓ/∂X^(l): dM plus LN1's); last `dembedding` (= b0.din)."""
    ex = tiny()
    logits, cache = forward(ex.params, ex.ids, ex.cfg)
    loss, xent_cache = cross_entropy_forward(logits, np.array([TINY_TARGETS]))
    steps = {}
    grads = backward(cross_entropy_backward(1.0, xent_cache), cache, trace=steps)
    return Backward(float(loss), steps, grads)
