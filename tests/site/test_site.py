"""The site builds strictly, its generated tables match the code, links run both
ways between equations and code, and the build is cached and deterministic."""

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from sitebuild import ROOT, html_of, mkdocs_build, nav_pages

from site_scripts import anatomy, build, common, depends, notebooks, registry
from site_scripts.equations import by_id
from site_scripts.registry import PAGE_PATHS
from site_scripts.markers import Marker, collect_markers
from site_scripts.profile import without_profile
from site_scripts.sections import listed_functions

CONTEXT = {"repo_url": "https://github.com/transformer-explained/transformer"}  # what mkdocs.yml gives by default


@pytest.fixture
def fragments_dir(built_mode):
    """The folder of the fragments built_site shows (its mode's)."""
    return build.fragments_dir(built_mode)


def test_every_page_is_in_the_registry_with_its_prose():
    for page in registry.PAGES:
        source = ROOT / "notebooks" / f"{page.id}.py" if page.notebook else ROOT / "docs" / page.path
        assert source.is_file(), f"{page.id}: {source} is missing"
    generators = {p.stem for p in (ROOT / "site_scripts" / "pages").glob("*.py") if not p.name.startswith("_")}
    assert generators <= set(build.page_names()), "a generator without a registry entry never runs"
    docs = {p.relative_to(ROOT / "docs").as_posix() for p in (ROOT / "docs").rglob("*.md")}
    assert docs <= set(nav_pages()), "a docs page the navigation does not reach"
    assert set(notebooks.names()) == {p.id for p in registry.PAGES if p.notebook}


def test_every_nav_page_is_built_with_every_fragment_included(built_site):
    for md in nav_pages():
        html = html_of(built_site, md)
        assert "--8<--" not in html, md
    for page in PAGE_PATHS:
        html = html_of(built_site, PAGE_PATHS[page])
        for eq in (eq for eq in by_id().values() if eq.page == page):
            assert f'id="eq-{eq.id}"' in html and 'class="arithmatex"' in html, (page, eq.id)
    api = html_of(built_site, "reference/api.md")
    assert 'id="transformer.model.loss_and_grads"' in api  # mkdocstrings rendered the functions


def test_every_experiment_page_is_built_with_its_figures(built_site, built_mode):
    experiments = [md for md in nav_pages() if md.startswith("experiments/")]
    assert {md.split("/")[1][:-3] for md in experiments} == set(notebooks.names())
    for md in experiments:
        html = html_of(built_site, md)
        assert ("Quick run" in html) == (built_mode == "quick")  # a shortened run says so
        images = re.findall(r'<img[^>]+src="([^"]+\.png)"', html)
        assert images, md
        for src in images:
            assert (built_site / md[:-3] / src).is_file(), (md, src)


def test_every_included_fragment_is_generated_and_every_generated_one_is_used(fragments_dir):
    included = set()
    for page in (p for p in registry.PAGES if not p.notebook):  # each docs page with its anatomy written out
        text = anatomy.expand((ROOT / "docs" / page.path).read_text(), page.id, build.made_fragments(page.id))
        included |= set(re.findall(r'--8<-- "([^"]+)"', text))
    generated = {p.relative_to(fragments_dir).as_posix() for p in fragments_dir.rglob("*.md")}
    assert included <= generated, included - generated
    assert generated <= included, f"generated but shown on no page: {generated - included}"


def test_no_page_shows_a_failed_check(built_site):
    for md in nav_pages():
        assert "**FAIL" not in html_of(built_site, md) and "<strong>FAIL" not in html_of(built_site, md), md


def test_connection_tables_point_at_the_code_shown(fragments_dir):
    roles = set()
    for page in PAGE_PATHS:
        path = fragments_dir / page / "connection.md"
        if not path.exists():
            continue
        rows = re.findall(r"^\| [^|]* \| ([^|]*) \| \[`([\w/.]+):(\d+)`\]\([^)]*\) \| `(.*)` \|$", path.read_text(),
                          flags=re.M)
        assert rows, page
        for role, file, line, code in rows:
            roles.add(role.split(" (")[0])
            text = (ROOT / file).read_text().splitlines()[int(line) - 1]
            assert text.strip().startswith(code.replace("\\|", "|")), (page, file, line)
    assert roles >= {"computes it", "tests it"}
    assert any(r.startswith("written inline") for r in roles)


