"""Which unit tests check each function the pages explain: those that fail when its output is made wrong.

For each unit ("module:name" of the package; the site build names the functions its pages explain), in a
temporary copy of the package and its unit tests (tools/project_copy.py; the working tree is never touched):

1. trace: one run of the unit tests (tests/unit, `--jobs` pytest-xdist workers) with every unit wrapped by the
   pytest plugin tools/checked_by_plugin.py, which hands each output on unchanged and records which tests call
   which units, directly or not (through another function, or a fixture shared by several tests). Every test
   must pass there: a test that fails on the unchanged code could not tell us anything. (tools/mutants.py takes
   this run as the unit tests of the unchanged code, beside a plain run of the tests it skipped.)
2. perturb: for each unit, one pytest process runs exactly the tests that call it, with the unit's output
   made wrong by the rules of tools/perturbations.py (floating-point numbers scaled by 1 + 1e-3, an int off by
   one, ...). The tests that fail check it; those that pass only use it. `--jobs` processes run at once,
   each with one BLAS thread, the longest first.

A unit that returns nothing is perturbed through what it changes in place (tools/perturbations.py). A unit that
no test calls, or that neither returns nor changes anything a rule can change, is reported as not measured,
with the reason.

The results live in reports/checked-by.json, kept in the repository (tools/keyed_report.py): one entry for the
trace, keyed on every package and test file, and one per unit, keyed on the unit's own source, the tests that
call it and the text of their files, the plugin and the environment. The trace runs again after any edit of the
package or the tests; a unit only when its key changed. CI recomputes a random sample of the reused units.

    python -m tools.checked_by                    # bring the report up to date for the units it holds
    python -m tools.checked_by --sample 3         # and measure 3 reused units again; a disagreement fails
    python -m tools.checked_by --force            # measure every unit again
    python -m tools.checked_by --control model:forward   # the negative control: copies, nothing changed
"""

import argparse
import ast
import inspect
import json
import os
import shutil
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed

from .common import ROOT, code_text, cores, environment, files_text, hash_parts, parse, positive_int, pytest_settings
from .keyed_report import KeyedReport
from .project_copy import UNIT_TESTS, project_copy, run_in

REPORT = ROOT / "reports" / "checked-by.json"
TRACE = "trace"  # the entry of the trace run
PLUGIN = ("tools/__init__.py", "tools/perturbations.py", "tools/checked_by_plugin.py")  # copied beside the package
TIMEOUT_S = 900  # per process, beyond each test's own limit: tests that have not finished are reported as not run
MEASURED_BY = ("tools/perturbations.py", "tools/checked_by_plugin.py")  # what a unit's result depends on, here
# One update at a time in a process: the site build brings this report up to date beside the mutation run, whose
# unit tests of the unchanged code are this report's trace (tools/mutants.py asks for it and waits here).
UPDATING = threading.Lock()


def add_plugin(copy):
    for path in PLUGIN:
        (copy / path).parent.mkdir(exist_ok=True)
        shutil.copy(ROOT / path, copy / path)


def pytest_cmd(args):
    return [sys.executable, "-m", "pytest", "-p", "tools.checked_by_plugin", "-q", "-p", "no:cacheprovider", *args]


def read_records(out):
    """The JSON lines a run wrote (one file per xdist worker): (test records, rules by unit)."""
    tests, rules = {}, {}
    for path in sorted(out.parent.glob(out.name + "*")):
        for line in path.read_text().splitlines():
            record = json.loads(line)
            if "test" in record:
                tests[record["test"]] = record
            else:
                for unit, seen in record["units"].items():
                    mine = rules.setdefault(unit, {"calls": 0, "rules": set(), "untouched": set(), "outside": 0})
                    mine["calls"] += seen["calls"]
                    mine["rules"] |= set(seen["rules"])
                    mine["untouched"] |= set(seen["untouched"])
                    mine["outside"] += record["stray"].get(unit, 0)  # calls outside any test: at import
    return tests, rules


