"""Check the checks: plant one deliberate mistake at a time and see which check notices.

For each mutant of tools/mutant_catalogue.py, copy the package and its unit tests to a temporary folder
(tools/project_copy.py; the working tree is never touched), apply the mutant's edits there, and run each of the
project's checks against the copy:

  gradcheck   float64 central differences of every parameter (the gradcheck command, ReLU and GELU)
  crosscheck  the comparison with PyTorch on the CPU (the crosscheck command, ReLU and GELU)
  tests       the unit tests (pytest on tests/unit; not the tests of the site and the tools)
  training    a short training run on Tiny Shakespeare, which must beat a bigram model

The unchanged code must pass every check first: a check that fails anyway cannot tell us anything. Its unit
tests are the trace of tools/checked_by.py, which runs every one of them on the unchanged code for its own report,
and a plain run of those the trace skips (`check_unchanged_tests`): each test runs once for both reports.

The results live in reports/mutants.json, kept in the repository (tools/keyed_report.py), one entry per
mutant and check. An entry's key holds the mutant's edits and the text of the functions they edit, the check's
definition (its functions here) and the package files the check itself consists of, the environment, and, for
the unit tests, the file that caught the mutant (all the test files when none did). It rests on an assumption:
that a mistake in one function is caught or missed by a check whatever the text of the other functions, as
long as the unchanged code passes. So an edit elsewhere reuses the entry, while the unchanged code's entries,
whose keys hold every package and test file, run again after any edit; CI recomputes a random sample of the
reused entries on every run to test the assumption.

    python -m tools.mutants                # bring the report up to date (what changed runs again)
    python -m tools.mutants --sample 8     # and compute 8 reused entries again; a disagreement fails
    python -m tools.mutants --force        # compute every entry again
    python -m tools.mutants --only NAME [NAME ...]   # these mutants again
    python -m tools.mutants --list         # the mutants and the lines they edit

Exit status 1 when a mutant that some check should catch survives, when one the catalogue marks as invisible
is caught (the catalogue is wrong), or when a sampled entry disagrees.
"""

import argparse
import ast
import inspect
import json
import math
import os
import re
import sys
import textwrap
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import cache, lru_cache
from pathlib import Path

from .common import (CORPUS, ROOT, code_text, cores, ensure_corpus, environment, files_text, hash_parts,
                     parse, pinned_corpus_digest, positive_int, pytest_settings)
from .keyed_report import KeyedReport
from .mutant_catalogue import MUTANTS
from .project_copy import UNIT_TESTS, project_copy, run_in, run_pytest

REPORT = ROOT / "reports" / "mutants.json"
UNCHANGED = "unchanged code"  # the entries of the unmutated copy: "unchanged code/<check>"
PACKAGE = "transformer"
# The unit tests stop at the first failure, so they run the most specific tests first (unit_test_files): the
# mutated module's own test file, then the files that import it at their top, then the rest in this order.
UNIT_TEST_ORDER = ("test_layers.py", "test_model.py", "test_optim.py", "test_data.py", "test_generate.py",
                   "test_checkpoint.py", "test_crosscheck.py", "test_train.py")
TIMEOUT_S = 600  # per check: a mutant that makes a check hang counts as caught, after this long
# One shard per batch (--threads 1): JOBS mutants run at once, one per core, and the losses are the same on any
# machine.
TRAINING = ["--preset", "A", "--steps", "200", "--lr", "1e-2", "--warmup", "20", "--eval-every", "200",
            "--batch-size", "32", "--seed", "0", "--threads", "1", "--no-progress"]


@dataclass(frozen=True)
class Check:
    name: str
    title: str
    what: str  # what it compares, for the page
    files: tuple  # the package files that are the check itself (its machinery, not the code it judges)


