"""Negative controls for the Bad inputs page: the checks that keep a wrong result off it
(site_scripts/refusals.py) stop the build when a bad input is not refused properly."""

import pytest

from site_scripts import bad_input_cases
from site_scripts.refusals import Case, check_command, check_files, check_raised, run_call, run_command
from transformer.errors import InputError

CASE = Case("negative-id", "A negative id", "", "forward(params, np.array([3, -1]), cfg)",
            ("train", "--out", "run"), names=("found -1",))


def test_an_accepted_library_call_stops_the_build(tmp_path):
    accepted = Case("valid", "Valid ids", "", "forward(params, ids, cfg)")
    with pytest.raises(RuntimeError, match="was accepted: it raised no error"):
        run_call(accepted, bad_input_cases.setup_namespace(), tmp_path)


def test_the_real_bad_call_passes_the_same_check(tmp_path):
    ran = run_call(CASE, bad_input_cases.setup_namespace(), tmp_path)
    assert ran.raised == "InputError" and "found -1" in ran.message


@pytest.mark.parametrize("error", [ValueError("a plain ValueError"), KeyError("head_w"), IndexError("index 5")])
def test_an_error_that_is_not_a_transformer_error_stops_the_build(error):
    with pytest.raises(RuntimeError, match="must raise a TransformerError"):
        check_raised(CASE, error)


def test_a_message_that_does_not_name_the_problem_stops_the_build():
    with pytest.raises(RuntimeError, match=r"does not mention \['found -1'\]"):
        check_raised(CASE, InputError("ids must lie in [0, 5), found 5"))
    check_raised(CASE, InputError("ids must lie in [0, 5), found -1"))  # the right one passes


@pytest.mark.parametrize("status, stdout, stderr, message", [
    (0, "done", "", "exited with status 0"),
    (2, "", "Traceback (most recent call last):\n  ...\nValueError: x\n", "printed a traceback"),
    (1, "", "error: found -1\n", "exited with status 1, not 2"),
    (2, "", "warning: something\nerror: found -1\n", "one line"),
    (2, "some output\n", "error: found -1\n", "nothing on stdout"),
    (2, "", "found -1\n", "one line `error: ...`"),
    (2, "", "error: something else\n", "does not mention"),
])
def test_a_command_not_refused_properly_stops_the_build(status, stdout, stderr, message):
    with pytest.raises(RuntimeError, match=message):
        check_command(CASE, status, stdout, stderr)
    check_command(CASE, 2, "", "error: ids must lie in [0, 5), found -1\n")  # a proper refusal passes


def test_a_real_command_that_exits_0_stops_the_build(tmp_path):
    with pytest.raises(RuntimeError, match="exited with status 0: the bad input was accepted"):
        run_command(Case("help", "", "", argv=("gradcheck", "--help")), tmp_path)


BEFORE = {"run/checkpoint.npz": "a", "corpus.txt": "c"}  # path: sha256


@pytest.mark.parametrize("after, message", [
    ({**BEFORE, "run/checkpoint.npz": "changed"}, r"changed \['run/checkpoint.npz'\]"),
    ({"corpus.txt": "c"}, r"removed \['run/checkpoint.npz'\]"),
    ({**BEFORE, "new/checkpoint.npz": "x"}, r"left behind \['new/checkpoint.npz'\]"),
    ({**BEFORE, "run/checkpoint.npz.x1.tmp": "x"}, r"left behind \['run/checkpoint.npz.x1.tmp'\]"),
])
def test_a_lost_file_or_a_checkpoint_left_behind_stops_the_build(after, message):
    with pytest.raises(RuntimeError, match=message):
        check_files("a command", BEFORE, after)
    kept, created = check_files("a command", BEFORE, {**BEFORE, "new/metrics.jsonl": "m"})
    assert kept == ["run/checkpoint.npz", "corpus.txt"] and created == ["new/metrics.jsonl"]


def test_the_setup_the_page_shows_imports_what_its_cache_key_follows(monkeypatch):
    bad_input_cases.setup_namespace()
    monkeypatch.delitem(bad_input_cases.KEYED, "forward")
    with pytest.raises(RuntimeError, match="SETUP and KEYED must name the same transformer objects"):
        bad_input_cases.setup_namespace()
