"""Fine-tuning a trained model: its parameters frozen, dense or in NF4, and LoRA adapters trained beside them.

```text
base (frozen)      every parameter of a trained checkpoint; with quantize="nf4" (QLoRA) the weights of
                   the linear layers are stored in NF4, and embeddings, biases and LayerNorms stay as they were
adapters (trained) `<weight>.lora_a` (in, r) and `<weight>.lora_b` (r, out) of each targeted weight
forward            the model's own, run on the base with each linear weight wrapped in `Frozen`
backward           the model's own; a frozen layer forms dx (and its adapters' gradients), never dW
```

The optimizer, the gradient clipping and the checkpoints see the adapters alone: the base has no gradient,
no AdamW moments, and is never written again.
"""

import hashlib
import json

import numpy as np

from .config import ModelConfig
from .lora import TARGETS, Frozen, LoRAConfig
from .model import backward, check_targets, forward
from .nf4 import NF4Weight, dequantize, quantize
from .softmax import (cross_entropy_backward, cross_entropy_forward, cross_entropy_time_range_backward,
                      cross_entropy_time_range_forward)

QUANTIZE = ("none", "nf4")  # what the base's linear weights are stored in
LINEAR_WEIGHTS = frozenset(TARGETS.values())  # wq, wk, wv, wo, ff1_w, ff2_w, head_w


def is_linear_weight(name):
    """Whether a parameter is the weight of a linear layer (the ones LoRA adapts and NF4 stores)."""
    return name.rsplit(".", 1)[-1] in LINEAR_WEIGHTS


def quantize_base(params, block_size=64, block_size2=256):
    """The base with every linear layer's weight in NF4, its scales double-quantized (QLoRA's storage).

    Parameters
    ----------
    params : dict
        A trained model's parameters.
    block_size, block_size2 : int
        Weights per absmax scale, and scales per second-level scale.

    Returns
    -------
    dict
        The same keys: NF4Weight for the linear weights, the other arrays as they were.
    """
    return {name: quantize(p, block_size, block_size2=block_size2) if is_linear_weight(name) else p  # eq:qlora-base
            for name, p in params.items()}


def frozen_params(base, adapters, lora: LoRAConfig):
    """What the forward runs: each linear weight of the base wrapped in `Frozen`, with its adapters if any.

    Parameters
    ----------
    base : dict
        The frozen parameters (arrays, or NF4Weight for quantized weights).
    adapters : dict
        `<weight>.lora_a` and `<weight>.lora_b` of every targeted weight.
    lora : LoRAConfig
        Supplies the scale alpha / r.

    Returns
    -------
    dict
        The keys of base.
    """
    out = {}
    for name, p in base.items():
        if not is_linear_weight(name):
            out[name] = p
        elif f"{name}.lora_a" in adapters:
            out[name] = Frozen(p, adapters[f"{name}.lora_a"], adapters[f"{name}.lora_b"], lora.scale)
        else:
            out[name] = Frozen(p)
    return out


def adapter_loss_and_grads(base, adapters, ids, targets, cfg: ModelConfig, lora: LoRAConfig, learn_from=0):
    """The loss of the adapted model and its gradient with respect to the adapters alone.

    Parameters
    ----------
    base, adapters, lora
        See `frozen_params`.
    ids, targets : array_like of shape (B, T) or (T,)
        Token ids and the next token of each.
    cfg : ModelConfig
        The base model's configuration.
    learn_from : int
        Positions before it are context only: the loss is the mean over positions learn_from .. T - 1 of
        every window (`cross_entropy_time_range_forward`), and the others get a gradient of exactly zero.

    Returns
    -------
    loss : float
    grads : dict
        Keyed like adapters.
    """
    targets = check_targets(targets, ids, cfg)
    ids, targets = np.atleast_2d(ids), np.atleast_2d(targets)  # one window is a batch of one
    logits, cache = forward(frozen_params(base, adapters, lora), ids, cfg)
    if learn_from:
        T = logits.shape[1]
        loss, xent_cache = cross_entropy_time_range_forward(logits, targets, learn_from, T - learn_from)
        dlogits = cross_entropy_time_range_backward(1.0, xent_cache)
    else:
        loss, xent_cache = cross_entropy_forward(logits, targets)
        dlogits = cross_entropy_backward(1.0, xent_cache)
    grads = backward(dlogits, cache, embeddings=False)
    out = {}
    for name in adapters:
        if name.endswith(".lora_a"):
            weight = name[: -len(".lora_a")]
            out[name], out[f"{weight}.lora_b"] = grads[weight]
    return loss, out


def dense_base(base):
    """The base with NF4 weights decoded to float32 arrays (to merge adapters into, for sampling)."""
    return {name: dequantize(p) if isinstance(p, NF4Weight) else p for name, p in base.items()}


def params_sha256(params) -> str:
    """A hash of a model's parameters: names, dtypes, shapes and bytes, in order. An adapter file names its
    base by it, so an adapter is never applied to a base it was not trained on."""
    h = hashlib.sha256()
    for name, p in params.items():
        p = np.ascontiguousarray(p)
        h.update(json.dumps([name, p.dtype.str, list(p.shape)]).encode())
        h.update(p.tobytes())
    return h.hexdigest()


def weight_bytes(base) -> int:
    """Bytes the base's parameters occupy, NF4 weights at their packed size."""
    return sum(p.nbytes for p in base.values())
