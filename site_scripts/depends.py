"""Which transformer functions a page generator uses, read from the source.

A page's cache key hashes the source of exactly the code its numbers can come from, so editing one function
reruns only the pages that reach it. The units of a transformer module are its top-level functions and classes
(named by their names), its top-level assignments (named "<NAME>" after the first name assigned, so a table such
as PRESETS is followed only where it is used), and "<module>", the rest (docstring, imports, module-level checks),
which comes along with any unit of the module. From a unit we follow every name it mentions that resolves to
another unit: a function of the same module, a name imported from a sibling module (`from .layernorm import
layer_norm_forward`, also inside a function), or an attribute of an imported sibling module.

    python -m site_scripts.build --units layernorm    # the units a page reaches
"""

import ast
from functools import lru_cache
from pathlib import Path

from .common import ROOT

MODULE = "<module>"


class Source:
    """One parsed file: its units (see above) and, for each, the (module, unit) pairs it mentions."""

    def __init__(self, text, package_module=None, root=ROOT):
        self.tree = ast.parse(text)
        self.lines = text.splitlines()
        self.root = root
        self.package_module = package_module  # the transformer module this file is, if it is one
        self.nodes, self.unit_of = {}, {}  # unit -> its top-level statement; global name -> its unit
        for node in self.tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                self.nodes[node.name] = node
                self.unit_of[node.name] = node.name
            elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                names = [n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)]
                if names:
                    unit = self.unit_of.get(names[0], f"<{names[0]}>")
                    self.nodes.setdefault(unit, node)
                    if self.nodes[unit] is not node:  # assigned again further down: keep every statement
                        unit = f"<{names[0]}@{node.lineno}>"
                        self.nodes[unit] = node
                    for name in names:
                        self.unit_of.setdefault(name, unit)
        self.helpers, self._mentions = [], {}  # helpers: the site_scripts and tools files it imports
        self.module_level = [n for n in self.tree.body if n not in self.nodes.values()]  # the unit "<module>"
        # Imports at module level are seen by every unit; an import inside a function only by that function.
        self.names, self.modules = self._imports(self.module_level)
        for node in self.defs.values():
            self._imports([node])  # records the site_scripts helpers a page imports inside a function

    def _imports(self, statements):
        """({local name: (module, name)}, {local name: module}) of the transformer imports in the statements."""
        names, modules = {}, {}
        for top in statements:
            for node in ast.walk(top):
                if isinstance(node, ast.ImportFrom):
                    self._import_from(node, names, modules)
                elif isinstance(node, ast.Import):
                    for alias in node.names:
                        if alias.name.startswith("transformer."):
                            modules[alias.asname or alias.name] = alias.name.split(".")[1]
        return names, modules

    @property
    def defs(self):
        """The top-level functions and classes, by name."""
        return {name: node for name, node in self.nodes.items() if not name.startswith("<")}

    def _import_from(self, node, names, modules):
        relative_to_transformer = self.package_module is not None and node.level == 1
        if relative_to_transformer or (node.level == 0 and (node.module or "").startswith("transformer")):
            base = node.module.split(".")[-1] if node.module and node.module != "transformer" else None
            for alias in node.names:
                local = alias.asname or alias.name
                if base is None:
                    if (self.root / "transformer" / f"{alias.name}.py").exists():
                        modules[local] = alias.name
                else:
                    names[local] = (base, alias.name)
        elif self.package_module is None:
            # a page importing a helper of site_scripts or a tool: its transformer uses count too
            for helper in self._helper_files(node):
                if helper not in self.helpers:
                    self.helpers.append(helper)

    @staticmethod
    def _helper_files(node):
        """What a `from ... import` of site_scripts or of tools/ names: a relative import as (level, module),
        which reached_files resolves from the importing file's folder; tools/ as paths."""
        if node.level >= 1:  # `from .x import y`; `from . import _qlora_memory`, `from .. import memory`: modules
            return [(node.level, node.module)] if node.module else [(node.level, a.name) for a in node.names]
        if node.module == "tools":
            return [f"tools/{alias.name}.py" for alias in node.names]
        if (node.module or "").startswith("tools."):
            return [f"tools/{node.module.split('.', 1)[1]}.py"]
        return []

    def first_line(self, unit):
        node = self.nodes.get(unit)
        return 0 if node is None else min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])

    def unit_source(self, unit):
        if unit == MODULE:
            inside = set()
            for u, node in self.nodes.items():
                inside.update(range(self.first_line(u), node.end_lineno + 1))
            return "\n".join(text for i, text in enumerate(self.lines, start=1) if i not in inside)
        return "\n".join(self.lines[self.first_line(unit) - 1:self.nodes[unit].end_lineno])

    def mentions(self, unit):
        """(module, unit) pairs the unit refers to (computed once per unit)."""
        if unit in self._mentions:
            return self._mentions[unit]
        nodes = self.module_level if unit == MODULE else [self.nodes[unit]]
        local_names, local_modules = self._imports(nodes)
        names, modules = {**self.names, **local_names}, {**self.modules, **local_modules}
        # What a function imports for itself it means to use, even where no name shows it (code it
        # evaluates from text, as the Bad inputs page's setup() does), so its own imports count.
        found = set() if unit == MODULE else set(local_names.values())
        for top in nodes:
            for node in ast.walk(top):
                if isinstance(node, ast.Name):
                    if node.id in names:
                        found.add(names[node.id])
                    elif node.id in modules:
                        found.add((modules[node.id], MODULE))
                    elif node.id in self.unit_of and self.package_module:
                        found.add((self.package_module, self.unit_of[node.id]))
                elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
                    if node.value.id in modules:
                        found.add((modules[node.value.id], node.attr))
        self._mentions[unit] = found
        return found


