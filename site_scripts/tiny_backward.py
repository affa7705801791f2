"""The tiny example's real backward, replayed call by call, for the pages' backward examples.

A module of its own, apart from site_scripts/examples.py: a page's cache key follows the site_scripts
files it imports, and only the pages that show a backward example should rerun when a backward changes.
"""

from dataclasses import dataclass

import numpy as np

from transformer.attention import attention_backward
from transformer.block import ACTIVATION_FUNCTIONS
from transformer.embedding import embedding_backward
from transformer.layernorm import layer_norm_backward
from transformer.linear import linear_backward
from transformer.model import forward
from transformer.softmax import cross_entropy_backward, cross_entropy_forward

from .examples import TINY_TARGETS, tiny


@dataclass(frozen=True)
class Backward:
    """The tiny example's real backward (the mean cross-entropy against TINY_TARGETS), replayed call by
    call with the model's own backward functions: the loss, the gradient each call hands on, by name and
    in the order the backward makes them (each of shape (1, T, ...), like the forward's trace), and every
    parameter's gradient (equal to `loss_and_grads`; tests/site checks it)."""
    loss: float
    steps: dict  # dlogits, dlnf (into the head), dx3 ... : see tiny_backward
    grads: dict


def tiny_backward():
    """Names of `steps`, in order: `dlogits` (∂ℓ/∂Z), `dlnf` (∂ℓ/∂X_f, from the head), then for each
    block l from the last: `b{l}.dout` (∂ℓ/∂X^(l+1)), `b{l}.dhidden` (∂ℓ/∂φ(G), from W_2), `b{l}.dpre`
    (∂ℓ/∂G), `b{l}.dln2` (∂ℓ/∂U_2, from W_1), `b{l}.dmid` (∂ℓ/∂M: the residual's dY plus LN2's),
    `b{l}.dln1` (∂ℓ/∂U_1, from attention), and `b{l}.din` (∂ℓ/∂X^(l): dM plus LN1's); last `dembedding`
    (= b0.din)."""
    ex = tiny()
    logits, (_, emb_cache, block_caches, lnf_cache, head_cache) = forward(ex.params, ex.ids, ex.cfg)
    loss, xent_cache = cross_entropy_forward(logits, np.array([TINY_TARGETS]))
    steps, grads = {"dlogits": cross_entropy_backward(1.0, xent_cache)}, {}
    steps["dlnf"], grads["head_w"], grads["head_b"] = linear_backward(steps["dlogits"], head_cache)
    dx, grads["lnf_g"], grads["lnf_b"] = layer_norm_backward(steps["dlnf"], lnf_cache)
    for l in reversed(range(ex.cfg.num_layers)):
        activation, ln1, attn, ln2, ff1, act, ff2 = block_caches[l]
        steps[f"b{l}.dout"] = dx
        steps[f"b{l}.dhidden"], grads[f"b{l}.ff2_w"], grads[f"b{l}.ff2_b"] = linear_backward(dx, ff2)
        steps[f"b{l}.dpre"] = ACTIVATION_FUNCTIONS[activation][1](steps[f"b{l}.dhidden"], act)
        steps[f"b{l}.dln2"], grads[f"b{l}.ff1_w"], grads[f"b{l}.ff1_b"] = linear_backward(steps[f"b{l}.dpre"], ff1)
        from_ln2, grads[f"b{l}.ln2_g"], grads[f"b{l}.ln2_b"] = layer_norm_backward(steps[f"b{l}.dln2"], ln2)
        steps[f"b{l}.dmid"] = dx + from_ln2
        steps[f"b{l}.dln1"], attn_grads = attention_backward(steps[f"b{l}.dmid"], attn)
        grads.update({f"b{l}.{name}": g for name, g in attn_grads.items()})
        from_ln1, grads[f"b{l}.ln1_g"], grads[f"b{l}.ln1_b"] = layer_norm_backward(steps[f"b{l}.dln1"], ln1)
        dx = steps[f"b{l}.din"] = steps[f"b{l}.dmid"] + from_ln1
    steps["dembedding"] = dx
    grads["tok_emb"], grads["pos_emb"] = embedding_backward(dx, emb_cache)
    return Backward(float(loss), steps, grads)