CHECKS = (
    Check("gradcheck", "Finite differences",
          "every gradient of a tiny model against float64 central differences, ReLU and GELU "
          "(`python -m transformer gradcheck`)", ("transformer/gradcheck.py",)),
    Check("crosscheck", "PyTorch cross-check",
          "logits, loss, gradients, intermediates, AdamW steps, training steps and KV-cache decoding "
          "against PyTorch on the CPU, ReLU and GELU (`python -m transformer crosscheck`)",
          ("transformer/crosscheck.py", "transformer/crosscheck_finetune.py", "transformer/crosscheck_memory.py",
           "transformer/crosscheck_report.py", "transformer/crosscheck_rows.py", "transformer/crosscheck_serving.py",
           "transformer/torch_mirror.py")),
    Check("tests", "Unit tests",
          "the pytest suite without the tests of the site and the tools: the mutated module's own test file "
          "first, then the files that import it, then the layers' tests; it stops at the first failure, which is "
          "named", (f"{UNIT_TESTS}/conftest.py",)),
    Check("training", "Training run",
          f"{TRAINING[TRAINING.index('--steps') + 1]} steps of preset A on Tiny Shakespeare; the validation loss "
          "must fall below that of a bigram model counted from the training split", ("transformer/data.py",)),
)
BY_NAME = {m.name: m for m in MUTANTS}


# ---------------------------------------------------------------- applying a mutant

def function_span(source, function, path):
    """(start, end) character offsets of a function's source: a function anywhere, by its name, or a
    method, as "Class.method"."""
    found = function_spans(source).get(function, [])
    if len(found) != 1:
        raise ValueError(f"{path}: expected one function {function}, found {len(found)}")
    return found[0]


@lru_cache(maxsize=128)
def function_spans(source):
    """{name: [(start, end), ...]} of every function in a source, nested ones too, and of every method also as
    "Class.method" (parsed once per text: each key reads the spans of the functions a mutant edits)."""
    tree, starts = parse(source), [0]
    for line in source.splitlines(keepends=True):
        starts.append(starts[-1] + len(line))
    spans = {}
    for scope in [tree, *(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef))]:
        for n in ast.walk(scope):
            if isinstance(n, ast.FunctionDef):
                name = n.name if scope is tree else f"{scope.name}.{n.name}"
                spans.setdefault(name, []).append((starts[n.lineno - 1], starts[n.end_lineno]))
    return spans


def apply_edit(source, e):
    """Return (the edited source, the 1-based line of the edit). `e.old` must occur once in its scope."""
    start, end = function_span(source, e.function, e.path) if e.function else (0, len(source))
    scope = source[start:end]
    count = scope.count(e.old)
    if count != 1:
        where = f"{e.path}:{e.function}" if e.function else e.path
        raise ValueError(f"edit does not fit the code: {e.old!r} occurs {count} times in {where}")
    at = start + scope.index(e.old)
    return source[:at] + e.new + source[at + len(e.old):], source.count("\n", 0, at) + 1


def apply_mutant(mutant, root):
    """Apply every edit of the mutant, in order, to the files under root (the working tree is ROOT: nothing is
    written then); return the edits' lines and the edited sources by path."""
    sources, lines = {}, []
    for e in mutant.edits:
        sources[e.path], line = apply_edit(sources.get(e.path) or (root / e.path).read_text(), e)
        lines.append(line)
    if root != ROOT:
        for path, source in sources.items():
            compile(source, path, "exec")
            (root / path).write_text(source)
    return lines, sources


def edit_lines(mutant):
    """The line of each edit in the working tree's (unmutated) source."""
    return apply_mutant(mutant, ROOT)[0]


def edited_text(mutant, root=ROOT):
    """The text the mutant edits, as it is now: each edited function's source (the whole file for an edit that
    names none)."""
    parts = []
    for e in mutant.edits:
        source = (root / e.path).read_text()
        start, end = function_span(source, e.function, e.path) if e.function else (0, len(source))
        parts.append(f"{e.path}:{e.function}\0{code_text(textwrap.dedent(source[start:end]))}")
    return parts


