"""What mkdocs made of each page, kept from one build to the next: a rebuild with nothing changed converts no
markdown and indexes no page for search again.

mkdocs converts every page's markdown to HTML on every build (`Page.render`), and Material's search plugin
parses every page's HTML for its index (`SearchIndex.add_entry_from_context`). In a rebuild where nothing
changed, that is most of the time the build takes. `install()` wraps both methods so that each looks up its
result under a key before doing the work, and stores what it made:

- **A page's HTML** is keyed by all that its conversion reads: the markdown after the hook's expansion
  (`on_page_markdown`), where the page is, every file of the site and where it goes (links are resolved
  against them), the markdown extensions and their settings, the plugins' settings (plugins add extensions:
  mkdocs-autorefs, mkdocstrings), the validation settings, the versions of the packages that convert, and
  the text of every snippet the page includes (`--8<-- "name"`). Kept with it: its table of contents, its
  title, its anchors and its links to other pages' anchors (mkdocs checks those after every page is made),
  and the anchors it registered for cross-references (mkdocs-autorefs), which a reused page registers again.
- **A page's search entries** are keyed by the page's HTML, table of contents, address, title and metadata,
  the search settings and the same packages' versions.

Not kept, so made every time:

- a page whose markdown calls mkdocstrings (a line that starts with `:::`): rendering it reads the code of
  the package and registers what it documents with mkdocstrings' inventory and autorefs;
- a page whose snippets are not all plain `--8<-- "name"` lines of files that include nothing themselves;
- a conversion that logged a warning: reused, it would not log it again, and `mkdocs build --strict` would
  pass where it should fail.

The key also hashes this file, so a change to what is kept changes every key. Results live in
`build/cache/rendered/<mode>/`, one file each; at the end of a build those no page used are deleted.
`SITE_RENDER_CACHE=0` turns it off (the tests build a site both ways and compare the files).
"""

import logging
import os
import pickle
import re
from collections.abc import Mapping
from functools import cache
from pathlib import Path

from .common import CACHE, hash_parts, mode, package_version

FOLDER = CACHE / "rendered"  # with a folder per mode: a quick and a full build of one checkout prune only their own
ENV = "SITE_RENDER_CACHE"  # SITE_RENDER_CACHE=0: convert and index every page, store nothing
PACKAGES = ("mkdocs", "Markdown", "pymdown-extensions", "Pygments", "mkdocs-autorefs", "mkdocstrings",
            "mkdocstrings-python", "mkdocs-material")
SNIPPET = re.compile(r'^-{1,}8<-{1,}[ \t]+"([^"\n]+)"[ \t]*$', re.M)  # a whole line that includes one file
CALLS_MKDOCSTRINGS = re.compile(r"^:::", re.M)
SELF = Path(__file__).read_text()

used = set()  # the keys this build looked up or stored; on_post_build deletes the rest
autorefs = None  # this build's mkdocs-autorefs plugin (mkdocs serve makes one per build), or None


def enabled():
    return os.environ.get(ENV, "1") != "0"


def stable(value):
    """A text of a setting that is the same in every process: an object is named by its type, not by its
    address (mkdocstrings puts extension objects, and mkdocs.yml functions, into the markdown settings)."""
    if isinstance(value, Mapping):  # a dict, or a mkdocs setting with settings inside (validation: links, nav)
        return "{" + ", ".join(f"{stable(k)}: {stable(v)}" for k, v in sorted(value.items(), key=str)) + "}"
    if isinstance(value, (list, tuple, set, frozenset)):
        items = sorted(value, key=str) if isinstance(value, (set, frozenset)) else value
        return "[" + ", ".join(stable(v) for v in items) + "]"
    if value is None or isinstance(value, (str, int, float, bool)):
        return repr(value)
    named = value if callable(value) and hasattr(value, "__qualname__") else type(value)
    return f"<{named.__module__}.{named.__qualname__}>"


@cache
def versions():
    """The versions of the packages that convert and index, read once: this process has imported them, so they
    cannot change under it (read for every page, they cost a no-change build 0.13 s)."""
    return tuple(package_version(p) for p in PACKAGES)


def records_links():
    """Whether mkdocs keeps a page's links to other pages' anchors: not when its log is at debug level
    (`mkdocs build -v`), and then a page it made has none to keep."""
    return logging.getLogger("mkdocs.structure.pages").getEffectiveLevel() > logging.DEBUG


def folder():
    return FOLDER / mode()


def _load(key):
    used.add(key)
    try:
        return pickle.loads((folder() / key).read_bytes())
    except (FileNotFoundError, EOFError, pickle.UnpicklingError):  # not made yet, or cut short: make it again
        return None


def _store(key, value):
    folder().mkdir(parents=True, exist_ok=True)
    partial = folder() / f"{key}.{os.getpid()}.partial"  # whole or absent, as common.cached_json
    partial.write_bytes(pickle.dumps(value))
    partial.replace(folder() / key)


