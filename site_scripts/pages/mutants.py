"""Generator of the "Are the checks good enough?" page: the report of tools/mutants.py.

The report is the cached result of running every check against every mutant; it is rerun whenever the package,
the tests or the tool change, so the page always describes the code it is built with. In quick mode (SITE_QUICK=1,
the test build) only the mutants of QUICK run, and the page says so.
"""

import html
import re

from tools import mutants as tool

from .. import sections
from ..common import ROOT, mode
from ..schedule import jobs_from_env

PAGE = "mutants"


def plain(text):
    """A check's own words (a test's exception, say) as Markdown that shows them as they are: no tags, no
    emphasis, no math."""
    return re.sub(r"([\\`*_\[\]$])", r"\\\1", html.escape(text, quote=False))


def anchor(name):
    return f"m-{name}"


def mutant_page(record):
    """The page that lists the function the mutant is in (the tool names the function, the site its page)."""
    path, function = record["subject"]["path"], record["subject"]["function"]
    page = sections.function_page(path, function)
    if page is None:
        raise LookupError(f"mutant {record['name']} is in {path}:{function}, which no page lists")
    return page


def check_titles(report):
    return {c["name"]: c["title"] for c in report["checks"]}


def summary_md(report, total):
    records = report["mutants"]
    caught = [r for r in records if r["caught_by"]]
    unseen = [r for r in records if not r["caught_by"] and r["uncatchable"]]
    gaps = [r for r in records if r["gap"]]
    banner = (f'!!! warning "Quick run"\n    This build ran {len(records)} of the {total} mutants (SITE_QUICK=1, '
              "as the test suite builds the site). `scripts/site` runs them all.\n\n") if mode() == "quick" else ""
    return banner + (f"**{len(caught)} of {len(records)} mutants caught** by at least one check. "
                     f"{len(unseen)} {'is' if len(unseen) == 1 else 'are'} invisible to every check by nature (below, "
                     f"with the reason), and **{len(gaps)} survived** as a gap. The unchanged code passed all "
                     f"{len(report['checks'])} checks first, in the same run, so every catch below is the mutant's "
                     "doing.\n")


def checks_md(report):
    records = report["mutants"]
    rows = []
    for c in report["checks"]:
        caught = [r for r in records if c["name"] in r["caught_by"]]
        alone = [r for r in caught if r["caught_by"] == [c["name"]]]
        rows.append([f"**{c['title']}**", c["what"], f"{len(caught)} of {len(records)}",
                     ", ".join(f"[{r['name']}](#{anchor(r['name'])})" for r in alone) or "none",
                     plain(report['baseline'][c['name']]['detail'])])
    return sections.md_table(["Check", "What it compares", "Caught", "Caught by it alone",
                              "On the unchanged code"], rows)


def matrix_md(report):
    titles = check_titles(report)
    header = ["Mutant", "Page", *titles.values()]
    rows = []
    for r in report["mutants"]:
        cells = ["caught" if r["results"][c]["caught"] else "—" for c in titles]
        name = f"[{r['name']}](#{anchor(r['name'])})"
        if r["gap"]:
            name = f"[**{r['name']}**](#{anchor(r['name'])}) (gap)"
        elif not r["caught_by"]:
            name += " (invisible)"
        page = mutant_page(r)
        rows.append([name, f"[{sections.page_title(page)}]({sections.page_link(PAGE, page)})", *cells])
    return sections.md_table(header, rows)


def edit_md(e, repo_url):
    """Where the edit is (linked to the listing on its page, else to the hosted line) and a diff of it."""
    path, function, line = e["path"], e["function"], e["line"]
    original = (ROOT / path).read_text().splitlines()[line - 1]
    mutated = original.replace(e["old"], e["new"], 1).split("\n")
    where = f"`{path}:{line}`" + (f" in `{function}`" if function else "")
    page = sections.function_page(path, function) if function else None
    link = (sections.function_link(PAGE, path, function, line) if page
            else sections.source_url(repo_url, path, line))
    diff = "\n".join([f"- {original.strip()}", *(f"+ {m.strip()}" for m in mutated)])
    return f"[{where}]({link}):\n\n```diff\n{diff}\n```\n"


