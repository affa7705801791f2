"""The caches of one run of the model's forward, found by running it: site_scripts/cache_inventory.py
prints them.

One forward runs with a profiler that notes which transformer function first returned each object as its
cache (the second item of its result): that function built it. One backward then runs with a profiler that
notes which function first received each cache as its own cache argument: that function reads it. The
lines are read from those functions' source (the line that makes the cache, the first line that reads the
argument), the fields from the NamedTuple or from the builder's docstring (`cache : (x, w)`), the bytes from
the arrays themselves. A buffer is counted once, at the first field that holds it (a view counts as its
base, as in tools/memory_policies.owned_bytes), and the parameters are not counted, so the rows of a run add
up to owned_bytes of its whole cache: the `retained` of tools/memory_policies.py.
"""

import ast
import inspect
import sys
from dataclasses import dataclass, field

import numpy as np

from tools.memory_policies import POLICIES, owned_bytes
from transformer.config import ModelConfig
from transformer.model import backward, forward, init_params

from . import code_facts
from .common import ROOT
from .examples import SEED

TRANSFORMER = str(ROOT / "transformer") + "/"


@dataclass
class Field:
    name: str
    text: str  # what it holds, when not an array
    shape: tuple | None = None  # an array's shape
    base_shape: tuple | None = None  # the shape of the buffer it is a view of, when that is larger
    charged: int = 0  # the bytes counted at this field, over every instance of its cache
    shared_with: str = ""  # the field that already counted its buffer
    parameter: bool = False
    inner: str = ""  # a cache inside the cache: its path
    items: int = 0  # a list of caches: how many


@dataclass
class Cache:
    path: str  # as the backward's locals name it: block_caches[l].attn_cache
    kind: str  # the NamedTuple's name, or "tuple" / "ndarray"
    built: code_facts.Place  # the line that makes it
    read: code_facts.Place  # the first line of its backward that reads it
    fields: list = field(default_factory=list)
    count: int = 1  # instances (L for a block's caches); the bytes are summed over them

    @property
    def charged(self):
        return sum(f.charged for f in self.fields)


def profiled(run, event, note):
    """run() with note(frame, arg) called on each `event` of a function in transformer/."""
    def profile(frame, what, arg):
        if what == event and frame.f_code.co_filename.startswith(TRANSFORMER):
            note(frame, arg)
    old = sys.getprofile()
    sys.setprofile(profile)
    try:
        return run()
    finally:
        sys.setprofile(old)


def traced(params, ids, cfg):
    """(cache, builders, readers): forward's cache; {id: (code, obj)} of the first function that returned each
    object as the second item of its result; {id: (code, argument name)} of the first function called with
    it as its second argument. The objects are kept in `builders` so that their ids stay theirs."""
    builders, readers = {}, {}

    def returned(frame, result):
        if isinstance(result, tuple) and len(result) >= 2:
            builders.setdefault(id(result[1]), (frame.f_code, result[1]))

    def called(frame, _):
        code = frame.f_code
        if code.co_argcount >= 2:
            readers.setdefault(id(frame.f_locals[code.co_varnames[1]]), (code, code.co_varnames[1]))

    logits, cache = profiled(lambda: forward(params, ids, cfg), "return", returned)
    profiled(lambda: backward(np.ones_like(logits), cache), "call", called)
    return cache, builders, readers


def function_node(code):
    """The ast of the function a code object runs."""
    tree = ast.parse((ROOT / place_path(code)).read_text())
    return next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)
                and n.name == code.co_name and n.lineno == code.co_firstlineno)


def place_path(code):
    return code.co_filename[len(str(ROOT)) + 1:]


def built_line(code):
    """The line of a forward that makes its cache: the return's second item if that is a call, else the last
    assignment before the return to the name it returns."""
    fn = function_node(code)
    ret = [n for n in ast.walk(fn) if isinstance(n, ast.Return) and isinstance(n.value, ast.Tuple)][-1]
    item = ret.value.elts[1]
    if not isinstance(item, ast.Name):
        return ret.lineno
    return max(n.lineno for n in ast.walk(fn) if isinstance(n, ast.Assign) and n.lineno < ret.lineno
               and any(isinstance(t, ast.Name) and t.id == item.id for t in n.targets))


def read_line(code, name):
    """The first line of a backward that reads its cache argument `name`."""
    return min(n.lineno for n in ast.walk(function_node(code)) if isinstance(n, ast.Name) and n.id == name
               and isinstance(n.ctx, ast.Load))


def field_names(obj, code):
    """A cache's fields: a NamedTuple's own, else the names its builder's docstring gives (`cache : (x, w)`)."""
    if hasattr(obj, "_fields"):
        return list(obj._fields)
    doc = inspect.getdoc(sys.modules[code_module(code)].__dict__[code.co_name])
    for line in doc.splitlines():
        if line.startswith("cache : "):
            return [n.strip() for n in line[len("cache : "):].strip("()").split(",")]
    raise LookupError(f"{code.co_name}'s docstring does not name the parts of its cache (`cache : (a, b)`)")


def code_module(code):
    return "transformer." + place_path(code).removeprefix("transformer/").removesuffix(".py")