def read_text(path):
    """A file's text, read again only when its size or modification time changed."""
    stat = Path(path).stat()
    return _read(str(path), stat.st_mtime_ns, stat.st_size)


@lru_cache(maxsize=1024)
def _read(path, mtime_ns, size):
    return Path(path).read_text()


def module_source(name, root=ROOT):
    """The parsed source of transformer/<name>.py."""
    return _parse(read_text(root / "transformer" / f"{name}.py"), name, root)


@lru_cache(maxsize=256)
def _parse(text, name, root):
    """Keyed by the text, so a long `mkdocs serve` sees every edit."""
    return Source(text, package_module=name, root=root)


def closure(seeds, root=ROOT):
    """Every (module, unit) reachable from the seeds, each module's "<module>" included."""
    todo, seen = set(seeds), set()
    while todo:
        module, unit = todo.pop()
        if (module, unit) in seen:
            continue
        source = module_source(module, root)
        if unit != MODULE and unit not in source.nodes:
            unit = source.unit_of.get(unit, MODULE)  # a name imported from the module: the unit that assigns it
            if (module, unit) in seen:
                continue
        seen.add((module, unit))
        todo.add((module, MODULE))
        todo |= source.mentions(unit)
    return seen


def all_units(root=ROOT):
    """Every unit of every transformer module."""
    units = set()
    for path in sorted((Path(root) / "transformer").glob("*.py")):
        units |= {(path.stem, unit) for unit in [*module_source(path.stem, root).nodes, MODULE]}
    return units


# The site_scripts modules whose text every page's key holds (site_scripts/build.py hashes them whole): reached_files
# lists one a page imports, but not what it imports in turn, which is the build's code, not the page's.
SHARED = ("build.py", "checked.py", "common.py", "depends.py", "equations.py", "examples.py", "markers.py",
          "code_facts.py", "registry.py", "sections.py")


def reached_files(page_path, root=ROOT):
    """The generator (or notebook) and every site_scripts and tools file it imports, directly or not (not
    through a SHARED module)."""
    files, done = [Path(page_path)], []
    shared = {Path(root) / "site_scripts" / name for name in SHARED}
    while files:
        path = files.pop()
        if path in done or not path.exists():
            continue
        done.append(path)
        if path in shared:
            continue
        for helper in _parse(read_text(path), None, root).helpers:
            files += [root / helper] if isinstance(helper, str) else _relative_files(path, *helper)
    return done


def _relative_files(path, level, module):
    """The file `from <level dots><module> import ...` in `path` means."""
    return [Path(path).parents[level - 1].joinpath(*module.split(".")).with_suffix(".py")]


def page_units(page_path, root=ROOT):
    """The transformer units a page generator (and the site_scripts and tools files it imports) reaches."""
    seeds = set()
    for path in reached_files(page_path, root):
        source = _parse(read_text(path), None, root)
        for unit in [*source.nodes, MODULE]:
            seeds |= source.mentions(unit)
    return closure(seeds, root)


def units_text(units, root=ROOT):
    """The source and first line of the units (listings print the line, so it belongs in a key), for hashing."""
    sources = {m: module_source(m, root) for m, _ in units}
    return "\n\0".join(f"{m}:{u}@{sources[m].first_line(u)}\n{sources[m].unit_source(u)}" for m, u in sorted(units))