def test_listings_show_the_file_lines_they_claim(fragments_dir):
    blocks = 0
    for page in PAGE_PATHS:
        path = fragments_dir / page / "implementation.md"
        if not path.exists():
            continue
        text = path.read_text()
        listing = r'\[`([\w/.]+):(\d+)-\d+`\].*?\n\n``` \{[^}]*linenums="\d+"[^}]*\}\n(.*?)\n```'
        for file, start, code in re.findall(listing, text, flags=re.S):
            blocks += 1
            lines = (ROOT / file).read_text().splitlines()
            for offset, shown in enumerate(code.splitlines()):
                shown = re.sub(r" \(\d+\)$", "", shown)  # the annotation marker the page adds
                assert shown == lines[int(start) - 1 + offset], (page, file, int(start) + offset)
    assert blocks >= len(collect_markers()) // 4


def test_equation_links_land_on_the_lines_that_compute_them(built_site):
    """Equation -> code: each 'Computed at' link reaches the marked line, on the page that lists it."""
    checked = 0
    for page in PAGE_PATHS:
        html = html_of(built_site, PAGE_PATHS[page])
        for anchor in re.findall(r'Computed at.*?</p>', html, flags=re.S):
            for target in re.findall(r'href="#(__codelineno-[^"]+)"', anchor):
                start = html.index(f'id="{target}"')
                line_html = html[start:html.index("\n", start)]
                assert "eq:" in re.sub(r"<[^>]+>", "", line_html), (page, target)
                checked += 1
    assert checked == len(collect_markers())


def test_code_lines_link_back_to_their_equations(built_site):
    """Code -> equation: every marked line in a listing carries an annotation linking to its equation."""
    from site_scripts.code_facts import top_level_function

    for page in PAGE_PATHS:
        html = html_of(built_site, PAGE_PATHS[page])
        listed = set(listed_functions(page))
        marked = {(m.path, m.line) for m in collect_markers()
                  if (m.path, top_level_function(m.path, m.line)[0]) in listed}
        items = re.findall(r"<li>Line (\d+) computes (.*?)</li>", html, flags=re.S)
        assert len(items) == len(marked), page
        for _, links in items:
            assert re.search(r'href="[^"]*#eq-[a-z0-9-]+"', links), (page, links)
    layernorm = html_of(built_site, PAGE_PATHS["layernorm"])
    line = next(m.line for m in collect_markers() if m.eq_id == "ln-grad")
    assert re.search(rf'<li>Line {line} computes <a href="#eq-ln-grad">', layernorm)


def test_every_function_is_listed_on_one_page_only():
    seen = {}
    for page in PAGE_PATHS:
        for place in listed_functions(page):
            assert place not in seen, f"{place} is listed on {seen.get(place)} and {page}"
            seen[place] = page


def test_every_tested_by_command_names_a_real_test(fragments_dir):
    commands = set()
    for path in fragments_dir.rglob("*.md"):  # the "used" sections, the Bad inputs page's "checked by", ...
        commands |= set(re.findall(r"`pytest (tests/[\w/.]+::\w+)`", path.read_text()))
    assert len(commands) > 20
    assert any("tests/unit/test_cli.py::" in c for c in commands)  # the Bad inputs page's commands are among them
    result = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                             "-m", "", *sorted(commands)], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout[-2000:]
    collected = {line.split("[")[0] for line in result.stdout.splitlines() if "::" in line}
    assert collected == commands


def test_nothing_reruns_when_nothing_changed_and_reruns_are_byte_identical(fragments_dir):
    made = [p for p in fragments_dir.rglob("*") if p.name.endswith((".md", *build.SERVED))]  # fragments, figures, data
    before = {p: p.read_bytes() for p in made}
    assert build.generate_all(CONTEXT) == []
    assert sorted(build.generate_all(CONTEXT, force=True)) == sorted(build.page_names())
    after = {p: p.read_bytes() for p in made}
    assert [p for p in made if after[p] != before[p]] == []


