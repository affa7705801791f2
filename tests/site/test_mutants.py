"""The mutation run (tools/mutants.py), the report it keeps in the repository (tools/keyed_report.py) and the
page that shows it: mutants that fit the code, checks that see what they should, keys that change exactly with
what an entry depends on, and the sample that CI recomputes."""

import ast
import json
import re
import shutil
import subprocess
import urllib.request

import numpy as np
import pytest

from site_scripts.sections import function_page
from tools import checked_by, keyed_report, mutant_catalogue, mutants
from tools.common import ROOT
from tools.keyed_report import KeyedReport

BY_NAME = {m.name: m for m in mutants.MUTANTS}
CHECK = {c.name: c for c in mutants.CHECKS}


# ---------------------------------------------------------------- the catalogue fits the code

def test_every_catalogued_mutant_fits_the_code_once_and_compiles():
    """Each edit's text occurs exactly once in its function, so no mutant silently tests nothing."""
    assert len(mutants.MUTANTS) >= 20 and len(BY_NAME) == len(mutants.MUTANTS)
    for m in mutants.MUTANTS:
        lines, sources = mutants.apply_mutant(m, ROOT)  # the working tree itself is not written
        for e, line in zip(m.edits, lines):
            assert e.new.split("\n")[0] in sources[e.path].splitlines()[line - 1]
        for path, text in sources.items():
            assert text != (ROOT / path).read_text()
            compile(text, path, "exec")


def test_every_mutant_is_in_a_function_that_a_page_lists():
    """The tool names the function each mutant is in; the site finds its page from that (the matrix's Page
    column)."""
    for m in mutants.MUTANTS:
        path, function = m.subject
        assert function in {n.name for n in ast.walk(ast.parse((ROOT / path).read_text()))
                            if isinstance(n, (ast.FunctionDef, ast.ClassDef))}, m.name  # a method's is its class
        assert function_page(path, function) is not None, m.name
    module_level = BY_NAME["weight-decay-on-layernorm-gains"]
    assert module_level.edits[0].function is None and module_level.subject == ("transformer/optim.py", "is_decayed")
    with pytest.raises(ValueError, match="needs `about`"):
        mutant_catalogue.Mutant("x", "breaks", module_level.edits).subject


def test_a_mutant_that_no_longer_fits_the_code_stops_the_run():
    """Negative control: text that is absent, or present twice, is refused with the place named."""
    source = (ROOT / "transformer/layernorm.py").read_text()
    for old, count in (("dx = dxhat * 2", 0), ("dx -= ", 2)):
        absent = mutant_catalogue.edit("transformer/layernorm.py:layer_norm_backward", old, "dx = 0")
        with pytest.raises(ValueError, match=rf"occurs {count} times in transformer/layernorm.py:layer_norm_backward"):
            mutants.apply_edit(source, absent)
    missing = mutant_catalogue.edit("transformer/layernorm.py:no_such_function", "x", "y")
    with pytest.raises(ValueError, match="expected one function"):
        mutants.apply_edit(source, missing)


def test_the_unit_tests_of_a_mutant_start_with_its_modules_own_file_then_the_files_that_import_it(tmp_path):
    """A mutant of nf4: test_nf4.py, then the files that import nf4 at their top in each form, then the usual
    order. Imports inside a test and relative ones do not count. Watched failing with the files that import it
    left in the usual order."""
    files = {"test_nf4.py": "",
             "test_alpha.py": "from transformer.nf4 import pack\n",
             "test_beta.py": "from transformer import lora, nf4\n",
             "test_gamma.py": "import numpy\nimport transformer.nf4 as q\n",
             "test_cli.py": "from .helpers import nf4\nimport transformer\nfrom transformer import cli\n\n\n"
                            "def test_x():\n    from transformer import nf4\n",
             **{name: "" for name in mutants.UNIT_TEST_ORDER}}
    (tmp_path / "tests" / "unit").mkdir(parents=True)
    for name, text in files.items():
        (tmp_path / "tests" / "unit" / name).write_text(text)
    usual = [f"tests/unit/{name}" for name in (*mutants.UNIT_TEST_ORDER, "test_alpha.py", "test_beta.py",
                                               "test_cli.py", "test_gamma.py", "test_nf4.py")]
    assert mutants.unit_test_files(tmp_path) == usual
    first = [f"tests/unit/test_{name}.py" for name in ("nf4", "alpha", "beta", "gamma")]
    assert mutants.unit_test_files(tmp_path, {"nf4"}) == first + [f for f in usual if f not in first]
    assert mutants.unit_test_files(tmp_path, {"cli"})[:2] == ["tests/unit/test_cli.py", "tests/unit/test_layers.py"]
    assert mutants.mutated_modules(BY_NAME["shard-parameters-shared-once"]) == {"shard_processes"}
    assert mutants.mutated_modules(BY_NAME["pool-accepts-a-double-return"]) == {"kv_cache"}



