"""Generator of the "Are the checks good enough?" page: the report of tools/mutants.py, brought up to date (what
an edit can have changed is computed again; the rest is reused from reports/mutants.json), as values, tables
and a picture of which check caught which mutant."""

import html
import re

import numpy as np

from tools import mutants as tool

from .. import sections
from ..common import ROOT
from ..figures import new_figure, png
from ..registry import PAGES
from ..schedule import jobs_from_env

PAGE = "mutants"
TITLES = {c.name: c.title for c in tool.CHECKS}
ORDER = {page.id: i for i, page in enumerate(PAGES)}


def plain(text):
    """A check's own words (a test's exception, say) as Markdown that shows them as they are: no tags, no
    emphasis, no math."""
    return re.sub(r"([\\`*_\[\]$|])", r"\\\1", html.escape(text, quote=False))


def anchor(name):
    return f"m-{name}"


def link(record):
    name = record["mutant"].name
    return f"[{name}](#{anchor(name)})"


def mutant_page(mutant):
    """The page that lists the function the mutant is in (the tool names the function, the site its page)."""
    path, function = mutant.subject
    page = sections.function_page(path, function)
    if page is None:
        raise LookupError(f"mutant {mutant.name} is in {path}:{function}, which no page lists")
    return page


def by_page(records):
    """The records in the order of the pages their functions are on (the catalogue's order within a page)."""
    return sorted(records, key=lambda r: ORDER[mutant_page(r["mutant"])])


def checks_md(report, records):
    rows = []
    for c in tool.CHECKS:
        caught = [r for r in records if c.name in r["caught_by"]]
        alone = [r for r in caught if r["caught_by"] == [c.name]]
        base = report.entries[tool.entry_name(None, c)]["value"]
        rows.append([f"**{c.title}**", c.what, f"{len(caught)} of {len(records)}",
                     ", ".join(link(r) for r in alone) or "none", plain(base["detail"])])
    return sections.md_table(["Check", "What it compares", "Caught", "Caught by it alone",
                              "On the unchanged code"], rows)


def matrix_md(records):
    rows = []
    for r in by_page(records):
        cells = ["caught" if r["results"][c]["value"]["caught"] else "—" for c in TITLES]
        kind = "a gap" if r["gap"] else "invisible" if r["mutant"].uncatchable else ""
        page = mutant_page(r["mutant"])
        rows.append([link(r), kind, f"[{sections.page_title(page)}]({sections.page_link(PAGE, page)})", *cells])
    return sections.md_table(["Mutant", "Kind", "Page", *TITLES.values()], rows)


def matrix_png(records):
    """Mutants along, checks down: a dark cell where the check caught the mutant; the mutants grouped by the page
    of the function they edit, so the reader sees which checks guard which part of the model."""
    from matplotlib.colors import ListedColormap

    ordered = by_page(records)
    grid = np.array([[c in r["caught_by"] for r in ordered] for c in TITLES], dtype=float)
    fig, ax = new_figure(figsize=(11, 3.2))
    ax.imshow(grid, aspect="auto", cmap=ListedColormap(["#eeeeee", "#3b5b92"]), vmin=0, vmax=1,
              interpolation="nearest")
    pages = [mutant_page(r["mutant"]) for r in ordered]
    starts = [i for i, p in enumerate(pages) if i == 0 or p != pages[i - 1]]
    ax.vlines([s - 0.5 for s in starts[1:]], -0.5, len(TITLES) - 0.5, color="white", linewidth=2)
    ends = starts[1:] + [len(pages)]
    ax.set_xticks([(s + e - 1) / 2 for s, e in zip(starts, ends)],
                  [sections.page_title(pages[s]) for s in starts], rotation=60, ha="right", fontsize="small")
    ax.set_yticks(range(len(TITLES)), list(TITLES.values()))
    for i, r in enumerate(ordered):
        if not r["caught_by"]:
            ax.text(i, len(TITLES) - 0.35, "○", ha="center", va="center", fontsize=7, clip_on=False)
    ax.set_xlabel("mutants, grouped by the page of the function they edit (○: caught by no check)")
    ax.set_ylabel("check")
    return png(fig)


def invisible_md(records):
    found = [r for r in records if r["mutant"].uncatchable]
    return sections.md_table(["Mutant", "What it changes", "Why no check can see it", "Caught by"],
                             [[link(r), r["mutant"].breaks, r["mutant"].uncatchable,
                               ", ".join(TITLES[c] for c in r["caught_by"]) or "none"] for r in found])


def gaps_md(records):
    """The survivors as a list (empty when there are none; the prose gives their count)."""
    return "".join(f"- [**{r['mutant'].name}**](#{anchor(r['mutant'].name)}): {r['mutant'].breaks}\n"
                   for r in records if r["gap"])


def edit_md(e, line, repo_url):
    """Where the edit is (linked to the listing on its page, else to the hosted line) and a diff of it."""
    original = (ROOT / e.path).read_text().splitlines()[line - 1]
    mutated = original.replace(e.old, e.new, 1).split("\n")
    where = f"`{e.path}:{line}`" + (f" in `{e.function}`" if e.function else "")
    page = sections.function_page(e.path, e.function) if e.function else None
    target = (sections.function_link(PAGE, e.path, e.function, line) if page
              else sections.source_url(repo_url, e.path, line))
    diff = "\n".join([f"- {original.strip()}", *(f"+ {m.strip()}" for m in mutated)])
    return f"[{where}]({target}):\n\n```diff\n{diff}\n```\n"


def details_md(records, repo_url):
    """One section per mutant: what it breaks, its edits as diffs, and each check's verdict in the check's words."""
    parts = []
    for r in by_page(records):
        m = r["mutant"]
        verdict = ("**A gap: no check caught it.**" if r["gap"] else
                   "No check caught it." if not r["caught_by"] else
                   "Caught by: " + ", ".join(TITLES[c] for c in r["caught_by"]) + ".")
        text = f"### {m.name} {{#{anchor(m.name)}}}\n\n{m.breaks} {verdict}\n\n"
        if m.uncatchable:
            text += f"*Why no check can see it:* {m.uncatchable}\n\n"
        text += "".join(edit_md(e, line, repo_url) + "\n" for e, line in zip(m.edits, tool.edit_lines(m)))
        text += "\n".join(f"- {TITLES[c]}: {'**caught**' if res['value']['caught'] else 'missed'}. "
                          f"{plain(res['value']['detail'])} (computed at `{res['commit']}`)"
                          for c, res in r["results"].items()) + "\n"
        parts.append(text)
    return "\n".join(parts)


def values(report, records):
    return {"caught": sum(bool(r["caught_by"]) for r in records), "total": len(records),
            "invisible": sum(bool(r["mutant"].uncatchable) for r in records),
            "gaps": sum(r["gap"] for r in records), "checks": len(tool.CHECKS), "entries": len(report.entries),
            "computed_at": report.provenance(),
            "core_minutes": round(sum(e["value"]["seconds"] for e in report.entries.values()) / 60),
            "training": "python -m transformer train " + " ".join(tool.TRAINING), "bigram": tool.bigram_loss()}


def generate(context):
    report = tool.update(jobs=jobs_from_env())  # scripts/site --jobs
    records = tool.records(report)
    seed = tool.TRAINING[tool.TRAINING.index("--seed") + 1]
    return {"values": values(report, records), "checks": checks_md(report, records), "matrix.png": matrix_png(records),
            "matrix": matrix_md(records), "invisible": invisible_md(records), "gaps": gaps_md(records),
            "details": details_md(records, context["repo_url"]),
            "provenance": sections.provenance_md(PAGE, {"training run": seed})}
