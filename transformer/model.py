"""The whole model: parameters, forward, backward and the loss.

```text
ids (B, T) -> tok_emb[ids] + pos_emb[:T]                 X (B, T, d)
for each block l: X = block_l(X)                        X (B, T, d)
LN_f(X) @ head_w + head_b                               logits (B, T, n_V)
    (GPT-2's layout: head_w is tok_emb's transpose, and there is no head_b)
mean cross-entropy over all B*T positions               loss
```
"""

from typing import NamedTuple

import numpy as np

from .activation_checkpoint import BlockReplay, checkpointed_block_backward, checkpointed_block_forward
from .block import BLOCK_KEYS, block_backward, block_forward, block_params
from .config import ModelConfig
from .embedding import embedding_backward, embedding_forward
from .errors import ConfigError, InputError
from .layernorm import layer_norm_backward, layer_norm_forward
from .linear import linear_backward, linear_forward
from .softmax import cross_entropy_backward, cross_entropy_forward


def param_shapes(cfg: ModelConfig) -> dict:
    """Name and shape of every parameter, in a fixed order.

    Parameters
    ----------
    cfg : ModelConfig
        The model configuration.

    Returns
    -------
    dict
        Parameter name to shape tuple; block parameters are named `b{layer}.<name>`.
    """
    n_v, t_max, d, F = cfg.vocab_size, cfg.context_len, cfg.emb_dim, cfg.ff_dim
    block = {"ln1_g": (d,), "ln1_b": (d,),
             "wq": (d, d), "bq": (d,), "wk": (d, d), "bk": (d,),
             "wv": (d, d), "bv": (d,), "wo": (d, d), "bo": (d,),
             "ln2_g": (d,), "ln2_b": (d,),
             "ff1_w": (d, F), "ff1_b": (F,), "ff2_w": (F, d), "ff2_b": (d,)}
    shapes = {"tok_emb": (n_v, d), "pos_emb": (t_max, d)}
    for layer in range(cfg.num_layers):
        shapes.update({f"b{layer}.{name}": block[name] for name in BLOCK_KEYS})
    shapes.update({"lnf_g": (d,), "lnf_b": (d,)})
    if not cfg.tied_head:
        shapes["head_w"] = (d, n_v)
    if cfg.head_bias:
        shapes["head_b"] = (n_v,)
    return shapes


def param_count(cfg: ModelConfig) -> int:
    """Number of parameters, `N_θ = 2 n_V d + T_max d + 2d + n_V + L (4d^2 + 2dF + 9d + F)`.

    A tied head has no table of its own (one n_V d fewer), and a head without bias no n_V.

    Parameters
    ----------
    cfg : ModelConfig
        The model configuration.

    Returns
    -------
    int
        N_θ.
    """
    n_v, t_max, d, F, L = cfg.vocab_size, cfg.context_len, cfg.emb_dim, cfg.ff_dim, cfg.num_layers
    count = 2 * n_v * d + t_max * d + 2 * d + n_v + L * (4 * d * d + 2 * d * F + 9 * d + F)  # eq:param-count
    if cfg.tied_head:  # no head table of its own
        count -= n_v * d  # eq:param-count-gpt2
    if not cfg.head_bias:
        count -= n_v  # eq:param-count-gpt2
    return count


def init_params(cfg: ModelConfig, seed: int = 0, dtype=np.float64) -> dict:
    """Draw the initial parameters.

    Matrices, the embedding tables included, are Xavier-uniform; biases are zero; LayerNorm gains are one
    and shifts zero. The same seed gives the same arrays.

    Parameters
    ----------
    cfg : ModelConfig
        The model configuration.
    seed : int
        Seed of the random generator.
    dtype : numpy.dtype
        The dtype of every array.

    Returns
    -------
    dict
        Parameter name to array, in the order of `param_shapes`.
    """
    rng = np.random.default_rng(seed)
    params = {}
    for name, shape in param_shapes(cfg).items():
        short = name.rsplit(".", 1)[-1]
        if len(shape) == 2:
            fan_in, fan_out = shape
            limit = np.sqrt(6.0 / (fan_in + fan_out))  # eq:xavier
            params[name] = rng.uniform(-limit, limit, size=shape).astype(dtype)
        elif short.endswith("_g"):
            params[name] = np.ones(shape, dtype=dtype)
        else:  # biases and LayerNorm shifts
            params[name] = np.zeros(shape, dtype=dtype)
    return params


