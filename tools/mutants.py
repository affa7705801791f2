"""Check the checks: plant one deliberate mistake at a time and see which check notices.

For each mutant of tools/mutant_catalogue.py, copy the package and its unit tests
to a temporary folder (tools/project_copy.py; the working tree is never touched),
apply the mutant's edits there, and run every one of the project's checks against
the copy:

  gradcheck   float64 central differences of every parameter (the gradcheck command, ReLU and GELU)
  crosscheck  the comparison with PyTorch on the CPU (the crosscheck command, ReLU and GELU)
  tests       the unit tests (pytest on tests/unit; not the tests of the site and the tools)
  training    a short training run on Tiny Shakespeare, which must beat a bigram model

The unchanged code goes through the same checks first; if any of them fails
there, the run stops, since a check that fails anyway cannot tell us anything.
Its gradcheck, crosscheck and training commands also note which of the package's
functions they call (tools/reached.py): a mutant that changes only functions a
command never called would run the same code, so that check takes the unchanged
code's result, marked "never_called", instead of running again.

    python tools/mutants.py              # every mutant; ~8 min on 2 idle cores
    python tools/mutants.py --quick      # the three of QUICK
    python tools/mutants.py --only NAME [NAME ...]   [--list] [-j JOBS] [--json PATH]

Mutants run JOBS at a time (default: the cores this process may use), each in its own copy and
processes, one BLAS thread each. Each of the JOBS workers has a launcher (tools/preloaded.py) that has
imported numpy, torch and pytest once; every check is a fork of it, which imports the project from the copy.

The whole run's report is cached in build/cache/ under a key of everything it
depends on, and the site's "Are the checks good enough?" page is generated from
it. Exit status 1 when a mutant that some check should catch survives.
"""

import argparse
import ast
import json
import math
import re
import subprocess
import sys
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

if __package__ in (None, ""):  # run as `python tools/mutants.py`: import from the project root, as `-m` does
    sys.path[0] = str(Path(__file__).resolve().parent.parent)

from site_scripts import depends  # noqa: E402
from site_scripts.common import (CACHE, ROOT, cached_json, hash_parts, numpy_version, positive_int,  # noqa: E402
                                 torch_version)
from tools.mutant_catalogue import MUTANTS, QUICK  # noqa: E402
from tools.preloaded import launchers, lent  # noqa: E402
from tools.project_copy import UNIT_TESTS, project_copy, run_in, run_pytest  # noqa: E402
from tools.reached import merged, read_record, unreached  # noqa: E402
from transformer.parallel import cores  # noqa: E402  (the cores this process may use)

CORPUS = ROOT / "data" / "tinyshakespeare" / "input.txt"
FETCH_CORPUS = ROOT / "scripts" / "fetch_corpus.py"  # puts the corpus in place, verified against its SHA256
# The unit tests (every test file under tests/unit) stop at the first failure, so they run the most specific
# tests first (unit_test_files): the mutated module's own test file, then the files that import it at their
# top, then the rest in this order (the layers before the model), then by name.
PACKAGE = "transformer"
UNIT_TEST_ORDER = ("test_layers.py", "test_model.py", "test_optim.py", "test_data.py", "test_generate.py",
                   "test_checkpoint.py", "test_crosscheck.py", "test_train.py")
TIMEOUT_S = 600  # per check: a mutant that makes a check hang counts as caught, after this long
# One shard per batch (--threads 1): JOBS mutants run at once, one per core, so a run that cut its batches to
# use every core would fight the others for them; and so its losses are the same on any machine.
TRAINING = ["--preset", "A", "--steps", "200", "--lr", "1e-2", "--warmup", "20", "--eval-every", "200",
            "--batch-size", "32", "--seed", "0", "--threads", "1", "--no-progress"]


@dataclass(frozen=True)
class Check:
    name: str
    title: str
    what: str  # what it compares, for the page


CHECKS = (
    Check("gradcheck", "Finite differences",
          "every gradient of a tiny model against float64 central differences, ReLU and GELU "
          "(`python -m transformer gradcheck`)"),
    Check("crosscheck", "PyTorch cross-check",
          "logits, loss, gradients, intermediates, AdamW steps, training steps and KV-cache decoding "
          "against PyTorch on the CPU, ReLU and GELU (`python -m transformer crosscheck`)"),
    Check("tests", "Unit tests",
          "the pytest suite without the tests of the site and the tools: the mutated module's own test file "
          "first, then the files that import it, then the layers' tests; it stops at the first failure, which is "
          "named"),
    Check("training", "Training run",
          "200 steps of preset A on Tiny Shakespeare; the validation loss must fall below that of a "
          "bigram model counted from the training split"),
)


