"""mkdocs hook: `mkdocs build` and `mkdocs serve` rerun the page generators and
the experiment notebooks that need it before reading the docs, so no page can
be built stale, several at a time (SITE_JOBS, site_scripts/schedule.py); the
rendered notebooks join the site as experiments/<name>.md.
The navigation comes from site_scripts/registry.py, each docs page's
`<!-- anatomy -->` line becomes the standard sections (site_scripts/anatomy.py),
and each equation of its prose gets the links to its code (site_scripts/equations.py). Once the pages are
built, the print edition is printed from them and cited under each equation (site_scripts/print_edition.py)."""

import re
import time
from pathlib import Path

from mkdocs.exceptions import PluginError

try:  # mkdocs loads this file by path; the project root is on sys.path when mkdocs runs as `python -m mkdocs` from it
    from site_scripts import (anatomy, build, equations, notebooks, print_edition, profile, prose, registry, schedule,
                              sections, site_state)
except ModuleNotFoundError as e:
    if e.name not in ("site_scripts", "tools"):
        raise
    raise PluginError("the site's build code (site_scripts/) is not importable: run mkdocs from the project root "
                      "as `python -m mkdocs build` (or scripts/site)") from None

SNIPPETS = build.SNIPPETS.relative_to(build.ROOT).as_posix()  # mkdocs.yml's base path of the fragments
COMMAND = "build"  # or "serve", "gh-deploy": on_startup says which
PRE_BUILT = {}  # when the pages' markdown was ready: mkdocs converts it to HTML from then to on_post_build


def on_startup(command, **kwargs):
    global COMMAND
    COMMAND = command


def on_config(config, **kwargs):
    """The navigation is the registry's: mkdocs.yml names no page. The footer links to the print edition
    when this build makes it (overrides/partials/copyright.html)."""
    if config["nav"] and config["nav"] != registry.nav():
        raise PluginError("mkdocs.yml has a nav: the pages and their order come from site_scripts/registry.py")
    config["nav"] = registry.nav()
    config["extra"]["print_edition"] = print_edition.PDF if print_edition.wanted(COMMAND) else None
    snippets = config["mdx_configs"]["pymdownx.snippets"]
    if snippets.get("base_path") != [SNIPPETS]:
        raise PluginError(f"mkdocs.yml: pymdownx.snippets' base_path must be [{SNIPPETS}] (the hook adds the mode)")
    snippets["base_path"] = [str(build.fragments_dir().relative_to(build.ROOT))]  # this mode's fragments
    return config


def on_pre_build(config, **kwargs):
    import logging

    log = logging.getLogger("mkdocs.hooks.site_scripts")
    vendor = Path(config["docs_dir"]) / "assets" / "vendor" / "mathjax" / "tex-mml-chtml.js"
    if not vendor.exists():
        raise PluginError(f"{vendor} is missing: run scripts/setup, which copies MathJax and mermaid from npm")
    try:
        jobs = schedule.jobs_from_env()
    except ValueError as e:
        raise PluginError(str(e)) from None
    profile.start()
    try:  # the pages and the notebooks that need it, `jobs` at a time
        pages = build.Plan({"repo_url": config["repo_url"]}, log=log.info)
        ran = schedule.run(pages.tasks + notebooks.tasks(repo_url=config["repo_url"]), jobs, log.info,
                           fresh=COMMAND == "serve")  # a long-lived process: its imports may predate an edit
        pages.record()
    except (RuntimeError, LookupError) as e:  # a check that failed, or a page linking to what no page shows
        raise PluginError(str(e)) from None
    for name, seconds in ran.items():
        profile.record(name, seconds)
    PRE_BUILT["at"] = time.perf_counter()


def on_files(files, config, **kwargs):
    """Add the rendered notebooks and their figures, and the page generators' figures (they live in build/,
    not docs/)."""
    from mkdocs.structure.files import File

    for src_uri, path in [*notebooks.site_files(), *build.figure_files()]:
        files.append(File.generated(config, src_uri, abs_src_path=str(path)))
    return files


def on_page_markdown(markdown, page, config, **kwargs):
    """Bind a page's prose to its generator's values (and refuse a measured number typed by hand), write the
    standard sections of a component page where its docs page says `<!-- anatomy -->`, and under each of its
    equations the lines of code that compute it."""
    entry = next((p for p in registry.PAGES if p.path == page.file.src_uri), None)
    if entry is None:
        return markdown
    try:
        typed = prose.typed_numbers(notebooks.markdown_cells(entry.id) if entry.notebook else markdown)
        if typed:
            raise ValueError("a measured number typed into the prose goes stale; bind it to a value the page's "
                             "generator returns ({{ name:format }}), or print it from the notebook's code: "
                             + "; ".join(f"line {line}: {text!r}" for line, text in typed))
        if entry.notebook:
            return markdown
        markdown = prose.bind(markdown, build.made_values(entry.id), page.file.src_uri)
        markdown = anatomy.expand(markdown, entry.id, build.made_fragments(entry.id))
        return equations.expand(markdown, lambda eq_id: sections.computed_at(entry.id, eq_id, config["repo_url"])
                                + print_edition.placeholder(eq_id))
    except ValueError as e:
        raise PluginError(f"{page.file.src_uri}: {e}") from None


def on_page_content(html, page, **kwargs):
    """Let mkdocs validate links to code lines too: the line anchors come from the
    highlighter's raw HTML, which mkdocs does not scan for ids by itself."""
    if page.present_anchor_ids is not None:
        page.present_anchor_ids |= set(re.findall(r'\bid="([^"]+)"', html))
    return html


SOURCE_FACTS = ' data-md-component="source"'


def on_post_page(output, page, **kwargs):
    """Keep the header's repository link a plain link: marked as Material's "source" component,
    it makes every visit fetch the repository's stars and forks from api.github.com, and the
    site makes no request off itself."""
    return output.replace(SOURCE_FACTS, "")


def on_post_template(output_content, template_name, **kwargs):
    """The same for the pages built from theme templates alone (404.html)."""
    return output_content.replace(SOURCE_FACTS, "")


def on_post_build(config, **kwargs):
    """Write the build's profile into its page, print the edition from the built pages, then cite it under
    their equations."""
    import logging

    log = logging.getLogger("mkdocs.hooks.site_scripts")
    if "at" in PRE_BUILT:
        profile.record("pages converted to HTML by mkdocs", time.perf_counter() - PRE_BUILT.pop("at"))
    site = Path(config["site_dir"])
    try:
        profile.fill(site)
        if print_edition.wanted(COMMAND):
            start = time.perf_counter()
            print_edition.build(site, config, log=log.info)
            profile.record("print edition (typeset, printed, read back, cited)", time.perf_counter() - start)
        else:
            log.info(f"print edition skipped ({print_edition.SKIP_ENV}=0 or mkdocs serve)")
    except RuntimeError as e:
        raise PluginError(str(e)) from None
    if COMMAND == "build":
        site_state.record(site)  # scripts/site builds nothing while it holds
