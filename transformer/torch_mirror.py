"""The same model written with PyTorch operations and PyTorch autograd.

It never calls our backward functions: gradients come from torch.autograd, so
agreement with the NumPy reference is evidence from an independent framework.
It runs on any torch device (cpu, cuda, mps, xla) in the dtype it is given.
torch is imported inside each function; the rest of the package never needs it.
"""

import math

import numpy as np

from .block import BLOCK_KEYS
from .model import check_ids


def to_torch(params, device="cpu", dtype=None, requires_grad=True):
    """numpy parameter dict -> dict of torch leaf tensors on `device`."""
    import torch

    out = {}
    for name, value in params.items():
        t = torch.tensor(np.asarray(value), dtype=dtype).to(device)
        out[name] = t.requires_grad_(requires_grad)
    return out


def torch_block(x, p, cfg, trace):
    """One pre-norm block, x (B, T, d) -> (B, T, d); p has the short key names.

    Records ln1, attention (probabilities; not with cfg.attention "flash"), ln2 and out in `trace`.
    """
    import torch
    import torch.nn.functional as F

    B, T, d = x.shape
    H, dh = cfg.num_heads, cfg.head_dim
    a = F.layer_norm(x, (d,), p["ln1_g"], p["ln1_b"], cfg.ln_eps)
    q = (a @ p["wq"] + p["bq"]).view(B, T, H, dh).transpose(1, 2)  # (B, H, T, dh)
    k = (a @ p["wk"] + p["bk"]).view(B, T, H, dh).transpose(1, 2)
    v = (a @ p["wv"] + p["bv"]).view(B, T, H, dh).transpose(1, 2)
    if cfg.attention == "flash":  # torch's fused attention; it forms no probabilities to trace
        heads = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, T, d)
    else:
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(dh)
        future = torch.ones(T, T, dtype=torch.bool, device=x.device).triu(1)
        att = torch.softmax(scores.masked_fill(future, float("-inf")), dim=-1)
        heads = (att @ v).transpose(1, 2).reshape(B, T, d)
        trace["attention"] = att
    h = x + heads @ p["wo"] + p["bo"]
    u = F.layer_norm(h, (d,), p["ln2_g"], p["ln2_b"], cfg.ln_eps)
    trace.update({"ln1": a, "ln2": u})
    u = u @ p["ff1_w"] + p["ff1_b"]
    if cfg.activation == "relu":
        u = F.relu(u)
    else:  # gelu's default is the exact erf form; "tanh" is GPT-2's approximation
        u = F.gelu(u, approximate="tanh" if cfg.activation == "gelu_tanh" else "none")
    y = h + u @ p["ff2_w"] + p["ff2_b"]
    trace["out"] = y
    return y


def torch_forward(tparams, ids, cfg, trace=None):
    """ids (T,) or (B, T) -> logits computed by torch, shaped like forward's.

    If `trace` is a dict it receives the same intermediates, under the same
    names, as transformer.model.forward's trace.
    """
    import torch
    import torch.nn.functional as F

    trace = {} if trace is None else trace
    single = np.ndim(ids) == 1
    ids2 = torch.as_tensor(check_ids(ids, cfg)).to(tparams["tok_emb"].device)
    T = ids2.shape[1]
    x = tparams["tok_emb"][ids2] + tparams["pos_emb"][:T]
    trace["embedding"] = x
    for layer in range(cfg.num_layers):
        p = {name: tparams[f"b{layer}.{name}"] for name in BLOCK_KEYS}
        block_trace = {}
        if cfg.checkpoint_blocks:  # torch's own activation checkpointing: drop, then replay in backward
            from torch.utils.checkpoint import checkpoint

            x = checkpoint(torch_block, x, p, cfg, block_trace, use_reentrant=False)
        else:
            x = torch_block(x, p, cfg, block_trace)
        trace.update({f"b{layer}.{name}": value for name, value in block_trace.items()})
    x = F.layer_norm(x, (cfg.emb_dim,), tparams["lnf_g"], tparams["lnf_b"], cfg.ln_eps)
    logits = x @ (tparams["tok_emb"].T if cfg.tied_head else tparams["head_w"])  # GPT-2's head is the token table
    if cfg.head_bias:
        logits = logits + tparams["head_b"]
    trace.update({"lnf": x, "logits": logits})
    return logits[0] if single else logits


def torch_loss(tparams, ids, targets, cfg, trace=None):
    """Mean cross-entropy over all positions, by torch."""
    import torch
    import torch.nn.functional as F

    logits = torch_forward(tparams, ids, cfg, trace)
    t = torch.as_tensor(np.asarray(targets)).reshape(-1).to(logits.device)
    return F.cross_entropy(logits.reshape(-1, cfg.vocab_size), t)
