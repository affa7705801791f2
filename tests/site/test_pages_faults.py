"""The fault page refuses to print a fault the program did not survive (its generator's guards), and its kill
moments are drawn where a run can resume from."""

import pytest

from site_scripts.pages import faults
from tools import fault_cases as fc


def ran(status, stderr="", stdout=""):
    return fc.Ran("python -m transformer train ...", status, stdout, stderr)


def kill_round(step, kept_step, loads=True):
    return fc.KillRound(step, "after-step", ran(-9), fc.Kept(kept_step, ["checkpoint.npz"], loads))


def test_the_kill_table_refuses_a_resume_that_differs_by_one_bit_or_a_kill_that_left_no_checkpoint():
    rounds = [kill_round(25, 20), kill_round(34, 30)]
    assert "**equal**" in faults.kill_md(rounds, ran(0), (True, 66), True)
    for bad in ((rounds, ran(0), (False, 66), True), (rounds, ran(0), (True, 66), False),
                ([kill_round(25, None, loads=False)], ran(0), (True, 66), True)):
        with pytest.raises(RuntimeError, match="fault page"):
            faults.kill_md(*bad)


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