def test_each_mode_keeps_its_own_fragments_and_state(tmp_path, monkeypatch):
    """The tests build quick, `scripts/site` full: a build of one mode must leave the other's fragments, keys and
    stored state as they are, or every build after one of the other mode reruns every generator."""
    monkeypatch.setattr(build, "SNIPPETS", tmp_path / "snippets")
    monkeypatch.setattr(build, "ROOT", tmp_path)
    monkeypatch.setattr(build, "fragments", lambda name, context: {"shown": f"made by the {common.mode()} build"})
    for quick in ("1", "0"):
        monkeypatch.setenv("SITE_QUICK", quick)
        build.write_page("layernorm", CONTEXT, f"key {quick}")
        build.write_if_changed(build.last_run(), f"state {quick}")
    for quick, name in (("1", "quick"), ("0", "full")):
        monkeypatch.setenv("SITE_QUICK", quick)
        assert (build.fragments_dir() / "layernorm" / "shown.md").read_text() == f"made by the {name} build"
        assert build.is_current(build.fragments_dir() / "layernorm" / ".key", f"key {quick}")
        assert build.is_current(build.last_run(), f"state {quick}")
    assert build.fragments_dir("quick") != build.fragments_dir("full")


def test_the_inputs_state_moves_with_any_file_a_key_reads_and_with_nothing_else(tmp_path):
    """Negative controls of the shortcut that skips every page key: each change below must show."""
    for folder in build.KEYED_FOLDERS:
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "a.py").write_text("x = 1\n")
    page = tmp_path / build.fragments_dir().relative_to(build.ROOT) / "page"  # this mode's fragments of a page
    page.mkdir(parents=True)
    (page / ".key").write_text("k")
    (tmp_path / "build" / "cache").mkdir()

    def state(context=CONTEXT):
        return build.inputs_state(context, None, build.source_state(tmp_path), tmp_path)

    first = state()
    assert state() == first
    (tmp_path / "docs" / "a.py").write_text("x = 2\n")  # same size, another modification time
    second = state()
    assert second != first
    (tmp_path / "tests" / "unit").mkdir()
    (tmp_path / "tests" / "unit" / "test_new.py").write_text("")
    third = state()
    assert third != second
    (page / ".key").unlink()  # a page's output removed
    fourth = state()
    assert fourth != third
    (tmp_path / "build" / "cache" / f"mutants-{common.mode()}.json").write_text("{}")  # a report brought up to date
    assert state() != fourth
    fifth = state()
    other = next(m for m in common.MODES if m != common.mode())
    (tmp_path / "build" / "cache" / f"mutants-{other}.json").write_text("{}")  # the other mode's: no page reads it
    assert state() == fifth
    (tmp_path / "build" / "cache" / "crosscheck.json").write_text("{}")  # a report of both modes
    assert state() != fifth
    assert state({"repo_url": "https://example.org/fork"}) != state()
    (tmp_path / "transformer" / "__pycache__").mkdir()  # bytecode changes no key
    before = state()
    (tmp_path / "transformer" / "__pycache__" / "a.cpython-311.pyc").write_bytes(b"")
    assert state() == before
    (tmp_path / "docs" / ".#a.md").symlink_to("nobody@host.1234")  # an editor's lock file: a dangling link
    assert state() != before  # seen, and no error
    (tmp_path / "docs" / ".#a.md").unlink()
    edited = tmp_path / "tools" / "a.py"
    stamp = edited.stat()
    edited.write_text("x = 3\n")
    os.utime(edited, ns=(stamp.st_atime_ns, stamp.st_mtime_ns))  # the old modification time put back (cp -p)
    assert state() != before  # its change time still moved


def test_with_the_inputs_state_current_no_page_key_is_computed(built_mode, monkeypatch):
    assert build.generate_all(CONTEXT) == []  # the state of the last run is stored

    def no_key(*args):
        raise AssertionError("a page key was computed")

    monkeypatch.setattr(build, "page_key", no_key)
    assert build.generate_all(CONTEXT) == []
    monkeypatch.setattr(build, "inputs_state", lambda context, pages, sources: "another state")
    with pytest.raises(AssertionError, match="a page key was computed"):
        build.generate_all(CONTEXT)


