"""The pytest plugin of tools/checked_by.py: it wraps functions and classes of the package while the tests run.

    CHECKED_BY_MODE=trace|perturb|control CHECKED_BY_UNITS=model:forward,... CHECKED_BY_OUT=run.jsonl \\
        python -m pytest -p tools.checked_by_plugin tests/unit ...

Each unit ("module:name" of the transformer package) is wrapped before the test modules are imported: a function
in its module and wherever a module of the project holds it (a name imported with `from ... import`, a table
such as a dict of functions), a class in every method it defines. What the wrapper does with what the function
returns (tools/perturbations.py) depends on the mode:

- trace: hands it on as it is, and records which tests call which units (directly, or through a fixture set
  up for several tests) and which rules would apply (for a unit that returns nothing, whether it changes
  arrays among its arguments);
- perturb: hands it on made wrong, and records which tests fail;
- control: hands on copies with nothing changed (the negative control: no test may fail).

One JSON line per test goes to CHECKED_BY_OUT (a worker of pytest-xdist adds its name), written as the test
ends, then one line of what the rules did to each unit. CHECKED_BY_TESTS (a file, a test id a line, each
optionally followed by a tab, a time limit in seconds, a tab and the most calls of the units it may make) keeps
only those tests; a test that runs past either limit is stopped and recorded as hung.
The units of CHECKED_BY_IN_PLACE (those that return nothing) have what they change in their
arguments perturbed instead, after each call. In every mode a training step's shards run in threads, never in
worker processes, which would compute outside the wrappers (`shards_in_threads`).
"""

import functools
import importlib
import json
import os
import pkgutil
import signal
import sys
import time
from pathlib import Path

import pytest

from tools.perturbations import changed_in_place, perturb, rules_for, snapshot

PACKAGE = "transformer"
# The dunder methods a class's wrapper covers besides its named methods (the others, __repr__, __eq__ and
# the like, say nothing about what the class computes).
DUNDERS = ("__init__", "__call__", "__len__", "__getitem__", "__iter__")


class Recorder:
    """Who called what (trace), what failed (perturb), and what the rules did to each unit's outputs."""

    def __init__(self, mode, out, in_place=()):
        self.mode, self.out, self.in_place = mode, out, set(in_place)
        self.context = []  # the test, then any fixture being set up above function scope
        self.calls, self.stray = {}, {}  # context -> {unit: calls}; unit -> calls outside any test
        self.budget, self.spent = None, 0  # the most calls the running test may make (perturb), and its count
        self.rules = {}  # unit -> {"calls": n, "rules": set, "untouched": set}

    def watches(self, unit):
        """Whether to look for what a call changes in its arguments: for the units of CHECKED_BY_IN_PLACE, and
        in the trace for a unit whose outputs so far held nothing a rule can change."""
        if self.mode == "trace":
            return unit in self.rules and not self.rules[unit]["rules"]
        return unit in self.in_place

    def output(self, unit, value, in_place=()):
        if self.context:
            calls = self.calls.setdefault(self.context[-1], {})
            calls[unit] = calls.get(unit, 0) + 1
            self.spent += 1
            if self.budget is not None and self.spent > self.budget:
                STATE["hung"] = True
                raise Hung(f"{unit} was called more than {self.budget} times, far more than unperturbed")
        else:
            self.stray[unit] = self.stray.get(unit, 0) + 1
        seen = self.rules.setdefault(unit, {"calls": 0, "rules": set(), "untouched": set()})
        seen["calls"] += 1
        if self.mode == "trace":
            if seen["rules"]:  # what the trace needs of the rules: whether any output holds something to change
                return value
            rules, untouched = rules_for(value)
        else:
            done = perturb(value, change=self.mode == "perturb")
            rules, untouched, value = done.rules, done.untouched, done.value
        seen["rules"] |= rules | set(in_place)
        seen["untouched"] |= untouched
        return value

    def write(self, record):
        with open(self.out, "a") as f:
            f.write(json.dumps(record, sort_keys=True) + "\n")


