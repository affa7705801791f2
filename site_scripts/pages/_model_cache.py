"""The Full Model page's cache fragments (site_scripts/pages/model.py shows them): the fields of `forward`'s
`ModelCache`, read from the code, what each caller of `forward` does with the cache, and the inventory of every
cache inside it for the materialized policy, with what the other memory policies change, in one table each."""

import ast
import inspect
import re

import numpy as np

from transformer.model import ModelCache, forward

from .. import code_facts, depends, sections
from ..cache_inventory import LONG_T, RUNS, comparison_table, holds_text, long_config, place_link, policy_text, \
    runs_of, size_text, unbatched
from ..common import md_table
from ..examples import default_run, tiny
from ._model_backward import PAGE, here

BASE = RUNS[0]  # the policy whose whole inventory the page shows; the others show what they change


# ---------------------------------------------------------------- the fields of forward's cache

def field_descriptions():
    """{field: what it holds}, from the Attributes section of ModelCache's docstring."""
    doc = inspect.getdoc(ModelCache)
    attributes = doc.split("Attributes\n----------\n", 1)[1]
    return {name: " ".join(text.split()) for name, text in
            re.findall(r"^(\w+) : [^\n]+\n((?:    [^\n]+\n?)+)", attributes, flags=re.M)}


def built_line(fn):
    """The line of `forward` that makes its ModelCache."""
    return next(n.lineno for n in ast.walk(fn) if isinstance(n, ast.Assign)
                and isinstance(n.value, ast.Call) and ast.unparse(n.value.func) == ModelCache.__name__)


def made_at(fn, name):
    """Lines of fn where `name` gets its value from a call, and that call's name (through `.append(x)` to x), or
    where a config field is passed as it is to the ModelCache it makes (no call: None)."""
    found = []
    for node in ast.walk(fn):
        assigned = node.targets[0] if isinstance(node, ast.Assign) else None
        if assigned and name in {t.id for t in ast.walk(assigned) if isinstance(t, ast.Name)}:
            value = node.value.elts[0] if isinstance(node.value, ast.Tuple) else node.value
            if isinstance(value, ast.Call) and isinstance(value.func, ast.Name):
                found.append((node.lineno, value.func.id))
            elif isinstance(value, ast.Compare):
                found.append((node.lineno, None))
        if isinstance(node, ast.Call) and ast.unparse(node.func) == f"{name}.append":
            found += made_at(fn, node.args[0].id)
        if isinstance(node, ast.Call) and ast.unparse(node.func) == ModelCache.__name__:  # a config field, as it is
            found += [(node.lineno, None) for field, arg in zip(ModelCache._fields, node.args, strict=False)
                      if field == name and isinstance(arg, ast.Attribute)]
    return sorted(found)


def read_at(fn, name):
    """(line, the smallest call holding it, else the line's code) for each place fn reads `cache.<name>`."""
    text = (sections.ROOT / "transformer/model.py").read_text()
    found = {}
    for node in ast.walk(fn):
        if isinstance(node, ast.Attribute) and node.attr == name and ast.unparse(node.value) == "cache":
            calls = [c for c in ast.walk(fn) if isinstance(c, ast.Call) and node in ast.walk(c)]
            smallest = min(calls, key=lambda c: len(ast.unparse(c)), default=None)
            found[node.lineno] = (ast.get_source_segment(text, smallest) if smallest is not None else
                                  text.splitlines()[node.lineno - 1].split("  #")[0].strip())
    return sorted(found.items())


def contents(value):
    """A field of the tiny example's cache: its type and, for a cache, its fields and their shapes."""
    if isinstance(value, list):  # one cache per block
        return f"{len(value)} × `{type(value[0]).__name__}`: " + ", ".join(f"`{f}`" for f in value[0]._fields)
    if not hasattr(value, "_fields"):
        return f"`{value}`"
    parts = [f"`{f}` " + (sections.shape_text(v.shape) if isinstance(v, np.ndarray) else f"`{v}`")
             for f, v in zip(value._fields, value, strict=True)]
    return f"`{type(value).__name__}`: " + "; ".join(parts)


def fields_table():
    ex = tiny()
    _, cache = forward(ex.params, ex.ids, ex.cfg)
    source, described = depends.module_source("model"), field_descriptions()
    fwd, bwd = source.defs["forward"], source.defs["backward"]
    rows = []
    for name, value in zip(ModelCache._fields, cache, strict=True):
        built = "; ".join(f"[{n}]({here('forward', n)})" + (f" `{c}`" if c else "") for n, c in made_at(fwd, name))
        read = "; ".join(f"[{n}]({here('backward', n)}) `{code}`" for n, code in read_at(bwd, name))
        rows.append([f"`{name}`", described[name], built, contents(value), read])
    return md_table(["Field", "Holds", "Built at", "On the tiny example", "Read by backward at"], rows)


