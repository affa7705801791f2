"""Which functions a check's command calls (tools/reached.py), and the mutation run taking the unchanged code's
result where a mutant changes only functions that command never called (tools/mutants.py)."""

import inspect
import textwrap

import pytest

from site_scripts.common import ROOT
from tools import mutants
from tools.preloaded import Launcher, available
from tools.project_copy import project_copy
from tools.reached import enclosing_function, merged, read_record, unreached

needs_fork = pytest.mark.skipif(not available(), reason="a launcher forks, and this system cannot")

SOURCE = textwrap.dedent('''\
    import functools

    LIMIT = 3


    @functools.lru_cache(maxsize=None)
    def cached(x):
        return x + 1


    def outer(x):
        def inner(y):
            return y * 2
        return inner(x) + LIMIT


    def signature(x, eps=1e-5):
        return x + eps


    class Pool:
        size = 4

        def take(self):
            return self.size
    ''')
PATH = "transformer/example.py"


def span(text, occurrence=0):
    """(PATH, SOURCE, first line, last line) of an edit of `text` in SOURCE."""
    at = -1
    for _ in range(occurrence + 1):
        at = SOURCE.index(text, at + 1)
    first = SOURCE.count("\n", 0, at) + 1
    return PATH, SOURCE, first, first + text.count("\n")


def test_an_edit_belongs_to_the_innermost_function_whose_body_holds_it():
    import ast

    tree = ast.parse(SOURCE)
    assert enclosing_function(tree, *span("return x + 1")[2:]) == ("cached", 6)  # numbered from its decorator
    assert enclosing_function(tree, *span("return y * 2")[2:]) == ("inner", 12)
    assert enclosing_function(tree, *span("return inner(x)")[2:]) == ("outer", 11)
    assert enclosing_function(tree, *span("return self.size")[2:]) == ("take", 24)
    # A nested def's own line, or lines of both the inner and the outer body, belong to the outer function.
    assert enclosing_function(tree, *span("def inner")[2:]) == ("outer", 11)
    assert enclosing_function(tree, *span("return y * 2\n    return")[2:]) == ("outer", 11)
    for outside in ("LIMIT = 3", "@functools", "eps=1e-5", "size = 4", "return x + 1\n\n\ndef outer"):
        assert enclosing_function(tree, *span(outside)[2:]) is None, outside


def test_a_mutant_takes_the_unchanged_result_only_when_every_edit_is_in_a_function_never_called():
    called = {(PATH, "outer", 11), (PATH, "take", 24)}
    assert unreached([span("return x + 1")], called) == f"{PATH}:cached"
    assert unreached([span("return y * 2")], called) == f"{PATH}:inner"  # its outer function ran, it did not
    assert unreached([span("return x + 1"), span("return x + eps")], called) == f"{PATH}:cached, {PATH}:signature"
    # Negative controls: each of these may run, so the check must run.
    assert unreached([span("return inner(x)")], called) is None  # called
    assert unreached([span("return x + 1"), span("return self.size")], called) is None  # one edit is called
    assert unreached([span("LIMIT = 3")], called) is None  # module level: runs at import
    assert unreached([span("eps=1e-5")], called) is None  # a default: evaluated where the function is defined
    assert unreached([span("maxsize=None")], called) is None  # a decorator, the same
    assert unreached([span("size = 4")], called) is None  # a class body runs at import
    assert unreached([("tests/unit/test_x.py", SOURCE, 8, 8)], called) is None  # not the package
    assert unreached([span("return x + 1")], None) is None  # no usable record
    assert unreached([], called) is None


def test_checks_that_record_nothing_say_nothing_of_what_they_call():
    """The unit tests run no recorded command: an empty list of records is no record at all, not a record of
    no calls (which would let every mutant take the unchanged code's result; it did, once, in a trial run)."""
    assert merged([]) is None
    assert merged([{(PATH, "a", 1)}, None]) is None
    assert merged([{(PATH, "a", 1)}, {(PATH, "b", 2)}]) == {(PATH, "a", 1), (PATH, "b", 2)}


PROBE = '''import subprocess, sys
from transformer import model, nf4
if sys.argv[1] == "spawn":
    subprocess.run(["true"])
if sys.argv[1] == "untrace":
    sys.settrace(None)
from transformer.config import PRESETS
model.param_count(PRESETS["A"])
'''


@needs_fork
def test_a_recorded_command_names_what_it_called_and_a_record_that_cannot_be_trusted_is_refused(tmp_path):
    from transformer import model, nf4

    with Launcher(threads=1) as launcher, \
            project_copy(lambda c: (c / "transformer" / "probe.py").write_text(PROBE), prefix="reached-") as copy:
        records = {}
        for how in ("plain", "spawn", "untrace"):
            result = launcher.run(copy, "transformer.probe", [how], timeout=60, record=tmp_path / f"{how}.json")
            assert result.returncode == 0, result.stderr
            records[how] = read_record(tmp_path / f"{how}.json")
        missing = read_record(tmp_path / "never-written.json")
    param_count = ("transformer/model.py", "param_count", inspect.getsourcelines(model.param_count)[1])
    quantize = ("transformer/nf4.py", "quantize", inspect.getsourcelines(nf4.quantize)[1])
    assert param_count in records["plain"] and quantize not in records["plain"]
    assert ("transformer/probe.py", "<module>", 1) in records["plain"]
    assert all(path.startswith("transformer/") for path, _, _ in records["plain"])
    # Negative controls: a process started (its calls are not seen), the trace taken away, no record at all.
    assert records["spawn"] is None and records["untrace"] is None and missing is None


