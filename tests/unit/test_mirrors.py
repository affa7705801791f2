"""The other writings of the model, listed in one place: each must use every parameter of the NumPy model.

The block is written more than once on purpose: the NumPy layers (the explained code), the torch mirror (the
cross-check against an independent framework) and the model composed from the autograd engine's operations.
A parameter that one of them never reads gets no gradient there; these tests fail on it, so a layer added to
the NumPy model (see the checklist "Adding a layer" on the "How the site is built" page) cannot be forgotten in
a mirror.
"""

import numpy as np
import pytest

from transformer import autograd, autograd_model
from transformer.config import PRESETS
from transformer.model import init_params, param_shapes


def torch_grads(params, ids, targets, cfg):
    """The parameters the torch mirror's loss reaches: those whose torch gradient exists."""
    torch = pytest.importorskip("torch")
    from transformer.torch_mirror import to_torch, torch_loss

    tparams = to_torch(params, dtype=torch.float64)
    torch_loss(tparams, ids, targets, cfg).backward()
    return {name for name, t in tparams.items() if t.grad is not None}


def autograd_grads(params, ids, targets, cfg):
    """The parameters the autograd engine's loss reaches: those whose leaf got a gradient on the tape."""
    leaves = autograd_model.as_leaves(params, cfg)
    autograd.backward(autograd_model.cross_entropy(autograd_model.forward(leaves, ids, cfg), targets))
    return {name for name, t in leaves.items() if t.grad is not None}


MIRRORS = {"torch (transformer/torch_mirror.py)": torch_grads,
           "autograd engine (transformer/autograd_model.py)": autograd_grads}


@pytest.mark.parametrize("mirror", MIRRORS)
@pytest.mark.parametrize("cfg", [PRESETS["tiny"], PRESETS["tiny"].with_(activation="gelu"), PRESETS["gpt2-tiny"]],
                         ids=["relu", "gelu", "gpt2"])
def test_every_mirror_reaches_every_parameter_of_the_numpy_model(mirror, cfg):
    rng = np.random.default_rng(5)
    ids, targets = rng.integers(0, cfg.vocab_size, (2, 3)), rng.integers(0, cfg.vocab_size, (2, 3))
    reached = MIRRORS[mirror](init_params(cfg, seed=5), ids, targets, cfg)
    missing = sorted(set(param_shapes(cfg)) - reached)
    assert not missing, f"{mirror} never uses {', '.join(missing)}"


@pytest.mark.parametrize("mirror", MIRRORS)
def test_a_mirror_that_ignores_a_parameter_is_found(mirror, monkeypatch):
    """Negative control: with the second LayerNorm's shift left out of the block, the check above must fail."""
    cfg = PRESETS["tiny"]
    if mirror.startswith("torch"):
        pytest.importorskip("torch")
        from transformer import torch_mirror

        block = torch_mirror.torch_block
        monkeypatch.setattr(torch_mirror, "torch_block",
                            lambda x, p, cfg, trace: block(x, {**p, "ln2_b": p["ln2_b"].detach()}, cfg, trace))
    else:
        block = autograd_model.block
        monkeypatch.setattr(autograd_model, "block", lambda x, p, cfg, fused=(): block(
            x, {**p, "ln2_b": autograd.Tensor(p["ln2_b"].data)}, cfg, fused))
    rng = np.random.default_rng(5)
    ids, targets = rng.integers(0, cfg.vocab_size, (2, 3)), rng.integers(0, cfg.vocab_size, (2, 3))
    reached = MIRRORS[mirror](init_params(cfg, seed=5), ids, targets, cfg)
    assert {f"b{l}.ln2_b" for l in range(cfg.num_layers)}.isdisjoint(reached)
