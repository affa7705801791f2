"""transformers' GPT-2 as a third implementation in the cross-check, beside the torch mirror and the autograd engine.

The mirror (transformer/torch_mirror.py) and the engine were both written here, so a misreading of the model
that they share would pass between them. `transformers`' GPT2LMHeadModel was not: when the cross-check runs in
GPT-2's layout (tanh GELU, head tied to the token table, no head bias), the same parameters are copied into
one (`gpt2.to_hf`: q, k and v joined into c_attn) and its logits, loss and every gradient are compared with
the NumPy reference on each device ("transformers" rows). In another layout the comparison is skipped and the
report says why.
"""

from .config import GPT2_LAYOUT, ModelConfig
from .crosscheck_rows import compare
from .gpt2 import config_to_hf, from_hf, to_hf
from .model import forward, loss_and_grads


def transformers_status(cfg: ModelConfig):
    """(compared, why): whether transformers' GPT-2 can run this config, and the reason shown in the report."""
    different = [f"{k}={getattr(cfg, k)!r}" for k, want in GPT2_LAYOUT.items() if getattr(cfg, k) != want]
    if different:
        return False, f"not compared: GPT-2's layout needs {', '.join(f'{k}={v!r}' for k, v in GPT2_LAYOUT.items())}" \
                      f" (this run has {', '.join(different)})"
    try:
        import transformers
    except ImportError:
        return False, "not compared: transformers is not installed (pip install -e '.[test]')"
    return True, f"transformers {transformers.__version__} GPT2LMHeadModel"


def hf_model(params, cfg: ModelConfig, torch_device, tdtype):
    """A GPT2LMHeadModel holding `params`, in eval mode (no dropout), on torch_device in tdtype."""
    import torch
    import transformers

    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(**config_to_hf(cfg)))
    model = model.to(device=torch_device, dtype=tdtype).eval()
    state = to_hf(params, cfg, prefix="transformer.")
    own = dict(model.named_parameters())  # the tied lm_head.weight is wte's parameter, listed once
    if set(own) != set(state):
        raise ValueError(f"transformers' GPT-2 holds {sorted(set(own) ^ set(state))} beyond or short of ours")
    with torch.no_grad():
        for name, p in own.items():
            p.copy_(torch.as_tensor(state[name], device=torch_device, dtype=tdtype))
    return model


def check_transformers(device, torch_device, dtype, cfg, params, ids, targets):
    """The NumPy reference against transformers' GPT-2 on one device: logits, loss and every gradient.

    Parameters
    ----------
    device : str
        The device name.
    torch_device : torch.device
        Where torch computes.
    dtype : str
        The torch dtype name; it selects the tolerance.
    cfg : ModelConfig
        The model configuration, in GPT-2's layout (else no rows).
    params : dict
        Parameter name to float64 array.
    ids, targets : ndarray of shape (B, T)
        Token ids and target ids.

    Returns
    -------
    list of Row
        Rows of check "transformers" (logits and loss) and "transformers gradient" (one per parameter).
    """
    import torch
    import torch.nn.functional as F

    if not transformers_status(cfg)[0]:
        return []
    model = hf_model(params, cfg, torch_device, getattr(torch, dtype))
    logits = model(torch.as_tensor(ids, device=torch_device)).logits
    loss = F.cross_entropy(logits.reshape(-1, cfg.vocab_size), torch.as_tensor(targets, device=torch_device).reshape(-1))
    loss.backward()
    theirs = from_hf({name: p.grad.detach().cpu().double().numpy() for name, p in model.named_parameters()}, cfg)
    our_loss, grads = loss_and_grads(params, ids, targets, cfg)
    rows = []
    compare(rows, device, dtype, "transformers", "logits", forward(params, ids, cfg)[0], logits)
    compare(rows, device, dtype, "transformers", "loss", our_loss, loss)
    for name in params:
        compare(rows, device, dtype, "transformers gradient", name, grads[name], theirs[name])
    return rows