# ---------------------------------------------------------------- applying a mutant

def function_span(source, function, path):
    """(start, end) character offsets of a function's source: a function anywhere, by its name, or a
    method, as "Class.method"."""
    tree = ast.parse(source)
    owner, _, name = function.rpartition(".")
    scopes = [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == owner] if owner else [tree]
    found = [n for scope in scopes for n in ast.walk(scope) if isinstance(n, ast.FunctionDef) and n.name == name]
    if len(found) != 1:
        raise ValueError(f"{path}: expected one function {function}, found {len(found)}")
    lines = source.splitlines(keepends=True)
    start = sum(len(line) for line in lines[:found[0].lineno - 1])
    end = sum(len(line) for line in lines[:found[0].end_lineno])
    return start, end


def apply_edit(source, e):
    """Return (the edited source, the 1-based line of the edit). `e.old` must occur once in its scope."""
    start, end = function_span(source, e.function, e.path) if e.function else (0, len(source))
    scope = source[start:end]
    count = scope.count(e.old)
    if count != 1:
        where = f"{e.path}:{e.function}" if e.function else e.path
        raise ValueError(f"mutant edit does not fit the code: {e.old!r} occurs {count} times in {where}")
    at = start + scope.index(e.old)
    return source[:at] + e.new + source[at + len(e.old):], source.count("\n", 0, at) + 1


def apply_mutant(mutant, root):
    """Apply every edit of the mutant to the files under root; return the edits' lines in the original."""
    lines = []
    for e in mutant.edits:
        path = root / e.path
        source = path.read_text()
        mutated, line = apply_edit(source, e)
        compile(mutated, e.path, "exec")
        path.write_text(mutated)
        lines.append(line)
    return lines


def edit_lines(mutant):
    """The line of each edit in the working tree's (unmutated) source, applying the edits in order."""
    sources, lines = {}, []
    for e in mutant.edits:
        source = sources.get(e.path) or (ROOT / e.path).read_text()
        sources[e.path], line = apply_edit(source, e)
        lines.append(line)
    return lines


# ---------------------------------------------------------------- the checks, run in a copy

def run(copy, ctx, *args):
    """`python -m transformer *args` in the copy, with one thread (JOBS mutants run at once), in a fork of the
    worker's launcher (a new process where there is none); None after TIMEOUT_S. When ctx has a list "records"
    (the unchanged code's run), the functions the command called are added to it (tools/reached.py; None where
    they cannot be recorded)."""
    records, launcher = ctx.get("records"), ctx.get("launcher")
    if records is None or launcher is None:
        if records is not None:
            records.append(None)
        return run_in(copy, [sys.executable, "-m", "transformer", *args], timeout=TIMEOUT_S, threads=1,
                      launcher=launcher)
    path = copy / "records" / f"{len(records)}.json"
    path.parent.mkdir(exist_ok=True)
    result = launcher.run(copy, "transformer", args, TIMEOUT_S, record=path)
    records.append(read_record(path))
    return result


def crash_line(result):
    """The last line of a traceback (the exception), or the last line of stderr."""
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    return lines[-1].strip() if lines else f"exit status {result.returncode}"


def check_gradcheck(copy, ctx):
    fails = []
    for activation in ("relu", "gelu"):
        result = run(copy, ctx, "gradcheck", "--activation", activation)
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


def check_crosscheck(copy, ctx):
    fails = []
    for activation in ("relu", "gelu"):
        report = copy / f"crosscheck-{activation}.json"
        result = run(copy, ctx, "crosscheck", "--devices", "cpu", "--activation", activation, "--json", str(report))
        if result is None:
            return True, f"{activation}: timed out after {TIMEOUT_S} s"
        try:  # a crash after the command made the (empty) report file exits 1 too, like a failed check
            rows = json.loads(report.read_text())["rows"] if result.returncode in (0, 1) else None
        except (OSError, ValueError, KeyError):
            rows = None
        if rows is None:
            return True, f"{activation}: crashed ({crash_line(result)})"
        bad = [r for r in rows if not r["passed"]]
        if result.returncode == 1 or bad:
            kinds = sorted({r["check"] for r in bad})
            fails.append(f"{activation}: {len(bad)} of {len(rows)} comparisons ({', '.join(kinds)})")
    return bool(fails), "; ".join(fails) or "every comparison within tolerance, ReLU and GELU"