def base_of(a):
    while isinstance(a.base, np.ndarray):
        a = a.base
    return a


# ---------------------------------------------------------------- walking a run's cache

@dataclass
class Walk:
    builders: dict
    readers: dict
    params: set  # ids of the parameters' buffers
    counted: dict = field(default_factory=dict)  # id of a buffer -> the field that counted it
    found: dict = field(default_factory=dict)  # path -> Cache


def is_cache(name):
    return name.endswith(("_cache", "_caches"))


def visit(obj, path, walk):
    """Add obj, a cache at `path`, and the caches it holds to walk.found."""
    code, _ = walk.builders[id(obj)]
    reader, argument = walk.readers[id(obj)]
    values = list(obj) if isinstance(obj, tuple) else [obj]
    names = field_names(obj, code)
    if len(names) != len(values):
        raise LookupError(f"{code.co_name}'s cache has {len(values)} parts, its docstring names {names}")
    if path not in walk.found:
        built = code_facts.Place(place_path(code), built_line(code), code.co_name)
        read = code_facts.Place(place_path(reader), read_line(reader, argument), reader.co_name)
        walk.found[path] = Cache(path, type(obj).__name__, built, read, [Field(n, "") for n in names], 0)
    entry = walk.found[path]
    entry.count += 1
    for f, value in zip(entry.fields, values):
        if is_cache(f.name):
            items = value if isinstance(value, list) else [value]
            inner = (f.name if path == "cache" else f"{path}.{f.name}") + ("[l]" if isinstance(value, list) else "")
            for item in items:
                visit(item, inner, walk)
            f.inner, f.items = inner, (len(items) if isinstance(value, list) else 0)
        elif isinstance(value, np.ndarray):
            count_array(f, value, f"{path}.{f.name}", walk)
        else:
            f.text = value_text(value, walk)


def count_array(f, a, label, walk):
    """Count an array's buffer at this field, unless it is a parameter's or an earlier field counted it."""
    base = base_of(a)
    if f.shape is not None and f.shape != a.shape:
        raise RuntimeError(f"{label} differs in shape between blocks: the inventory shows one shape per field")
    f.shape, f.base_shape = a.shape, (base.shape if base.size > a.size else None)
    if id(base) in walk.params:
        f.parameter = True
    elif id(base) in walk.counted:
        f.shared_with = walk.counted[id(base)]
    else:
        walk.counted[id(base)] = label
        f.charged += base.nbytes


def value_text(value, walk):
    """What a field that is neither an array nor a cache holds, in words."""
    if isinstance(value, dict):
        if not all(id(base_of(a)) in walk.params for a in value.values()):
            raise RuntimeError("a dictionary in the cache holds arrays that are not parameters: count them")
        return f"{len(value)} parameters (the model's own arrays, not counted)"
    if isinstance(value, ModelConfig):
        return "the `ModelConfig`"
    return f"`{value!r}`"


def inventory(policy, cfg, ids, dtype=np.float64):
    """(caches, owned bytes of the whole cache) of one run of forward under a policy of tools/memory_policies."""
    cfg = cfg.with_(**POLICIES[policy])
    params = init_params(cfg, SEED, dtype)
    cache, builders, readers = traced(params, ids, cfg)
    walk = Walk(builders, readers, {id(base_of(a)) for a in params.values()})
    visit(cache, "cache", walk)
    caches = list(walk.found.values())
    total = owned_bytes(cache, exclude=params.values())
    check_total(caches, total)
    for c in caches:
        check_lines(c)
    return caches, total


def check_total(caches, total):
    """The rows must add up to the whole cache's owned bytes: a buffer counted twice, or missed, stops the build."""
    rows = sum(c.charged for c in caches)
    if rows != total:
        raise RuntimeError(f"the inventory's rows add up to {rows} bytes, the cache owns {total}")


def check_lines(c):
    """The built-at line must assign the name its function returns as the cache (or return a new one), and the
    read-at line must read the backward's cache argument: a wrong file:line stops the build."""
    fn = function_node_at(c.built.path, c.built.function)
    item = [n for n in ast.walk(fn) if isinstance(n, ast.Return) and isinstance(n.value, ast.Tuple)][-1].value.elts[1]
    name = item.id if isinstance(item, ast.Name) else None
    makes = any(getattr(n, "lineno", None) == c.built.line and (
        isinstance(n, ast.Assign) and name in {t.id for t in n.targets if isinstance(t, ast.Name)}
        or isinstance(n, ast.Return) and name is None) for n in ast.walk(fn))
    if not makes:
        raise RuntimeError(f"{c.built.path}:{c.built.line} does not make {c.path}")
    reader = function_node_at(c.read.path, c.read.function)
    argument = reader.args.args[1].arg
    if not any(isinstance(n, ast.Name) and n.id == argument and isinstance(n.ctx, ast.Load)
               and n.lineno == c.read.line for n in ast.walk(reader)):
        raise RuntimeError(f"{c.read.path}:{c.read.line} does not read {c.path}")


def function_node_at(path, name):
    tree = ast.parse((ROOT / path).read_text())
    return next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == name)