# ---------------------------------------------------------------- the checks, run in a copy

def run(copy, *args):
    """`python -m transformer *args` in the copy, with one thread; None after TIMEOUT_S."""
    return run_in(copy, [sys.executable, "-m", PACKAGE, *args], timeout=TIMEOUT_S, threads=1)


def crash_line(result):
    """The last line of a traceback (the exception), or the last line of stderr."""
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    return lines[-1].strip() if lines else f"exit status {result.returncode}"


def check_gradcheck(copy, mutated):
    fails = []
    for activation in ("relu", "gelu"):
        result = run(copy, "gradcheck", "--activation", activation)
        if result is None:
            return True, f"{activation}: timed out after {TIMEOUT_S} s"
        if result.returncode not in (0, 1):
            return True, f"{activation}: crashed ({crash_line(result)})"
        bad = [line.split()[0] for line in result.stdout.splitlines() if "FAIL" in line.split()]
        total = re.search(r"of (\d+) parameters pass", result.stdout)
        if result.returncode == 1 or bad:
            names = ", ".join(bad[:4]) + (", ..." if len(bad) > 4 else "")
            fails.append(f"{activation}: {len(bad)} of {total.group(1) if total else '?'} parameters off ({names})")
    return bool(fails), "; ".join(fails) or "every parameter within tolerance, ReLU and GELU"


# The crosscheck command for ReLU, then GELU, in one process: torch (and the parts of it an optimizer loads)
# is imported once, not twice, which is most of the check's time; each call writes its own report.
CROSSCHECK_BOTH = ("import sys\nfrom transformer.cli import main\n"
                   "sys.exit(max([main(['crosscheck', '--devices', 'cpu', '--activation', a, '--json', "
                   "f'crosscheck-{a}.json']) for a in ('relu', 'gelu')]))")


def check_crosscheck(copy, mutated):
    result = run_in(copy, [sys.executable, "-c", CROSSCHECK_BOTH], timeout=TIMEOUT_S, threads=1)
    if result is None:
        return True, f"timed out after {TIMEOUT_S} s"
    fails = []
    for activation in ("relu", "gelu"):
        try:  # missing, or empty: the run crashed before (or while) writing it
            rows = json.loads((copy / f"crosscheck-{activation}.json").read_text())["rows"]
        except (OSError, ValueError, KeyError):
            return True, f"{activation}: crashed ({crash_line(result)})"
        bad = [r for r in rows if not r["passed"]]
        if bad:
            kinds = sorted({r["check"] for r in bad})
            fails.append(f"{activation}: {len(bad)} of {len(rows)} comparisons ({', '.join(kinds)})")
    if not fails and result.returncode != 0:  # a failed status that no row explains
        return True, f"crashed ({crash_line(result)})"
    return bool(fails), "; ".join(fails) or "every comparison within tolerance, ReLU and GELU"


def imported_modules(path):
    """The package's modules a test file imports at its top ("layernorm" for `from transformer.layernorm import
    ...`, `from transformer import layernorm` or `import transformer.layernorm`)."""
    found = set()
    for node in parse(path.read_text()).body:
        if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == PACKAGE:
            found |= {a.name for a in node.names} if node.module == PACKAGE else {node.module.split(".")[1]}
        elif isinstance(node, ast.Import):
            found |= {a.name.split(".")[1] for a in node.names if a.name.startswith(PACKAGE + ".")}
    return found


def mutated_modules(mutant):
    """The package's modules a mutant edits ("layernorm" for transformer/layernorm.py)."""
    return {Path(path).stem for path in {e.path for e in mutant.edits} | {mutant.subject[0]}
            if Path(path).parent.name == PACKAGE}


def kinship(root, test_file, mutated):
    """0: the test file is a mutated module's own (test_nf4.py for nf4), 1: it imports one, 2: neither."""
    if Path(test_file).stem.removeprefix("test_") in mutated:
        return 0
    return 1 if imported_modules(root / test_file) & set(mutated) else 2