def imported_modules(path, root=ROOT):
    """The package's modules a test file imports at its top ("layernorm" for `from transformer.layernorm import
    ...`, `from transformer import layernorm` or `import transformer.layernorm`), as site_scripts/depends.py
    reads them. Imports inside a test (a negative control that patches a module) do not count, nor `import
    transformer` alone."""
    source = depends.Source(path.read_text(), root=root)
    return set(source.modules.values()) | {module for module, _ in source.names.values()}


def mutated_modules(mutant):
    """The package's modules a mutant edits ("layernorm" for transformer/layernorm.py)."""
    return {Path(path).stem for path in {e.path for e in mutant.edits} | {mutant.subject[0]}
            if Path(path).parent.name == PACKAGE}


def unit_test_files(root=ROOT, first=()):
    """Every test file under tests/unit: a module of `first`'s own (test_nf4.py for nf4), then those that import
    one, then the rest, each in UNIT_TEST_ORDER, then by name. A mistake is caught by the first failing test, so a
    mutant of the worker processes, say, is seen by test_parallel.py at once instead of after a minute of the
    layers' tests."""
    files = sorted(p.relative_to(root).as_posix() for p in (root / UNIT_TESTS).rglob("test_*.py"))
    stale = set(UNIT_TEST_ORDER) - {Path(f).name for f in files}
    if stale:
        raise ValueError(f"UNIT_TEST_ORDER names {', '.join(sorted(stale))}, not under {UNIT_TESTS}")
    rank = {name: i for i, name in enumerate(UNIT_TEST_ORDER)}
    mutated = set(first)

    def kinship(f):  # 0: a mutated module's own tests, 1: they import one, 2: neither (or nothing is mutated)
        if not mutated:
            return 2
        if Path(f).stem.removeprefix("test_") in mutated:
            return 0
        return 1 if imported_modules(root / f, root) & mutated else 2
    return sorted(files, key=lambda f: (kinship(f), rank.get(Path(f).name, len(rank)), f))


def check_tests(copy, ctx):
    files = unit_test_files(copy, ctx.get("mutated", ()))
    result = run_pytest(copy, files, timeout=TIMEOUT_S, threads=1, launcher=ctx.get("launcher"))
    if result is None:
        return True, f"timed out after {TIMEOUT_S} s"
    if result.returncode == 0:
        return False, result.summary or "passed"
    if result.failures:
        reason = f" ({result.reasons[0]})" if result.reasons[0] else ""
        return True, f"first failure: {result.failures[0]}{reason}"
    return True, f"pytest exit status {result.returncode} ({crash_line(result)})"


def check_training(copy, ctx):
    out = copy / "run"
    result = run(copy, ctx, "train", "--corpus", str(CORPUS), "--out", str(out), *TRAINING)
    if result is None:
        return True, f"timed out after {TIMEOUT_S} s"
    if result.returncode != 0:
        return True, f"crashed ({crash_line(result)})"
    losses = [json.loads(line)["val_loss"] for line in (out / "metrics.jsonl").read_text().splitlines()
              if '"val_loss"' in line]
    loss, bar = losses[-1], ctx["bigram_loss"]
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
    V = tokenizer.vocab_size
    counts = np.ones((V, V))
    np.add.at(counts, (train[:-1], train[1:]), 1.0)
    probs = counts / counts.sum(axis=1, keepdims=True)
    return float(-np.log(probs[val[:-1], val[1:]]).mean())


def mutant_copy(mutant):
    """A temporary copy of the package and its unit tests with the mutant applied (None: unchanged)."""
    return project_copy(None if mutant is None else lambda copy: apply_mutant(mutant, copy))


def edit_spans(mutant):
    """For each edit: (its path, the unchanged source, its first and last line there), for tools/reached.py;
    None when an edit does not fit the unchanged source alone (it edits what an earlier edit wrote)."""
    spans = []
    for e in mutant.edits:
        source = (ROOT / e.path).read_text()
        try:
            line = apply_edit(source, e)[1]
        except ValueError:
            return None
        spans.append((e.path, source, line, line + e.old.count("\n")))
    return spans


