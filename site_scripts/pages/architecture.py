"""Generator of the contributors' page: every entry of the registry, as the build sees it, and the run that
measured which tests check each function (tools/checked_by.py)."""

from tools.checked_by import TRACE
from tools.perturbations import RULES

from .. import build, checked, registry, sections
from ..registry import Rows, Steps

PAGE = "architecture"


def crosscheck_text(rows):
    if isinstance(rows, Steps):
        return f"each {rows.check}"
    if isinstance(rows, Rows):
        return "; ".join(f"{check}: " + ", ".join(f"`{p}`" for p in patterns)
                         for check, patterns in rows.select.items())
    return "—"


def pages_md():
    rows = []
    for page in registry.PAGES:
        source = f"`notebooks/{page.id}.py`" if page.notebook else f"`docs/{page.path}`"
        generator = build.generator_path(page.id)
        own = f"`{generator.relative_to(build.ROOT).as_posix()}`" if generator else "—"
        rows.append([f"[{page.title}]({sections.page_link(PAGE, page.id)})", page.section or "—", source, own,
                     len(page.functions), crosscheck_text(page.crosscheck)])
    return sections.md_table(["Page", "Section", "Prose", "Own generator", "Functions explained",
                              "Cross-check rows"], rows)


def pages_values():
    return {"pages": len(registry.PAGES), "notebooks": sum(p.notebook for p in registry.PAGES),
            "prose_only": [p.title for p in registry.PAGES if not p.notebook and build.generator_path(p.id) is None]}


def alone_md():
    """The pages and notebooks that run with nothing beside them, and why (their registry entries say)."""
    return "".join(f"- [{page.title}]({sections.page_link(PAGE, page.id)}): {page.alone}.\n"
                   for page in registry.PAGES if page.alone)


def used_on(units, most=12):
    """The functions a rule was used on: their names, or their number when they are many."""
    if not units:
        return "—"
    if len(units) > most:
        return f"{len(units)} functions"
    return ", ".join(f"`{u}`" for u in units)


def checked_md():
    """The measurement behind every "Checked by": which rule made which functions' outputs wrong, and the
    functions not measured, with the reason; and the report's counts and provenance as values."""
    report = checked.report()
    units = {u: e["value"] for u, e in report.entries.items() if u != TRACE}
    measured = [u for u, r in units.items() if r["measured"]]
    rows = [[f"`{name}`", what, used_on([u for u in measured if name in units[u]["rules"]])]
            for name, what in RULES.items()]
    unmeasured = sections.md_table(["Function", "Why it is not measured"],
                                   [[f"`{u}`", r["reason"]] for u, r in units.items() if not r["measured"]])
    values = {"traced_tests": report.entries[TRACE]["value"]["tests"], "measured": len(measured),
              "functions": len(units), "checked": sum(bool(units[u]["failed"]) for u in measured),
              "computed_at": report.provenance(), "computed_now": len(report.computed)}
    return sections.md_table(["Rule", "What it does to the output", "Used on"], rows), unmeasured, values


def generate(context):
    rules, unmeasured, checked_values = checked_md()
    return {"pages": pages_md(), "rules": rules, "unmeasured": unmeasured, "alone": alone_md(),
            "values": {**pages_values(), **checked_values}}