def check_ids(ids, cfg: ModelConfig, what="ids"):
    """Check token ids and return them as a (B, T) integer array.

    Negative ids are refused: numpy would silently read row n_V - k for id -k.

    Parameters
    ----------
    ids : array_like of shape (T,) or (B, T)
        Token ids.
    cfg : ModelConfig
        Supplies n_V (vocab_size) and context_len.
    what : str
        What to call the ids in error messages.

    Returns
    -------
    ndarray of shape (B, T)
        The ids, with a batch axis of 1 added to a single sequence.

    Raises
    ------
    InputError
        If the ids are empty, not integers, outside [0, n_V), neither 1-D nor 2-D, or longer than
        context_len; the message names the problem.
    """
    ids = np.asarray(ids)
    if ids.size == 0:
        raise InputError(f"{what} is empty: shape {ids.shape}")
    _check_token_values(ids, cfg.vocab_size, what)
    if ids.ndim not in (1, 2):
        raise InputError(f"{what} must have shape (T,) or (B, T), got {ids.shape}")
    T = ids.shape[-1]
    if T > cfg.context_len:  # eq:model-length
        raise InputError(
            f"sequence of {T} tokens is longer than the position table "
            f"(context_len={cfg.context_len})"
        )
    return ids.reshape(-1, T)


def _check_token_values(arr, vocab_size, what):
    """Integer dtype, every value in [0, n_V). arr is a non-empty numpy array."""
    if arr.dtype == bool or not np.issubdtype(arr.dtype, np.integer):
        raise InputError(f"{what} must be integers, got dtype {arr.dtype}")
    low, high = arr.min(), arr.max()
    if low < 0 or high >= vocab_size:
        bad = low if low < 0 else high
        raise InputError(f"{what} must lie in [0, {vocab_size}), found {bad}")


def check_params(params, cfg: ModelConfig):
    """Check that a parameter dictionary matches the configuration exactly.

    Parameters
    ----------
    params : dict
        Parameter name to array.
    cfg : ModelConfig
        The model configuration.

    Raises
    ------
    ConfigError
        If a parameter is missing, has the wrong shape, or is not part of this config.
    """
    shapes = param_shapes(cfg)
    for name, shape in shapes.items():
        if name not in params:
            raise ConfigError(f"parameter {name!r} is missing")
        if np.shape(params[name]) != shape:
            raise ConfigError(f"parameter {name!r} has shape {np.shape(params[name])}, the config needs {shape}")
    extra = sorted(set(params) - set(shapes))
    if extra:
        raise ConfigError(f"parameters not in this config: {', '.join(extra)}")


class ModelCache(NamedTuple):
    """What `forward` keeps for `backward`.

    Attributes
    ----------
    single : bool
        True when the ids were 1-D, so dlogits gets its batch axis back.
    emb_cache : EmbeddingCache
        The cache of `embedding_forward`.
    block_caches : list
        One `BlockCache` per block (checkpointed: a `BlockReplay`).
    lnf_cache : LayerNormCache
        The cache of the final `layer_norm_forward`.
    head_cache : LinearCache
        The cache of the output head's `linear_forward`.
    tied_head : bool
        The config's field: whether the head's weight gradient goes into tok_emb's (GPT-2's layout).
    head_bias : bool
        The config's field: whether the head has a bias to receive a gradient.
    """

    single: bool
    emb_cache: tuple
    block_caches: list
    lnf_cache: tuple
    head_cache: tuple
    tied_head: bool = False
    head_bias: bool = True


