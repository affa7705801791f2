"""Run the page generators, each only when something it depends on changed.

Every page is an entry of site_scripts/registry.py. Its fragments are the standard ones its entry
describes (the listings of its functions, its equations, its rows of the cross-check, ...) and those
of its optional generator, site_scripts/pages/<id>.py, a module with generate(context) -> {fragment
name: markdown}. They are written to build/snippets/<mode>/<id>/<fragment>.md, which the docs pages include:
each mode (quick, full) keeps its own, so that building in one mode does not undo the other's fragments.

The cache key of a page, in one paragraph: it hashes the code the page's numbers can come from. That
is the generator and the site_scripts and tools modules it imports, and the shared modules (SHARED,
the registry among them); the transformer units (functions, classes,
tables) reachable from what the generator imports and from the units its entry names; the callers
and tests of those units and the measured report's entries for them (which tests check them,
site_scripts/checked.py; the pages print all three); the files its entry lists under `reads`, for code it
runs in ways no import shows; the titles of all pages and the ids, pages and titles of all equations
(links print them; the prose alone shows the rest); the symbols of the Notation page; the numpy, torch and
bitsandbytes versions (the NF4 page compares with bitsandbytes where it is installed) and the build context. Editing one function therefore reruns exactly the pages that can reach it.
Files are rewritten only when their content changes, so `mkdocs serve` does not rebuild forever. A build in
which no file changed computes no key at all: the state of the files the keys read (their modification and change
times, sizes and inodes, `inputs_state`), taken before the keys are read, is stored after each run, and while it
is the same, every page is current.

    python -m site_scripts.build [--page NAME ...] [--force] [--jobs N]
"""

import argparse
import importlib
import json
import os
import re
import sys
import time

from . import checked, depends, equations, prose, registry, schedule
from .common import (MODES, ROOT, hash_parts, is_current, mode, numpy_version, package_version, positive_int,
                     stamps, torch_version, write_if_changed)
from .schedule import Task

SNIPPETS = ROOT / "build" / "snippets"  # a folder per mode: `fragments_dir`
FIGURE = ".png"  # a fragment named like this is a figure: PNG bytes, served beside its page (hook.on_files)
DATA = ".data.js"  # and one named like this is data for a script of the page, served beside it the same way
SERVED = (FIGURE, DATA)


def fragments_dir(build_mode=None):
    """Where the fragments of a mode's build go (default: this build's mode): build/snippets/quick or
    build/snippets/full. The tests build quick when `scripts/site`'s full site is not current; each mode keeps its
    own fragments, so that a build after one of the other mode finds its own still current instead of rerunning
    every generator."""
    return SNIPPETS / (build_mode or mode())


DERIVATION = re.compile(r"^## Derivation\b", flags=re.M)
SHARED = depends.SHARED  # hashed whole into every page's key


def page_names():
    return [p.id for p in registry.PAGES if p.generated and not p.notebook]


def generator_path(name, root=ROOT):
    """The page's own generator, or None when its entry says all it shows."""
    path = root / "site_scripts" / "pages" / f"{name}.py"
    return path if path.exists() else None


def page_sources(name, root=ROOT):
    """The page generator and the site_scripts and tools files it imports, directly or not (beyond the shared
    ones)."""
    path = generator_path(name, root)
    shared = {root / "site_scripts" / s for s in SHARED}
    found = [p for p in depends.reached_files(path, root) if p not in shared] if path else []
    if registry.BY_ID[name].crosscheck and root / "site_scripts" / "results.py" not in found:
        found.append(root / "site_scripts" / "results.py")
    return found


def page_units(name, root=ROOT):
    """The transformer units the page can reach: from its generator's imports and its entry's names."""
    entry = registry.BY_ID[name]
    if "transformer" in entry.reads:
        return depends.all_units(root)
    path = generator_path(name, root)
    units = depends.page_units(path, root) if path else set()
    seeds = entry.units | ({("crosscheck", "run_crosscheck")} if entry.crosscheck else set())
    return units | depends.closure(seeds, root)


