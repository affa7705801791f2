"""The explorer's steps (site_scripts/pages/_explorer_steps.py): the model's own tensors, checked against its
traces so that a step wired wrong fails the build; Jacobians that central differences confirm; dependencies,
read from those Jacobians, that are the causal mask for attention, one row for LayerNorm and the linear layers,
one entry for the activation."""

import json

import numpy as np
import pytest

from site_scripts.pages import _explorer_steps as steps
from site_scripts.pages import explorer as page


@pytest.fixture(scope="module")
def run():
    return page.run(next(iter(page.SEQUENCES)), 0)


def central_jacobian(run, step, k, h=1e-6):
    """∂ output / ∂ input k of one step by central differences of its forward (the step's own function, run
    again on a moved copy of the input)."""
    inputs = [np.array(run.values[name], dtype=float) for name in step.inputs]
    forward = run.forwards[step.id]
    columns = []
    for i in range(inputs[k].size):
        moved = []
        for sign in (1, -1):
            shifted = [x.copy() for x in inputs]
            shifted[k].flat[i] += sign * h
            moved.append(np.ravel(forward(*shifted)[0]))
        columns.append((moved[0] - moved[1]) / (2 * h))
    return np.array(columns).T


def test_every_steps_jacobian_is_what_central_differences_give(run):
    for step in run.steps:
        for k, jacobian in enumerate(step.jacobians):
            numeric = central_jacobian(run, step, k)
            scale = max(np.abs(jacobian).max(), 1e-12)
            assert np.abs(jacobian - numeric).max() / scale < 1e-6, (step.id, k)


def test_dependencies_are_the_causal_mask_for_attention_and_a_row_or_an_entry_elsewhere(run):
    d = page.data(run)
    for step in d["steps"]:
        shape_in = [d["tensors"][name]["shape"] for name in step["inputs"]]
        rows_out, cols_out = d["tensors"][step["output"]]["shape"]
        for k, jacobian in enumerate(step["jacobians"]):
            cols_in = shape_in[k][1]
            for o, entries in enumerate(jacobian):
                t, c = divmod(o, cols_out)
                deps = {divmod(i, cols_in) for i, _ in entries}
                kind = step["id"].split(".")[-1]
                if kind == "attn":  # every entry of every row at or before t, none after
                    assert deps == {(t2, i) for t2 in range(t + 1) for i in range(cols_in)}, (step["id"], o)
                elif kind in ("ln1", "ln2", "lnf", "pre", "ffn", "logits"):
                    assert deps == {(t, i) for i in range(cols_in)}, (step["id"], o)
                elif kind in ("hidden", "mid", "out"):  # entry-wise: itself, or nothing where ReLU is off
                    assert deps <= {(t, c)} and (deps or kind == "hidden"), (step["id"], o)


def test_a_step_wired_wrong_or_a_backward_that_differs_fails_the_build(monkeypatch):
    real = steps.attention_forward
    monkeypatch.setattr(steps, "attention_forward", lambda u, p, h: (lambda y, c: (y * (1 + 1e-12), c))(*real(u, p, h)))
    with pytest.raises(RuntimeError, match="computes b0.ln2 otherwise than the model's forward"):
        page.run(next(iter(page.SEQUENCES)), 0)
    monkeypatch.undo()
    real_back = steps.layer_norm_backward
    monkeypatch.setattr(steps, "layer_norm_backward", lambda dy, c: (lambda dx, *g: (dx * (1 + 1e-12), *g))(
        *real_back(dy, c)))
    with pytest.raises(RuntimeError, match="differs from the model's backward"):
        page.run(next(iter(page.SEQUENCES)), 0)


def test_a_data_file_holds_the_runs_numbers_under_its_key(run):
    script = page.data_script("s0-seed0", page.data(run)).decode()
    prefix = '(window.explorerData = window.explorerData || {})["s0-seed0"] = '
    assert script.startswith(prefix) and script.endswith(";\n")
    value = json.loads(script[len(prefix):-2])
    assert value["tensors"]["b0.ln1"]["value"] == run.matrix("b0.ln1").ravel().tolist()
    assert value["tensors"]["embedding"]["grad"] == np.ravel(run.grads["embedding"]).tolist()
    assert [s["id"] for s in value["steps"]] == [s.id for s in run.steps] and len(value["steps"]) == 20
