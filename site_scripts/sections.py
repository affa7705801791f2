"""Markdown for the sections every component page shares. Each function reads
the code or runs it; none holds a number, a line or a name typed by hand."""

import platform
import posixpath
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from .code_facts import (
    called_by,
    called_through,
    enclosing_function,
    named_function,
    passed_by,
    test_mentions,
    top_level_function,
)
from . import checked, registry
from .common import ROOT, md_table, stamps, torch_version, verdict_text
from .depends import read_text
from .equations import by_id, page_equations, table_text
from .markers import collect_markers
from .registry import PAGE_PATHS


def array_md(name, a, decimals=4, row_label=""):
    """A labelled 1-D or 2-D array as a markdown table (rows = first axis)."""
    a = np.atleast_2d(np.asarray(a, dtype=np.float64))
    header = [f"`{name}`" + (f" ({row_label} \\ column)" if row_label else "")] + [str(j) for j in range(a.shape[1])]
    rows = [[str(i)] + [fixed(v, decimals) for v in row] for i, row in enumerate(a)]
    return md_table(header, rows)


def fixed(v, decimals=4):
    """A number with `decimals` decimals; one that rounds to zero gets no sign (not -0.0000)."""
    text = f"{v:.{decimals}f}"
    return text.lstrip("-") if float(text) == 0 else text


def shape_text(shape):
    return f"`{tuple(int(n) for n in shape)}`"


def source_url(repo_url, path, start, end=None):
    lines = f"#L{start}" + (f"-L{end}" if end and end != start else "")
    return f"{repo_url}/blob/main/{path}{lines}"


def page_link(from_page, to_page, anchor=""):
    """A relative link between two pages' markdown files (mkdocs checks it at build)."""
    here = posixpath.dirname(PAGE_PATHS[from_page])
    target = "" if from_page == to_page else posixpath.relpath(PAGE_PATHS[to_page], here or ".")
    return target + (f"#{anchor}" if anchor else "")


def page_title(page):
    """The title of a page: the first level-1 heading of its markdown file."""
    return markdown_title((ROOT / "docs" / PAGE_PATHS[page]).read_text())


def markdown_title(text):
    """The first level-1 heading of a markdown text, after any front matter (whose YAML comments also
    start with "# ")."""
    text = re.sub(r"\A---\n.*?^---\n", "", text, flags=re.M | re.S)
    return re.search(r"^# (.+)$", text, flags=re.M).group(1).strip()


# ---------------------------------------------------------------- code listings

def listing_id(path, name):
    return f"src-{Path(path).stem}-{name}"


def line_anchor(path, function, line):
    """The id pymdownx.highlight gives line `line` of the listing of `function`."""
    return f"__codelineno-{listing_id(path, function)}-{line}"


def listed_functions(page):
    """(path, name) of every function listed on the page: each one holding a marker of
    the page's equations (in file order), then the listings of its registry entry."""
    ids = {eq.id for eq in page_equations(page)}
    found = []
    for m in collect_markers():
        if m.eq_id in ids:
            place = (m.path, top_level_function(m.path, m.line)[0])
            if place not in found:
                found.append(place)
    for unit in registry.BY_ID[page].listings:
        module, name = unit.split(":")
        place = (f"transformer/{module}.py", name)
        if place not in found:
            found.append(place)
    return found


def function_page(path, name):
    """The page that lists a function's code, or None."""
    return function_pages(table_text(), tuple(stamps(ROOT, "transformer", "*.py"))).get((path, name))


@lru_cache(maxsize=4)
def function_pages(_equations, _package):
    """{(path, function): the first page that lists it}, for one state of the equations and of the package
    (the arguments: the pages ask for one function at a time, hundreds of times a build)."""
    index = {}
    for page in PAGE_PATHS:
        for place in listed_functions(page):
            index.setdefault(place, page)
    return index


def function_link(from_page, path, name, line=None):
    """A link to a function's listing (at `line`, else its first line) wherever it is shown."""
    page = function_page(path, name)
    if page is None:
        raise LookupError(f"no page lists {path}:{name}; add it to a page's listings in site_scripts/registry.py")
    line = line or named_function(path, name)[1]
    return page_link(from_page, page, line_anchor(path, name, line))