def read_files(entry, root=ROOT):
    """The text of the files under the entry's `reads` paths (a folder: its files, in order), and the
    build's mode if the entry reads it."""
    paths, text = [], f"mode {mode()}\n" if "mode" in entry.reads else ""
    for read in entry.reads:
        if ":" in read or read in ("transformer", "mode"):
            continue
        path = root / read
        paths += sorted(p for p in path.rglob("*.py")) if path.is_dir() else [path]
    return text + "\n".join(f"{p.relative_to(root).as_posix()}\n{p.read_text()}" for p in paths if p.exists())


def code_facts_text(units, root=ROOT):
    """Who calls each unit, which tests mention it, and which check it (the measured report's entries): the
    pages print all three."""
    from .checked import key_text
    from .code_facts import facts_by_name

    facts = facts_by_name(root)
    names = sorted({unit for _, unit in units if unit != depends.MODULE})
    return "\n".join(f"{n}: {facts.get(n, '[] [] []')}" for n in names) \
        + key_text(f"{module}:{unit}" for module, unit in units)


def titles_text(root=ROOT):
    """The title of every docs page: pages print each other's titles in links."""
    from .sections import markdown_title

    return "\n".join(markdown_title(p.read_text()) for p in sorted((root / "docs").rglob("*.md")))


def notation_text(root=ROOT):
    """The symbols and meanings of the Notation page: symbol tables print them."""
    from .sections import notation

    return json.dumps(sorted(notation(root).items()))


def page_key(name, context, root=ROOT) -> str:
    """The hash of everything the page's output depends on (see the module docstring)."""
    units = page_units(name, root)
    return hash_parts(*[p.read_text() for p in page_sources(name, root)],
                      *[(root / "site_scripts" / s).read_text() for s in SHARED],
                      depends.units_text(units, root), code_facts_text(units, root), titles_text(root),
                      equations.table_text(root), notation_text(root),
                      read_files(registry.BY_ID[name], root), numpy_version(), torch_version(), package_version("bitsandbytes"),
                      json.dumps(context, sort_keys=True))


def fragments(name, context):
    """The page's standard fragments (from its entry), then its generator's (which may replace one)."""
    from .results import devices_md
    from .sections import code_fragments

    entry = registry.BY_ID[name]
    out = code_fragments(entry, context["repo_url"])
    devices = devices_md(name, entry.crosscheck) if entry.crosscheck else None
    if devices is not None:
        out["devices"] = devices
    if generator_path(name):
        out.update(importlib.import_module(f"site_scripts.pages.{name}").generate(context))
    return out


def is_stale(name, context, force=False):
    """The page's key when its generator must run (its key changed, or `force`), else None."""
    key = page_key(name, context)
    return key if force or not is_current(fragments_dir() / name / ".key", key) else None


VALUES = "values.json"  # what a generator returns under "values": the numbers its prose shows (site_scripts/prose.py)


def write_page(name, context, key):
    """Run the page's generators and write their fragments and values, then its key. A schedule.Task: it may
    run in a worker process."""
    made = fragments(name, context)
    folder = fragments_dir() / name
    values = made.pop("values", None)
    files = {folder / (f if f.endswith(SERVED) else f"{f}.md"): text for f, text in made.items()}
    if values is not None:
        files[folder / VALUES] = prose.dumps(values)
    for path, content in files.items():
        if isinstance(content, bytes):
            if not path.exists() or path.read_bytes() != content:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(content)
        else:
            write_if_changed(path, content)
    for stale in {*folder.glob("*.md"), *(p for s in SERVED for p in folder.glob(f"*{s}")), *folder.glob(VALUES)} - set(files):
        stale.unlink()  # a fragment the generator no longer makes must not linger
    write_if_changed(folder / ".key", key)


def generate(name, context, force=False) -> bool:
    """Rerun one page's generator if its key changed. Returns True if it ran."""
    key = is_stale(name, context, force)
    if key is not None:
        write_page(name, context, key)
    return key is not None


def made_fragments(name):
    """The names of the fragments the page's last run made."""
    return {p.stem for p in (fragments_dir() / name).glob("*.md")}


def made_values(name):
    """The values the page's last run returned for its prose ({} for a page whose generator returns none)."""
    return prose.load(fragments_dir() / name / VALUES)


def figure_files():
    """(path in the site, file on disk) of every page's figures and data files: page <id>'s figure F is served as
    <folder of its docs page>/<id>/F, so its markdown links it as `<id>/F`."""
    import posixpath

    for page in registry.PAGES:
        for figure in sorted(p for s in SERVED for p in (fragments_dir() / page.id).glob(f"*{s}")):
            yield posixpath.join(posixpath.dirname(page.path), page.id, figure.name), figure