def run_one(mutant, ctx, waiting):
    """Run every check against a copy with the mutant applied, in forks of a launcher borrowed from the queue
    `waiting` (tools/preloaded.py); return the results by check.

    The unchanged code (mutant None) records which functions each check's commands call, and hands each check's
    result and record to the mutants through ctx["baseline"] as soon as it has them; it runs the unit tests,
    which record nothing and take longest, last. A mutant takes the unchanged code's result of a check instead
    of running it when every edit lies in a function that run never called (tools/reached.py): the check would
    run the very same code. It does not wait for that result: a mutant that comes to a check before the
    unchanged code has finished it (the first of the run) runs the check, as a run of one job never does."""
    results, baseline = {}, ctx["baseline"]
    order = CHECKS if mutant else sorted(CHECKS, key=lambda c: c.name == "tests")
    spans = edit_spans(mutant) if mutant else None
    with lent(waiting) as launcher, mutant_copy(mutant) as copy:
        mutated = mutated_modules(mutant) if mutant else ()
        try:
            for check in order:
                if mutant is not None and baseline[check.name].done():
                    base = baseline[check.name].result()
                    never = None if base["caught"] or spans is None else unreached(spans, base["reached"])
                    if never:
                        results[check.name] = {"caught": False, "detail": base["detail"], "seconds": 0.0,
                                               "never_called": never}
                        continue
                records = [] if mutant is None else None
                start = time.perf_counter()
                caught, detail = CHECK_FUNCTIONS[check.name](
                    copy, {**ctx, "launcher": launcher, "mutated": mutated, "records": records})
                results[check.name] = {"caught": caught, "detail": detail,
                                       "seconds": round(time.perf_counter() - start, 1)}
                if mutant is None:
                    baseline[check.name].set_result({**results[check.name], "reached": merged(records)})
        except BaseException as e:
            if mutant is None:  # the mutants waiting for these results would wait for ever
                for future in baseline.values():
                    if not future.done():
                        future.set_exception(e)
            raise
    return {c.name: results[c.name] for c in CHECKS}


# ---------------------------------------------------------------- the whole run, and its cache

def selected(names=None, quick=False):
    by_name = {m.name: m for m in MUTANTS}
    unknown = [n for n in names or [] if n not in by_name]
    if unknown:
        raise SystemExit(f"error: no mutant named {', '.join(unknown)} (see --list)")
    if names:
        return [by_name[n] for n in names]
    return [by_name[n] for n in QUICK] if quick else list(MUTANTS)


def mutant_record(mutant, results):
    caught_by = [c.name for c in CHECKS if results[c.name]["caught"]]
    path, function = mutant.subject
    return {"name": mutant.name, "subject": {"path": path, "function": function}, "breaks": mutant.breaks,
            "uncatchable": mutant.uncatchable,
            "edits": [{"path": e.path, "function": e.function, "line": line, "old": e.old, "new": e.new}
                      for e, line in zip(mutant.edits, edit_lines(mutant), strict=True)],
            "results": results, "caught_by": caught_by,
            "gap": not caught_by and not mutant.uncatchable}


def run_all(mutants, jobs=None, log=print):
    """Run the unchanged code, then every mutant, through every check. Returns the report."""
    ensure_corpus()
    ctx = {"bigram_loss": bigram_loss(), "baseline": {c.name: Future() for c in CHECKS}}
    start = time.perf_counter()
    jobs = jobs or cores()
    with launchers(jobs) as waiting, ThreadPoolExecutor(jobs) as pool:  # each check forks a worker's launcher
        baseline = pool.submit(run_one, None, ctx, waiting)
        futures = [(m, pool.submit(run_one, m, ctx, waiting)) for m in mutants]
        base = baseline.result()
        wrong = {name: r["detail"] for name, r in base.items() if r["caught"]}
        if wrong:
            for _, f in futures:
                f.cancel()
            raise RuntimeError("the checks fail on the unchanged code, so they cannot judge a mutant: "
                               + "; ".join(f"{k}: {v}" for k, v in wrong.items()))
        log(f"{'unchanged code':<36} passes every check")
        records = []
        for mutant, future in futures:
            record = mutant_record(mutant, future.result())
            records.append(record)
            log(f"{mutant.name:<36} {status_text(record)}")
    return {"checks": [c.__dict__ for c in CHECKS], "bigram_loss": ctx["bigram_loss"], "baseline": base,
            "mutants": records, "seconds": round(time.perf_counter() - start), "jobs": jobs,
            "training_args": TRAINING}


def status_text(record):
    if record["caught_by"]:
        return "caught by " + ", ".join(record["caught_by"])
    return "not caught (no check can see it)" if record["uncatchable"] else "SURVIVED"