def trace(copy, units, files, jobs):
    """One run of the tests with every unit wrapped and nothing changed: (test records, rules by unit)."""
    out = copy / "runs" / "trace.jsonl"
    out.parent.mkdir(exist_ok=True)
    env = {"CHECKED_BY_MODE": "trace", "CHECKED_BY_UNITS": ",".join(units), "CHECKED_BY_OUT": str(out)}
    workers = ["-n", str(jobs)] if jobs > 1 else []
    result = run_in(copy, pytest_cmd([*workers, *files]), timeout=TIMEOUT_S, threads=1, env=env)
    tests, rules = read_records(out)
    broken = [t for t, r in tests.items() if r["outcome"] in ("failed", "error")]
    if result is None or result.returncode not in (0, 5) or broken:
        why = ("it ran past the time limit" if result is None else f"pytest exit status {result.returncode}: "
               + (", ".join(broken[:5]) or (result.stdout + result.stderr)[-1500:]))
        raise RuntimeError(f"the unit tests fail with the units wrapped and nothing changed ({why}); they must "
                           "pass unchanged before they can tell which tests check what")
    return tests, rules


def test_limits(record, unit):
    """"seconds<TAB>calls": how long each phase of a test may run perturbed, and how many calls of the unit it may
    make, before it counts as hung (a loop that a wrong value never lets end). Generous, since only a hang
    should reach either and the machine may be busy: twenty and ten times what the trace measured, plus a
    margin. A loop that calls the unit stops at once at its budget of calls; one that does not, at the time."""
    return f"{round(30 + 20 * record['seconds'])}\t{1000 + 10 * record['calls'].get(unit, 0)}"


def perturb(copy, unit, tests, mode="perturb", in_place=False, limits=None):
    """Run the tests that call `unit` with its output made wrong (mode control: copied, unchanged). in_place:
    for a unit that returns nothing, what it changes in its arguments instead. limits: {test: test_limits}."""
    name = unit.replace(":", ".")
    out, keep = copy / "runs" / f"{mode}-{name}.jsonl", copy / "runs" / f"{mode}-{name}.tests"
    limits = limits or {}
    keep.write_text("".join(f"{t}\t{limits.get(t, '')}\n" for t in tests))
    env = {"CHECKED_BY_MODE": mode, "CHECKED_BY_UNITS": unit, "CHECKED_BY_OUT": str(out),
           "CHECKED_BY_TESTS": str(keep), "CHECKED_BY_IN_PLACE": unit if in_place else ""}
    files = sorted({t.split("::")[0] for t in tests})
    start = time.perf_counter()
    timeout = TIMEOUT_S + sum(float(limits[t].split("\t")[0]) for t in tests if t in limits)
    result = run_in(copy, pytest_cmd(files), timeout=timeout, threads=1, env=env)
    seconds = time.perf_counter() - start
    records, rules = read_records(out)
    if result is not None and result.returncode not in (0, 1):
        raise RuntimeError(f"{unit}: pytest exit status {result.returncode}: {(result.stdout + result.stderr)[-1500:]}")
    seen = rules.get(unit, {"calls": 0, "rules": set(), "untouched": set()})
    outcome = {t: records.get(t, {}).get("outcome") for t in tests}
    return {"failed": [t for t in tests if outcome[t] in ("failed", "error", "hung")],
            "hung": [t for t in tests if outcome[t] == "hung"],
            "not_run": [t for t in tests if not outcome[t]],
            "calls": seen["calls"], "rules": sorted(seen["rules"]), "untouched": sorted(seen["untouched"]),
            "seconds": round(seconds, 1)}


def unit_record(unit, traced, rules, run):
    """What the report says of one unit: the tests that call it, those that fail when it is wrong, or why it
    was not measured."""
    calling = sorted(t for t, r in traced.items() if unit in r["units"])
    record = {"tests": calling, "failed": [], "measured": False, "reason": "", "rules": [], "untouched": [],
              "seconds": 0.0, "not_run": [], "hung": [], "outside": rules.get(unit, {}).get("outside", 0)}
    if not calling:
        record["reason"] = "no unit test calls it in the test process (a command run in a subprocess is not traced)"
        return record
    if run is None:
        seen = rules.get(unit, {"untouched": set()})
        record["untouched"] = sorted(seen["untouched"])
        record["reason"] = (f"it returns nothing a rule can change ({', '.join(record['untouched']) or 'None'}), "
                            "and changes no array among its arguments")
        return record
    record.update({k: run[k] for k in ("rules", "untouched", "seconds")})
    if not run["rules"]:  # the trace saw something to change, the perturbed run did not: nothing was measured
        record["reason"] = "its calls in the perturbed run returned nothing a rule can change"
        return record
    record.update(measured=True, failed=run["failed"], not_run=run["not_run"], hung=run["hung"])
    return record