def registry_problems(root=ROOT):
    """What the registry names that is not there: a page's prose, a transformer unit, a file it reads, the
    derivation of a backward the page explains.
    (Its names are strings, so a typo would otherwise show as a function that nothing calls.)"""
    problems = []
    for page in registry.PAGES:
        prose = f"notebooks/{page.id}.py" if page.notebook else f"docs/{page.path}"
        if not (root / prose).exists():
            problems.append(f"{page.id}: its prose {prose} is missing")
        for module, name in sorted(page.units):
            if not (root / "transformer" / f"{module}.py").exists() or \
                    name not in depends.module_source(module, root).unit_of:
                problems.append(f"{page.id}: transformer/{module}.py defines no {name}")
        for read in page.reads:
            if ":" not in read and read not in ("transformer", "mode") and not (root / read).exists():
                problems.append(f"{page.id}: it reads {read}, which is not there")
        backward = sorted(name for _, name in page.units if name.endswith("backward"))
        if backward and (root / prose).exists() and not DERIVATION.search((root / prose).read_text()):
            problems.append(f"{page.id}: it explains {', '.join(backward)} but its prose has no '## Derivation'")
    return problems


# Everything a page's key can read lives under these (with pyproject.toml, the reports in build/cache and the
# keys themselves): while none of their files changed since the last run, no key can have changed either.
KEYED_FOLDERS = ("transformer", "tests", "site_scripts", "tools", "docs", "scripts", "notebooks", "reports")


def last_run():
    """Where the state of the last run that ended well is stored: one file per mode, like the fragments."""
    return ROOT / "build" / "cache" / f"pages-{mode()}-state"


def source_state(root=ROOT):
    """The stamps (`common.stamps`) of every file under KEYED_FOLDERS and of pyproject.toml: what the pages'
    keys read. Reading them stats a few hundred files, where computing the keys parses the package and the
    tests (about a second)."""
    files = [s for folder in KEYED_FOLDERS for s in stamps(root, folder, "**/*") if "__pycache__" not in s[0]]
    return files + list(stamps(root, ".", "pyproject.toml"))


def inputs_state(context, pages, sources, root=ROOT):
    """One hash of the sources' stamps (`source_state`), of the build's own products that keys read or that
    must be there (the reports in build/cache, each page's stamp), of the versions, the mode, the context
    and the pages asked for."""
    fragments = fragments_dir().relative_to(ROOT).as_posix()  # this mode's
    products = reports(root) + stamps(root, fragments, "*/.key")
    return hash_parts(*map(str, sources), *map(str, products), numpy_version(), torch_version(),
                      package_version("bitsandbytes"), mode(), json.dumps(context, sort_keys=True), pages)


def reports(root=ROOT):
    """The stamps of the reports in build/cache that this mode's pages can read: the shared ones and this mode's
    (<name>-<mode>.json), not the other mode's: a quick build between two full builds of `scripts/site` must not
    make the full build compute every page's key again to find none changed."""
    others = tuple(f"-{other}.json" for other in MODES if other != mode())
    return tuple(s for s in stamps(root, "build/cache", "*.json") if not s[0].endswith(others))


# The results several pages show, each brought up to date by a task of its own that the pages showing it come
# after (each page would otherwise compute it at once): the task's name, the file a page's sources hold when it
# shows the result, the function that brings the stored result up to date, and why it runs alone ("": it need not).
SHARED_RESULTS = (("the cross-check", "results.py", "site_scripts.results:crosscheck_report", ""),
                  ("the memory policies", "memory.py", "site_scripts.memory:measurements",
                   "it times the steps of each memory policy"))


def bring_up_to_date(function):
    """Call "module:function", a function that brings a stored result up to date. A schedule.Task."""
    module, _, attr = function.partition(":")
    getattr(importlib.import_module(module), attr)()