@pytest.mark.parametrize("failing, expected", [
    (None, (False, "4 passed, 1 skipped")),
    ("tests/unit/test_alpha.py::test_a", (True, "first failure: tests/unit/test_alpha.py::test_a (assert False)")),
    ("tests/unit/test_zeta.py::test_e", (True, "first failure: tests/unit/test_zeta.py::test_e (assert False)"))])
def test_a_mutants_unit_tests_run_the_nearest_files_first_and_count_both_runs(tmp_path, failing, expected):
    """check_tests runs the mutated module's own file, then, if it passed, the rest: the first failure is the
    verdict wherever it is, and a pass counts the tests of both runs (watched failing with only the last run's
    counts kept)."""
    unit = tmp_path / "tests" / "unit"
    unit.mkdir(parents=True)
    for name in mutants.UNIT_TEST_ORDER:
        (unit / name).write_text("")
    tests = {"test_alpha.py": ["test_a", "test_b"], "test_zeta.py": ["test_c", "test_e"]}
    for name, functions in tests.items():
        skipped = "import pytest\n\n@pytest.mark.skip\ndef test_d():\n    pass\n" * (name == "test_zeta.py")
        (unit / name).write_text(skipped + "".join(f"\ndef {f}():\n    assert {f'tests/unit/{name}::{f}' != failing}\n"
                                                   for f in functions))
    assert mutants.check_tests(tmp_path, {"alpha"}) == expected


def test_the_mutant_runner_sees_what_each_check_can_see():
    """The two fast checks on three cases: the unchanged code passes both; a LayerNorm dx without its mean term
    fails finite differences; a different epsilon, consistent between forward and backward, passes finite
    differences and fails only the comparison with PyTorch."""
    pytest.importorskip("torch")
    expected = {None: (False, False), "layernorm-dx-no-mean-term": (True, True),
                "layernorm-other-epsilon": (False, True)}
    for name, seen in expected.items():
        results = mutants.run_checks(BY_NAME.get(name), [CHECK["gradcheck"], CHECK["crosscheck"]])
        assert (results["gradcheck"]["caught"], results["crosscheck"]["caught"]) == seen, (name, results)
    assert "ln1_g" in mutants.run_checks(BY_NAME["layernorm-dx-no-mean-term"], [CHECK["gradcheck"]])["gradcheck"][
        "detail"]  # the parameters upstream of a LayerNorm are named


@pytest.mark.parametrize("worker_test_passes", [True, False])
def test_the_unchanged_codes_unit_tests_are_the_trace_and_a_plain_run_of_what_it_skipped(tmp_path, monkeypatch,
                                                                                      worker_test_passes):
    """Each unit test runs once for both reports: the trace's passes are counted, the tests it skipped (those of
    worker processes) run plainly, and one of those failing fails the unchanged code (the negative control: a
    check that counted the skipped tests as passed would miss it)."""
    tests = tmp_path / "tests" / "unit"
    tests.mkdir(parents=True)
    (tests / "test_w.py").write_text(f"def test_worker():\n    assert {worker_test_passes}\n\n"
                                     "def test_device():\n    import pytest\n    pytest.skip('no such device')\n")
    skipped = ["tests/unit/test_w.py::test_worker", "tests/unit/test_w.py::test_device"]
    trace = KeyedReport(tmp_path / "c.json")
    trace.entries["trace"] = {"key": "", "commit": "", "value": {"tests": 9, "seconds": 1, "skipped": skipped}}
    monkeypatch.setattr("tools.checked_by.update", lambda source: trace)
    caught, detail = mutants.check_unchanged_tests(tmp_path)
    if worker_test_passes:
        assert (caught, detail) == (False, "8 passed, 1 skipped")
    else:
        assert caught and detail == "first failure: tests/unit/test_w.py::test_worker"


def test_the_bigram_bar_is_the_cross_entropy_of_counted_pairs(tmp_path):
    """On a text where each character fixes the next one, the bigram model is nearly certain; on the
    same characters in a random order it is close to log of the number of characters."""
    (tmp_path / "cycle.txt").write_text("abcd" * 5000)
    assert mutants.bigram_loss(tmp_path / "cycle.txt") < 0.01
    rng = np.random.default_rng(0)
    (tmp_path / "noise.txt").write_text("".join(rng.choice(list("abcd"), 20000)))
    assert abs(mutants.bigram_loss(tmp_path / "noise.txt") - np.log(4)) < 0.01