def unit_source(unit, root=ROOT):
    """The source of a unit ("module:name"): its top-level function or class."""
    module, name = unit.split(":")
    path = root / "transformer" / f"{module}.py"
    source = path.read_text()
    node = next((n for n in parse(source).body if getattr(n, "name", None) == name), None)
    if node is None:
        raise ValueError(f"transformer/{module}.py defines no {name}")
    return ast.get_source_segment(source, node)


def trace_summary(traced, seconds):
    """What the report keeps of the trace: how many tests ran and how long, and the tests that skipped (those that
    need worker processes, which the trace keeps out, among them): tools/mutants.py runs those plainly, its unit
    tests of the unchanged code being this trace and that run."""
    return {"tests": len(traced), "seconds": round(seconds),
            "skipped": sorted(t for t, r in traced.items() if r["outcome"] == "skipped")}


def trace_key(units, root):
    """What the trace depends on: every package and test file, the plugin, the environment, the units and what
    is kept of it (the code of the .py files: which test calls which function does not change with their words)."""
    return hash_parts(environment(), files_text("transformer", UNIT_TESTS, *PLUGIN, root=root, code=True),
                      pytest_settings(root), *sorted(units), code_text(inspect.getsource(trace_summary)))


def unit_key(unit, calling, root):
    """What a unit's result depends on: its own source, the tests that call it and their files, the tools."""
    files = sorted({t.split("::")[0] for t in calling})
    return hash_parts(environment(), code_text(unit_source(unit, root)), *calling,
                      files_text(*files, *MEASURED_BY, root=root, code=True))


def measure(copy, units, todo, jobs, log, files=(UNIT_TESTS,)):
    """In the copy (with the plugin): trace the tests of `files`, then perturb each unit that `todo(calling tests by
    unit)` names and that can be; returns ({unit: record}, a summary of the trace, the calling tests by unit)."""
    start = time.perf_counter()
    traced, rules = trace(copy, units, list(files), jobs)
    summary = trace_summary(traced, time.perf_counter() - start)
    log(f"traced {len(traced)} tests in {summary['seconds']} s")
    calls = {u: sorted(t for t, r in traced.items() if u in r["units"]) for u in units}
    todo = [u for u in todo(calls)]
    cost = {u: sum(traced[t]["seconds"] for t in calls[u]) for u in todo}
    runnable = sorted((u for u in todo if cost[u] and rules.get(u, {}).get("rules")), key=lambda u: -cost[u])

    def perturbed(unit):
        return perturb(copy, unit, calls[unit], in_place="changed in place" in rules[unit]["rules"],
                       limits={t: test_limits(traced[t], unit) for t in calls[unit]})

    runs = {}
    with ThreadPoolExecutor(jobs) as pool:
        futures = {pool.submit(perturbed, u): u for u in runnable}
        for future in as_completed(futures):
            unit, run = futures[future], future.result()
            runs[unit] = run
            log(f"{unit:<48} {len(run['failed'])} of {len(calls[unit])} tests fail ({run['seconds']:.0f} s)")
    return {u: unit_record(u, traced, rules, runs.get(u)) for u in todo}, summary, calls


def update(units=None, force=False, jobs=None, log=print, path=REPORT, source=ROOT):
    """Bring the report (reports/checked-by.json) up to date for `units` (default: those it holds): trace the
    tests when the package or the tests changed, then measure every unit whose key changed (all with force). The
    keys and the runs read one copy of the tree (`source`: the working tree, or a copy of it), taken when the run
    starts. Returns the report."""
    with UPDATING:
        return _update(units, force, jobs, log, path, source)