def details_md(report, repo_url):
    titles = check_titles(report)
    parts = []
    for r in report["mutants"]:
        verdict = ("**A gap: no check caught it.**" if r["gap"] else
                   "No check caught it, as expected." if not r["caught_by"] else
                   "Caught by: " + ", ".join(titles[c] for c in r["caught_by"]) + ".")
        text = f"### {r['name']} {{#{anchor(r['name'])}}}\n\n{r['breaks']} {verdict}\n\n"
        if r["uncatchable"]:
            text += f"*Why no check can see it:* {r['uncatchable']}\n\n"
        text += "".join(edit_md(e, repo_url) + "\n" for e in r["edits"])
        results = [(c, r["results"][c]) for c in titles]  # in the checks' order (the stored report sorts keys)
        text += "\n".join(f"- {titles[c]}: {'**caught**' if res['caught'] else 'missed'}. {plain(res['detail'])} "
                          + (not_run_md(res) if res.get("never_called") else f"({res['seconds']:.0f} s)")
                          for c, res in results) + "\n"
        parts.append(text)
    return "\n".join(parts)


def not_run_md(result):
    """What a result taken from the unchanged code's run says about why the check did not run again."""
    where = ", ".join(f"`{name}` in `{path}`" for path, _, name in
                      (item.partition(":") for item in result["never_called"].split(", ")))
    return (f"(the unchanged code's result: its run of this check never called {where}, which holds every edit "
            "of this mutant, so it was not run again)")


def not_run_counts(report):
    """(check runs on mutants that took the unchanged code's result, all check runs on mutants, the unchanged
    code's seconds for those runs)."""
    results = [(name, res) for r in report["mutants"] for name, res in r["results"].items()]
    taken = [name for name, res in results if res.get("never_called")]
    return len(taken), len(results), sum(report["baseline"][name]["seconds"] for name in taken)


def invisible_md(report):
    records = [r for r in report["mutants"] if r["uncatchable"]]
    if not records:
        return "None of the mutants in this run is invisible by nature.\n"
    lines = []
    for r in records:
        outcome = ("No check caught it." if not r["caught_by"] else
                   "Yet it was caught, by " + ", ".join(check_titles(report)[c] for c in r["caught_by"])
                   + ": its details say what differed.")
        lines.append(f"- [**{r['name']}**](#{anchor(r['name'])}): {r['uncatchable']} *{outcome}*")
    return "\n".join(lines) + "\n"


def gaps_md(report):
    gaps = [r for r in report["mutants"] if r["gap"]]
    if not gaps:
        return ("None in this run: every mutant that a check could see, some check saw. A new gap would be "
                "listed here, and `python tools/mutants.py` (run in CI) would exit with status 1.\n")
    return ("These mutants passed every check, and the next step for each is a check that catches it:\n\n"
            + "\n".join(f"- [**{r['name']}**](#{anchor(r['name'])}): {r['breaks']}" for r in gaps) + "\n")


def run_md(report, total):
    training = " ".join(report["training_args"])
    taken, runs, seconds = not_run_counts(report)
    return (f"This run took {report['seconds']} s with {report['jobs']} mutants at a time, each check in its own "
            f"process with one thread. Of the {runs} checks of mutants, {taken} took the unchanged code's result "
            f"without running, since their command never called the code the mutant changes (about {seconds:.0f} s "
            "of checks, at the unchanged code's times). "
            f"The training check ran `python -m transformer train {training}` and "
            f"compared the final validation loss with that of a bigram model counted from the same training "
            f"split: {report['bigram_loss']:.4f} nats.\n\n"
            "```bash\n"
            f"python tools/mutants.py            # all {total} mutants, or the cached report if nothing changed\n"
            "python tools/mutants.py --list     # the mutants and the lines they edit\n"
            "python tools/mutants.py --only attention-grad-no-scale   # one mutant, every check\n"
            "```\n")


def generate(context):
    report = tool.report(quick=mode() == "quick", jobs=jobs_from_env())  # scripts/site --jobs
    total, seed = len(tool.MUTANTS), tool.TRAINING[tool.TRAINING.index("--seed") + 1]
    return {"summary": summary_md(report, total), "checks": checks_md(report), "matrix": matrix_md(report),
            "invisible": invisible_md(report), "gaps": gaps_md(report),
            "details": details_md(report, context["repo_url"]), "run": run_md(report, total),
            "provenance": sections.provenance_md(PAGE, {"training run": seed})}