def unit_test_files(root, mutated=()):
    """Every test file under tests/unit: a module of `mutated`'s own, then those that import one, then the rest
    (`kinship`), each in UNIT_TEST_ORDER, then by name. A mistake is caught by the first failing test, so a
    mutant of the worker processes, say, is seen by test_parallel.py at once instead of after a minute of the
    layers' tests."""
    files = sorted(p.relative_to(root).as_posix() for p in (root / UNIT_TESTS).rglob("test_*.py"))
    stale = set(UNIT_TEST_ORDER) - {Path(f).name for f in files}
    if stale:
        raise ValueError(f"UNIT_TEST_ORDER names {', '.join(sorted(stale))}, not under {UNIT_TESTS}")
    rank = {name: i for i, name in enumerate(UNIT_TEST_ORDER)}
    return sorted(files, key=lambda f: (kinship(root, f, mutated), rank.get(Path(f).name, len(rank)), f))


def check_tests(copy, mutated):
    """The unit tests in unit_test_files' order up to the first failure, in two pytest runs: the files nearest the
    mutated modules (their own, and those that import one), where most mutants are caught, then, if those pass,
    the rest. pytest collects every file it is given before running any, which is most of a run that stops at
    once."""
    files = unit_test_files(copy, mutated)
    near = [f for f in files if kinship(copy, f, mutated) < 2]
    counts = {}  # "passed", "skipped", ...: their numbers over both runs
    for part in (near, files[len(near):]):
        if not part:
            continue
        result = run_pytest(copy, part, timeout=TIMEOUT_S, threads=1)
        if result is None:
            return True, f"timed out after {TIMEOUT_S} s"
        if result.failures:
            reason = f" ({result.reasons[0]})" if result.reasons[0] else ""
            return True, f"first failure: {result.failures[0]}{reason}"
        if result.returncode != 0:
            return True, f"pytest exit status {result.returncode} ({crash_line(result)})"
        for number, kind in re.findall(r"(\d+) (\w+)", re.sub(r" in [\d.]+s.*", "", result.summary)):
            counts[kind] = counts.get(kind, 0) + int(number)
    return False, ", ".join(f"{number} {kind}" for kind, number in counts.items()) or "passed"


def check_unchanged_tests(copy, mutated=()):
    """The unit tests of the unchanged code, each run once for both reports: the trace of tools/checked_by.py (its
    report brought up to date first, from this copy; the trace fails unless every test passes or skips), then,
    plainly, the tests it skipped (those of worker processes, which it keeps out, and of devices not here)."""
    from . import checked_by

    trace = checked_by.update(source=copy).entries[checked_by.TRACE]["value"]
    passed, skipped = trace["tests"] - len(trace["skipped"]), 0
    if trace["skipped"]:
        result = run_pytest(copy, trace["skipped"], timeout=TIMEOUT_S, threads=1)
        if result is None:
            return True, f"timed out after {TIMEOUT_S} s"
        if result.returncode != 0:
            return True, f"first failure: {result.failures[0]}" if result.failures else \
                f"pytest exit status {result.returncode} ({crash_line(result)})"
        count = {kind: int(n) for n, kind in re.findall(r"(\d+) (passed|skipped)", result.summary)}
        passed, skipped = passed + count.get("passed", 0), count.get("skipped", 0)
    return False, f"{passed} passed, {skipped} skipped"


def check_training(copy, mutated):
    out = copy / "run"
    result = run(copy, "train", "--corpus", str(CORPUS), "--out", str(out), *TRAINING)
    if result is None:
        return True, f"timed out after {TIMEOUT_S} s"
    if result.returncode != 0:
        return True, f"crashed ({crash_line(result)})"
    losses = [json.loads(line)["val_loss"] for line in (out / "metrics.jsonl").read_text().splitlines()
              if '"val_loss"' in line]
    loss, bar = losses[-1], bigram_loss()
    if not math.isfinite(loss) or loss >= bar:
        return True, f"validation loss {loss:.4f}, not below the bigram model's {bar:.4f}"
    return False, f"validation loss {loss:.4f}, below the bigram model's {bar:.4f}"