def listing_md(page, path, name, repo_url):
    """One function's source with the file's line numbers. A line that computes an
    equation is highlighted and carries an annotation linking to that equation."""
    _, start, end = named_function(path, name)
    lines = (ROOT / path).read_text().splitlines()[start - 1:end]
    by_line, equations = {}, by_id()
    for m in collect_markers():
        if m.path == path and start <= m.line <= end:
            by_line.setdefault(m.line, []).append(m.eq_id)
    shown, notes = [], []
    for number, text in enumerate(lines, start=start):
        if number in by_line:
            notes.append(", ".join(f"[{equations[i].title}]({page_link(page, equations[i].page, 'eq-' + i)})"
                                   for i in dict.fromkeys(by_line[number])))
            text += f" ({len(notes)})"
        shown.append(text)
    hl = " ".join(str(n - start + 1) for n in by_line)
    annotations = "\n".join(f"{i}.  Line {n} computes {note}." for i, (n, note) in
                            enumerate(zip(by_line, notes, strict=True), start=1))
    code = "\n".join(shown)
    header = (f"**`{name}`**, [`{path}:{start}-{end}`]({source_url(repo_url, path, start, end)})"
              + (" (highlighted lines compute an equation; click their marker to go to it)" if by_line else ""))
    return (f"{header}\n\n"
            f'``` {{ .python #{listing_id(path, name)} linenums="{start}"' + (f' hl_lines="{hl}"' if hl else "")
            + f" }}\n{code}\n```\n\n" + (annotations + "\n" if annotations else ""))


def implementation_md(page, repo_url):
    return "\n".join(listing_md(page, path, name, repo_url) for path, name in listed_functions(page))


# ---------------------------------------------------------------- equations and their code

def computed_at(page, eq_id, repo_url):
    """The sentence under an equation: links to the lines that compute it, in their listings on this page."""
    links = []
    for m in (m for m in collect_markers() if m.eq_id == eq_id):
        function = top_level_function(m.path, m.line)[0]
        here = page_link(page, page, line_anchor(m.path, function, m.line))
        links.append(f"[`{m.path}:{m.line}`]({here}) ([source]({source_url(repo_url, m.path, m.line)}))")
    return "Computed at " + ", ".join(links) + " ([connection table](#code-and-math))."


def connection_md(page, repo_url):
    """Equation | Role | file:line | the code on that line: the lines that compute each
    equation, then the tests that check those functions (checked_and_named)."""
    rows, functions = [], {}
    for eq in page_equations(page):
        for m in (m for m in collect_markers() if m.eq_id == eq.id):
            function = enclosing_function(m.path, m.line)
            role = "computes it" if function.endswith(("_forward", "_backward")) else f"written inline in `{function}`"
            rows.append([f"[{eq.id}](#eq-{eq.id})", role,
                         f"[`{m.path}:{m.line}`]({source_url(repo_url, m.path, m.line)})", f"`{m.code.strip()}`"])
            top = (m.path, top_level_function(m.path, m.line)[0])
            functions.setdefault(top, [])
            if eq.id not in functions[top]:
                functions[top].append(eq.id)
    for (path, function), eq_ids in functions.items():
        for place in checked_and_named(path, function):
            code = (ROOT / place.path).read_text().splitlines()[place.line - 1]
            rows.append([", ".join(f"[{i}](#eq-{i})" for i in eq_ids), f"tests it (`{place.function}`)",
                         f"[`{place.path}:{place.line}`]({source_url(repo_url, place.path, place.line)})",
                         f"`{code.strip()}`"])
    return md_table(["Equation", "Role", "file:line", "Code on that line"], rows)


def checked_and_named(path, function):
    """The unit tests that fail when the function's output is perturbed (measured: site_scripts/checked.py) and
    name it in their code, each at its first line doing so; none where it was not measured."""
    entry = checked.record(f"{Path(path).stem}:{function}")
    if entry is None or not entry["measured"]:
        return []
    failing = {test.split("[")[0] for test in entry["failed"]}
    return [t for t in test_mentions(function, folder="tests/unit") if f"{t.path}::{t.function}" in failing]


NOTATION = "reference/notation.md"
GRADIENT = re.compile(r"\\partial\\ell/\\partial (.+)")


def notation(root=ROOT):
    """Symbol (LaTeX) -> (meaning, shape), from the tables of the Notation page."""
    rows = re.findall(r"^\| \\\((.+?)\\\) \| (.+?) \| (.+?) \|$", read_text(root / "docs" / NOTATION), flags=re.M)
    table = {symbol: (meaning, shape) for symbol, meaning, shape in rows}
    if len(table) != len(rows):
        twice = sorted({symbol for symbol, _, _ in rows if sum(r[0] == symbol for r in rows) > 1})
        raise LookupError(f"the Notation page gives {', '.join(twice)} more than one meaning")
    return table


