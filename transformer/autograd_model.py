"""The model of `transformer.model`, composed from the engine's operations: no hand-written backward.

The parameters are the same dictionary (`transformer.model.init_params`), the maths is the same step
for step (pre-norm blocks, population variance with eps inside the square root, queries scaled by
1/sqrt(dh), an additive -inf causal mask, mean cross-entropy from log-sum-exp), and the gradients come
from `backward` on the tape.

Two options of ModelConfig choose how the hand-written model computes, not what: `attention="flash"`
(the same attention, tile by tile) and `checkpoint_blocks` (the same block, replayed). The composed
model computes both the same way, the materialized way. With `fused` it instead puts the hand-written
LayerNorm, or the hand-written attention (flash or materialized, as cfg says), on the tape through the
custom-gradient seam.
"""

import math

import numpy as np

from .attention import attention_backward, attention_forward, causal_mask
from .autograd import Tensor, backward
from .autograd_functions import detach_max, embedding, exp, gelu, gelu_tanh, log, relu, softmax
from .block import ATTENTION_KEYS
from .config import ModelConfig
from .custom_gradient import custom_op
from .errors import ConfigError
from .flash_attention import flash_attention_backward, flash_attention_forward
from .layernorm import layer_norm_backward, layer_norm_forward
from .model import check_ids, check_params, check_targets

FUSABLE = ("layer_norm", "attention")


def layer_norm(x, g, b, eps):
    """LayerNorm over the last axis, composed: mean, centre, population variance, scale, shift.

    Parameters
    ----------
    x : Tensor of shape (..., d)
    g, b : Tensor of shape (d,)
        The gain and the shift.
    eps : float
        Added to the variance inside the square root.

    Returns
    -------
    Tensor of shape (..., d)
    """
    mu = x.mean(axis=-1, keepdims=True)
    centred = x - mu
    var = (centred * centred).mean(axis=-1, keepdims=True)
    xhat = centred * (var + eps) ** -0.5
    return xhat * g + b


def fused_layer_norm(x, g, b, eps):
    """LayerNorm as one node: `layer_norm_forward` forward, `layer_norm_backward` as its VJP."""
    return custom_op("layer_norm", lambda x, g, b: layer_norm_forward(x, g, b, eps), layer_norm_backward, x, g, b)


