"""Cross-check of fine-tuning: LoRA on a dense base, QLoRA on an NF4 base, and the loss over part of a window.

- "lora" rows: our adapted model (`finetune.adapter_loss_and_grads`, every target adapted) against the
  torch mirror whose weights are `W + (alpha / r) A B`, with W a constant tensor and A, B torch leaf
  parameters; the logits, the loss and every adapter gradient, by torch autograd.
- "qlora" rows: the same with the base's linear weights in NF4 (our frozen layers decode them a block of
  rows at a time; torch gets the decoded weights as constants), learning from the middle of the window
  (`learn_from`): torch's loss is `F.cross_entropy` over those positions only.
- "time range" rows: `cross_entropy_time_range_forward` and its logit gradient against
  `F.cross_entropy` over the same slice of the window, by torch autograd (zero outside it).
"""

import numpy as np

from .crosscheck_rows import compare
from .finetune import adapter_loss_and_grads, dense_base, frozen_params, quantize_base
from .lora import LoRAConfig, init_adapters, present_targets
from .model import forward, param_shapes
from .softmax import cross_entropy_time_range_backward, cross_entropy_time_range_forward

def lora_config(cfg):
    """Rank 4 on every weight the model has (the head too, unless it is tied to the token table)."""
    return LoRAConfig(rank=4, alpha=8.0, targets=present_targets(param_shapes(cfg)))


def trained_adapters(cfg, seed):
    """Adapters as training leaves them (B no longer zero, or every B gradient would be compared at A's
    start only)."""
    rng = np.random.default_rng(seed + 17)
    shapes = init_adapters(param_shapes(cfg), lora_config(cfg))
    return {name: rng.standard_normal(a.shape) * 0.2 for name, a in shapes.items()}


def torch_adapted(base, adapters, torch_device, tdtype, scale):
    """The torch mirror's parameters: each adapted weight is W + s A B with A and B leaf tensors."""
    from .torch_mirror import to_torch

    tbase = to_torch(base, torch_device, tdtype, requires_grad=False)
    tadapters = to_torch(adapters, torch_device, tdtype)
    merged = dict(tbase)
    for name in adapters:
        if name.endswith(".lora_a"):
            weight = name[: -len(".lora_a")]
            merged[weight] = tbase[weight] + scale * (tadapters[name] @ tadapters[f"{weight}.lora_b"])
    return merged, tadapters


def check_finetune(device, torch_device, dtype, cfg, params, ids, targets, seed=0):
    """The "lora", "qlora" and "time range" rows of one device."""
    import torch
    import torch.nn.functional as F

    from .torch_mirror import torch_forward

    tdtype = getattr(torch, dtype)
    lora, adapters = lora_config(cfg), trained_adapters(cfg, seed)
    rows = []
    T = np.shape(ids)[-1]
    for check, base, learn_from in (("lora", params, 0), ("qlora", quantize_base(params), T // 2)):
        logits, _ = forward(frozen_params(base, adapters, lora), ids, cfg)
        loss, grads = adapter_loss_and_grads(base, adapters, ids, targets, cfg, lora, learn_from)
        merged, tadapters = torch_adapted(dense_base(base), adapters, torch_device, tdtype, lora.scale)
        tlogits = torch_forward(merged, ids, cfg)
        t = torch.as_tensor(np.asarray(targets)).to(tlogits.device)
        tloss = F.cross_entropy(tlogits[:, learn_from:].reshape(-1, cfg.vocab_size), t[:, learn_from:].reshape(-1))
        tloss.backward()
        compare(rows, device, dtype, check, "logits", logits, tlogits)
        compare(rows, device, dtype, check, "loss", loss, tloss)
        for name in adapters:
            compare(rows, device, dtype, check, name, grads[name], tadapters[name].grad)
    rng = np.random.default_rng(seed + 5)
    logits = rng.standard_normal((*np.shape(ids), cfg.vocab_size))
    offset, count = 3, T - 7
    loss, cache = cross_entropy_time_range_forward(logits, np.asarray(targets), offset, count)
    tlogits = torch.tensor(logits, dtype=tdtype, device=torch_device, requires_grad=True)
    t = torch.as_tensor(np.asarray(targets)).to(tlogits.device)
    tloss = F.cross_entropy(tlogits[:, offset:offset + count].reshape(-1, cfg.vocab_size),
                            t[:, offset:offset + count].reshape(-1))
    tloss.backward()
    compare(rows, device, dtype, "time range", "loss", loss, tloss)
    compare(rows, device, dtype, "time range", "dlogits", cross_entropy_time_range_backward(1.0, cache), tlogits.grad)
    return rows
