"""Cross-check of the memory policies: flash attention and activation checkpointing against PyTorch.

- "flash" rows: our model with `attention="flash"` against the torch mirror whose attention is
  `torch.nn.functional.scaled_dot_product_attention(is_causal=True)`; the logits, the loss and every
  gradient.
- "checkpointed" rows: our model with `checkpoint_blocks=True` against the torch mirror with each block
  wrapped in `torch.utils.checkpoint.checkpoint`, which also drops the block's activations and replays
  it in the backward; the logits, the loss and every gradient.
- "flash kernel" rows: our tiled core (`flash_core_forward` and `flash_core_backward`) against torch's
  own flash-attention kernel, selected with `torch.nn.attention.sdpa_kernel(SDPBackend.FLASH_ATTENTION)`:
  on the CPU in the device's dtype, and on CUDA in float16 (torch's CUDA flash kernel runs in half
  precision only), each with its tolerance. A device whose torch has no flash kernel for that dtype gets
  no such row, and the report says so in its device line.
"""

import numpy as np

from .crosscheck_rows import Tolerance, compare
from .flash_attention import flash_core_backward, flash_core_forward
from .model import forward, loss_and_grads

# Rounding of float16 inputs (unit round-off 4.9e-4) with float32 accumulation inside the kernel leaves
# relative gaps of a few 1e-3 in the output and the gradients; 3e-2 passes them and still fails a term
# dropped from the backward (a relative error of order 1).
HALF = Tolerance(3e-2, 1e-3, (
    "torch's CUDA flash kernel takes float16 inputs (unit round-off 4.9e-4) and accumulates in float32; "
    "against our float64 that leaves gaps of a few 1e-3, and 3e-2 still fails a dropped term by far"))
KERNEL_SHAPE = (2, 4, 37, 8)  # (B, H, T, dh): T = 37 is not a multiple of any tile
KERNEL_TILE = 8


def check_policies(device, torch_device, dtype, cfg, params, ids, targets):
    """The "flash" and "checkpointed" rows of one device."""
    import torch

    from .torch_mirror import to_torch, torch_loss

    rows = []
    for check, changes in (("flash", {"attention": "flash"}), ("checkpointed", {"checkpoint_blocks": True})):
        policy = cfg.with_(**changes)
        logits, _ = forward(params, ids, policy)
        loss, grads = loss_and_grads(params, ids, targets, policy)
        tparams = to_torch(params, torch_device, getattr(torch, dtype))
        trace = {}
        tloss = torch_loss(tparams, ids, targets, policy, trace)
        tloss.backward()
        compare(rows, device, dtype, check, "logits", logits, trace["logits"])
        compare(rows, device, dtype, check, "loss", loss, tloss)
        for name in params:
            compare(rows, device, dtype, check, name, grads[name], tparams[name].grad)
    return rows


def kernel_dtype(device, dtype):
    """The dtype torch's flash kernel is run in on this device: the device's own on the CPU, float16 on
    CUDA; None elsewhere."""
    return {"cpu": dtype, "cuda": "float16"}.get(device)


def check_flash_kernel(device, torch_device, dtype, seed=0):
    """The "flash kernel" rows: our tiled core against torch's flash kernel on the same q, k, v.

    Returns
    -------
    rows : list of Row
        out, dq, dk and dv; empty when torch offers no flash kernel here.
    note : str
        What ran, or why nothing did.
    """
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    kdtype = kernel_dtype(device, dtype)
    if kdtype is None:
        return [], f"no flash kernel of torch's on {device}"
    rng = np.random.default_rng(seed)
    q, k, v, dout = (rng.standard_normal(KERNEL_SHAPE) for _ in range(4))
    scale = 1.0 / np.sqrt(KERNEL_SHAPE[-1])
    out, row_max, row_sum = flash_core_forward(q * scale, k, v, KERNEL_TILE)
    dq_scaled, dk, dv = flash_core_backward(dout, q * scale, k, v, out, row_max, row_sum, KERNEL_TILE)
    tq, tk, tv = (torch.tensor(a, dtype=getattr(torch, kdtype), device=torch_device, requires_grad=True)
                  for a in (q, k, v))
    try:
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            tout = F.scaled_dot_product_attention(tq, tk, tv, is_causal=True)
            tout.backward(torch.tensor(dout, dtype=tout.dtype, device=torch_device))
    except RuntimeError as e:  # this torch build or device has no flash kernel for the dtype
        return [], f"torch's flash kernel did not run on {device} in {kdtype}: {str(e).splitlines()[0]}"
    tol = HALF if kdtype == "float16" else None
    rows = []
    for name, ours, theirs in (("out", out, tout), ("dq", dq_scaled * scale, tq.grad), ("dk", dk, tk.grad),
                               ("dv", dv, tv.grad)):
        compare(rows, device, kdtype, "flash kernel", name, ours, theirs, tol)
    return rows, f"torch's flash kernel in {kdtype} on (B, H, T, dh) = {KERNEL_SHAPE}, our tile {KERNEL_TILE}"