def split_heads(x, num_heads):
    """(B, T, d) -> (B, H, T, dh)."""
    B, T, d = x.shape
    return x.reshape(B, T, num_heads, d // num_heads).swapaxes(1, 2)


def merge_heads(x):
    """(B, H, T, dh) -> (B, T, d)."""
    B, H, T, dh = x.shape
    return x.swapaxes(1, 2).reshape(B, T, H * dh)


def attention(x, p, num_heads):
    """Causal multi-head self-attention, composed from matmul, the mask and softmax.

    Parameters
    ----------
    x : Tensor of shape (B, T, d)
    p : dict of Tensor
        wq, bq, wk, bk, wv, bv, wo and bo.
    num_heads : int
        H.

    Returns
    -------
    Tensor of shape (B, T, d)
    """
    q, k, v = (split_heads(x @ p[f"w{n}"] + p[f"b{n}"], num_heads) for n in "qkv")  # (B, H, T, dh)
    q = q * (1.0 / math.sqrt(q.shape[-1]))
    scores = q @ k.swapaxes(-1, -2)  # (B, H, T, T)
    scores = scores + causal_mask(x.shape[1], scores.data.dtype)  # a constant: -inf above the diagonal
    heads = softmax(scores) @ v  # (B, H, T, dh)
    return merge_heads(heads) @ p["wo"] + p["bo"]


def fused_attention(x, p, cfg: ModelConfig):
    """Attention as one node: the hand-written forward and backward (flash when cfg.attention says so)."""
    if cfg.attention == "flash":
        fwd, bwd = (lambda x, p: flash_attention_forward(x, p, cfg.num_heads, cfg.flash_tile)), flash_attention_backward
    else:
        fwd, bwd = (lambda x, p: attention_forward(x, p, cfg.num_heads)), attention_backward

    def forward(x, *weights):
        return fwd(x, dict(zip(ATTENTION_KEYS, weights)))

    def vjp(dy, saved):
        dx, grads = bwd(dy, saved)
        return (dx, *(grads[k] for k in ATTENTION_KEYS))

    return custom_op(f"{cfg.attention}_attention", forward, vjp, x, *(p[k] for k in ATTENTION_KEYS))


def block(x, p, cfg: ModelConfig, fused=()):
    """One pre-norm block: x + Attention(LN1(x)), then h + FFN(LN2(h))."""
    norm = fused_layer_norm if "layer_norm" in fused else layer_norm
    a = norm(x, p["ln1_g"], p["ln1_b"], cfg.ln_eps)
    h = x + (fused_attention(a, p, cfg) if "attention" in fused else attention(a, p, cfg.num_heads))
    u = norm(h, p["ln2_g"], p["ln2_b"], cfg.ln_eps) @ p["ff1_w"] + p["ff1_b"]  # (B, T, F)
    u = {"relu": relu, "gelu": gelu, "gelu_tanh": gelu_tanh}[cfg.activation](u)
    return h + (u @ p["ff2_w"] + p["ff2_b"])


def cross_entropy(logits, targets):
    """Mean over the N positions of -log softmax(logits)[target], through log-sum-exp.

    The target entries are gathered by index (the embedding's gather, over the log-probabilities laid out as a
    table of one-entry rows), not picked by multiplying with a one-hot array: a class whose logit is -inf has
    log-probability -inf, and 0 * -inf would make the loss NaN where the hand-written one is finite.
    """
    n_v = logits.shape[-1]
    z = logits.reshape(-1, n_v)
    z = z - detach_max(z, what="cross-entropy")  # the shift does not change the loss: a constant
    log_probs = z - log(exp(z).sum(axis=-1, keepdims=True))  # (N, n_V)
    n = log_probs.shape[0]
    rows = np.arange(n) * n_v + np.asarray(targets).reshape(-1)  # row t of position i: i * n_V + t
    return -embedding(log_probs.reshape((n * n_v, 1)), rows).sum() * (1.0 / n)


def check_fused(fused):
    """Refuse an unknown name in fused (a typo would silently compose what was meant to be fused)."""
    unknown = sorted(set(fused) - set(FUSABLE))
    if unknown:
        raise ConfigError(f"cannot fuse {', '.join(unknown)}: fusable are {', '.join(FUSABLE)}")


def forward(leaves, ids, cfg: ModelConfig, fused=()):
    """The logits as a Tensor, from parameter Tensors.

    Parameters
    ----------
    leaves : dict of Tensor
        The parameters as leaf Tensors, keyed like `init_params`.
    ids : array_like of shape (T,) or (B, T)
        Integer token ids.
    cfg : ModelConfig
        The model configuration.
    fused : sequence of str
        Operations to run as hand-written custom ops instead of compositions: from FUSABLE.

    Returns
    -------
    Tensor of shape (B, T, n_V)
        The logits, always batched.
    """
    check_fused(fused)
    ids = check_ids(ids, cfg)
    T = ids.shape[1]
    x = embedding(leaves["tok_emb"], ids) + embedding(leaves["pos_emb"], np.arange(T))  # (B, T, d)
    for layer in range(cfg.num_layers):
        p = {name.split(".", 1)[1]: t for name, t in leaves.items() if name.startswith(f"b{layer}.")}
        x = block(x, p, cfg, fused)
    norm = fused_layer_norm if "layer_norm" in fused else layer_norm
    x = norm(x, leaves["lnf_g"], leaves["lnf_b"], cfg.ln_eps)
    logits = x @ (leaves["tok_emb"].swapaxes(0, 1) if cfg.tied_head else leaves["head_w"])  # GPT-2: the table, twice
    return logits + leaves["head_b"] if cfg.head_bias else logits


def as_leaves(params, cfg: ModelConfig):
    """Every parameter as a leaf Tensor that wants its gradient.

    Raises
    ------
    ConfigError
        If params do not match cfg, or a parameter is not a plain array (a frozen fine-tuning weight).
    """
    check_params(params, cfg)
    for name, value in params.items():
        if not isinstance(value, np.ndarray):
            raise ConfigError(f"the autograd engine takes plain arrays; parameter {name!r} is a "
                              f"{type(value).__name__}")
    return {name: Tensor(value, requires_grad=True) for name, value in params.items()}


def loss_and_grads(params, ids, targets, cfg: ModelConfig, fused=(), free_graph=True):
    """Mean cross-entropy and the gradient of every parameter, by the tape: `transformer.model.loss_and_grads`.

    Parameters
    ----------
    params : dict
        Parameter name to array.
    ids, targets : array_like of shape (T,) or (B, T)
        Token ids and the next token of each.
    cfg : ModelConfig
        The model configuration.
    fused : sequence of str
        See `forward`.
    free_graph : bool
        Passed to `backward`.

    Returns
    -------
    loss : float
    grads : dict
        Gradient of each parameter, keyed like params.
    """
    targets = check_targets(targets, ids, cfg)
    leaves = as_leaves(params, cfg)
    loss = cross_entropy(forward(leaves, ids, cfg, fused), targets)
    backward(loss, free_graph=free_graph)
    # Copies: a leaf's grad may be a read-only broadcast view or share memory with another gradient.
    return float(loss.data), {name: np.array(t.grad) for name, t in leaves.items()}


def logits(params, ids, cfg: ModelConfig, fused=()):
    """The logits as an array, shaped like `transformer.model.forward`'s: (T, n_V) for 1-D ids.

    Parameters
    ----------
    params : dict
        Parameter name to array.
    ids : array_like of shape (T,) or (B, T)
        Integer token ids.
    cfg : ModelConfig
        The model configuration.
    fused : sequence of str
        See `forward`.

    Returns
    -------
    ndarray of shape (T, n_V) or (B, T, n_V)
    """
    out = forward(as_leaves(params, cfg), ids, cfg, fused).data
    return out[0] if np.ndim(ids) == 1 else out
