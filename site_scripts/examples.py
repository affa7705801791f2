"""The inputs the pages' examples share (the tiny illustrative model, the default configuration with a
small batch), and the few pieces of page text several generators repeat.

Illustrative numbers come from the real `init_params`; nothing here is learned.
"""

from dataclasses import dataclass

import numpy as np

from transformer.block import ACTIVATION_FUNCTIONS
from transformer.config import PRESETS, ModelConfig
from transformer.attention import attention_backward
from transformer.embedding import embedding_backward
from transformer.layernorm import layer_norm_backward
from transformer.linear import linear_backward
from transformer.model import forward, init_params
from transformer.softmax import cross_entropy_backward, cross_entropy_forward

SEED = 0
TINY_IDS = [2, 0, 2]
TINY_TARGETS = [0, 2, 1]
H_STEP = 1e-5


@dataclass(frozen=True)
class Example:
    """A model as `init_params` builds it (seed SEED) and one forward pass of it."""
    cfg: ModelConfig
    params: dict
    ids: np.ndarray  # (B, T)
    trace: dict  # every intermediate of the forward pass, by `forward`'s names (embedding, b0.ln1, ...)


def example(cfg, ids):
    params = init_params(cfg, seed=SEED)
    trace = {}
    forward(params, ids, cfg, trace)
    return Example(cfg, params, ids, trace)


def tiny():
    """The tiny preset on one sequence, TINY_IDS."""
    return example(PRESETS["tiny"], np.array([TINY_IDS]))


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
    """Names of `steps`, in order: `dlogits` (∂ℓ/∂Z), `dlnf` (∂ℓ/∂X_f, from the head), then for each block l
    from the last: `b{l}.dout` (∂ℓ/∂X^(l+1)), `b{l}.dhidden` (∂ℓ/∂φ(G), from W_2), `b{l}.dpre` (∂ℓ/∂G),
    `b{l}.dln2` (∂ℓ/∂U_2, from W_1), `b{l}.dmid` (∂ℓ/∂M: the residual's dY plus LN2's), `b{l}.dln1`
    (∂ℓ/∂U_1, from attention), and `b{l}.din` (∂ℓ/∂X^(l): dM plus LN1's); last `dembedding` (= b0.din)."""
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


def default_run():
    """The default config on B = 2 sequences of T = context_len / 2 tokens (sizes chosen to differ from
    each other and from d, so that a recorded shape names its axes)."""
    cfg = PRESETS["default"]
    return example(cfg, np.random.default_rng(SEED).integers(0, cfg.vocab_size, (2, cfg.context_len // 2)))


def sizes(cfg):
    return (f"n_V = {cfg.vocab_size}, T_max = {cfg.context_len}, d = {cfg.emb_dim}, H = {cfg.num_heads}, "
            f"L = {cfg.num_layers}, F = {cfg.ff_dim}")


def illustrative(text):
    """The admonition that labels a tiny example as illustrative."""
    return (f'!!! example "Illustrative: the tiny model built by the real `init_params` (seed {SEED}), '
            f'not learned values"\n    Sizes: {sizes(PRESETS["tiny"])}. {text}\n')


def default_note(batch=True):
    """Where a symbol table's recorded shapes come from: default_run (or the default config alone)."""
    cfg = PRESETS["default"]
    text = f"the default config ({sizes(cfg)})"
    return text + (f" with a batch of B = 2 sequences of T = {cfg.context_len // 2} tokens" if batch else "")


def biases_moved(params, rng):
    """A copy of the parameters with every 1-D one (biases, gains) moved by 0.1 × N(0, 1), so that their
    gradient terms count in a check (at initialisation they are exactly 0 or 1)."""
    return {k: v + 0.1 * rng.standard_normal(v.shape) if v.ndim == 1 else v.copy() for k, v in params.items()}


def weighted_sum(dy, layer_forward, *args):
    """f = Σ layer_forward(*args)[0] ⊙ dy, as a function of no arguments for `numerical_grad` (which moves
    the arrays in args in place). Its gradient with respect to the output is dy, so the backward called
    with dy gives exactly its gradients."""
    return lambda: float(np.sum(layer_forward(*args)[0] * dy))


def collapsed(title, text):
    """Markdown text inside a note that opens on a click (pymdownx.details), for a table too long to show open."""
    return f'??? note "{title}"\n\n' + "\n".join("    " + line for line in text.splitlines()) + "\n"
