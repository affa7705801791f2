"""Which unit tests check a function, as the pages say it: measured by tools/checked_by.py, which runs every unit
test that calls the function with the function's output made wrong and records which tests fail.

The measurements live in reports/checked-by.json, kept in the repository: the build brings it up to date for
the functions the pages explain (build.Plan asks for it before any page), which measures again only what an
edit can have changed. A page's cache key holds the report's entries for its own functions (key_text), so a
page reruns when what it prints changed.
"""

import json

from tools import checked_by as tool
from tools.perturbations import RULES

from . import registry
from .common import md_table
from .schedule import jobs_from_env

_memo = {}
LONG = 8  # a list longer than this is folded (a details block the reader opens)


def explained_units():
    """Every "module:name" the pages explain, in the registry's order."""
    return list(dict.fromkeys(unit for page in registry.PAGES for unit in page.functions))


def report(log=print):
    """The report, brought up to date for the functions the pages explain (once per process)."""
    if "report" not in _memo:
        _memo["report"] = tool.update(explained_units(), jobs=jobs_from_env(), log=log)  # scripts/site --jobs
    return _memo["report"]


def record(unit):
    """The report's entry for a "module:name" unit (its value), or None when it holds none."""
    entry = report().entries.get(unit)
    return entry and entry["value"]


def key_text(units):
    """The report's entries for the units, without how long measuring them took (which no page prints), and the
    perturbation rules' wording (which checked_md prints): what a page's cache key holds of the report."""
    stored = tool.KeyedReport(tool.REPORT).entries
    printed = {u: {k: v for k, v in stored[u]["value"].items() if k != "seconds"} if u in stored else None
               for u in sorted(units)}
    return json.dumps({"units": printed, "rules": RULES}, sort_keys=True)


def by_function(tests):
    """{(file, test function): [parameter ids]} of pytest ids, in order."""
    found = {}
    for test in tests:
        path, name = test.split("::", 1)
        function, _, case = name.partition("[")
        found.setdefault((path, function), []).append(case.rstrip("]"))
    return found


def test_names(groups, all_cases):
    """`test` or `test` (cases a, b) when only some of its cases are in the group."""
    out = []
    for (path, function), cases in groups.items():
        partial = [c for c in cases if c] if len(cases) < len(all_cases[path, function]) else []
        out.append(f"`{function}`" + (f" (cases {', '.join(partial)})" if partial else ""))
    return out


def folded(title, text, count):
    """The text as it is, or folded under a title when it lists more than LONG things."""
    if count <= LONG:
        return text
    return f'??? note "{title}"\n\n' + "".join(f"    {line}\n" if line else "\n" for line in text.splitlines()) + "\n"


def rules_text(entry):
    rules = "; ".join(RULES[r] for r in entry["rules"])
    untouched = entry["untouched"]
    return rules + (f" (left as they are: {', '.join(untouched)})" if untouched else "")


def checked_md(unit, mentions):
    """What a page says under a function about the tests that check it. `mentions`: the unit tests that name
    it in their code (site_scripts/code_facts.py), the only thing said where nothing was measured."""
    entry = record(unit)
    if entry is None or not entry["measured"]:
        why = entry["reason"] if entry else "no measurement holds it"
        named = ", ".join(dict.fromkeys(f"`{t.function}`" for t in mentions))
        return (f"Checked by: **not measured**: {why}."
                + (f" Unit tests that name it in their code (read, not measured): {named}." if named else "") + "\n")
    every = by_function(entry["tests"])
    failing = by_function(entry["failed"])
    passing = by_function([t for t in entry["tests"] if t not in entry["failed"]])
    out = [f"Of the {len(every)} unit tests that call it, directly or not, **{len(failing)} "
           f"{'fails' if len(failing) == 1 else 'fail'}** when its output is perturbed: {rules_text(entry)}.\n"]
    if failing:
        rows = [[name, f"`pytest {path}::{function}`"]
                for name, (path, function) in zip(test_names(failing, every), failing)]
        table = md_table(["Checked by (measured: fails when its output is perturbed)", "Run it"], rows)
        out.append(folded(f"Checked by: the {len(rows)} tests that fail when its output is perturbed", table,
                          len(rows)))
    if passing:
        names = ", ".join(test_names(passing, every))
        out.append(folded(f"Uses it: {len(passing)} tests", f"Uses it (calls it, and passes with its output "
                          f"perturbed): {names}.\n", len(passing)))
    if entry["hung"]:
        names = ", ".join(test_names(by_function(entry["hung"]), every))
        out.append(f"Of the tests that fail, {names} hung with the perturbation: stopped at a limit far beyond "
                   "its time or its number of calls without it (a loop that the wrong value never lets end).\n")
    if entry["outside"]:
        out.append(f"It was also called {entry['outside']} times outside any test (as a test module was imported): "
                   "what such a call returns reaches that module's tests unseen by this measurement.\n")
    if entry["not_run"]:
        out.append(f"{len(entry['not_run'])} of the tests were not run (the run stopped at its overall time limit), "
                   "and count neither way.\n")
    return "\n".join(out)


def lead_md(link):
    """The paragraph above the functions: what "checked by" means here. `link`: to the explanation."""
    return ("\"Checked by\" is measured ([how]({link})): every unit test that calls the function was run with the "
            "function's output made wrong, and the tests that failed check it. A test that passes may still check a "
            "property the perturbation keeps: a causality test compares the function with itself, and both sides "
            "are scaled alike.\n").format(link=link)