def _update(units, force, jobs, log, path, source):
    report = KeyedReport(path)
    units = list(units or [u for u in report.entries if u != TRACE])
    report.keep_only([TRACE, *units])
    stored = {u: report.entries[u]["value"]["tests"] for u in units if u in report.entries}
    with project_copy(add_plugin, prefix="checked-by-", source=source) as copy:
        fresh = not force and set(stored) == set(units) and report.current(TRACE, trace_key(units, copy)) is not None \
            and all(report.current(u, unit_key(u, stored[u], copy)) is not None for u in units)
        if not fresh:
            def todo(calls):
                return [u for u in units if force or report.current(u, unit_key(u, calls[u], copy)) is None]
            records, summary, calls = measure(copy, units, todo, jobs or cores(), log)
            report.put(TRACE, trace_key(units, copy), summary)
            for unit, record in records.items():
                report.put(unit, unit_key(unit, calls[unit], copy), record)
    report.save()
    return report


def verify_sample(report, count, seed, jobs=None, log=print):
    """Measure `count` reused units again; return those whose tests or verdicts differ from the stored ones."""
    names = report.sample(count, seed)
    names = [n for n in names if n != TRACE]
    log(f"measuring {len(names)} reused units again (seed {seed}): {', '.join(names)}")
    if not names:
        return []
    units = [u for u in report.entries if u != TRACE]
    with project_copy(add_plugin, prefix="checked-by-") as copy:
        records, _, _ = measure(copy, units, lambda calls: names, jobs or cores(), log)
    fields = ("tests", "failed", "measured", "hung", "not_run")
    return [f"{u}: stored {[report.entries[u]['value'][f] for f in fields]}, now {[records[u][f] for f in fields]}"
            for u in names if any(records[u][f] != report.entries[u]["value"][f] for f in fields)]


def control(units, jobs=None, log=print):
    """The negative control: each unit's tests with its outputs copied and nothing changed. Returns
    {unit: tests that failed}, which must all be empty."""
    jobs = jobs or cores()
    with project_copy(add_plugin, prefix="checked-by-") as copy:
        traced, _ = trace(copy, units, [UNIT_TESTS], jobs)
        calls = {u: sorted(t for t, r in traced.items() if u in r["units"]) for u in units}
        with ThreadPoolExecutor(jobs) as pool:
            runs = dict(zip(units, pool.map(lambda u: perturb(copy, u, calls[u], "control"), units)))
    for unit, run in runs.items():
        log(f"{unit:<48} control: {len(run['failed'])} of {len(calls[unit])} tests fail")
    return {unit: run["failed"] for unit, run in runs.items()}


def summary(report):
    units = [e["value"] for name, e in report.entries.items() if name != TRACE]
    measured = [r for r in units if r["measured"]]
    return (f"{len(measured)} of {len(units)} units measured, {sum(bool(r['failed']) for r in measured)} of them "
            f"checked by at least one test; {len(report.computed)} entries computed now, {len(report.reused())} "
            "reused from reports/checked-by.json")


def main():
    parser = argparse.ArgumentParser(prog="python -m tools.checked_by", description=__doc__.splitlines()[0])
    parser.add_argument("--units", nargs="+", metavar="UNIT", help="measure these units (module:name) instead of "
                        "those the report holds (the site build passes the ones its pages explain)")
    parser.add_argument("--control", nargs="+", metavar="UNIT", help="the negative control for these units")
    parser.add_argument("--force", action="store_true", help="measure every unit again")
    parser.add_argument("--sample", type=int, default=0, metavar="N",
                        help="then measure N reused units again and compare (CI does)")
    parser.add_argument("--seed", type=int, default=None, help="which units --sample draws (default: random)")
    parser.add_argument("-j", "--jobs", type=positive_int, default=None,
                        help=f"processes at once (default: the cores this process may use, {cores()} here)")
    args = parser.parse_args()
    try:
        for unit in (args.units or []) + (args.control or []):
            unit_source(unit)
        if args.control:
            return 1 if any(control(args.control, args.jobs).values()) else 0
        report = update(args.units, args.force, args.jobs)
        seed = args.seed if args.seed is not None else int.from_bytes(os.urandom(4), "little")
        differ = verify_sample(report, args.sample, seed, args.jobs) if args.sample else []
    except (RuntimeError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for unit, entry in report.entries.items():
        r = entry["value"]
        if unit != TRACE:
            what = (f"{len(r['failed'])} of {len(r['tests'])} calling tests fail ({', '.join(r['rules'])})"
                    if r["measured"] else f"not measured: {r['reason']}")
            print(f"{unit:<48} {what}")
    print(summary(report))
    for line in differ:
        print(f"DISAGREES: {line}")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
