"""One pre-norm transformer block: attention and a feed-forward network, each
added to the residual stream.

```text
h = x + Attention(LN1(x))
y = h + FFN(LN2(h)),   FFN(u) = act(u W1 + b1) W2 + b2
```
"""

from typing import NamedTuple

from .activations import ACTIVATION_FUNCTIONS
from .attention import attention_backward, attention_forward
from .flash_attention import FlashCache, flash_attention_backward, flash_attention_forward
from .layernorm import layer_norm_backward, layer_norm_forward
from .linear import linear_backward, linear_forward

ATTENTION_KEYS = ("wq", "bq", "wk", "bk", "wv", "bv", "wo", "bo")
BLOCK_KEYS = ("ln1_g", "ln1_b") + ATTENTION_KEYS + ("ln2_g", "ln2_b", "ff1_w", "ff1_b", "ff2_w", "ff2_b")


def block_params(params, layer):
    """Pick out the parameters of one block, with the 'b{layer}.' prefix removed.

    Parameters
    ----------
    params : dict
        All the model's parameters.
    layer : int
        The index of the block.

    Returns
    -------
    dict
        The block's parameters, named as in BLOCK_KEYS.
    """
    return {name: params[f"b{layer}.{name}"] for name in BLOCK_KEYS}


class BlockCache(NamedTuple):
    """What `block_forward` keeps for `block_backward`: the cache of each step, in the order the forward ran them.

    Attributes
    ----------
    activation : str
        "relu" or "gelu": which backward undoes the feed-forward non-linearity.
    ln1_cache : LayerNormCache
        The cache of LN1's `layer_norm_forward`.
    attn_cache : AttentionCache or FlashCache
        The cache of `attention_forward`, or of `flash_attention_forward` when cfg.attention is "flash".
    ln2_cache : LayerNormCache
        The cache of LN2's `layer_norm_forward`.
    ff1_cache : LinearCache
        The cache of the first feed-forward `linear_forward`, (d, F).
    act_cache : ndarray or GeluCache
        The cache of the activation's forward.
    ff2_cache : LinearCache
        The cache of the second feed-forward `linear_forward`, (F, d).
    """

    activation: str
    ln1_cache: tuple
    attn_cache: tuple
    ln2_cache: tuple
    ff1_cache: tuple
    act_cache: object
    ff2_cache: tuple


def block_forward(x, p, cfg, trace=None):
    """One pre-norm block: attention, then the feed-forward network, each added to the residual stream.

    Parameters
    ----------
    x : ndarray of shape (B, T, d)
        The residual stream entering the block.
    p : dict
        The block's parameters, as `block_params` returns them.
    cfg : ModelConfig
        Supplies num_heads, ln_eps, the activation and the attention (materialized or flash, and its tile).
    trace : dict, optional
        If given, the block's intermediates are stored in it: ln1, attention (the probabilities; not
        with flash attention, which never forms them), ln2 and out.

    Returns
    -------
    y : ndarray of shape (B, T, d)
        The residual stream leaving the block.
    cache : BlockCache
        What `block_backward` needs (see `BlockCache`).
    """
    act_forward, _ = ACTIVATION_FUNCTIONS[cfg.activation]
    a, ln1_cache = layer_norm_forward(x, p["ln1_g"], p["ln1_b"], cfg.ln_eps)
    if trace is not None:
        trace["ln1"] = a
    if cfg.attention == "flash":  # no (T, T) probabilities exist to trace
        a, attn_cache = flash_attention_forward(a, p, cfg.num_heads, cfg.flash_tile)
    else:
        a, attn_cache = attention_forward(a, p, cfg.num_heads, trace)
    h = x + a  # eq:block-attn-residual
    u, ln2_cache = layer_norm_forward(h, p["ln2_g"], p["ln2_b"], cfg.ln_eps)
    if trace is not None:
        trace["ln2"] = u
    u, ff1_cache = linear_forward(u, p["ff1_w"], p["ff1_b"])  # eq:ffn  (B, T, F)
    u, act_cache = act_forward(u)  # eq:ffn
    u, ff2_cache = linear_forward(u, p["ff2_w"], p["ff2_b"])  # eq:ffn  (B, T, d)
    y = h + u  # eq:block-ffn-residual
    if trace is not None:
        trace["out"] = y
    cache = BlockCache(cfg.activation, ln1_cache, attn_cache, ln2_cache, ff1_cache, act_cache, ff2_cache)
    return y, cache


def block_backward(dy, cache, trace=None):
    """Gradients of one block with respect to its input and its parameters.

    Parameters
    ----------
    dy : ndarray of shape (B, T, d)
        Gradient with respect to the block's output.
    cache : BlockCache
        The cache from `block_forward`.
    trace : dict, optional
        If given, the gradients the block hands from step to step are stored in it, in the order they are made:
        dout (dy itself), dhidden (into the activation's output, from W_2), dpre (into the activation's input),
        dln2 (into LN2's output, from W_1), dmid (into the stream between the two halves), dln1 (into LN1's
        output, from attention) and din (dx).

    Returns
    -------
    dx : ndarray of shape (B, T, d)
        Gradient with respect to the block's input.
    grads : dict
        Gradient of each parameter, with the keys `block_params` returns.
    """
    _, act_backward = ACTIVATION_FUNCTIONS[cache.activation]
    # y = h + FFN(LN2(h)): the residual passes dy to h unchanged, and the
    # feed-forward branch adds its own gradient on top.
    dhidden, dff2_w, dff2_b = linear_backward(dy, cache.ff2_cache)  # eq:block-grad-ff2
    dpre = act_backward(dhidden, cache.act_cache)  # eq:block-grad-act
    dln2, dff1_w, dff1_b = linear_backward(dpre, cache.ff1_cache)  # eq:block-grad-ff1
    dh_ffn, dln2_g, dln2_b = layer_norm_backward(dln2, cache.ln2_cache)  # eq:block-grad-ln2
    dh = dy + dh_ffn  # eq:block-residual-grad
    # h = x + Attention(LN1(x)): the same pattern once more.
    attn_backward = flash_attention_backward if isinstance(cache.attn_cache, FlashCache) else attention_backward
    dln1, attn_grads = attn_backward(dh, cache.attn_cache)  # eq:block-grad-attn
    dx_attn, dln1_g, dln1_b = layer_norm_backward(dln1, cache.ln1_cache)  # eq:block-grad-ln1
    dx = dh + dx_attn  # eq:block-residual-grad eq:block-grad-identity
    if trace is not None:
        trace.update(dout=dy, dhidden=dhidden, dpre=dpre, dln2=dln2, dmid=dh, dln1=dln1, din=dx)
    grads = {"ln1_g": dln1_g, "ln1_b": dln1_b, **attn_grads,
             "ln2_g": dln2_g, "ln2_b": dln2_b,
             "ff1_w": dff1_w, "ff1_b": dff1_b, "ff2_w": dff2_w, "ff2_b": dff2_b}
    return dx, grads