def head_weights(params, cfg: ModelConfig):
    """The output head's weight (d, n_V) and bias (n_V,): head_w and head_b, or in GPT-2's layout tok_emb's
    transpose (a view, no copy) and zeros.

    Parameters
    ----------
    params : dict
        Parameter name to array.
    cfg : ModelConfig
        Supplies tied_head and head_bias.

    Returns
    -------
    w, b
        What `linear_forward` applies to LN_f's output.
    """
    w = params["tok_emb"].T if cfg.tied_head else params["head_w"]  # eq:head-tied
    b = params["head_b"] if cfg.head_bias else np.zeros(cfg.vocab_size, dtype=params["tok_emb"].dtype)
    return w, b


def forward(params, ids, cfg: ModelConfig, trace=None):
    """Run the model from token ids to logits.

    Parameters
    ----------
    params : dict
        Parameter name to array.
    ids : array_like of shape (T,) or (B, T)
        Integer token ids.
    cfg : ModelConfig
        The model configuration.
    trace : dict, optional
        If given, the intermediates are stored in it, always batched (B, ...): embedding, `b{l}.ln1`,
        `b{l}.attention`, `b{l}.ln2`, `b{l}.out`, lnf and logits.

    Returns
    -------
    logits : ndarray of shape (T, n_V) or (B, T, n_V)
        Batched exactly when ids are.
    cache : ModelCache
        What `backward` needs.

    Raises
    ------
    InputError
        If the ids are invalid (see `check_ids`).
    ConfigError
        If params do not match cfg.
    """
    single = np.ndim(ids) == 1
    ids = check_ids(ids, cfg)
    check_params(params, cfg)
    x, emb_cache = embedding_forward(ids, params["tok_emb"], params["pos_emb"])  # eq:model-embed
    block_caches, block_trace = [], None if trace is None else {}
    if trace is not None:
        trace["embedding"] = x
    for layer in range(cfg.num_layers):
        p = block_params(params, layer)
        if cfg.checkpoint_blocks:  # keep the block's input only, replay it in the backward
            x, block_cache = checkpointed_block_forward(x, p, cfg, block_trace)  # eq:model-blocks
        else:
            x, block_cache = block_forward(x, p, cfg, block_trace)  # eq:model-blocks
        block_caches.append(block_cache)
        if trace is not None:
            trace.update({f"b{layer}.{name}": value for name, value in block_trace.items()})
    x, lnf_cache = layer_norm_forward(x, params["lnf_g"], params["lnf_b"], cfg.ln_eps)  # eq:model-lnf
    logits, head_cache = linear_forward(x, *head_weights(params, cfg))  # eq:head
    if trace is not None:
        trace.update({"lnf": x, "logits": logits})
    cache = ModelCache(single, emb_cache, block_caches, lnf_cache, head_cache, cfg.tied_head, cfg.head_bias)
    return (logits[0] if single else logits), cache


def backward(dlogits, cache, embeddings=True, trace=None):
    """Backpropagate a gradient of the logits to every parameter.

    Parameters
    ----------
    dlogits : ndarray
        Gradient with respect to the logits, shaped like them.
    cache : ModelCache
        The cache from `forward`.
    embeddings : bool
        Compute the embedding tables' gradients; fine-tuning, which freezes them, passes False.
    trace : dict, optional
        If given, the gradient each step hands to the next is stored in it, always batched (B, ...), as `forward`
        stores its tensors: dlogits, dlnf (into LN_f's output, from the head), each block's from the last
        (`b{l}.dout`, `b{l}.dhidden`, ..., `b{l}.din`: see `block_backward`), and dembedding (into the
        embedding's output).

    Returns
    -------
    grads : dict
        Gradient of each parameter, with the keys of params (with a tied head, tok_emb's is the sum of what
        the embedding and the head give it; without embeddings, the head's share is left out too). A weight that computes its own layer (in
        fine-tuning, `lora.Frozen`) has what its backward gives instead: its adapters' gradients or None.
    """
    if cache.single:
        dlogits = dlogits[None]
    steps, grads = {"dlogits": dlogits}, {}
    dx, dhead_w, dhead_b = linear_backward(dlogits, cache.head_cache)  # eq:head-grads eq:head-index
    if not cache.tied_head:
        grads["head_w"] = dhead_w
    if cache.head_bias:
        grads["head_b"] = dhead_b
    steps["dlnf"] = dx
    dx, grads["lnf_g"], grads["lnf_b"] = layer_norm_backward(dx, cache.lnf_cache)  # eq:model-lnf-grad
    for layer in reversed(range(len(cache.block_caches))):  # eq:model-blocks-grad eq:model-reverse
        block_cache, block_trace = cache.block_caches[layer], None if trace is None else {}
        if isinstance(block_cache, BlockReplay):  # a checkpointed block
            dx, block_grads = checkpointed_block_backward(dx, block_cache, block_trace)  # eq:model-blocks-grad eq:model-vjp
        else:
            dx, block_grads = block_backward(dx, block_cache, block_trace)  # eq:model-blocks-grad eq:model-vjp
        grads.update({f"b{layer}.{name}": g for name, g in block_grads.items()})  # eq:model-param-once
        steps.update({f"b{layer}.{name}": g for name, g in (block_trace or {}).items()})
    steps["dembedding"] = dx
    if embeddings:
        grads["tok_emb"], grads["pos_emb"] = embedding_backward(dx, cache.emb_cache)  # eq:model-embed-grad eq:model-many-uses
        if cache.tied_head:  # the table is used twice, so its gradient is the sum of both uses'
            grads["tok_emb"] += dhead_w.T  # eq:head-tied-grad
    if trace is not None:
        trace.update(steps)
    return grads


