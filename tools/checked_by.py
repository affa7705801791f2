"""Which unit tests check each function the pages explain: those that fail when its output is made wrong.

For the functions and classes the site's pages explain (the `functions` of site_scripts/registry.py), in a
temporary copy of the package and its unit tests (tools/project_copy.py; the working tree is never touched):

1. trace: one run of the unit tests (tests/unit, `--jobs` pytest-xdist workers) with every unit wrapped by the
   pytest plugin tools/checked_by_plugin.py, which hands each output on unchanged and records which tests call
   which units, directly or not (through another function, or a fixture shared by several tests). Every test
   must pass there: a test that fails on the unchanged code could not tell us anything.
2. perturb: for each unit, one pytest process runs exactly the tests that call it, with the unit's output
   made wrong by the rules of tools/perturbations.py (floating-point numbers scaled by 1 + 1e-3, an int off by
   one, ...). The tests that fail check it; those that pass only use it. `--jobs` processes run at once,
   each with one BLAS thread, the longest first; each is a fork of a launcher that has imported torch and
   pytest once (tools/preloaded.py).

A unit that returns nothing is perturbed through what it changes in place (tools/perturbations.py). A unit that
no test calls, or that neither returns nor changes anything a rule can change, is reported as not measured,
with the reason. The report is cached in build/cache/ under a key of everything it depends on (REPORT_INPUTS,
the units, the versions); the site's pages read it (site_scripts/sections.py).

    python tools/checked_by.py                  # every unit: the cached report, or a new run
    python tools/checked_by.py --quick          # the units of QUICK, traced over QUICK_FILES only
    python tools/checked_by.py --only model:forward [...]   # these units (not cached)
    python tools/checked_by.py --control model:forward      # the negative control: copies, nothing changed
"""

import argparse
import json
import shutil
import sys
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

if __package__ in (None, ""):  # run as `python tools/checked_by.py`: import from the project root, as `-m` does
    sys.path[0] = str(Path(__file__).resolve().parent.parent)

from site_scripts.common import (CACHE, ROOT, cached_json, cores, hash_parts, numpy_version,  # noqa: E402
                                 positive_int, torch_version)
from tools.preloaded import launchers, lent  # noqa: E402
from tools.project_copy import UNIT_TESTS, project_copy, run_in  # noqa: E402

PLUGIN = ("tools/__init__.py", "tools/perturbations.py", "tools/checked_by_plugin.py")  # copied beside the package
REPORT_INPUTS = ("transformer", "pyproject.toml", UNIT_TESTS, "tools/checked_by.py", "tools/checked_by_plugin.py",
                 "tools/perturbations.py", "tools/project_copy.py", "tools/preloaded.py",
                 "tools/reached.py")  # the launcher imports it
# The quick run (SITE_QUICK=1, the tests' build): a few units of different kinds, traced over the test files that
# hold their own tests. The pages say which units it measured.
QUICK = ("model:forward", "layernorm:layer_norm_backward", "data:CharTokenizer", "nf4:pack", "optim:lr_at")
QUICK_FILES = ("test_model.py", "test_generate.py", "test_layers.py", "test_data.py", "test_nf4.py", "test_optim.py")
TIMEOUT_S = 900  # per process, beyond each test's own limit: tests that have not finished are reported as not run


def page_units():
    """Every "module:name" the pages explain, in the registry's order."""
    from site_scripts import registry

    return list(dict.fromkeys(unit for page in registry.PAGES for unit in page.functions))


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


def perturb(copy, unit, tests, mode="perturb", in_place=False, limits=None, launcher=None):
    """Run the tests that call `unit` with its output made wrong (mode control: copied, unchanged). in_place:
    for a unit that returns nothing, what it changes in its arguments instead. limits: {test: test_limits}.
    launcher: pytest runs in a fork of it, with torch imported already (tools/preloaded.py)."""
    name = unit.replace(":", ".")
    out, keep = copy / "runs" / f"{mode}-{name}.jsonl", copy / "runs" / f"{mode}-{name}.tests"
    limits = limits or {}
    keep.write_text("".join(f"{t}\t{limits.get(t, '')}\n" for t in tests))
    env = {"CHECKED_BY_MODE": mode, "CHECKED_BY_UNITS": unit, "CHECKED_BY_OUT": str(out),
           "CHECKED_BY_TESTS": str(keep), "CHECKED_BY_IN_PLACE": unit if in_place else ""}
    files = sorted({t.split("::")[0] for t in tests})
    start = time.perf_counter()
    timeout = TIMEOUT_S + sum(float(limits[t].split("\t")[0]) for t in tests if t in limits)
    result = run_in(copy, pytest_cmd(files), timeout=timeout, threads=1, env=env, launcher=launcher)
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


