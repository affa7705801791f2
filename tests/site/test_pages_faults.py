"""The fault page refuses to print a fault the program did not survive (its generator's guards), its kill
moments are drawn where a run can resume from, and its injector reaches the program through the training
loop's hooks only, striking at the moments it names."""

import ast
import io
import os
import signal
import zipfile

import numpy as np
import pytest

from site_scripts.common import ROOT
from site_scripts.pages import faults
from tools import fault_cases as fc
from tools import fault_inject
from transformer.checkpoint import write_npz
from transformer.run_folder import METRICS_NAME, read_metrics


def ran(status, stderr="", stdout=""):
    return fc.Ran("python -m transformer train ...", status, stdout, stderr)


def kill_round(step, kept_step, loads=True):
    return fc.KillRound(step, "after-step", ran(-9), fc.Kept(kept_step, ["checkpoint.npz"], loads))


FINAL = fc.Kept(40, ["checkpoint.npz", "metrics.jsonl", "run.lock"], True)


def test_the_kill_table_refuses_a_resume_that_differs_by_one_bit_a_kill_that_left_no_checkpoint_or_a_torn_file():
    rounds = [kill_round(25, 20), kill_round(34, 30)]
    table, values = faults.kill_part(rounds, ran(0), (True, 66), True, FINAL)
    assert "| step 20 |" in table and values["redone"] == 5 + 4 and values["arrays"] == 66
    torn = fc.Kept(40, ["checkpoint.npz", "checkpoint.npz.*.tmp"], True)
    for bad in ((rounds, ran(0), (False, 66), True, FINAL), (rounds, ran(0), (True, 66), False, FINAL),
                ([kill_round(25, None, loads=False)], ran(0), (True, 66), True, FINAL),
                (rounds, ran(0), (True, 66), True, torn)):
        with pytest.raises(RuntimeError, match="fault page"):
            faults.kill_part(*bad)


def test_the_lock_table_refuses_a_refusal_that_does_not_name_the_live_run():
    case = fc.LockCase(ran(0), ran(2, "error: shared is in use by another run (process P); ..."), True, True)
    assert "process P" in faults.lock_md(case)
    for changes in ({"pid_named": False}, {"one_run": False}):
        with pytest.raises(RuntimeError, match="fault page"):
            faults.lock_md(fc.LockCase(**{**case.__dict__, **changes}))


def test_the_kill_moments_are_distinct_steps_after_the_first_checkpoint_and_include_a_torn_save():
    moments = fc.kill_moments()
    steps = [s for s, _ in moments]
    assert len(moments) == fc.KILLS and steps == sorted(set(steps)) and min(steps) > fc.CKPT_EVERY
    assert any(m in ("mid-save", "validation") for _, m in moments)


def overflow_row(dtype, norm):
    return fc.OverflowRow(dtype, fc.OVERFLOW_FACTORS[dtype], ran(0), norm, True, True)


def test_the_overflow_table_refuses_a_row_whose_squares_would_not_have_overflowed():
    """float32's squares overflow past sqrt(3.4e38) = 1.8e19: a norm of 1.3e19 (the factor 1e19 the page once
    used) demonstrates nothing, 1.3e21 does; float64's limit is 1.3e154."""
    assert "1.3000e+21" in faults.overflow_md([overflow_row("float32", 1.3e21), overflow_row("float64", 1.3e200)])
    for dtype, norm in (("float32", 1.3e19), ("float64", 1.3e150)):
        with pytest.raises(RuntimeError, match="do not overflow"):
            faults.overflow_md([overflow_row(dtype, norm)])


def test_the_worked_global_norm_is_global_norms_and_its_plain_square_overflows():
    """The page's float32 example: the largest entry's square is past float32's range, s = 2^k lies at or below
    the largest entry and above half of it, and s times the root of the scaled squares is the norm."""
    _, values = faults.squares()
    w = values["worked"]
    assert w["square"] > w["max"] and 2.0 ** w["k"] <= w["largest"] < 2.0 ** (w["k"] + 1)
    assert 2.0 ** w["k"] * w["root"] == w["norm"] and w["root"] == pytest.approx(np.sqrt(w["total"]))


def test_the_faults_prose_shows_no_typed_number():
    from site_scripts import prose

    assert prose.typed_numbers((ROOT / "docs" / "verification" / "faults.md").read_text()) == []


# ---------------------------------------------------------------- tools/fault_inject.py: the loop's hooks, and only them