CHECK_FUNCTIONS = {"gradcheck": check_gradcheck, "crosscheck": check_crosscheck, "tests": check_tests,
                   "training": check_training}


def bigram_loss(path=CORPUS):
    """Cross-entropy on the validation split of a bigram model counted on the training split.

    Add-one smoothing; the split is the library's (the first 90% for training). A model that learns
    anything beyond the previous character beats it; one that cannot use context cannot.
    """
    import numpy as np

    from transformer.data import CharTokenizer, train_val_split

    text = path.read_text()
    tokenizer = CharTokenizer.from_text(text)
    train, val = train_val_split(tokenizer.encode(text), seq_len=64)
    counts = np.ones((tokenizer.vocab_size, tokenizer.vocab_size))
    np.add.at(counts, (train[:-1], train[1:]), 1.0)
    probs = counts / counts.sum(axis=1, keepdims=True)
    return float(-np.log(probs[val[:-1], val[1:]]).mean())


# ---------------------------------------------------------------- keys

def definition(check, root=ROOT):
    """The text that defines a check: its function and the helpers it runs, its settings, its own files."""
    corpus = [pinned_corpus_digest()] if check.name == "training" else []
    settings = [pytest_settings(root)] if check.name == "tests" else []
    return [*check_code(check.name), files_text(*check.files, root=root, code=True), *settings, *corpus]


@cache
def check_code(name):
    """The source of a check's function and of the helpers it runs, and its settings (read once per process)."""
    helpers = (run, crash_line, run_pytest, run_in) + ((unit_test_files, imported_modules, kinship) if name == "tests"
                                                        else (bigram_loss,) if name == "training" else ())
    settings = [TIMEOUT_S] + ([TRAINING] if name == "training" else [CROSSCHECK_BOTH] if name == "crosscheck" else [])
    return tuple([code_text(textwrap.dedent(inspect.getsource(f))) for f in (CHECK_FUNCTIONS[name], *helpers)]
                 + [str(s) for s in settings])


def entry_key(mutant, check, value, root=ROOT):
    """The key of one entry (see the module docstring). `value` is the entry's result: for the unit tests, a
    caught mutant's key holds the test file that caught it, an uncaught one's every test file (a new test may
    come to catch it)."""
    parts = [environment(), *definition(check, root)]
    if mutant is None:
        unchanged = [code_text(inspect.getsource(check_unchanged_tests))] if check.name == "tests" else []
        return hash_parts(*parts, *unchanged, files_text(PACKAGE, UNIT_TESTS, root=root, code=True),
                          pytest_settings(root))
    parts += [*(f"{e.path}:{e.function}\0{e.old}\0{e.new}" for e in mutant.edits), *edited_text(mutant, root)]
    if check.name == "tests":  # the file that caught it (all of them, if none did or the detail names none)
        found = re.search(r"first failure: ([^:\s]+)::", value["detail"]) if value and value["caught"] else None
        parts.append(files_text(found[1] if found and (root / found[1]).exists() else UNIT_TESTS, root=root,
                                code=True))
    return hash_parts(*parts)


def entry_name(mutant, check):
    return f"{mutant.name if mutant else UNCHANGED}/{check.name}"


def stale_checks(report, mutant, root):
    """The checks whose stored result for the mutant (None: the unchanged code) is not current."""
    return [c for c in CHECKS if report.current(entry_name(mutant, c), entry_key(
        mutant, c, (report.entries.get(entry_name(mutant, c)) or {}).get("value"), root)) is None]


# ---------------------------------------------------------------- running

