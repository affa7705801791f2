"""The bytes that full fine-tuning, LoRA and QLoRA hold for a config, from its sizes alone: the formula the QLoRA
page sets beside the bytes of the real arrays (site_scripts/pages/_qlora_memory.py), and the GPT-2 page applies
to GPT-2 small. A module of its own, without the timed steps, so that a page that needs only the formula neither
reruns when those change nor counts as a page that times what it runs."""

import inspect
from dataclasses import dataclass

import numpy as np

from transformer.finetune import is_linear_weight, quantize_base
from transformer.lora import LoRAConfig, adapter_shapes
from transformer.model import param_count, param_shapes
from transformer.nf4 import payload_bytes

# The block sizes quantize_base stores the base with (its defaults).
BLOCK, BLOCK2 = (inspect.signature(quantize_base).parameters[name].default for name in ("block_size", "block_size2"))
METHODS = ("full", "LoRA", "QLoRA")
LORA = LoRAConfig()  # rank 8, alpha 16, q and v


@dataclass(frozen=True)
class Bytes:
    weights: int
    grads: int
    state: int

    @property
    def total(self):
        return self.weights + self.grads + self.state


def formula(cfg, method):
    """The same bytes from the sizes: float32 everywhere, NF4 weights at `nf4.payload_bytes`."""
    n_theta = param_count(cfg)
    n_a = sum(int(np.prod(s)) for s in adapter_shapes(param_shapes(cfg), LORA).values())
    if method == "full":
        return Bytes(4 * n_theta, 4 * n_theta, 8 * n_theta)
    if method == "LoRA":
        return Bytes(4 * n_theta + 4 * n_a, 4 * n_a, 8 * n_a)
    linear = [int(np.prod(s)) for name, s in param_shapes(cfg).items() if is_linear_weight(name)]
    return Bytes(4 * (n_theta - sum(linear)) + sum(payload_bytes(n) for n in linear) + 4 * n_a, 4 * n_a, 8 * n_a)