def run_all(units, files=(UNIT_TESTS,), jobs=None, log=print):
    """Trace, then perturb each unit that can be; returns the report."""
    jobs = jobs or cores()
    start = time.perf_counter()
    with project_copy(add_plugin, prefix="checked-by-") as copy:
        traced, rules = trace(copy, units, files, jobs)
        trace_seconds = time.perf_counter() - start
        log(f"traced {len(traced)} tests in {trace_seconds:.0f} s")
        cost = {u: sum(r["seconds"] for r in traced.values() if u in r["units"]) for u in units}
        todo = sorted((u for u in units if cost[u] and rules.get(u, {}).get("rules")), key=lambda u: -cost[u])
        calls = {u: sorted(t for t, r in traced.items() if u in r["units"]) for u in todo}  # the longest first
        in_place = {u for u in todo if "changed in place" in rules[u]["rules"]}  # it returns nothing to change
        runs = {}

        def perturbed(unit):  # in forks of a launcher the worker borrows
            with lent(waiting) as launcher:
                return perturb(copy, unit, calls[unit], in_place=unit in in_place,
                               limits={t: test_limits(traced[t], unit) for t in calls[unit]}, launcher=launcher)

        with launchers(jobs) as waiting, ThreadPoolExecutor(jobs) as pool:
            futures = {pool.submit(perturbed, u): u for u in todo}
            for future in as_completed(futures):
                unit, run = futures[future], future.result()
                runs[unit] = run
                log(f"{unit:<48} {len(run['failed'])} of {len(calls[unit])} tests fail ({run['seconds']:.0f} s)")
    report = {u: unit_record(u, traced, rules, runs.get(u)) for u in units}
    return {"units": report, "jobs": jobs, "files": list(files), "traced_tests": len(traced),
            "trace_seconds": round(trace_seconds), "seconds": round(time.perf_counter() - start)}


def report_key(quick):
    """A hash of everything a run's outcome depends on: REPORT_INPUTS, the units, the versions, the mode."""
    files = [f for name in REPORT_INPUTS for f in (sorted((ROOT / name).rglob("*.py")) if (ROOT / name).is_dir()
                                                    else [ROOT / name])]
    parts = [part for path in files for part in (path.relative_to(ROOT).as_posix(), path.read_bytes())]
    return hash_parts(*parts, *selected(quick), numpy_version(), torch_version(), f"quick={quick}")


def selected(quick):
    return [u for u in page_units() if u in QUICK] if quick else page_units()


def report_path(quick):
    return CACHE / f"checked-by-{'quick' if quick else 'full'}.json"


def report(quick=False, jobs=None, force=False, log=print):
    """The report of the whole (or quick) run: the stored one while its key is current, else a new run's."""
    files = [f"{UNIT_TESTS}/{f}" for f in QUICK_FILES] if quick else [UNIT_TESTS]
    return cached_json(report_path(quick), report_key(quick),
                       lambda: {**run_all(selected(quick), files, jobs, log), "quick": quick}, force)


def stored(quick):
    """The stored report as it is, current or not, or None: what a page's cache key reads (it never runs)."""
    path = report_path(quick)
    return json.loads(path.read_text())["value"] if path.exists() else None


def control(units, jobs=None, log=print):
    """The negative control: each unit's tests with its outputs copied and nothing changed. Returns
    {unit: tests that failed}, which must all be empty."""
    jobs = jobs or cores()
    with project_copy(add_plugin, prefix="checked-by-") as copy:
        traced, _ = trace(copy, units, [UNIT_TESTS], jobs)
        calls = {u: sorted(t for t, r in traced.items() if u in r["units"]) for u in units}

        def control_run(unit):
            with lent(waiting) as launcher:
                return perturb(copy, unit, calls[unit], "control", launcher=launcher)

        with launchers(jobs) as waiting, ThreadPoolExecutor(jobs) as pool:
            runs = dict(zip(units, pool.map(control_run, units)))
    for unit, run in runs.items():
        log(f"{unit:<48} control: {len(run['failed'])} of {len(calls[unit])} tests fail")
    return {unit: run["failed"] for unit, run in runs.items()}


def summary(result):
    units = result["units"].values()
    measured = [r for r in units if r["measured"]]
    checked = [r for r in measured if r["failed"]]
    return (f"{len(measured)} of {len(result['units'])} units measured, {len(checked)} of them checked by at least "
            f"one test; {result['traced_tests']} tests traced in {result['trace_seconds']} s; the whole run took "
            f"{result['seconds']} s with {result['jobs']} jobs")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="only the units of QUICK, traced over QUICK_FILES")
    parser.add_argument("--only", nargs="+", metavar="UNIT", help="only these units, module:name (not cached)")
    parser.add_argument("--control", nargs="+", metavar="UNIT", help="the negative control for these units")
    parser.add_argument("--force", action="store_true", help="rerun even when the cached report is current")
    parser.add_argument("-j", "--jobs", type=positive_int, default=None,
                        help=f"processes at once (default: the cores this process may use, {cores()} here)")
    parser.add_argument("--json", type=Path, help="also write the report here")
    args = parser.parse_args()
    unknown = [u for u in (args.only or []) + (args.control or []) if u not in page_units()]
    if unknown:
        parser.error(f"no page explains {', '.join(unknown)} (units are module:name of site_scripts/registry.py)")
    try:
        if args.control:
            return 1 if any(control(args.control, args.jobs).values()) else 0
        result = run_all(args.only, jobs=args.jobs) if args.only else report(args.quick, args.jobs, args.force)
    except RuntimeError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for unit, r in result["units"].items():
        what = (f"{len(r['failed'])} of {len(r['tests'])} calling tests fail ({', '.join(r['rules'])})"
                if r["measured"] else f"not measured: {r['reason']}")
        print(f"{unit:<48} {what}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    print(summary(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