def run_checks(mutant, checks, source=ROOT):
    """{check name: result} of the checks against a copy of `source` with the mutant applied (None: unchanged)."""
    mutated = mutated_modules(mutant) if mutant else ()
    results = {}
    with project_copy(None if mutant is None else lambda copy: apply_mutant(mutant, copy), source=source) as copy:
        for check in checks:
            start = time.perf_counter()
            unchanged_tests = mutant is None and check.name == "tests"
            caught, detail = (check_unchanged_tests if unchanged_tests else CHECK_FUNCTIONS[check.name])(copy, mutated)
            results[check.name] = {"caught": caught, "detail": detail,
                                   "seconds": round(time.perf_counter() - start, 1)}
    return results


def compute(report, todo, jobs, log, tree):
    """Run the checks of `todo` ([(mutant, checks)]) on copies of `tree`, `jobs` at a time, and store their results:
    the unchanged code's checks first, one by one, then the mutants'. The unchanged code must pass its checks: the
    mutants' results are stored only once it has (until then they wait, computed or not)."""
    items = [(None, [c]) for mutant, checks in todo if mutant is None for c in checks]
    items += [(m, checks) for m, checks in todo if m is not None]
    with ThreadPoolExecutor(jobs) as pool:
        try:
            judged = False  # whether the unchanged code's results were all read and passed
            for (mutant, _), results in zip(items, pool.map(lambda item: run_checks(*item, source=tree), items)):
                if mutant is not None and not judged:
                    refuse_failing_checks(report)
                    judged = True
                store(report, mutant, results, log, tree)
            refuse_failing_checks(report)
        except BaseException:
            pool.shutdown(wait=False, cancel_futures=True)
            raise


def refuse_failing_checks(report):
    wrong = {name: v["value"]["detail"] for name, v in report.entries.items()
             if name.startswith(UNCHANGED + "/") and v["value"]["caught"]}
    if wrong:
        raise RuntimeError("the checks fail on the unchanged code, so they cannot judge a mutant: "
                           + "; ".join(f"{k}: {v}" for k, v in wrong.items()))


def store(report, mutant, results, log, tree):
    for name, value in results.items():
        check = next(c for c in CHECKS if c.name == name)
        report.put(entry_name(mutant, check), entry_key(mutant, check, value, tree), value)
    log(f"{mutant.name if mutant else UNCHANGED:<40} " + ", ".join(
        f"{name}: {'caught' if v['caught'] else 'passed' if mutant is None else 'missed'}" for name, v in results.items()))


def update(force=False, only=(), jobs=None, log=print, path=REPORT):
    """Bring the report (reports/mutants.json) up to date: compute the entries whose key changed (every entry
    with force, those of `only` too), keep the rest. The keys and the checks read one copy of the tree, taken
    when the run starts. Returns the report."""
    report = KeyedReport(path)
    report.keep_only([entry_name(m, c) for m in [None, *MUTANTS] for c in CHECKS])
    with project_copy(prefix="mutants-tree-") as tree:
        todo = [(m, list(CHECKS) if force or (m and m.name in only) else stale_checks(report, m, tree))
                for m in [None, *MUTANTS]]
        todo = [(m, checks) for m, checks in todo if checks]
        if todo:
            ensure_corpus()
            log(f"computing {sum(len(c) for _, c in todo)} of {(len(MUTANTS) + 1) * len(CHECKS)} entries "
                f"({len(todo)} mutants or the unchanged code), {jobs or cores()} at a time")
            compute(report, todo, jobs or cores(), log, tree)
    report.save()
    return report