# ---------------------------------------------------------------- the keys: what an entry depends on

@pytest.fixture
def tree(tmp_path):
    """A copy of the package, its unit tests and pyproject.toml, to edit."""
    for name in ("transformer", "tests/unit"):
        shutil.copytree(ROOT / name, tmp_path / name, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    return tmp_path


def append(path, text):
    path.write_text(path.read_text() + text)


def replace(path, old, new):
    source = path.read_text()
    assert source.count(old) == 1
    path.write_text(source.replace(old, new))


def test_an_entrys_key_changes_with_what_it_depends_on_and_not_with_the_rest(tree):
    """A mutant's finite-differences entry, caught or missed: its key holds the function it edits, not another
    function; a caught unit-test entry holds the file that caught it, a missed one every test file; the unchanged
    code's holds everything. Each assertion was watched failing with that part left out of the key."""
    m = BY_NAME["layernorm-dx-no-mean-term"]
    caught = {"caught": True, "detail": "first failure: tests/unit/test_layers.py::test_x (AssertionError)"}
    missed = {"caught": False, "detail": "passed"}

    def keys():
        return {"grad caught": mutants.entry_key(m, CHECK["gradcheck"], caught, tree),
                "grad missed": mutants.entry_key(m, CHECK["gradcheck"], missed, tree),
                "tests caught": mutants.entry_key(m, CHECK["tests"], caught, tree),
                "tests missed": mutants.entry_key(m, CHECK["tests"], missed, tree),
                "unchanged": mutants.entry_key(None, CHECK["tests"], missed, tree)}

    before = keys()
    assert before["grad caught"] == before["grad missed"]  # the outcome of finite differences is not an input
    assert len(set(before.values())) == len(before) - 1
    append(tree / "transformer/linear.py", "\nEDITED = 1  # an edit of another file\n")
    after = keys()
    assert after["grad caught"] == before["grad caught"] and after["tests caught"] == before["tests caught"]
    assert after["grad missed"] == before["grad missed"] and after["unchanged"] != before["unchanged"]
    assert after["tests missed"] == before["tests missed"]  # a package edit: the tests are the same
    append(tree / "tests/unit/test_model.py", "\nEDITED = 1  # an edit of a test file that did not catch it\n")
    again = keys()
    assert again["tests caught"] == after["tests caught"] and again["tests missed"] != after["tests missed"]
    append(tree / "tests/unit/test_layers.py", "\nEDITED = 1  # an edit of the test file that caught it\n")
    assert keys()["tests caught"] != again["tests caught"]
    last = keys()
    replace(tree / "transformer/layernorm.py", "    dx = dxhat  #", "    dx = dxhat  # an edited comment  #")
    assert keys() == last  # words are not code: a comment changes no result
    replace(tree / "transformer/layernorm.py", "    dx = dxhat  #", "    dx = 1 * dxhat  #")
    assert all(keys()[k] != last[k] for k in ("grad caught", "tests caught", "grad missed", "unchanged"))


def test_the_unit_test_keys_hold_pytests_settings_and_not_the_rest_of_pyproject(tree):
    """Editing pyproject.toml's dependencies leaves every stored unit-test result and the trace current; editing
    its pytest table (which changes what a test run does) makes them stale. Watched failing with the whole file
    in the keys (the first assertion) and with no part of it (the second)."""
    m = BY_NAME["layernorm-dx-no-mean-term"]
    missed = {"caught": False, "detail": "passed"}
    for name in checked_by.PLUGIN:  # the trace's key reads the plugin too
        (tree / name).parent.mkdir(exist_ok=True)
        shutil.copy(ROOT / name, tree / name)

    def keys():
        return (mutants.entry_key(m, CHECK["tests"], missed, tree), mutants.entry_key(None, CHECK["tests"], missed, tree),
                checked_by.trace_key(["layernorm:layer_norm_backward"], tree))

    before = keys()
    replace(tree / "pyproject.toml", '"tqdm>=4.60"]', '"tqdm>=4.61"]')
    assert keys() == before
    replace(tree / "pyproject.toml", "-ra --strict-markers", "-ra -q --strict-markers")
    assert all(k != b for k, b in zip(keys(), before, strict=True))


def test_computing_a_key_fetches_and_runs_nothing(tmp_path, monkeypatch):
    """The training entries name the corpus by the digest scripts/fetch_corpus.py pins; only a run fetches it."""
    def no_fetch(*args, **kwargs):
        raise AssertionError("computing a key fetched or ran something")

    monkeypatch.setattr(mutants, "ensure_corpus", no_fetch)
    monkeypatch.setattr(subprocess, "run", no_fetch)
    monkeypatch.setattr(urllib.request, "urlopen", no_fetch)
    key = mutants.entry_key(mutant_catalogue.MUTANTS[0], CHECK["training"], {"caught": True, "detail": ""})
    assert re.fullmatch(r"[0-9a-f]{64}", key)
    monkeypatch.setattr(mutants, "pinned_corpus_digest", lambda: "0" * 64)  # another corpus, another key
    assert mutants.entry_key(mutant_catalogue.MUTANTS[0], CHECK["training"], {"caught": True, "detail": ""}) != key


# ---------------------------------------------------------------- the report: reused, recomputed, sampled

def fake_run_checks(log, outcome=lambda mutant, check: mutant is not None):
    """run_checks without running: every mutant caught by every check, the unchanged code passing them."""
    def run_checks(mutant, checks, source=None):
        log.append(mutant.name if mutant else "unchanged")
        return {c.name: {"caught": outcome(mutant, c), "detail": f"first failure: tests/unit/test_layers.py::t ({c.name})"
                         if c.name == "tests" else c.name, "seconds": 1.0} for c in checks}
    return run_checks


def test_the_report_reuses_current_entries_and_computes_what_changed(tmp_path, monkeypatch):
    path, ran = tmp_path / "mutants.json", []
    monkeypatch.setattr(mutants, "run_checks", fake_run_checks(ran))
    monkeypatch.setattr(mutants, "ensure_corpus", lambda: None)
    report = mutants.update(path=path, log=lambda line: None)
    assert len(ran) == len(mutants.MUTANTS) + 4  # the unchanged code, one check at a time, then each mutant
    assert len(report.entries) == (len(mutants.MUTANTS) + 1) * len(mutants.CHECKS) == len(report.computed)
    ran.clear()
    again = mutants.update(path=path, log=lambda line: None)
    assert ran == [] and again.computed == set() and again.entries == report.entries
    mutants.update(only=["layernorm-other-epsilon"], path=path, log=lambda line: None)
    assert ran == ["layernorm-other-epsilon"]
    stored = json.loads(path.read_text())["entries"]["layernorm-other-epsilon/gradcheck"]
    assert stored["commit"] == keyed_report.commit() and stored["value"]["caught"]


def test_the_unchanged_code_must_pass_before_any_mutant_is_stored(tmp_path, monkeypatch):
    monkeypatch.setattr(mutants, "run_checks", fake_run_checks([], outcome=lambda mutant, check: True))
    monkeypatch.setattr(mutants, "ensure_corpus", lambda: None)
    with pytest.raises(RuntimeError, match="fail on the unchanged code"):
        mutants.update(path=tmp_path / "m.json", log=lambda line: None)
    assert not (tmp_path / "m.json").exists()


def test_a_sampled_entry_that_disagrees_fails_the_tool(tmp_path, monkeypatch, capsys):
    """Negative control of CI's sample: an entry recomputed with another result is reported, and the run fails."""
    path = tmp_path / "mutants.json"
    monkeypatch.setattr(mutants, "run_checks", fake_run_checks([]))
    monkeypatch.setattr(mutants, "ensure_corpus", lambda: None)
    report = mutants.update(path=path, log=lambda line: None)
    fresh = KeyedReport(path)  # as a later process reads it: nothing computed, everything reused
    assert mutants.verify_sample(fresh, 6, seed=1, log=lambda line: None) == []
    monkeypatch.setattr(mutants, "run_checks", fake_run_checks([], outcome=lambda mutant, check: mutant is not None and check.name != "training"))
    differ = mutants.verify_sample(fresh, len(report.entries), seed=1, log=lambda line: None)
    assert differ and all("/training" in line for line in differ)
    monkeypatch.setattr(mutants, "update", lambda *args, **kwargs: fresh)
    monkeypatch.setattr("sys.argv", ["mutants", "--sample", "400", "--seed", "1"])
    assert mutants.main() == 1 and "DISAGREES" in capsys.readouterr().out


def test_keyed_report_keeps_an_entry_while_its_key_holds_and_writes_whole_files(tmp_path):
    report = KeyedReport(tmp_path / "r.json")
    assert report.current("a", "k1") is None
    report.put("a", "k1", {"y": 2, "x": 1})
    report.put("b", "k2", 3)
    assert report.save() and not report.save()  # nothing changed: not written again
    again = KeyedReport(tmp_path / "r.json")
    assert again.current("a", "k1") == {"x": 1, "y": 2} and again.current("a", "k2") is None
    assert again.reused() == ["a", "b"] and again.sample(1, seed=3) == again.sample(1, seed=3)
    again.keep_only(["b"])
    again.save()
    assert list(json.loads((tmp_path / "r.json").read_text())["entries"]) == ["b"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.json"]  # no partial file left
    assert re.fullmatch(r"[0-9a-f]{12}\+?|unknown", keyed_report.commit())


# ---------------------------------------------------------------- the page

def records_of(results_by_mutant):
    report = KeyedReport(ROOT / "absent.json")
    for m, results in results_by_mutant.items():
        for c in mutants.CHECKS:
            report.entries[mutants.entry_name(m, c)] = {"key": "k", "commit": "abc", "value": results[c.name]}
    return mutants.records(report, list(results_by_mutant))


def test_a_checks_words_show_on_the_page_as_they_are():
    """A test's exception is quoted in a mutant's details: rendered as the site renders Markdown, it must read
    the same, not become a tag, emphasis or math. Watched failing with the detail put in as it is."""
    import html

    import markdown

    from site_scripts.pages import mutants as page

    detail = "first failure: t.py::test_a_b[x] (assert <function f at 0x1> == $1 * 2$ and `a` * [b](c))"
    results = {c.name: {"caught": True, "detail": detail, "seconds": 1.0} for c in mutants.CHECKS}
    md = markdown.Markdown(extensions=["pymdownx.arithmatex"],  # as mkdocs.yml has it
                           extension_configs={"pymdownx.arithmatex": {"generic": True}})
    records = records_of({mutants.MUTANTS[0]: results})
    shown = html.unescape(re.sub(r"<[^>]+>", "", md.convert(page.details_md(records, "https://x"))))
    assert shown.count(detail) == len(mutants.CHECKS)


def test_a_surviving_mutant_is_shown_as_a_gap_and_fails_the_tool(monkeypatch, capsys):
    """Negative control of the page and of the tool's exit status: a report with a survivor."""
    from site_scripts.pages import mutants as page

    missed = {c.name: {"caught": False, "detail": "passed", "seconds": 1.0} for c in mutants.CHECKS}
    survivor, invisible = BY_NAME["attention-grad-no-scale"], next(m for m in mutants.MUTANTS if m.uncatchable)
    records = records_of({survivor: missed, invisible: missed})
    assert records[0]["gap"] and not records[1]["gap"]
    assert survivor.name in page.gaps_md(records) and invisible.name not in page.gaps_md(records)
    assert f"[{survivor.name}](#m-{survivor.name}) | a gap |" in page.matrix_md(records)
    monkeypatch.setattr(mutants, "update", lambda *args, **kwargs: whole_report(
        lambda m: m is not survivor and not m.uncatchable))
    monkeypatch.setattr("sys.argv", ["mutants"])
    assert mutants.main() == 1
    assert f"survivors: {survivor.name}" in capsys.readouterr().out


def whole_report(caught):
    """A report of every mutant in which each check's verdict is caught(mutant)."""
    report = KeyedReport(ROOT / "absent.json")
    for m in [None, *mutants.MUTANTS]:
        for c in mutants.CHECKS:
            report.entries[mutants.entry_name(m, c)] = {"key": "k", "commit": "abc", "value": {
                "caught": m is not None and caught(m), "detail": "", "seconds": 1.0}}
    return report


def test_a_caught_mutant_that_the_catalogue_calls_invisible_fails_the_tool(monkeypatch, capsys):
    """Negative control: the catalogue's reason why no check can see a mutant is wrong once a check sees it."""
    invisible = next(m for m in mutants.MUTANTS if m.uncatchable)
    monkeypatch.setattr(mutants, "update", lambda *args, **kwargs: whole_report(lambda m: True))
    monkeypatch.setattr("sys.argv", ["mutants"])
    assert mutants.main() == 1
    assert f"NO CHECK CAN SEE IT: {invisible.name}" in capsys.readouterr().out
    monkeypatch.setattr(mutants, "update", lambda *args, **kwargs: whole_report(lambda m: not m.uncatchable))
    assert mutants.main() == 0


def test_no_mutant_the_report_keeps_as_invisible_was_caught():
    """The page lists these under "What no check can see": the kept report must not contradict the list."""
    report = KeyedReport(mutants.REPORT)
    records = mutants.records(report, [m for m in mutants.MUTANTS if m.uncatchable])
    assert records and all(not r["caught_by"] for r in records), [r["mutant"].name for r in records if r["caught_by"]]
