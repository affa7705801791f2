"""Negative controls for the Bad inputs page: the checks that keep a wrong result off it
(tools/refusals.py) stop the build when a bad input is not refused properly."""

import ast
import re
from pathlib import Path

import numpy as np
import pytest

from site_scripts import depends
from tools import bad_input_cases
from site_scripts.pages.bad_inputs import checked_by, defined_tests
from tools.refusals import Case, check_command, check_files, check_raised, run_call, run_command
from transformer.errors import InputError

CASE = Case("negative-id", "A negative id", "forward(params, np.array([3, -1]), cfg)", "train --out run",
            names=("found -1",))


def test_an_accepted_library_call_stops_the_build(tmp_path):
    accepted = Case("valid", "Valid ids", "forward(params, ids, cfg)")
    with pytest.raises(RuntimeError, match="was accepted: it raised no error"):
        run_call(accepted, bad_input_cases.setup(), tmp_path)


def test_the_real_bad_call_passes_the_same_check(tmp_path):
    ran = run_call(CASE, bad_input_cases.setup(), tmp_path)
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
        run_command(Case("help", "", cli="gradcheck --help"), tmp_path)


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


def test_the_cache_key_follows_every_name_the_setup_imports():
    """The calls are text, evaluated after setup(): only setup()'s own imports put what they call into the key."""
    source = depends.Source(Path(bad_input_cases.__file__).read_text())
    imported = {(node.module.split(".")[1], alias.name) for node in ast.walk(source.nodes["setup"])
                if isinstance(node, ast.ImportFrom) for alias in node.names}
    assert {("model", "forward"), ("checkpoint", "load_checkpoint")} <= imported <= source.mentions("setup")


def test_the_setup_the_page_shows_is_the_setup_the_build_runs():
    text, ran, shown = bad_input_cases.setup_text(), bad_input_cases.setup(), {}
    exec(text, shown)  # noqa: S102 - what the page shows and python -O runs
    assert text.startswith("import numpy as np\n") and "return" not in text and '"""' not in text
    assert set(shown) - {"__builtins__"} == set(ran)
    np.testing.assert_array_equal(shown["params"]["tok_emb"], ran["params"]["tok_emb"])
    again = ran["init_params"](ran["cfg"], seed=bad_input_cases.SEED)  # the seed the page's provenance names
    np.testing.assert_array_equal(again["tok_emb"], ran["params"]["tok_emb"])


def test_tests_are_found_by_name_in_any_folder_and_a_missing_or_twice_defined_one_stops_the_build(tmp_path):
    (tmp_path / "tests" / "unit").mkdir(parents=True)
    two = "def test_once():\n    pass\n\n\ndef test_twice():\n    pass\n"
    (tmp_path / "tests" / "unit" / "test_a.py").write_text(two)
    (tmp_path / "tests" / "test_b.py").write_text("def test_twice():\n    pass\n")
    found = defined_tests(tmp_path)
    assert checked_by(Case("c", "", tests=("test_once",)), found) == ["tests/unit/test_a.py::test_once"]
    with pytest.raises(RuntimeError, match=r"test_twice, which is defined in \['tests/test_b.py', 'tests/unit/"):
        checked_by(Case("c", "", tests=("test_twice",)), found)
    with pytest.raises(RuntimeError, match="test_gone, which is defined in no file"):
        checked_by(Case("c", "", tests=("test_gone",)), found)


def test_every_case_names_tests_that_are_defined_once_under_tests():
    found = defined_tests()
    assert all(checked_by(case, found) for case in bad_input_cases.CASES)


def test_the_command_line_check_exits_1_when_a_bad_input_is_accepted(monkeypatch, capsys):
    """python -m tools.bad_input_cases is the page's check without the site: a case that is not refused fails it."""
    monkeypatch.setattr(bad_input_cases, "CASES", [Case("accepted", "", call="forward(params, ids, cfg)")])
    assert bad_input_cases.main([]) == 1
    assert capsys.readouterr().err.startswith("error: ")


# ---------------------------------------------------------------- the page's prose

PAGE = Path(__file__).resolve().parents[2] / "docs" / "verification" / "bad-inputs.md"


def test_the_page_has_a_section_for_every_case_in_the_catalogues_order_with_its_table():
    """The docs page holds each case's heading and sentence; its heading is the catalogue's title and anchor, and
    its table (one fragment per case) stands in its own section."""
    from site_scripts.pages.bad_inputs import fragment

    text = PAGE.read_text()
    headings = re.findall(r"^(?:    )?### (.+) \{#([\w-]+)\}$", text, flags=re.M)  # in the evidence block
    assert headings == [(case.title, case.slug) for case in bad_input_cases.CASES]
    sections = re.split(r"^(?:    )?### ", text, flags=re.M)[1:]
    for case, section in zip(bad_input_cases.CASES, sections):
        assert f'--8<-- "bad_inputs/{fragment(case)}.md"' in section, case.slug
    assert [g for g in re.findall(r"^(?:    )?## (.+)$", text, flags=re.M) if g in bad_input_cases.GROUPS] == \
        list(bad_input_cases.GROUPS)


def test_numpy_would_read_a_negative_id_as_the_last_row():
    """The page's sentence about id -1, read off the real table."""
    from site_scripts.pages.bad_inputs import negative_id

    namespace = bad_input_cases.setup()
    assert negative_id(namespace) == {"row": namespace["cfg"].vocab_size - 1, "same": "yes"}


def test_the_bad_inputs_prose_shows_no_typed_number():
    from site_scripts import prose

    assert prose.typed_numbers(PAGE.read_text()) == []