def check_targets(targets, ids, cfg: ModelConfig):
    """Check that targets are integer ids in [0, n_V) with exactly the shape of ids.

    Parameters
    ----------
    targets : array_like
        Target token ids.
    ids : array_like
        The input ids the targets belong to.
    cfg : ModelConfig
        Supplies n_V (vocab_size).

    Returns
    -------
    ndarray
        The targets as an array.

    Raises
    ------
    InputError
        If the targets are empty, shaped unlike ids, not integers, or outside [0, n_V).
    """
    targets_arr = np.asarray(targets)
    if targets_arr.size == 0:
        raise InputError(f"targets are empty: shape {targets_arr.shape}")
    if targets_arr.shape != np.shape(ids):
        raise InputError(f"targets have shape {targets_arr.shape}, ids have shape {np.shape(ids)}")
    _check_token_values(targets_arr, cfg.vocab_size, "targets")
    return targets_arr


def loss_fn(params, ids, targets, cfg: ModelConfig) -> float:
    """Mean cross-entropy, forward pass only (for evaluation).

    Parameters
    ----------
    params : dict
        Parameter name to array.
    ids : array_like of shape (T,) or (B, T)
        Integer token ids.
    targets : array_like of shape (T,) or (B, T)
        The next token of each input, shaped like ids.
    cfg : ModelConfig
        The model configuration.

    Returns
    -------
    float
        The loss.

    Raises
    ------
    InputError
        If the ids or targets are invalid.
    ConfigError
        If params do not match cfg.
    """
    targets = check_targets(targets, ids, cfg)
    logits, _ = forward(params, ids, cfg)
    loss, _ = cross_entropy_forward(logits, targets)
    return loss


def loss_and_grads(params, ids, targets, cfg: ModelConfig):
    """Mean cross-entropy and its gradient with respect to every parameter.

    Parameters
    ----------
    params : dict
        Parameter name to array.
    ids : array_like of shape (T,) or (B, T)
        Integer token ids.
    targets : array_like of shape (T,) or (B, T)
        The next token of each input, shaped like ids.
    cfg : ModelConfig
        The model configuration.

    Returns
    -------
    loss : float
        The mean cross-entropy.
    grads : dict
        Gradient of each parameter, keyed like params.

    Raises
    ------
    InputError
        If the ids or targets are invalid.
    ConfigError
        If params do not match cfg.
    """
    targets = check_targets(targets, ids, cfg)
    logits, cache = forward(params, ids, cfg)  # eq:model-composition
    loss, xent_cache = cross_entropy_forward(logits, targets)  # eq:model-composition
    dlogits = cross_entropy_backward(1.0, xent_cache)  # eq:model-dlogits eq:model-dlogits-mean
    grads = backward(dlogits, cache)
    return loss, {name: grads[name] for name in params}
