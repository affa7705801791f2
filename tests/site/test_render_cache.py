"""What mkdocs made of each page, kept between builds (site_scripts/render_cache.py): a rebuild reuses it and
writes the same site, and whatever a page's conversion reads is in its key. A small site of three pages, built
in this process."""

import logging
from types import SimpleNamespace

import pytest
from material.plugins.search.plugin import SearchIndex
from mkdocs.commands.build import build
from mkdocs.config import load_config
from mkdocs.exceptions import Abort
from mkdocs.structure.pages import Page

from site_scripts import render_cache
from site_scripts.common import ROOT
from site_scripts.bench_rebuild import differing_files

CONFIG = """site_name: kept pages
theme: material
hooks: [hook.py]
plugins: [search, autorefs]
validation:
  anchors: warn
markdown_extensions:
  - attr_list
  - toc: {{permalink: true}}
  - pymdownx.snippets: {{base_path: ["{snippets}"], check_paths: true}}
"""
HOOK = """from site_scripts import render_cache

def on_config(config):
    render_cache.install(config)
    return config

def on_post_build(config):
    render_cache.prune()
"""
PAGES = {
    "index.md": '# Home\n\nSee [a section](other.md#a-section) and [the anchor][kept-anchor].\n\n--8<-- "piece.md"\n',
    "other.md": "# Other\n\n## A section\n\n[](){#kept-anchor}\nSome text.\n",
    "third.md": "# Third\n\nNothing to include.\n",
}


@pytest.fixture
def project(tmp_path, monkeypatch):
    """The small site, its own cache folder, and a count of the pages mkdocs converted and indexed."""
    (tmp_path / "docs").mkdir()
    (tmp_path / "snippets").mkdir()
    (tmp_path / "mkdocs.yml").write_text(CONFIG.format(snippets=tmp_path / "snippets"))  # pymdownx: from the cwd
    (tmp_path / "hook.py").write_text(HOOK)
    for name, text in PAGES.items():
        (tmp_path / "docs" / name).write_text(text)
    (tmp_path / "snippets" / "piece.md").write_text("The snippet says one.\n")
    monkeypatch.setattr(render_cache, "FOLDER", tmp_path / "cache")
    monkeypatch.delenv(render_cache.ENV, raising=False)
    made = SimpleNamespace(converted=0, indexed=0)

    def counted(method, field):
        def wrapper(*args):
            setattr(made, field, getattr(made, field) + 1)
            return method(*args)
        return wrapper
    # counted under the cache, which install() wraps around them; monkeypatch puts the originals back
    monkeypatch.setattr(Page, "render", counted(Page.render, "converted"))
    monkeypatch.setattr(SearchIndex, "add_entry_from_context", counted(SearchIndex.add_entry_from_context, "indexed"))
    return SimpleNamespace(root=tmp_path, made=made)


def build_site(project, site="site", strict=True):
    """Build the small site into project.root/<site>; the counts start again from zero."""
    project.made.converted = project.made.indexed = 0
    config = load_config(str(project.root / "mkdocs.yml"), site_dir=str(project.root / site), strict=strict)
    config.plugins.on_startup(command="build", dirty=False)
    try:
        build(config)
    finally:
        config.plugins.on_shutdown()
    return project.root / site


def test_a_rebuild_converts_and_indexes_no_page_again_and_writes_the_same_site(project, monkeypatch):
    first = build_site(project, "first")
    assert (project.made.converted, project.made.indexed) == (3, 3)
    again = build_site(project, "again")
    assert (project.made.converted, project.made.indexed) == (0, 0)
    monkeypatch.setenv(render_cache.ENV, "0")
    without = build_site(project, "without")
    assert (project.made.converted, project.made.indexed) == (3, 3)
    assert differing_files(first, again) == differing_files(first, without) == []
    # the cross-reference to an anchor of another page resolved in the rebuild: its anchor was registered again
    assert 'href="other/#kept-anchor"' in (again / "index.html").read_text()
    assert "the snippet says one" in (again / "search" / "search_index.json").read_text().lower()


def test_a_page_is_made_again_when_a_snippet_it_includes_changes(project):
    build_site(project)
    (project.root / "snippets" / "piece.md").write_text("The snippet says two.\n")
    site = build_site(project)
    assert project.made.converted == 1  # index.md alone
    assert "The snippet says two." in (site / "index.html").read_text()


def test_a_link_to_a_page_that_is_gone_fails_the_strict_rebuild_though_the_linking_page_did_not_change(project):
    build_site(project)
    (project.root / "docs" / "other.md").unlink()
    with pytest.raises(Abort, match="warnings in strict mode"):
        build_site(project)


def test_a_kept_page_still_has_its_links_to_other_pages_anchors_checked(project):
    build_site(project)
    (project.root / "docs" / "other.md").write_text("# Other\n\n## Renamed\n\n[](){#kept-anchor}\nSome text.\n")
    with pytest.raises(Abort, match="warnings in strict mode"):  # index.md links to other.md#a-section
        build_site(project)
    assert project.made.converted == 1  # other.md alone: index.md was kept