def patches(source):
    """Where a module's source changes something it imported instead of handing it an argument: an assignment to
    an attribute (or a `setattr`) of an imported name, or of a name taken from one (`real = module.f`)."""
    tree = ast.parse(source)
    imported = {(a.asname or a.name).split(".")[0] for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))
                for a in n.names}

    def root(node):
        while isinstance(node, (ast.Attribute, ast.Subscript, ast.Call)):
            node = node.func if isinstance(node, ast.Call) else node.value
        return node.id if isinstance(node, ast.Name) else None

    assigns = [(n, t) for n in ast.walk(tree) if isinstance(n, (ast.Assign, ast.AugAssign, ast.AnnAssign))
               for t in (n.targets if isinstance(n, ast.Assign) else [n.target])]
    imported |= {t.id for n, t in assigns if isinstance(t, ast.Name) and n.value is not None and root(n.value) in imported}
    found = [f"line {n.lineno}: {ast.unparse(t)} = ..." for n, t in assigns
             if isinstance(t, ast.Attribute) and root(t) in imported]
    found += [f"line {n.lineno}: {ast.unparse(n)}" for n in ast.walk(tree) if isinstance(n, ast.Call)
              and isinstance(n.func, ast.Name) and n.func.id in ("setattr", "delattr") and n.args
              and root(n.args[0]) in imported]
    return found


def test_the_fault_injector_changes_no_module_or_class_it_imports():
    """It reaches the loop through `Hooks` only: a renamed function cannot silently leave a patch behind."""
    assert patches((ROOT / "tools" / "fault_inject.py").read_text()) == []
    monkeypatched = ("import numpy as np\nimport transformer.train as train_module\n"
                     "real = train_module.Session.save\n"
                     "def f():\n    train_module.Session.save = real\n    np.savez = None\n"
                     "    setattr(train_module, 'train_step', None)\n    real.__doc__ = ''\n")
    assert patches(monkeypatched) == ["line 5: train_module.Session.save = ...", "line 6: np.savez = ...",
                                      "line 8: real.__doc__ = ...", "line 7: setattr(train_module, 'train_step', None)"]


def test_the_fault_hooks_poison_then_scale_the_chosen_batch_and_write_other_saves_whole():
    hooks = fault_inject.fault_hooks([(6, "mid-save")], [(2, "nan")], [(2, "4")])
    assert hooks.step_taken is None and hooks.validating is None  # no kill at those moments
    grads = [hooks.gradients({"b0.wq": np.ones((2, 2)), "head_b": np.ones(3)}) for _ in range(3)]
    assert [np.isnan(g["b0.wq"]).sum() for g in grads] == [0, 1, 0]
    assert grads[1]["b0.wq"].flat[1] == 4 and grads[1]["head_b"].tolist() == [4, 4, 4] and grads[2]["head_b"][0] == 1
    arrays = {"a": np.arange(5.0)}
    whole, written = io.BytesIO(), io.BytesIO()
    write_npz(whole, arrays)
    hooks.write_checkpoint(4, written, arrays)  # the save of another step than the torn one
    assert written.getvalue() == whole.getvalue()


SMALL_RUN = ["train", "--corpus", "corpus.txt", "--out", "run", *fc.SMALL, "--steps", "4", "--ckpt-every", "2",
             "--eval-every", "2", "--warmup", "1", "--no-progress"]


@pytest.mark.skipif(os.name != "posix", reason="sends SIGKILL")
@pytest.mark.parametrize("moment", fault_inject.MOMENTS)
def test_each_kill_moment_strikes_where_the_page_says(tmp_path, moment):
    """Killed at step 2: after the step, its metrics line is not written; during the validation, neither (the
    lines of a step are flushed together, after its validation); halfway through the save, the step's lines
    are on disk, and so is half of the checkpoint, in its temporary file only."""
    fc.write_corpus(tmp_path)
    ran = fc.run(tmp_path, SMALL_RUN, ["--kill", f"2:{moment}"])
    assert ran.status == -signal.SIGKILL, ran.stderr
    records = read_metrics(tmp_path / "run" / METRICS_NAME)
    files = sorted(p.name for p in (tmp_path / "run").iterdir())
    if moment == "mid-save":
        assert [r["step"] for r in records] == [1, 2, 2] and "val_loss" in records[-1]
        torn = next((tmp_path / "run").glob("checkpoint.npz.*.tmp"))
        assert "checkpoint.npz" not in files and torn.stat().st_size > 0 and not zipfile.is_zipfile(torn)
    else:
        assert [r["step"] for r in records] == [1] and files == ["metrics.jsonl", "run.lock"]