def snippet_texts(markdown, config):
    """The text of every file the page includes, or None when it includes in a way this does not follow."""
    if "-8<-" not in markdown:
        return []
    settings = (config["mdx_configs"] or {}).get("pymdownx.snippets", {})
    lines = [line for line in markdown.splitlines() if "-8<-" in line]
    names = [m[1] for line in lines if (m := SNIPPET.match(line))]
    if len(names) != len(lines) or settings.get("auto_append"):
        return None
    texts = []
    for name in names:
        found = [Path(base) / name for base in settings.get("base_path", ["."]) if (Path(base) / name).is_file()]
        if not found:
            return None  # let the conversion say it is missing
        text = found[0].read_text()
        if "-8<-" in text:
            return None
        texts.append(f"{name}\0{text}")
    return texts


def render_key(page, config, files):
    """The key of a page's conversion, or None when it is not to be kept (see the module's docstring)."""
    if CALLS_MKDOCSTRINGS.search(page.markdown):
        return None
    snippets = snippet_texts(page.markdown, config)
    if snippets is None:
        return None
    site = sorted((f.src_uri, f.dest_uri, f.url, str(f.inclusion)) for f in files)
    # the extension objects plugins add (autorefs, mkdocstrings) are named by type; their settings are the plugins'
    plugins = {name: getattr(plugin, "config", None) for name, plugin in config["plugins"].items()}
    return "page-" + hash_parts(SELF, page.markdown, page.file.src_uri, page.file.dest_uri, page.url,
                                stable(site), stable(config["markdown_extensions"]), stable(config["mdx_configs"]),
                                stable(plugins), config["use_directory_urls"], stable(config["validation"]),
                                records_links(), *versions(), *snippets)


class _Warnings(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.count = 0

    def emit(self, record):
        self.count += 1


def install(config):
    """Wrap mkdocs' page conversion and Material's search indexing with the cache (once per process)."""
    from material.plugins.search.plugin import SearchIndex
    from mkdocs.structure.pages import Page

    global autorefs
    if not getattr(Page.render, "cached", False):
        Page.render = _cached_render(Page.render)
        SearchIndex.add_entry_from_context = _cached_index(SearchIndex.add_entry_from_context)
    autorefs = config["plugins"].get("autorefs")
    used.clear()


def _cached_render(render):
    def cached(page, config, files):
        key = render_key(page, config, files) if enabled() else None
        made = _load(key) if key else None
        if made is not None:
            page.content, page.toc, page._title_from_render, page.present_anchor_ids = made["page"]
            if made["links"] is not None:
                page.links_to_anchors = {files.get_file_from_path(uri): links for uri, links in made["links"]}
            for identifier, anchor, title, primary in made["anchors"]:
                autorefs.register_anchor(page, identifier, anchor, title=title, primary=primary)
            return
        anchors, warnings = [], _Warnings()
        register = autorefs.register_anchor if autorefs else None
        if register:  # record what the conversion registers with autorefs, to register it again when reused
            def recording(p, identifier, anchor=None, *, title=None, primary=True):
                anchors.append((identifier, anchor, title, primary))
                return register(p, identifier, anchor, title=title, primary=primary)
            autorefs.register_anchor = recording
        logging.getLogger("mkdocs").addHandler(warnings)
        try:
            render(page, config, files)
        finally:
            logging.getLogger("mkdocs").removeHandler(warnings)
            if register:
                del autorefs.register_anchor  # back to the class's method
        if key and not warnings.count:
            links = getattr(page, "links_to_anchors", None)
            _store(key, {"page": (page.content, page.toc, page._title_from_render, page.present_anchor_ids),
                         "links": None if links is None else [(f.src_uri, v) for f, v in links.items()],
                         "anchors": anchors})

    cached.cached = True
    return cached


def search_key(index, page):
    return "search-" + hash_parts(SELF, page.content, stable(stable_toc(page.toc)), page.url, page.title,
                                  stable(page.meta), stable(index.config), *versions())


def stable_toc(items):
    """A table of contents as nested (title, address, level, children)."""
    return [(item.title, item.url, item.level, stable_toc(item.children)) for item in items]


def _cached_index(add_entry):
    def cached(index, page):
        key = search_key(index, page) if enabled() else None
        entries = _load(key) if key else None
        if entries is not None:
            index.entries.extend(entries)
            return
        before = len(index.entries)
        add_entry(index, page)
        if key:
            _store(key, index.entries[before:])

    cached.cached = True
    return cached


def prune():
    """Delete the results this build did not use (run at the end of a build)."""
    if not enabled() or not folder().is_dir():
        return
    for path in folder().iterdir():
        if path.name not in used and not path.name.endswith(".partial"):
            path.unlink(missing_ok=True)