def test_a_file_edited_while_the_pages_are_made_is_seen_by_the_next_build(fragments_dir, monkeypatch):
    """The state stored after a run is the sources' state from before any key read them: a file edited while
    the pages are made (mkdocs serve rebuilds on a save) must make the next build compute the keys again."""
    assert build.generate_all(CONTEXT) == []
    now = build.source_state()
    before_the_edit = [(now[0][0], -1, *now[0][2:]), *now[1:]]
    # The plan reads the state twice before any key (once to see whether anything changed, once after bringing
    # the reports up to date): both see the file before its edit, every later read after it.
    reads = iter([before_the_edit, before_the_edit])
    monkeypatch.setattr(build, "source_state", lambda: next(reads, now))
    computed = []
    monkeypatch.setattr(build, "page_key", lambda name, context: computed.append(name) or
                        (fragments_dir / name / ".key").read_text())
    assert build.generate_all(CONTEXT) == []  # every key is current
    computed.clear()
    assert build.generate_all(CONTEXT) == []
    assert computed == build.page_names()  # the edit was seen, and every key computed again


def site_files(site):
    """{path: bytes} of a built site, the contributors' page without its build profile (each build's timings)."""
    found = {p.relative_to(site): p.read_bytes() for p in site.rglob("*") if p.is_file()}
    page = Path("reference/architecture/index.html")
    found[page] = without_profile(found[page])
    return found


def test_the_tests_read_a_current_site_or_build_a_quick_one_and_keep_the_first_choice(tmp_path, monkeypatch):
    import sitebuild

    def quick_build(site_dir):
        (site_dir / "index.html").parent.mkdir(parents=True)
        (site_dir / "index.html").write_text("quick")
        return subprocess.CompletedProcess([], 0)

    for session in "abc":
        (tmp_path / session).mkdir()
    monkeypatch.setattr(sitebuild, "mkdocs_build", quick_build)
    monkeypatch.setattr(sitebuild, "current_full_site", lambda: tmp_path / "full")
    assert sitebuild.build_once(tmp_path / "a") == (tmp_path / "full", "full")
    monkeypatch.setattr(sitebuild, "current_full_site", lambda: None)  # site/ changed while the tests ran
    assert sitebuild.build_once(tmp_path / "a") == (tmp_path / "full", "full")  # the session's first choice holds
    assert sitebuild.build_once(tmp_path / "b") == (tmp_path / "b" / "site", "quick")  # not current: built quick
    assert (tmp_path / "b" / "site" / "index.html").read_text() == "quick"
    monkeypatch.setattr(sitebuild, "current_full_site", lambda: tmp_path / "full")
    monkeypatch.setenv(sitebuild.REUSE_ENV, "0")
    assert sitebuild.build_once(tmp_path / "c") == (tmp_path / "c" / "site", "quick")  # told not to reuse


def test_two_builds_of_the_same_commit_are_byte_identical(built_site, built_mode, tmp_path):
    again = tmp_path / "again"
    assert mkdocs_build(again, mode=built_mode).returncode == 0
    first, second = (site_files(site) for site in (built_site, again))
    assert first.keys() == second.keys()
    assert [k for k in first if first[k] != second[k]] == []


@pytest.fixture()
def source_copy(tmp_path):
    for folder in ["transformer", "site_scripts", "tests", "docs"]:
        shutil.copytree(ROOT / folder, tmp_path / folder, ignore=shutil.ignore_patterns("__pycache__"))
    return tmp_path


def keys(root):
    return {name: build.page_key(name, CONTEXT, root) for name in build.page_names()}


def test_editing_one_function_reruns_exactly_the_pages_that_reach_it(source_copy):
    before = keys(source_copy)
    layernorm = source_copy / "transformer" / "layernorm.py"
    text = layernorm.read_text()
    assert "    dxhat = dy * g  # eq:ln-dxhat\n" in text  # the edit below must change the file
    layernorm.write_text(text.replace("    dxhat = dy * g  # eq:ln-dxhat\n", "    dxhat = dy * g  # eq:ln-dxhat edited\n"))
    changed = {name for name, key in keys(source_copy).items() if key != before[name]}
    reaching = {name for name in build.page_names()
                if ("layernorm", "layer_norm_backward") in build.page_units(name, source_copy)}
    assert changed == reaching
    assert {"layernorm", "block", "model", "gradcheck"} <= changed
    assert not changed & {"tokenizer", "cli", "configuration", "sampling"}