def symbol_meaning(symbol, table):
    """A symbol's meaning and shape on the Notation page; a gradient's come from what it is the gradient of."""
    if symbol in table:
        return table[symbol]
    of = GRADIENT.fullmatch(symbol)
    if of and of[1] in table:
        meaning, shape = table[of[1]]
        return f"the gradient of \\(\\ell\\) with respect to {meaning}", shape
    raise LookupError(f"\\({symbol}\\) is not on the Notation page (docs/{NOTATION}): add it there with its one "
                      "meaning, or use the symbol it gives for this meaning")


def symbols_md(rows, default_note):
    """Symbol | Meaning | In code | Shape | Recorded. rows: (LaTeX symbol, name in code, recorded shape or
    text[, what it holds on this page]); the meaning and the symbolic shape are the Notation page's."""
    table, cells = notation(), []
    for symbol, code, recorded, *here in rows:
        meaning, shape = symbol_meaning(symbol, table)
        cells.append([f"\\({symbol}\\)", meaning + (f"; here {here[0]}" if here else ""), f"`{code}`", shape,
                      shape_text(recorded) if isinstance(recorded, tuple) else recorded])
    return (md_table(["Symbol", "Meaning", "In code", "Shape", "Recorded"], cells)
            + f"\nThe last column was recorded by running the code on {default_note}. Each symbol means the same on "
              f"every page: see the [Notation](../{NOTATION}) page.\n")


# ---------------------------------------------------------------- gradient checks

@dataclass(frozen=True)
class GradRow:
    """One gradient against central differences."""
    label: str  # the gradient's name, as the page's code calls it
    shape: tuple
    gap: float  # max |analytic - numeric|
    rel: float  # that gap over the larger of max |analytic| and max |numeric|
    dtype: str
    h: float  # the step of the differences

    @property
    def result(self):
        from transformer.gradcheck import REL_TOL, check_passes

        return verdict_text(check_passes(self.gap, self.rel), self.rel >= REL_TOL,
                           "a zero gradient: the gap is below the absolute floor")

    def cells(self):
        label = self.label if "`" in self.label or "\\(" in self.label else f"`{self.label}`"  # code, or maths
        return [label, shape_text(self.shape), f"{self.gap:.2e}", f"{self.rel:.2e}", self.result]


def gradcheck_rows(loss, checks, h, dtype="float64"):
    """checks: (label, analytic gradient, array the loss reads). Central differences of
    `loss()` against each analytic gradient."""
    from transformer.gradcheck import numerical_grad, relative_gap

    rows = []
    for label, analytic, wrt in checks:
        numeric = numerical_grad(loss, wrt, h)
        rows.append(GradRow(label, np.shape(wrt), float(np.abs(analytic - numeric).max()),
                            relative_gap(analytic, numeric), dtype, h))
    return rows


def block_layer_check(layer_forward, layer_backward, keys, rng, *extra, label=""):
    """A layer of block 0 against central differences: the tiny model's block 0 with its biases moved, an input
    of two sequences and an upstream gradient drawn from rng; layer_forward reads (x, block parameters,
    *extra). Returns the check's rows (sections.gradcheck_rows) and the analytic gradients."""
    from transformer.block import block_params

    from .examples import H_STEP, biases_moved, tiny, weighted_sum

    ex = tiny()
    p = biases_moved(block_params(ex.params, 0), rng)
    x = rng.standard_normal((2, ex.cfg.context_len, ex.cfg.emb_dim))
    dy = rng.standard_normal(x.shape)
    dx, grads = layer_backward(dy, layer_forward(x, p, *extra)[1])
    checks = [(f"{label}dx", dx, x)] + [(f"{label}d{k}", grads[k], p[k]) for k in keys]
    return gradcheck_rows(weighted_sum(dy, layer_forward, x, p, *extra), checks, H_STEP), grads


def gradcheck_table(rows, differentiated=f"the [fake loss f](../{NOTATION}#fake-loss)"):
    """Rows of gradcheck_rows as a table; their dtype and step, shared by all, and what was differentiated
    (for a check of the whole model, the loss itself) go in the caption."""
    from transformer.gradcheck import ABS_FLOOR, REL_TOL

    settings = {(row.dtype, row.h) for row in rows}
    if len(settings) != 1:
        raise RuntimeError(f"one table, one dtype and step: got {sorted(settings)}")
    (dtype, h), = settings
    return (md_table(["Gradient", "Shape", "Largest gap", "Relative gap", "Result"], [row.cells() for row in rows])
            + f"\nIn {dtype}, with step Δ = {h:g}; \\(\\ell\\) is {differentiated}. The relative gap is "
              "max |analytic − numeric| divided by the larger of max |analytic| and max |numeric|. Pass: relative "
              f"gap below {REL_TOL:g}, or largest gap below {ABS_FLOOR:g} (the thresholds of "
              "`transformer/gradcheck.py`).\n")


