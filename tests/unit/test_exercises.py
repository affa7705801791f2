"""The exercises' grader (transformer/exercises/) and the command `exercise`: the reference passes every check,
a skeleton fails every one, and the command line refuses what it should with one line. Which check catches each
planted mistake is tests/site/test_exercise_mutants.py's (it needs the mutation catalogue, in tools/)."""

import ast
import importlib
import inspect

import pytest

from transformer.cli import main
from transformer.exercises import EXERCISES, grade, load, skeleton, solution


def graded(tmp_path, exercise, text):
    path = tmp_path / f"{exercise.name}.py"
    path.write_text(text)
    return grade(exercise, load(path, exercise))


@pytest.mark.parametrize("name", list(EXERCISES))
def test_the_reference_passes_every_check_and_a_skeleton_none(tmp_path, name):
    exercise = EXERCISES[name]
    results = graded(tmp_path, exercise, solution(exercise))
    assert results and [r for r in results if not r.passed] == []
    blank = graded(tmp_path, exercise, skeleton(exercise))
    assert all(not r.passed and "not written yet" in r.message and r.read for r in blank)


def test_there_are_at_least_ten_exercises_each_with_checks_of_its_own():
    assert len(EXERCISES) >= 10
    assert all(len(e.checks) >= 2 for e in EXERCISES.values())


@pytest.mark.parametrize("name", list(EXERCISES))
def test_a_skeleton_has_each_signature_docstring_and_equation_and_a_body_that_raises(name):
    exercise = EXERCISES[name]
    tree = ast.parse(skeleton(exercise))
    functions = {f.name: f for f in tree.body if isinstance(f, ast.FunctionDef)}
    assert list(functions) == [n for _, n in exercise.functions]
    for module, name in exercise.functions:
        f, reference = functions[name], getattr(importlib.import_module(f"transformer.{module}"), name)
        assert ast.get_docstring(f).startswith(inspect.getdoc(reference))
        assert f"Equations (on {exercise.page})" in ast.get_docstring(f)
        assert [a.arg for a in f.args.args] == list(inspect.signature(reference).parameters)
        assert isinstance(f.body[-1], ast.Raise) and f.body[-1].exc.func.id == "NotImplementedError"


def test_a_wrong_gradient_fails_central_differences_and_names_where_to_read(tmp_path):
    """A negative control written here, not taken from the catalogue: LayerNorm's dg doubled."""
    exercise = EXERCISES["layernorm"]
    text = solution(exercise).replace("dg = np.einsum(\"ni,ni->i\", dy2, xhat2)",
                                      "dg = 2 * np.einsum(\"ni,ni->i\", dy2, xhat2)")
    assert text != solution(exercise)
    failed = {r.property: r for r in graded(tmp_path, exercise, text) if not r.passed}
    assert {"central differences (layer_norm)", "the tiny example's numbers (layer_norm)"} <= set(failed)
    assert "gradient of g" in failed["central differences (layer_norm)"].message
    assert failed["central differences (layer_norm)"].read.startswith("model/layernorm.md#eq-")
    assert failed["the tiny example's numbers (layer_norm)"].read.startswith("model/layernorm.md#eq-ln-d")


def test_a_file_that_raises_is_a_failed_check_that_says_where(tmp_path):
    exercise = EXERCISES["relu"]
    text = solution(exercise).replace("y = np.maximum(x, 0)", "y = np.maximum(x, 0) + undefined_name")
    failed = [r for r in graded(tmp_path, exercise, text) if not r.passed]
    assert failed and all("NameError" in r.message and "line" in r.message for r in failed)


def run(capsys, *argv):
    code = main(["exercise", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_start_then_check_then_force(tmp_path, capsys):
    folder = tmp_path / "mine"
    code, out, _ = run(capsys, "start", "layernorm", "--dir", str(folder))
    assert code == 0 and (folder / "layernorm.py").read_text() == skeleton(EXERCISES["layernorm"])
    (folder / "layernorm.py").write_text("# my work\n")
    code, _, err = run(capsys, "start", "layernorm", "--dir", str(folder))
    assert code == 2 and err.count("\n") == 1 and "--force" in err
    assert (folder / "layernorm.py").read_text() == "# my work\n"
    assert run(capsys, "start", "layernorm", "--dir", str(folder), "--force")[0] == 0
    code, out, _ = run(capsys, "check", "layernorm", str(folder / "layernorm.py"))
    assert code == 1 and "FAIL  central differences (layer_norm)" in out and "read: docs/model/layernorm.md#eq-" in out
    (folder / "layernorm.py").write_text(solution(EXERCISES["layernorm"]))
    code, out, _ = run(capsys, "check", "layernorm", str(folder / "layernorm.py"))
    assert code == 0 and "FAIL" not in out and out.strip().endswith("layernorm done")


def test_an_unknown_name_or_a_missing_file_is_one_line(tmp_path, capsys):
    code, _, err = run(capsys, "check", "layer-norm")
    assert code == 2 and err.count("\n") == 1 and "no exercise 'layer-norm'" in err and "layernorm" in err
    code, _, err = run(capsys, "start", "nope", "--dir", str(tmp_path))
    assert code == 2 and err.count("\n") == 1 and not list(tmp_path.iterdir())
    code, _, err = run(capsys, "check", "relu", str(tmp_path / "absent.py"))
    assert code == 2 and err.count("\n") == 1 and "does not exist" in err


def test_a_file_that_does_not_parse_is_one_failed_line(tmp_path, capsys):
    path = tmp_path / "relu.py"
    path.write_text("def relu_forward(x:\n")
    code, out, err = run(capsys, "check", "relu", str(path))
    assert code == 1 and out.count("\n") == 1 and "SyntaxError" in out and "line 1" in out and not err


def test_help_lists_the_actions(capsys):
    with pytest.raises(SystemExit) as stop:
        main(["exercise", "--help"])
    assert stop.value.code == 0
    out = capsys.readouterr().out
    assert all(action in out for action in ("list", "start", "check"))


def test_without_torch_its_checks_are_skipped_and_said_so_not_passed(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(__import__("sys").modules, "torch", None)  # `import torch` raises ImportError
    path = tmp_path / "adamw.py"
    path.write_text(solution(EXERCISES["adamw"]))
    code, out, _ = run(capsys, "check", "adamw", str(path))
    assert code == 0 and "skip  PyTorch (torch.optim.AdamW): torch is not installed" in out
    assert "pass  PyTorch" not in out and out.strip().endswith("(1 skipped): adamw done")
