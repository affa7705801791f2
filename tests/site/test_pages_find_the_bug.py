"""The "Find the bug" page's puzzles, checked from outside the generator: each answer names the line the
mistake really changes (worked out here from the file's text with ast, not with the generator's diff), the line
it should be is the file's own, each puzzle shows a failing gradient check, and planting a mistake leaves the
package as it was."""

import ast
import dataclasses

import pytest

from site_scripts.pages import find_the_bug as ftb
from tools.common import ROOT
from tools.mutant_catalogue import MUTANTS
from transformer import activations, block, layernorm, model

BY_NAME = {m.name: m for m in MUTANTS}


@pytest.fixture(scope="module")
def puzzles():
    return {name: ftb.puzzle(name) for name in ftb.PUZZLES}


def changed_line(mutant):
    """(the file's number of the first line the mutant's edit changes, that line in the file, that line edited):
    the function found in the file's text with ast, the edit applied to its lines."""
    path, function = mutant.subject
    text = (ROOT / path).read_text()
    node = next(n for n in ast.parse(text).body if isinstance(n, ast.FunctionDef) and n.name == function)
    lines = text.splitlines()[node.lineno - 1:node.end_lineno]
    edited = "\n".join(lines)
    for e in mutant.edits:
        edited = edited.replace(e.old, e.new)
    edited = edited.splitlines()
    k = next(i for i, (a, b) in enumerate(zip(lines, edited)) if a != b)
    return node.lineno + k, lines[k], edited[k]


def answer_is_right(answer, mutant):
    """Whether an answer names the line the mutant changes, as the file has it and as the mutant makes it."""
    line, right, wrong = changed_line(mutant)
    in_file = (ROOT / answer.path).read_text().splitlines()[answer.line - 1]
    return (answer.path == mutant.subject[0] and answer.line == line and answer.right[0] == in_file == right
            and answer.wrong[0] == wrong)


def test_there_are_at_least_ten_puzzles_each_a_mistake_of_the_catalogue_the_check_can_see():
    assert len(ftb.PUZZLES) >= 10 and len(set(ftb.PUZZLES)) == len(ftb.PUZZLES)
    assert all(name in BY_NAME and not BY_NAME[name].uncatchable for name in ftb.PUZZLES)


@pytest.mark.parametrize("name", ftb.PUZZLES)
def test_the_answer_is_the_line_the_mistake_changes_and_the_files_own_line(puzzles, name):
    assert answer_is_right(puzzles[name].answer, BY_NAME[name])


@pytest.mark.parametrize("shift", [1, -1])
def test_an_answer_one_line_off_is_found_wrong(puzzles, shift):
    for name, p in puzzles.items():
        assert not answer_is_right(dataclasses.replace(p.answer, line=p.answer.line + shift), BY_NAME[name]), name


@pytest.mark.parametrize("name", ftb.PUZZLES)
def test_the_puzzle_shows_the_files_lines_with_only_the_answer_line_changed(puzzles, name):
    p = puzzles[name]
    shown = p.code.splitlines()
    in_file = (ROOT / p.answer.path).read_text().splitlines()[p.start - 1:p.start - 1 + len(shown)]
    differing = [p.start + i for i, (a, b) in enumerate(zip(shown, in_file)) if a != b]
    assert differing == [p.answer.line]


@pytest.mark.parametrize("name", ftb.PUZZLES)
def test_every_puzzle_has_failing_rows_and_its_markdown_shows_them_and_the_answer(puzzles, name):
    p = puzzles[name]
    failing = ftb.failing(p.report)
    assert failing
    text = ftb.puzzle_md(1, p)
    assert all(f"| `{k}` |" in text for k in failing)
    answer = text[text.index('??? success "Answer"'):]
    assert f'linenums="{p.answer.line}"' in answer and p.answer.right[0].strip() in answer
    assert BY_NAME[name].breaks in answer


def test_a_mistake_the_check_cannot_see_is_refused_as_a_puzzle():
    with pytest.raises(RuntimeError, match="passes with the mistake planted"):
        ftb.puzzle("attention-key-bias-grad-zeroed")  # its gradient is zero anyway: the check passes


def test_planting_reaches_every_reference_and_leaves_the_package_as_it_was():
    mutant = BY_NAME["relu-mask-reversed"]
    original = activations.relu_backward
    with ftb.planted(mutant):
        assert activations.relu_backward is not original
        assert activations.ACTIVATION_FUNCTIONS["relu"][1] is activations.relu_backward  # the pair in the table
    assert activations.relu_backward is original and activations.ACTIVATION_FUNCTIONS["relu"][1] is original
    mutant, original = BY_NAME["layernorm-dx-no-mean-term"], layernorm.layer_norm_backward
    with ftb.planted(mutant):  # each module's own name for it, the defining module's included
        assert block.layer_norm_backward is model.layer_norm_backward is layernorm.layer_norm_backward
        assert layernorm.layer_norm_backward is not original
    assert block.layer_norm_backward is model.layer_norm_backward is layernorm.layer_norm_backward is original


def test_the_page_has_every_puzzle_and_the_real_code_passes_its_check(puzzles):
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ftb, "puzzle", puzzles.__getitem__)
        made = ftb.generate({"repo_url": "https://example.invalid/repo"})
    values = made["values"]
    assert values["puzzles"] == len(ftb.PUZZLES) and values["clean_passed"] == values["gradients"]
    assert made["puzzles"].count('??? success "Answer"') == len(ftb.PUZZLES)
    assert values["pictured"] == made["puzzles"].count("(../model/explorer.md#mutants)") >= 1