@needs_fork
def test_the_run_takes_the_unchanged_result_where_the_command_never_calls_the_mutant_and_it_is_the_same(
        monkeypatch):
    """Finite differences never call nf4.pack, so the nf4 mutant takes the unchanged code's result; run on the
    mutant anyway, the check says the same. A LayerNorm mutant is called, so it runs, and is caught."""
    pytest.importorskip("torch")
    by_name = {m.name: m for m in mutants.MUTANTS}
    monkeypatch.setattr(mutants, "CHECKS", tuple(c for c in mutants.CHECKS if c.name == "gradcheck"))
    monkeypatch.setattr(mutants, "ensure_corpus", lambda: None)  # no training check: no corpus needed
    monkeypatch.setattr(mutants, "bigram_loss", lambda: 0.0)
    report = mutants.run_all([by_name["nf4-nibble-order-swapped"], by_name["layernorm-dg-without-xhat"]], jobs=1,
                             log=lambda line: None)  # one job: the unchanged code's results are in first
    nf4_result, ln_result = (r["results"]["gradcheck"] for r in report["mutants"])
    assert nf4_result["never_called"] == "transformer/nf4.py:pack" and nf4_result["seconds"] == 0.0
    assert nf4_result["detail"] == report["baseline"]["gradcheck"]["detail"] and not nf4_result["caught"]
    assert "never_called" not in ln_result and ln_result["caught"]
    with mutants.mutant_copy(by_name["nf4-nibble-order-swapped"]) as copy:
        assert mutants.check_gradcheck(copy, {}) == (False, nf4_result["detail"])


def test_the_catalogues_edits_are_placed_in_the_unchanged_source():
    """edit_spans finds each edit where the working tree has it (tools/reached.py matches functions by line)."""
    for m in mutants.MUTANTS:
        spans = mutants.edit_spans(m)
        assert spans is not None, m.name
        for (path, source, first, last), e in zip(spans, m.edits, strict=True):
            assert source == (ROOT / path).read_text()
            assert e.old in "\n".join(source.splitlines()[first - 1:last]), (m.name, first, last)


def test_the_page_marks_each_result_taken_from_the_unchanged_code_and_counts_them():
    from site_scripts.pages import mutants as page

    base = {c.name: {"caught": False, "detail": f"{c.name} passed", "seconds": 10.0} for c in mutants.CHECKS}
    ran = {**base, "tests": {"caught": True, "detail": "first failure: t", "seconds": 2.0}}
    taken = {**ran, "training": {**base["training"], "seconds": 0.0, "never_called": "transformer/nf4.py:pack"}}
    by_name = {m.name: m for m in mutants.MUTANTS}
    records = [mutants.mutant_record(by_name["nf4-nibble-order-swapped"], taken),
               mutants.mutant_record(by_name["layernorm-dg-without-xhat"], ran)]
    report = {"mutants": records, "checks": [c.__dict__ for c in mutants.CHECKS], "baseline": base, "seconds": 1,
              "jobs": 1, "training_args": mutants.TRAINING, "bigram_loss": 2.5}
    details = page.details_md(report, "https://x")
    marked = [line for line in details.splitlines() if "the unchanged code's result" in line]
    assert marked == ["- Training run: missed. training passed (the unchanged code's result: its run of this check "
                      "never called `pack` in `transformer/nf4.py`, which holds every edit of this mutant, so it "
                      "was not run again)"]
    assert f"Of the {2 * len(mutants.CHECKS)} checks of mutants, 1 took the unchanged code's result" in \
        page.run_md(report, 81)
    assert "about 10 s of checks" in page.run_md(report, 81)


@needs_fork
def test_a_mutant_that_comes_before_the_unchanged_result_runs_the_check(monkeypatch):
    """The first mutants of a run do not wait for the unchanged code's record: they run the check."""
    from concurrent.futures import Future

    from tools.preloaded import launchers

    by_name = {m.name: m for m in mutants.MUTANTS}
    monkeypatch.setattr(mutants, "CHECKS", tuple(c for c in mutants.CHECKS if c.name == "gradcheck"))
    pending = {"gradcheck": Future()}
    with launchers(1) as waiting:
        results = mutants.run_one(by_name["nf4-nibble-order-swapped"], {"baseline": pending}, waiting)
    assert "never_called" not in results["gradcheck"] and results["gradcheck"]["seconds"] > 0
    assert not results["gradcheck"]["caught"]
