"""Generator of the contributors' page: every entry of the registry, as the build sees it."""

from .. import build, registry, sections
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
    return (sections.md_table(["Page", "Section", "Prose", "Own generator", "Functions explained",
                               "Cross-check rows"], rows)
            + f"\n{len(registry.PAGES)} pages, {sum(p.notebook for p in registry.PAGES)} of them notebooks. Without "
              "a generator of their own: "
              + ", ".join(p.title for p in registry.PAGES if not p.notebook and build.generator_path(p.id) is None)
              + ".\n")


def generate(context):
    return {"pages": pages_md()}