def bring_reports_up_to_date(names, log):
    """The reports kept in the repository that the pages `names` read, side by side: the mutation run's processes
    fill the cores that the measurement of "checked by" leaves idle (it perturbs one function per process, and an
    edit usually changes a few). The mutation run's unit tests of the unchanged code are that measurement's trace,
    which it waits for (tools/checked_by.py, UPDATING)."""
    from concurrent.futures import ThreadPoolExecutor

    from . import profile

    def timed(what, function, *args, **kwargs):
        start = time.perf_counter()
        function(*args, **kwargs)
        profile.record(f"{what} brought up to date", time.perf_counter() - start)

    with ThreadPoolExecutor(2) as pool:
        done = []
        if any(registry.BY_ID[name].functions for name in names):
            done.append(pool.submit(timed, "reports/checked-by.json", checked.report, log))
        if "mutants" in names:
            from tools import mutants

            done.append(pool.submit(timed, "reports/mutants.json", mutants.update, jobs=schedule.jobs_from_env(),
                                    log=log))
        for future in done:
            future.result()


class Plan:
    """The page generators one build must run (`pages`), as schedule.Tasks with those of the shared results
    they show (`tasks`), and what to record once they all ran."""

    def __init__(self, context, pages=None, force=False, log=print):
        from .markers import check_ties, collect_markers

        problems = registry_problems()
        if problems:
            raise RuntimeError("site_scripts/registry.py names what is not there:\n  " + "\n  ".join(problems))
        problems = check_ties(collect_markers())
        if problems:
            raise RuntimeError("equations and code are not tied:\n  " + "\n  ".join(problems))
        self.state = (context, pages, source_state())
        self.pages, self.tasks = [], []
        if not force and is_current(last_run(), inputs_state(*self.state)):
            return
        names = pages or page_names()
        # The reports kept in the repository, brought up to date before any page's key reads them; then the state
        # again, so that their new entries are not taken for an edit by the next build.
        bring_reports_up_to_date(names, log)
        self.state = (context, pages, source_state())  # before any key reads them: a file edited now is seen next time
        keys = {name: is_stale(name, context, force) for name in names}
        self.pages = [name for name, key in keys.items() if key is not None]
        shown = {name: {result for result, file, _, _ in SHARED_RESULTS
                        if ROOT / "site_scripts" / file in page_sources(name)} for name in self.pages}
        self.tasks = [Task(f"brought {result} up to date", bring_up_to_date, (function,), alone=alone)
                      for result, _, function, alone in SHARED_RESULTS if any(result in s for s in shown.values())]
        self.tasks += [Task(f"generated page {name}", write_page, (name, context, keys[name]),
                            after=frozenset(f"brought {result} up to date" for result in shown[name]),
                            alone=registry.BY_ID[name].alone) for name in self.pages]

    def record(self):
        """Store the sources' state as the keys read it: while it stays the same, no page is computed again."""
        write_if_changed(last_run(), inputs_state(*self.state))


def generate_all(context, pages=None, force=False, log=print, jobs=1):
    """Check the registry and the equation ties, then run every (or the named) page generator whose key
    changed, `jobs` at a time (site_scripts/schedule.py). When no file changed since the last run that ended
    well (`inputs_state`), no key can have changed, and none is computed. Returns the pages that ran."""
    plan = Plan(context, pages, force, log)
    schedule.run(plan.tasks, jobs, log)
    plan.record()
    return plan.pages


def main():
    parser = argparse.ArgumentParser(description="run the site's page generators")
    parser.add_argument("--page", nargs="+", choices=page_names(), help="only these pages")
    parser.add_argument("--force", action="store_true", help="rerun even when nothing changed")
    parser.add_argument("--units", choices=page_names(), metavar="PAGE",
                        help="only list the transformer units the page reaches (its cache key's code), and exit")
    parser.add_argument("--repo-url", default="https://github.com/transformer-explained/transformer")
    parser.add_argument("-j", "--jobs", type=positive_int, default=None,
                        help="generators run at once, and mutants or measured tests (default: $SITE_JOBS, else "
                             "the number of cores)")
    args = parser.parse_args()
    if args.units:
        print("\n".join(f"{module}.{unit}" for module, unit in sorted(page_units(args.units))))
        return 0
    if args.jobs:
        os.environ[schedule.JOBS_ENV] = str(args.jobs)  # the mutation run and the measured "checked by" read it
    jobs = schedule.jobs_from_env()
    reran = generate_all({"repo_url": args.repo_url}, args.page, args.force, jobs=jobs)
    print(f"reran: {', '.join(reran) or 'nothing (all up to date)'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
