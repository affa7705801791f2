"""The developer tools work: the scaled-backward mutation runner and the benchmark's models."""

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent


def load_tool(name):
    spec = importlib.util.spec_from_file_location(name, ROOT / "tools" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def test_every_backward_output_becomes_a_mutant_that_compiles():
    tool = load_tool("scale_backward_outputs")
    mutants = tool.find_mutants()
    names = {m.name for m in mutants}
    for expected in ["layer_norm_backward:dg", "linear_backward:db", "embedding_backward:dtok_emb",
                     "attention_backward:grads['wq']", "block_backward:grads['ff2_b']", "block_backward:dx"]:
        assert expected in names
    for m in mutants:
        source = (ROOT / m.path).read_text()
        mutated = m.apply(source)
        assert mutated != source and f"* {tool.FACTOR})" in mutated
        compile(mutated, m.path, "exec")


def test_the_mutation_runner_reports_a_caught_mutant():
    """Negative control of the runner itself: a 0.1% wrong linear db must fail the linear test."""
    tool = load_tool("scale_backward_outputs")
    mutant = next(m for m in tool.find_mutants() if m.name == "linear_backward:db")
    _, code, failed = tool.run_mutant(mutant, ["tests/test_layers.py", "-k", "linear"])
    assert code == 1 and any("linear" in f for f in failed)


def test_benchmark_torch_step_trains_the_same_model():
    """The benchmark's PyTorch step and the NumPy step give the same loss on the same batch."""
    torch = pytest.importorskip("torch")
    from transformer.config import PRESETS
    from transformer.model import init_params, loss_and_grads
    from transformer.torch_mirror import to_torch, torch_loss

    cfg = PRESETS["default"].with_(vocab_size=11)
    params = init_params(cfg, seed=0, dtype=np.float64)
    rng = np.random.default_rng(0)
    ids, targets = rng.integers(0, 11, (3, 8)), rng.integers(0, 11, (3, 8))
    ours, _ = loss_and_grads(params, ids, targets, cfg)
    theirs = torch_loss(to_torch(params, dtype=torch.float64), torch.as_tensor(ids), targets, cfg)
    np.testing.assert_allclose(theirs.item(), ours, rtol=1e-12)