def verify_sample(report, count, seed, jobs=None, log=print):
    """Compute `count` reused entries again; return those whose result differs from the stored one."""
    names = report.sample(count, seed)
    log(f"recomputing {len(names)} reused entries (seed {seed}): {', '.join(names)}")
    by_mutant = {}
    for name in names:
        mutant, _, check = name.rpartition("/")
        by_mutant.setdefault(mutant, []).append(next(c for c in CHECKS if c.name == check))
    work = [(None if m == UNCHANGED else BY_NAME[m], checks) for m, checks in by_mutant.items()]
    if work:
        ensure_corpus()
    differ = []
    with ThreadPoolExecutor(jobs or cores()) as pool:
        for (mutant, _), results in zip(work, pool.map(lambda item: run_checks(*item), work)):  # the working tree
            for check, fresh in results.items():
                name = f"{mutant.name if mutant else UNCHANGED}/{check}"
                stored = report.entries[name]["value"]
                if (fresh["caught"], fresh["detail"]) != (stored["caught"], stored["detail"]):
                    differ.append(f"{name}: stored {stored['caught']} ({stored['detail']}), now "
                                  f"{fresh['caught']} ({fresh['detail']})")
    return differ


# ---------------------------------------------------------------- what the report says

def records(report, selected=MUTANTS):
    """One record per mutant, in the catalogue's order: its results by check, the checks that caught it, and
    whether it is a gap (no check caught it, and it is not marked as invisible)."""
    out = []
    for m in selected:
        results = {c.name: report.entries[entry_name(m, c)] for c in CHECKS}
        caught_by = [c.name for c in CHECKS if results[c.name]["value"]["caught"]]
        out.append({"mutant": m, "results": results, "caught_by": caught_by,
                    "gap": not caught_by and not m.uncatchable})
    return out


def status_text(record):
    if record["caught_by"]:
        return "caught by " + ", ".join(record["caught_by"])
    return "not caught (no check can see it)" if record["mutant"].uncatchable else "SURVIVED"


def main():
    parser = argparse.ArgumentParser(prog="python -m tools.mutants", description=__doc__.splitlines()[0])
    parser.add_argument("--list", action="store_true", help="list the mutants and exit")
    parser.add_argument("--only", nargs="+", metavar="NAME", default=(), help="compute these mutants again")
    parser.add_argument("--force", action="store_true", help="compute every entry again")
    parser.add_argument("--sample", type=int, default=0, metavar="N",
                        help="then compute N reused entries again and compare (CI does)")
    parser.add_argument("--seed", type=int, default=None, help="which entries --sample draws (default: random)")
    parser.add_argument("-j", "--jobs", type=positive_int, default=None,
                        help=f"mutants checked at once (default: the cores this process may use, {cores()} here)")
    args = parser.parse_args()
    if args.list:
        for m in MUTANTS:
            print(f"{m.name:<40} " + ", ".join(f"{e.path}:{line}" for e, line in zip(m.edits, edit_lines(m))))
        return 0
    unknown = [n for n in args.only if n not in BY_NAME]
    if unknown:
        parser.error(f"no mutant named {', '.join(unknown)} (see --list)")
    try:
        report = update(args.force, args.only, args.jobs)
        seed = args.seed if args.seed is not None else int.from_bytes(os.urandom(4), "little")
        differ = verify_sample(report, args.sample, seed, args.jobs) if args.sample else []
    except (RuntimeError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    found = records(report)
    for r in found:
        print(f"{r['mutant'].name:<40} {status_text(r)}")
    gaps = [r["mutant"].name for r in found if r["gap"]]
    seen = [r["mutant"].name for r in found if r["caught_by"] and r["mutant"].uncatchable]
    print(f"{sum(bool(r['caught_by']) for r in found)} of {len(found)} mutants caught; "
          f"{len(report.computed)} entries computed now, {len(report.reused())} reused from reports/mutants.json; "
          f"survivors: {', '.join(gaps) or 'none'}")
    for name in seen:
        print(f"CAUGHT, YET THE CATALOGUE SAYS NO CHECK CAN SEE IT: {name} (correct its edit or its `uncatchable`)")
    for line in differ:
        print(f"DISAGREES: {line}")
    return 1 if gaps or seen or differ else 0


if __name__ == "__main__":
    sys.exit(main())