def kept(call, backward_callers):
    """What a call of forward does with the cache: read from its line, and from whether the function that makes
    the call also calls `backward` (backward_callers: (path, function) of each call of model.backward)."""
    line = (sections.ROOT / call.path).read_text().splitlines()[call.line - 1]
    if re.search(r", _ = \w*forward\(", line) or re.search(r"\w*forward\(.*\)\[0\]", line):
        return "throws it away"
    if (call.path, call.function) in backward_callers:
        return "keeps it for `backward`"
    return "keeps it, and calls no `backward`"


def callers_table():
    """Every call of `forward` in transformer/ and what it does with the cache."""
    backward_callers = {(c.path, c.function) for c in code_facts.called_by("model:backward")}
    calls = code_facts.called_by("model:forward")
    return md_table(["Caller", "Line", "The cache"],
                    [[f"`{c.function}`", f"`{c.path}:{c.line}`", kept(c, backward_callers)] for c in calls]), len(calls)


def fields():
    source = depends.module_source("model")
    line = built_line(source.defs["forward"])
    callers, count = callers_table()
    return ({"cache_fields": fields_table(), "cache_callers": callers},
            {"line": line, "link": here("forward", line), "fields": len(ModelCache._fields), "callers": count})


# ---------------------------------------------------------------- every cache and its bytes

def row(c, c_long, c_sym, repo_url):
    """One cache of a policy's inventory: (path, holds, built at, read at, bytes at the default run, at LONG_T)."""
    holds = "; ".join(holds_text(f, fs) for f, fs in zip(c.fields, c_sym.fields, strict=True))
    times = f" × {c.count}" if c.count > 1 else ""
    return (f"`{c.path}`{times}", holds, f"`{c.built.function}`, {place_link(PAGE, c.built, repo_url)}",
            f"`{c.read.function}`, {place_link(PAGE, c.read, repo_url)}", size_text(c.charged),
            size_text(c_long.charged))


def rows_of(policy, repo_url):
    """{cache path: its row} of one policy, in the inventory's order, and its totals."""
    (short, total), (long, long_total), (sym, _) = runs_of(policy)
    return ({c.path: row(c, cl, cs, repo_url) for c, cl, cs in zip(short, long, sym, strict=True)},
            (total, long_total))


HEADER = ["Passed as", "Holds", "Built at", "Read at", "Bytes, default run", f"Bytes, \\(T\\) = {LONG_T}"]


def inventory(repo_url):
    """The base policy's whole inventory, then one table of what each other policy changes: a row it adds or
    holds differently, or one of the base's rows it does not keep (what it saves)."""
    base, (total, long_total) = rows_of(BASE, repo_url)
    whole = md_table(HEADER, [*base.values(), ["**All of it**", "", "", "", f"**{size_text(total)}**",
                                               f"**{size_text(long_total)}**"]])
    changes = []
    for policy in RUNS[1:]:
        mine, _ = rows_of(policy, repo_url)
        changes += [[f"`{policy}`", "holds" if path in base else "adds", *cells]
                    for path, cells in mine.items() if base.get(path) != cells]
        gone = [path for path in base if path not in mine]
        if gone:
            saved = [sum(c.charged for c in run if c.path in gone) for run, _ in runs_of(BASE)[:2]]
            changes.append([f"`{policy}`", f"does not keep {len(gone)} row" + "s" * (len(gone) > 1), ", ".join(f"`{p}`" for p in gone),
                            "", "", size_text(saved[0]), size_text(saved[1])])
    differ = md_table(["Policy", "This row", *HEADER], changes)
    ex, (long, _) = default_run(), runs_of(BASE)[1]
    attention = sum(c.charged for c in long if c.path.startswith("block_caches[l].attn_cache"))
    values = {"attn_share": attention / long_total, "dtype": str(ex.params["tok_emb"].dtype), "t_max": long_config().context_len, "long_t": LONG_T,
              "blocks": ex.cfg.num_layers, "base": BASE, "base_config": policy_text(BASE),
              "others": [f"`{p}` ({policy_text(p)})" for p in RUNS[1:]], "fixed": size_text(unbatched(BASE))}
    return {"cache_inventory": whole, "cache_changes": differ, "cache_totals": comparison_table(RUNS)}, values
