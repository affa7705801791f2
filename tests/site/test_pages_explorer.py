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


def same_row(rows, cols):
    """The mask of a Jacobian between two (rows, cols) tensors whose entries depend on their own row alone."""
    return np.kron(np.eye(rows, dtype=bool), np.ones((cols, cols), dtype=bool))


def test_each_functions_backward_matches_central_differences_and_each_mutant_differs_where_predicted(run):
    """The pictures' own numbers: every function's two Jacobians agree to central differences' error; each
    mutant's difference from the true Jacobian is non-zero exactly where its mistake predicts, worked out here
    from the mistake, not from the picture: LayerNorm without its mean term is wrong in every entry of each
    position's block (the term -r γ_j / d reaches all of them); the softmax without its subtraction loses
    p_j p_j', which no entry escapes; GELU without its density term is wrong on the diagonal; attention without the
    1/sqrt(d_h) in dq is wrong where an output reads its own position's query, except at the first position,
    whose single weight is 1 whatever the query."""
    from site_scripts.pages import _jacobians as jac

    found, functions, mutants = jac.pictures(run)
    for name, (backward, central) in functions.items():
        assert np.abs(backward - central).max() <= 1e-6 * np.abs(backward).max(), name
    T, d = run.matrix("b0.ln1").shape
    rows_after_first = same_row(T, d) & (np.arange(T * d)[:, None] >= d)
    predicted = {"layernorm-dx-no-mean-term": same_row(T, d),
                 "softmax-grad-no-subtraction": np.ones((run.cfg.vocab_size,) * 2, dtype=bool),
                 "gelu-grad-no-density-term": np.eye(found["gelu"].x.size, dtype=bool),
                 "attention-grad-no-scale": rows_after_first}
    assert set(predicted) == set(mutants) and len(mutants) >= 3 and len(functions) >= 5
    for name, (broken, true) in mutants.items():
        changed = np.abs(broken - true) > 1e-12 * np.abs(true).max()
        assert np.array_equal(changed, predicted[name]), name


def test_a_mutant_whose_edit_no_longer_fits_its_function_stops_the_page(monkeypatch):
    from site_scripts.pages import _jacobians as jac
    from tools.mutant_catalogue import MUTANTS, Edit

    stale = [m if m.name != "softmax-grad-no-subtraction" else
             type(m)(m.name, m.breaks, (Edit(m.edits[0].path, m.edits[0].function, "no such text", "x"),))
             for m in MUTANTS]
    monkeypatch.setattr(jac, "MUTANTS", stale)
    with pytest.raises(RuntimeError, match="its edit no longer fits transformer/softmax.py:softmax_backward"):
        jac.mutated("softmax-grad-no-subtraction")


def test_in_each_step_the_flows_of_every_output_entry_add_up_to_the_gradient_it_sends_back(run):
    """What the explorer draws for an input in the backward (the step's dx) is the sum over output entries of the
    flows it lists (dy_o times J[o, i]); for an input no other step reads, that is its whole gradient."""
    readers = {name: sum(name in s.inputs for s in run.steps) for name in run.values}
    for step in run.steps:
        dy = np.ravel(run.grads[step.output])
        for k, jacobian in enumerate(step.jacobians):
            flows = dy @ jacobian
            dx = np.ravel(step.dx[k])
            assert np.abs(flows - dx).max() <= 1e-12 * max(np.abs(dx).max(), 1e-300), (step.id, k)
            if readers[step.inputs[k]] == 1:
                assert np.array_equal(dx, np.ravel(run.grads[step.inputs[k]])), (step.id, k)