# ---------------------------------------------------------------- numbers written out, and comparisons

def agreement(mine, reference):
    """(largest gap, verdict) of an array against the one it must equal, by the gradient checks' pass rule."""
    from transformer.gradcheck import REL_TOL, check_passes, relative_gap

    mine, reference = np.asarray(mine, dtype=float), np.asarray(reference, dtype=float)
    gap = float(np.abs(mine - reference).max())
    rel = relative_gap(mine, reference)
    return gap, verdict_text(check_passes(gap, rel), rel >= REL_TOL, "both are 0 up to rounding")


def num(v, decimals=4, bracket=True):
    """A number for written-out arithmetic; a negative one in parentheses (unless bracket is False), so that
    `a·(−b)` reads right; one that rounds to 0 without a sign."""
    text = fixed(v, decimals).replace("-", "−")
    return f"({text})" if bracket and text.startswith("−") else text


def gap_text(gap):
    """A gap as the pages print it; an exact 0 says so."""
    return "0" if gap == 0 else f"{gap:.0e}"


# ---------------------------------------------------------------- where it is used, status, provenance

def place_md(place):
    """A place in the code as the pages name it: `function` (`path:line`)."""
    return f"`{place.function}` (`{place.path}:{place.line}`)"


def used_md(page, units):
    """Called by, found by reading the code; checked by, measured (site_scripts/checked.py)."""
    out = [checked.lead_md(page_link(page, "architecture", "checked-by")),
           "\"Called by\" is read from the code: the calls in `transformer/` that the imports in scope tie to this "
           "very function, under its own name or another. A function of the same name in another module or a method "
           "is not counted. Where a function is named without being called, handed on as a value (to a variable, "
           "or as an argument of another function, which calls it), the place that names it is listed apart.\n"]
    for unit in units:
        name = unit.split(":")[1]
        places = [place_md(p) for p in called_by(unit)]
        for table, users in called_through(name):
            via = ", ".join(place_md(u) for u in users) or "no function"
            places.append(f"{via}, through the table {place_md(table)}")
        handed = "; ".join(place_md(p) for p in passed_by(unit))
        handed = f" It is handed on as a value by {handed}." if handed else ""
        out.append(f"**`{name}`** is called by {'; '.join(places) or 'no function in transformer/'}.{handed}\n")
        out.append(checked.checked_md(unit, test_mentions(name, folder="tests/unit")))
    return "\n".join(out)


def code_fragments(entry, repo_url):
    """The fragments read from the code that a page about code shows: its equations and their connection
    table, the listings, where the entry's functions are called and checked, the status and the provenance.
    A page with none of functions, listings and equations (the home page, the references) gets none."""
    from .examples import SEED

    page = entry.id
    fragments = {}
    if page_equations(page):
        fragments["connection"] = connection_md(page, repo_url)
    if listed_functions(page):
        fragments["implementation"] = implementation_md(page, repo_url)
    if entry.functions:
        fragments["used"] = used_md(page, entry.functions)
    if fragments:
        fragments.update(status=status_md(page), provenance=provenance_md(page, dict.fromkeys(entry.seeds, SEED)))
    return fragments


def status_md(page):
    implemented = {m.eq_id for m in collect_markers()}
    eqs = page_equations(page)
    if not eqs:
        return "**Implemented**: this page declares no equation; its tables come from running the code.\n"
    done = [eq for eq in eqs if eq.id in implemented]
    state = "Implemented" if len(done) == len(eqs) else "Planned"
    return f"**{state}**: {len(done)} of {len(eqs)} equations of this page have implementing lines.\n"


def provenance_md(page, seeds):
    torch = torch_version()
    seed_text = ", ".join(f"{k} = {v}" for k, v in seeds.items()) or "none (nothing random)"
    generator = f"site_scripts/pages/{page}.py"
    made_by = f"`{generator}`" if (ROOT / generator).exists() else "its entry in `site_scripts/registry.py`"
    return (f"Generated by {made_by} with numpy {np.__version__}, "
            f"torch {'not installed' if torch == 'none' else torch}, "
            f"Python {platform.python_version()}; seeds: {seed_text}. "
            f"Rerun only this page: `python -m site_scripts.build --page {page} --force`.\n")