def test_a_new_test_or_a_moved_function_reruns_the_pages_that_print_them(source_copy):
    before = keys(source_copy)
    tests = source_copy / "tests" / "unit" / "test_layers.py"
    tests.write_text(tests.read_text() + "\n\ndef test_new():\n    layer_norm_backward\n")
    changed = {name for name, key in keys(source_copy).items() if key != before[name]}
    assert "layernorm" in changed and "cli" not in changed
    before = keys(source_copy)
    data = source_copy / "transformer" / "data.py"
    text = data.read_text()
    assert "    path = Path(path)\n" in text  # load_corpus, which the tokenizer page does not reach, above it
    data.write_text(text.replace("    path = Path(path)\n", "    path = Path(path)\n    path = Path(path)\n", 1))
    changed = {name for name, key in keys(source_copy).items() if key != before[name]}
    assert "tokenizer" in changed  # its listings' line numbers moved


def test_a_broken_marker_fails_the_build(monkeypatch):
    """Negative control: a marker that names no equation stops generation."""
    import site_scripts.markers as markers

    real = markers.collect_markers()
    monkeypatch.setattr(markers, "collect_markers",
                        lambda: real + [Marker("no-such-equation", "transformer/layernorm.py", 1, "x")])
    with pytest.raises(RuntimeError, match="eq:no-such-equation"):
        build.generate_all(CONTEXT, ["layernorm"])


def test_a_link_to_a_code_line_that_does_not_exist_fails_the_strict_build(tmp_path):
    """Negative control for the code-line anchors mkdocs checks through the hook."""
    (tmp_path / "docs").mkdir()
    (tmp_path / "hook.py").write_text("from site_scripts.hook import on_page_content  # noqa: F401\n")
    (tmp_path / "mkdocs.yml").write_text(textwrap.dedent("""\
        site_name: t
        validation: {anchors: warn}
        hooks: [hook.py]
        markdown_extensions:
          - attr_list
          - pymdownx.highlight: {anchor_linenums: true}
          - pymdownx.superfences
        """))
    (tmp_path / "docs" / "a.md").write_text('# a\n\n``` { .python #src-m-f linenums="10" }\nx = 1\ny = 2\n```\n')
    for line, ok in [(11, True), (99, False)]:
        (tmp_path / "docs" / "b.md").write_text(f"# b\n\n[line](a.md#__codelineno-src-m-f-{line})\n")
        result = mkdocs_build(tmp_path / "site", cwd=tmp_path)
        assert (result.returncode == 0) is ok, result.stderr[-1500:]
        if not ok:
            assert "__codelineno-src-m-f-99" in result.stderr


def test_every_section_and_table_recorded_is_still_shown(built_site, built_mode):
    """tests/site/page_inventory-<mode>.json holds each page's sections and table headers as a build of that
    mode showed them (the two differ only in the experiments' run lengths: steps, seeds, repeats); none may be
    gone. After a wanted change, record both again: python -m tools.page_inventory <site> --write <file>"""
    from tools.page_inventory import inventory, missing

    recorded = json.loads((ROOT / "tests" / "site" / f"page_inventory-{built_mode}.json").read_text())
    assert missing(recorded, inventory(built_site)) == []


def test_the_inventory_check_notices_a_lost_section_a_lost_table_a_lost_file_and_a_lost_page():
    from tools.page_inventory import missing

    was = {"a/": {"sections": ["h2 #x X", "h2 #y Y"], "tables": ["A | B", "A | B"], "files": ["f.png", "d.data.js"]},
           "b/": {"sections": [], "tables": []}}
    now = {"a/": {"sections": ["h2 #x X"], "tables": ["A | B"], "files": ["f.png"]}}
    assert missing(was, now) == ["a/: section 'h2 #y Y'", "a/: table 'A | B'", "a/: file 'd.data.js'",
                                 "b/: the whole page"]
    assert missing(was, was) == []


def test_the_pages_that_show_a_report_read_its_file():
    """The mutants page shows reports/mutants.json and the architecture page sums up reports/checked-by.json: each
    key must change whenever its report does (the build brings both up to date before any key)."""
    assert "reports/mutants.json" in registry.BY_ID["mutants"].reads
    assert "reports/checked-by.json" in registry.BY_ID["architecture"].reads