def ensure_corpus():
    """Put the corpus in place, verified against the SHA-256 that scripts/fetch_corpus.py pins (it copies or
    downloads it when it is missing or another file). Only a run calls this, right before it starts."""
    subprocess.run([sys.executable, str(FETCH_CORPUS)], check=True)


def pinned_corpus_digest():
    """The SHA-256 that scripts/fetch_corpus.py requires of the corpus, read from its source (not run): a
    run trains on exactly that file (ensure_corpus), so the key needs no corpus at hand."""
    for node in ast.parse(FETCH_CORPUS.read_text()).body:
        if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == ["SHA256"]:
            return ast.literal_eval(node.value)
    raise ValueError(f"{FETCH_CORPUS.relative_to(ROOT)} pins no SHA256")


# What a run's outcome depends on, besides the versions: the copied code and unit tests (with their
# fixtures), these tools, and the script that pins the corpus's digest. The site's mutants page names
# the same paths in its registry entry (a site test checks it).
REPORT_INPUTS = ("transformer", "pyproject.toml", UNIT_TESTS, "tools/mutants.py", "tools/mutant_catalogue.py",
                 "tools/project_copy.py", "tools/preloaded.py", "tools/reached.py", "scripts/fetch_corpus.py",
                 "site_scripts/depends.py")  # it reads the test files' imports (unit_test_files)


def report_key(quick):
    """A hash of everything a run's outcome depends on (REPORT_INPUTS, the corpus by its pinned digest, the
    versions). Computing it reads files; it never fetches or writes."""
    files = [f for name in REPORT_INPUTS for f in ((sorted((ROOT / name).rglob("*.py")) if (ROOT / name).is_dir()
                                                    else [ROOT / name]))]
    parts = [part for path in files for part in (path.relative_to(ROOT).as_posix(), path.read_bytes())]
    return hash_parts(*parts, pinned_corpus_digest(), numpy_version(), torch_version(), f"quick={quick}")


def report_path(quick):
    return CACHE / f"mutants-{'quick' if quick else 'full'}.json"


def report(quick=False, jobs=None, force=False, log=print):
    """The report of the whole (or quick) run: the stored one while its key is current, else a new run's.
    A report is whole or absent (cached_json writes it beside its place, then renames it)."""
    return cached_json(report_path(quick), report_key(quick),
                       lambda: {**run_all(selected(quick=quick), jobs, log), "quick": quick}, force)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--list", action="store_true", help="list the mutants and exit")
    parser.add_argument("--quick", action="store_true", help="only the mutants of QUICK")
    parser.add_argument("--only", nargs="+", metavar="NAME", help="only these mutants (not cached)")
    parser.add_argument("--force", action="store_true", help="rerun even when the cached report is current")
    parser.add_argument("-j", "--jobs", type=positive_int, default=None,
                        help=f"mutants run at once (default: the cores this process may use, {cores()} here)")
    parser.add_argument("--json", type=Path, help="also write the report here")
    args = parser.parse_args()
    if args.list:
        for m in MUTANTS:
            lines = ", ".join(f"{e.path}:{line}" for e, line in zip(m.edits, edit_lines(m), strict=True))
            print(f"{m.name:<36} {lines}")
        return 0
    try:
        if args.only:
            result = run_all(selected(args.only), args.jobs)
        else:
            printed = []
            result = report(args.quick, args.jobs, args.force, log=lambda line: printed.append(print(line, flush=True)))
            if not printed:  # the report came from the cache: show its lines too
                print(f"(the cached report of {report_path(args.quick).relative_to(ROOT)}, current for this code)")
                for record in result["mutants"]:
                    print(f"{record['name']:<36} {status_text(record)}")
    except (RuntimeError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    records = result["mutants"]
    caught = sum(bool(r["caught_by"]) for r in records)
    gaps = [r["name"] for r in records if r["gap"]]
    taken = sum("never_called" in res for r in records for res in r["results"].values())
    print(f"{caught} of {len(records)} mutants caught in {result['seconds']} s with {result['jobs']} jobs; "
          f"{len(records) - caught - len(gaps)} that no check can see; "
          f"survivors: {', '.join(gaps) or 'none'}; {taken} of {len(records) * len(CHECKS)} checks took the "
          "unchanged code's result (their command never called the code the mutant changes)")
    return 1 if gaps else 0


if __name__ == "__main__":
    sys.exit(main())
