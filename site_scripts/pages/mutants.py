"""Generator of the "Are the checks good enough?" page: the report of tools/mutants.py, brought up to date (what
an edit can have changed is computed again; the rest is reused from reports/mutants.json)."""

import html
import re

from tools import mutants as tool

from .. import sections
from ..common import ROOT
from ..schedule import jobs_from_env

PAGE = "mutants"
TITLES = {c.name: c.title for c in tool.CHECKS}


def plain(text):
    """A check's own words (a test's exception, say) as Markdown that shows them as they are: no tags, no
    emphasis, no math."""
    return re.sub(r"([\\`*_\[\]$])", r"\\\1", html.escape(text, quote=False))


def anchor(name):
    return f"m-{name}"


def mutant_page(mutant):
    """The page that lists the function the mutant is in (the tool names the function, the site its page)."""
    path, function = mutant.subject
    page = sections.function_page(path, function)
    if page is None:
        raise LookupError(f"mutant {mutant.name} is in {path}:{function}, which no page lists")
    return page


def summary_md(records):
    caught = [r for r in records if r["caught_by"]]
    unseen = [r for r in records if not r["caught_by"] and r["mutant"].uncatchable]
    gaps = [r for r in records if r["gap"]]
    return (f"**{len(caught)} of {len(records)} mutants caught** by at least one check. "
            f"{len(unseen)} {'is' if len(unseen) == 1 else 'are'} invisible to every check by nature (below, "
            f"with the reason), and **{len(gaps)} survived** as a gap. The unchanged code passes all "
            f"{len(tool.CHECKS)} checks, so every catch below is the mutant's doing.\n")


def checks_md(report, records):
    rows = []
    for c in tool.CHECKS:
        caught = [r for r in records if c.name in r["caught_by"]]
        alone = [r for r in caught if r["caught_by"] == [c.name]]
        base = report.entries[tool.entry_name(None, c)]["value"]
        rows.append([f"**{c.title}**", c.what, f"{len(caught)} of {len(records)}",
                     ", ".join(f"[{r['mutant'].name}](#{anchor(r['mutant'].name)})" for r in alone) or "none",
                     plain(base["detail"])])
    return sections.md_table(["Check", "What it compares", "Caught", "Caught by it alone",
                              "On the unchanged code"], rows)


def matrix_md(records):
    rows = []
    for r in records:
        name = r["mutant"].name
        cells = ["caught" if r["results"][c]["value"]["caught"] else "—" for c in TITLES]
        label = f"[{name}](#{anchor(name)})"
        if r["gap"]:
            label = f"[**{name}**](#{anchor(name)}) (gap)"
        elif not r["caught_by"]:
            label += " (invisible)"
        page = mutant_page(r["mutant"])
        rows.append([label, f"[{sections.page_title(page)}]({sections.page_link(PAGE, page)})", *cells])
    return sections.md_table(["Mutant", "Page", *TITLES.values()], rows)


def edit_md(e, line, repo_url):
    """Where the edit is (linked to the listing on its page, else to the hosted line) and a diff of it."""
    original = (ROOT / e.path).read_text().splitlines()[line - 1]
    mutated = original.replace(e.old, e.new, 1).split("\n")
    where = f"`{e.path}:{line}`" + (f" in `{e.function}`" if e.function else "")
    page = sections.function_page(e.path, e.function) if e.function else None
    link = (sections.function_link(PAGE, e.path, e.function, line) if page
            else sections.source_url(repo_url, e.path, line))
    diff = "\n".join([f"- {original.strip()}", *(f"+ {m.strip()}" for m in mutated)])
    return f"[{where}]({link}):\n\n```diff\n{diff}\n```\n"


def details_md(records, repo_url):
    parts = []
    for r in records:
        m = r["mutant"]
        verdict = ("**A gap: no check caught it.**" if r["gap"] else
                   "No check caught it, as expected." if not r["caught_by"] else
                   "Caught by: " + ", ".join(TITLES[c] for c in r["caught_by"]) + ".")
        text = f"### {m.name} {{#{anchor(m.name)}}}\n\n{m.breaks} {verdict}\n\n"
        if m.uncatchable:
            text += f"*Why no check can see it:* {m.uncatchable}\n\n"
        text += "".join(edit_md(e, line, repo_url) + "\n" for e, line in zip(m.edits, tool.edit_lines(m)))
        text += "\n".join(f"- {TITLES[c]}: {'**caught**' if res['value']['caught'] else 'missed'}. "
                          f"{plain(res['value']['detail'])} ({res['value']['seconds']:.0f} s, computed at "
                          f"`{res['commit']}`)" for c, res in r["results"].items()) + "\n"
        parts.append(text)
    return "\n".join(parts)


def invisible_md(records):
    found = [r for r in records if r["mutant"].uncatchable]
    if not found:
        return "None of the mutants is invisible by nature.\n"
    lines = []
    for r in found:
        outcome = ("No check caught it." if not r["caught_by"] else
                   "Yet it was caught, by " + ", ".join(TITLES[c] for c in r["caught_by"])
                   + ": its details say what differed.")
        lines.append(f"- [**{r['mutant'].name}**](#{anchor(r['mutant'].name)}): {r['mutant'].uncatchable} "
                     f"*{outcome}*")
    return "\n".join(lines) + "\n"


def gaps_md(records):
    gaps = [r for r in records if r["gap"]]
    if not gaps:
        return ("None: every mutant that a check could see, some check saw. A new gap would be listed here, and "
                "`python -m tools.mutants` (run in CI) would exit with status 1.\n")
    return ("These mutants passed every check, and the next step for each is a check that catches it:\n\n"
            + "\n".join(f"- [**{r['mutant'].name}**](#{anchor(r['mutant'].name)}): {r['mutant'].breaks}"
                        for r in gaps) + "\n")


def run_md(report):
    training = " ".join(tool.TRAINING)
    seconds = sum(e["value"]["seconds"] for e in report.entries.values())
    return (f"The {len(report.entries)} results (each mutant and the unchanged code, each check) were computed "
            f"{report.provenance()} (a `+` marks a working tree with changes on top of that "
            f"commit). Computing all of them takes about "
            f"{seconds / 60:.0f} minutes of one core. The training check ran `python -m transformer train "
            f"{training}` and compared the final validation loss with that of a bigram model counted from the same "
            f"training split: {tool.bigram_loss():.4f} nats.\n\n"
            "```bash\n"
            f"python -m tools.mutants            # bring reports/mutants.json up to date\n"
            "python -m tools.mutants --list     # the mutants and the lines they edit\n"
            "python -m tools.mutants --only attention-grad-no-scale   # one mutant, every check, again\n"
            "```\n")


def generate(context):
    report = tool.update(jobs=jobs_from_env())  # scripts/site --jobs
    records = tool.records(report)
    seed = tool.TRAINING[tool.TRAINING.index("--seed") + 1]
    return {"summary": summary_md(records), "checks": checks_md(report, records), "matrix": matrix_md(records),
            "invisible": invisible_md(records), "gaps": gaps_md(records),
            "details": details_md(records, context["repo_url"]), "run": run_md(report),
            "provenance": sections.provenance_md(PAGE, {"training run": seed})}