def wrap_function(fn, unit, recorder, method=False):
    """The wrapper of a function, or of a method of a class (whose outputs are its methods' returns: it is never
    watched for changes in place, and its `self` is half made in __init__)."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        if method or not recorder.watches(unit):
            return recorder.output(unit, fn(*args, **kwargs))
        before = snapshot((args, kwargs))
        value = fn(*args, **kwargs)
        change = None if recorder.mode == "trace" else recorder.mode == "perturb"
        return recorder.output(unit, value, changed_in_place(before, change))

    return wrapper


def wrap_class(cls, unit, recorder):
    """Wrap every method the class defines (properties, static and class methods included), in place."""
    for name, attr in list(vars(cls).items()):
        if name.startswith("__") and name not in DUNDERS:
            continue
        if isinstance(attr, (staticmethod, classmethod)):
            setattr(cls, name, type(attr)(wrap_function(attr.__func__, unit, recorder, method=True)))
        elif isinstance(attr, property) and attr.fget is not None:
            setattr(cls, name, attr.getter(wrap_function(attr.fget, unit, recorder, method=True)))
        elif callable(attr) and not isinstance(attr, type):
            setattr(cls, name, wrap_function(attr, unit, recorder, method=True))


def project_modules(root):
    """The loaded modules whose file is under the project root: the package, the conftest files, the tests."""
    for module in list(sys.modules.values()):
        path = getattr(module, "__file__", None)
        if path and Path(path).resolve().is_relative_to(root):
            yield module


def replaced(value, old, new):
    """`value` with `old` replaced by `new` where it holds it: itself, or inside a tuple, list or dict."""
    if value is old:
        return new
    if isinstance(value, tuple) and any(v is old for v in value):
        return type(value)(replaced(v, old, new) for v in value)
    if isinstance(value, list):
        for i, v in enumerate(value):
            if replaced(v, old, new) is not v:
                value[i] = replaced(v, old, new)
    elif isinstance(value, dict):
        for key, v in value.items():
            if replaced(v, old, new) is not v:
                value[key] = replaced(v, old, new)
    return value


def install(units, recorder, root):
    """Import the whole package, then wrap each unit everywhere the project's modules hold it. Returns the
    functools caches of the package (emptied before each test, so that each test computes what it uses)."""
    package = importlib.import_module(PACKAGE)
    for info in pkgutil.iter_modules(package.__path__):
        if info.name != "__main__":
            importlib.import_module(f"{PACKAGE}.{info.name}")
    caches = [v for m in project_modules(root) if m.__name__.startswith(PACKAGE)
              for v in vars(m).values() if hasattr(v, "cache_clear")]
    for unit in units:
        module, name = unit.split(":")
        original = getattr(sys.modules[f"{PACKAGE}.{module}"], name)
        if isinstance(original, type):
            wrap_class(original, unit, recorder)
            continue
        wrapper = wrap_function(original, unit, recorder)
        for m in project_modules(root):
            for key, value in list(vars(m).items()):
                if not key.startswith("__") and replaced(value, original, wrapper) is not value:
                    setattr(m, key, replaced(value, original, wrapper))
    return caches


MODES = ("trace", "perturb", "control")
STATE = {}


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config):
    mode = os.environ.get("CHECKED_BY_MODE")
    if mode not in MODES:
        raise pytest.UsageError(f"CHECKED_BY_MODE must be one of {', '.join(MODES)}, got {mode!r}")
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    out = os.environ["CHECKED_BY_OUT"] + (f".{worker}" if worker else "")
    recorder = Recorder(mode, out, [u for u in os.environ.get("CHECKED_BY_IN_PLACE", "").split(",") if u])
    units = [u for u in os.environ.get("CHECKED_BY_UNITS", "").split(",") if u]
    keep = os.environ.get("CHECKED_BY_TESTS")
    STATE.update(recorder=recorder, caches=install(units, recorder, Path(config.rootpath).resolve()),
                 keep=dict(line.partition("\t")[::2] for line in Path(keep).read_text().splitlines()) if keep else None,
                 outcomes={})
    shards_in_threads()
    try:  # a failing property test must not spend minutes shrinking its example
        from hypothesis import Phase, settings

        settings.register_profile("checked-by", phases=[Phase.explicit, Phase.reuse, Phase.generate], database=None)
        settings.load_profile("checked-by")
    except ImportError:
        pass


def shards_in_threads():
    """Keep a training step's shards out of worker processes (transformer/shard_processes.py), as on a machine
    without them: a worker imports the package without the wrappers, so it would compute its shards right while
    the test's own shard is perturbed, and its calls would not be traced. The tests that compare worker processes
    with threads then skip; perturbing a unit alike in both, as here, could not make them fail."""
    try:
        from transformer import shard_processes
    except ImportError:  # a package without worker processes (the fake one of tests/site/test_checked_by.py)
        return
    shard_processes.supported = lambda: False


def pytest_collection_modifyitems(config, items):
    keep = STATE["keep"]
    if keep is not None:
        config.hook.pytest_deselected(items=[i for i in items if i.nodeid not in keep])
        items[:] = [i for i in items if i.nodeid in keep]


@pytest.hookimpl(wrapper=True)
def pytest_fixture_setup(fixturedef, request):
    """Calls made while a fixture wider than one test is set up belong to that fixture: every test using it."""
    recorder = STATE["recorder"]
    wide = fixturedef.scope != "function"
    if wide:
        recorder.context.append(fixture_key(fixturedef))
    try:
        return (yield)
    finally:
        if wide:
            recorder.context.pop()


def fixture_key(fixturedef):
    return f"fixture {fixturedef.baseid}::{fixturedef.argname}"


class Hung(BaseException):
    """A test that a perturbation made hang: it ran past its time limit, or called the unit far more often than
    without the perturbation (a loop that a wrong value never lets end). A BaseException, so that a test's own
    `except Exception` cannot swallow it."""


def time_out(signum, frame):
    STATE["hung"] = True
    raise Hung("the test ran past its time limit")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    recorder = STATE["recorder"]
    for cache in STATE["caches"]:
        cache.cache_clear()
    recorder.context.append(item.nodeid)
    limit, _, budget = (STATE["keep"] or {}).get(item.nodeid, "").partition("\t")
    recorder.budget, recorder.spent, STATE["hung"] = (int(budget) if budget else None), 0, False
    STATE["limit"] = float(limit) if limit else None
    start = time.perf_counter()
    try:
        return (yield)
    finally:
        recorder.context.pop()
        seconds = time.perf_counter() - start
        calls = recorder.calls.pop(item.nodeid, {})
        for name in item.fixturenames:
            for fixturedef in item._fixtureinfo.name2fixturedefs.get(name, ())[-1:]:
                for unit, n in recorder.calls.get(fixture_key(fixturedef), {}).items():
                    calls[unit] = calls.get(unit, 0) + n
        recorder.write({"test": item.nodeid, "outcome": STATE["outcomes"].pop(item.nodeid, "passed"),
                        "seconds": round(seconds, 3), "units": sorted(calls), "calls": calls})


def limited():
    """Each phase of a test (setup, call, teardown) may run for the test's time limit, then is stopped, and again
    every second after in case something catches that; the alarm is off outside the phases, where pytest
    writes its reports."""
    limit = STATE.get("limit")
    if limit:
        signal.signal(signal.SIGALRM, time_out)
        signal.setitimer(signal.ITIMER_REAL, limit, 1.0)
    try:
        return (yield)
    finally:
        if limit:
            signal.setitimer(signal.ITIMER_REAL, 0)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item):
    return (yield from limited())


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    return (yield from limited())


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item, nextitem):
    return (yield from limited())


def pytest_runtest_logreport(report):
    outcomes = STATE["outcomes"]
    if report.failed and STATE.get("hung"):
        outcomes[report.nodeid] = "hung"
    elif report.failed and outcomes.get(report.nodeid) != "hung":
        outcomes[report.nodeid] = "failed" if report.when == "call" else "error"
    elif report.skipped and report.nodeid not in outcomes:
        outcomes[report.nodeid] = "skipped"


def pytest_sessionfinish(session):
    recorder = STATE.get("recorder")
    if recorder is not None and (recorder.rules or recorder.stray):
        recorder.write({"units": {u: {"calls": r["calls"], "rules": sorted(r["rules"]),
                                      "untouched": sorted(r["untouched"])} for u, r in recorder.rules.items()},
                        "stray": recorder.stray})