def test_a_registry_entry_that_names_what_is_not_there_stops_the_build(monkeypatch):
    """The registry names functions and files as strings: a typo must stop the build, not show a function
    that nothing calls."""
    typo = registry.Page("typo", "model/nothing.md", "Typo", "Model", functions=("layernorm:layer_norm_backwrd",),
                         reads=("tools/nothing.py",))
    assert build.registry_problems() == []
    monkeypatch.setattr(registry, "PAGES", registry.PAGES + (typo,))
    assert build.registry_problems() == ["typo: its prose docs/model/nothing.md is missing",
                                         "typo: transformer/layernorm.py defines no layer_norm_backwrd",
                                         "typo: it reads tools/nothing.py, which is not there"]
    with pytest.raises(RuntimeError, match="names what is not there"):
        build.generate_all(CONTEXT)


def test_a_page_that_explains_a_backward_without_deriving_it_stops_the_build(monkeypatch):
    """Negative control: the Tokenizer page's prose has no Derivation; give its entry a backward."""
    entry = registry.BY_ID["tokenizer"]
    explains = registry.Page(entry.id, entry.path, entry.title, entry.section,
                             functions=entry.functions + ("softmax:softmax_backward",))
    monkeypatch.setattr(registry, "PAGES", tuple(explains if p is entry else p for p in registry.PAGES))
    assert build.registry_problems() == ["tokenizer: it explains softmax_backward but its prose has no "
                                         "'## Derivation'"]


def test_the_anatomy_shows_the_example_then_folds_the_evidence_and_refuses_a_mistyped_marker():
    text = anatomy.expand("# T\n\n<!-- lead used -->\nWho calls it.\n<!-- end lead -->\n\n<!-- anatomy to example -->"
                          "\n\n## Own\n\n<!-- anatomy from implementation -->\n", "p",
                          {"symbols", "example", "implementation", "used", "provenance"})
    open_part, evidence = text.split("??? abstract evidence", 1)
    assert re.findall(r"^## (.+)$", open_part, flags=re.M) == ["Tiny numerical example", "Own"]
    assert re.findall(r"^    ## (.+)$", evidence, flags=re.M) == ["Symbols and tensor shapes", "Actual implementation",
                                                                 "Where is it used?"]
    assert "    Who calls it.\n\n    --8<-- \"p/used.md\"" in evidence and "lead" not in text
    assert text.rstrip().endswith('--8<-- "p/provenance.md"')
    for wrong in ("<!-- anatomy form used -->", "<!-- anatomy to nothing -->"):
        with pytest.raises(ValueError, match="anatomy"):
            anatomy.expand(f"# T\n\n{wrong}\n", "p", {"used"})
    with pytest.raises(ValueError, match="a lead for gradcheck"):
        anatomy.expand("<!-- lead gradcheck -->\nx\n<!-- end lead -->\n<!-- anatomy -->\n", "p", {"used"})


def test_a_fragment_the_page_never_shows_stops_the_build():
    """Negative control: a table the generator made and no include shows would be a number lost."""
    with pytest.raises(ValueError, match="made lost, which the page never shows"):
        anatomy.expand("# T\n\n<!-- anatomy -->\n", "p", {"symbols", "lost"})


def test_a_page_key_covers_the_modules_its_generator_imports_by_name_but_not_what_the_shared_modules_import():
    """`from . import _qlora_memory` and `from .. import memory` name modules: their files are the page's code.
    A shared module (hashed whole into every key) is listed where a page imports it, but its own imports are the
    build's code, not the page's."""
    sources = {n: {p.relative_to(ROOT).as_posix() for p in build.page_sources(n)} for n in ("qlora", "training", "lora")}
    assert "site_scripts/pages/_qlora_memory.py" in sources["qlora"]
    assert {"site_scripts/memory.py", "tools/memory_policies.py"} <= sources["training"]
    assert {"site_scripts/pages/_lora_checks.py", "site_scripts/pages/_lora_cli.py"} <= sources["lora"]
    reached = {p.relative_to(ROOT).as_posix() for p in depends.reached_files(build.generator_path("training"))}
    assert "site_scripts/sections.py" in reached  # `from .. import memory, sections`
    assert not {"tools/checked_by.py", "site_scripts/schedule.py"} & reached  # imported by checked.py, a shared one