def test_a_conversion_that_warned_is_not_kept_so_the_strict_build_still_fails(project):
    (project.root / "docs" / "third.md").write_text("# Third\n\nA link to [nowhere](missing.md).\n")
    build_site(project, strict=False)  # it warns, and passes
    with pytest.raises(Abort, match="warnings in strict mode"):
        build_site(project)
    assert project.made.converted == 1  # third.md was made again; the others were kept


def test_the_results_no_page_used_are_deleted_at_the_end_of_a_build(project):
    build_site(project)
    kept = set((render_cache.folder()).iterdir())
    (project.root / "docs" / "third.md").write_text("# Third\n\nChanged.\n")
    build_site(project)
    now = set(render_cache.folder().iterdir())
    assert len(kept - now) == 2 and len(now - kept) == 2  # third.md's page and its search entries


def page(markdown, src_uri="a.md"):
    return SimpleNamespace(markdown=markdown, url=src_uri[:-3] + "/",
                           file=SimpleNamespace(src_uri=src_uri, dest_uri=src_uri[:-3] + "/index.html"))


def test_a_page_that_calls_mkdocstrings_or_includes_in_a_way_not_followed_gets_no_key(tmp_path):
    (tmp_path / "plain.md").write_text("plain\n")
    (tmp_path / "nested.md").write_text('--8<-- "plain.md"\n')
    config = {"mdx_configs": {"pymdownx.snippets": {"base_path": [str(tmp_path)]}}, "markdown_extensions": [],
              "use_directory_urls": True, "validation": {}, "plugins": {}}
    files = []
    assert render_cache.render_key(page('# A\n\n--8<-- "plain.md"\n'), config, files) is not None
    assert render_cache.render_key(page("# API\n\n::: transformer.model\n"), config, files) is None
    assert render_cache.render_key(page('--8<-- "nested.md"\n'), config, files) is None  # includes in turn
    assert render_cache.render_key(page('--8<-- "gone.md"\n'), config, files) is None  # the conversion says so
    assert render_cache.render_key(page("--8<--\nplain.md\n--8<--\n"), config, files) is None  # a block form


def test_a_key_changes_with_what_the_conversion_reads(tmp_path):
    (tmp_path / "plain.md").write_text("plain\n")
    config = {"mdx_configs": {"pymdownx.snippets": {"base_path": [str(tmp_path)]}}, "markdown_extensions": ["toc"],
              "use_directory_urls": True, "validation": {"anchors": "warn"},
              "plugins": {"autorefs": SimpleNamespace(config={"scan_toc": True})}}
    files = [SimpleNamespace(src_uri="a.md", dest_uri="a/index.html", url="a/", inclusion="included")]
    text = '# A\n\n--8<-- "plain.md"\n'
    key = render_cache.render_key(page(text), config, files)
    assert render_cache.render_key(page(text), dict(config), list(files)) == key
    assert render_cache.render_key(page(text + "more\n"), config, files) != key
    assert render_cache.render_key(page(text, "b.md"), config, files) != key
    assert render_cache.render_key(page(text), config, files[:0]) != key  # a file of the site gone
    assert render_cache.render_key(page(text), {**config, "markdown_extensions": ["toc", "tables"]}, files) != key
    assert render_cache.render_key(page(text), {**config, "validation": {"anchors": "info"}}, files) != key
    other = {"autorefs": SimpleNamespace(config={"scan_toc": False})}
    assert render_cache.render_key(page(text), {**config, "plugins": other}, files) != key
    (tmp_path / "plain.md").write_text("changed\n")
    assert render_cache.render_key(page(text), config, files) != key
    logger = logging.getLogger("mkdocs.structure.pages")
    level = logger.level
    try:
        logger.setLevel(logging.DEBUG)  # mkdocs build -v: mkdocs keeps no links to anchors
        (tmp_path / "plain.md").write_text("plain\n")
        assert render_cache.render_key(page(text), config, files) != key
    finally:
        logger.setLevel(level)


def test_a_setting_reads_the_same_in_every_process():
    class Extension:
        pass

    one, two = [Extension(), {"b": 1, "a": len}], [Extension(), {"a": len, "b": 1}]
    assert render_cache.stable(one) == render_cache.stable(two)
    assert "0x" not in render_cache.stable([Extension(), len])
    assert render_cache.stable({"a": 1}) != render_cache.stable({"a": "1"})
    # mkdocs' settings nest: `validation` holds `links`, which holds `anchors`
    config = load_config(str(ROOT / "mkdocs.yml"))
    before = render_cache.stable(config["validation"])
    config["validation"]["links"]["anchors"] = logging.INFO
    assert render_cache.stable(config["validation"]) != before
