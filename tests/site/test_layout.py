"""The house's layout, read from the source with `ast`: imports go one way (transformer <- tools <- site_scripts,
no circle anywhere), nothing edits sys.path, the base layers know nothing of their extensions, and no code
outside the package reads a cache by position."""

import ast

import pytest

from site_scripts.common import ROOT

PACKAGES = ("transformer", "tools", "site_scripts", "notebooks", "tests")


def modules(root=ROOT):
    """{dotted module name: path} of every Python file of the project's folders."""
    found = {}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def imports(name, path, known):
    """The project's modules that a module imports, at its top or inside a function, each with its line."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[:len(package.split(".")) - node.level + 1] + ([base] if base else []))
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names]
        else:
            continue
        found += [(target, node.lineno) for target in targets if target in known and target != name]
    return found


def graph(root=ROOT):
    known = modules(root)
    return {name: imports(name, path, known) for name, path in known.items()}


def cycles(edges):
    """Each strongly connected group of more than one module (Tarjan's algorithm), as a sorted list."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w, _ in edges.get(v, []):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                out.append(sorted(group))

    for v in edges:
        if v not in index:
            visit(v)
    return out


def test_no_module_of_the_project_imports_itself_back_through_others():
    edges = {name: [(t, line) for t, line in targets if t.split(".")[0] != "tests"]
             for name, targets in graph().items()}
    # a package's __init__ is imported by each of its modules: that is how Python imports, not a circle
    edges = {name: [(t, line) for t, line in targets if t not in PACKAGES] for name, targets in edges.items()}
    assert cycles(edges) == []


def test_the_circle_finder_finds_a_planted_circle():
    """Negative control: a -> b -> c -> a is found, a -> d is not part of it."""
    edges = {"a": [("b", 1), ("d", 1)], "b": [("c", 1)], "c": [("a", 1)], "d": []}
    assert cycles(edges) == [["a", "b", "c"]]


def test_imports_go_one_way_between_the_folders():
    """transformer imports neither tools nor site_scripts; tools imports transformer only; site_scripts may import
    both. (tools/ is below site_scripts/: the site shows what the tools measure.)"""
    allowed = {"transformer": {"transformer"}, "tools": {"transformer", "tools"},
               "site_scripts": {"transformer", "tools", "site_scripts", "notebooks"}}
    wrong = [f"{name} imports {target} (line {line})" for name, targets in graph().items()
             for target, line in targets if name.split(".")[0] in allowed
             and target.split(".")[0] not in allowed[name.split(".")[0]]]
    assert wrong == []


def sys_path_edits(path):
    """The lines of a file that change sys.path (an assignment to it or to an item of it, or a call of one of
    its methods)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        targets = node.targets if isinstance(node, ast.Assign) else [node.func] if isinstance(node, ast.Call) else []
        for target in targets:
            text = ast.unparse(target)
            if text == "sys.path" or text.startswith(("sys.path[", "sys.path.")):
                found.append(node.lineno)
    return sorted(set(found))


def test_nothing_edits_sys_path():
    """The tools run as `python -m tools.NAME`, mkdocs as `python -m mkdocs`, from the project root."""
    edits = {str(path.relative_to(ROOT)): lines for path in modules().values() if (lines := sys_path_edits(path))}
    assert edits == {}


def test_a_sys_path_edit_is_found(tmp_path):
    (tmp_path / "x.py").write_text("import sys\nsys.path.insert(0, 'a')\nsys.path[0] = 'b'\nsys.path = []\n")
    assert sys_path_edits(tmp_path / "x.py") == [2, 3, 4]


def direct_parses(path):
    """The lines of a file that call ast.parse itself."""
    return [node.lineno for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, ast.Call)
            and ast.unparse(node.func) == "ast.parse"]


def test_the_tools_parse_python_one_call_at_a_time():
    """Two threads in ast.parse at once can fail in CPython (tools/common.py, `parse`), and the tools parse in
    threads: the site build's two reports side by side, the mutation run's checks. So every parse in tools/ goes
    through the lock of tools.common.parse (the site build's own parsing runs in one thread per process)."""
    found = {str(path.relative_to(ROOT)): lines for path in sorted((ROOT / "tools").rglob("*.py"))
             if (lines := direct_parses(path))}
    assert list(found) == ["tools/common.py"] and len(found["tools/common.py"]) == 1


def test_a_direct_parse_is_found(tmp_path):
    (tmp_path / "x.py").write_text("import ast\nast.parse('1')\nfrom tools.common import parse\nparse('2')\n")
    assert direct_parses(tmp_path / "x.py") == [2]

@pytest.mark.parametrize("layer", ["linear", "attention", "block", "model"])
def test_the_base_layers_import_nothing_of_fine_tuning(layer):
    """A frozen or quantized weight wraps the base layer (transformer/lora.py), not the other way round."""
    targets = {t for t, _ in graph()[f"transformer.{layer}"]}
    assert not targets & {"transformer.lora", "transformer.nf4", "transformer.quantized_linear",
                          "transformer.finetune"}


def positional_cache_reads(path):
    """The lines where a cache is read by position: `cache[2]`, `cache.o_cache[0]`, or a tuple unpacked from a
    name or attribute that ends in `cache` (`xhat, rstd, g = cache`)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) \
                and isinstance(node.slice.value, int) and cache_name(node.value):
            found.append(node.lineno)
        elif isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Tuple) and cache_name(node.value):
            found.append(node.lineno)
        elif isinstance(node, ast.For) and isinstance(node.target, ast.Tuple) and cache_name(node.iter):
            found.append(node.lineno)
    return sorted(found)


def cache_name(node):
    """A name of one cache (`cache`, `ln1_cache`), not of a list of them (`block_caches[0]` is block 0's)."""
    name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else ""
    return name.lower().endswith("cache")


def test_no_cache_is_read_by_position_outside_the_package():
    """Every cache is a named tuple; outside transformer/ it is read by field, so a new field breaks nothing."""
    found = {str(p.relative_to(ROOT)): lines for name, p in modules().items()
             if not name.startswith("transformer") and (lines := positional_cache_reads(p))}
    assert found == {}


def test_a_cache_read_by_position_is_found(tmp_path):
    (tmp_path / "x.py").write_text("xhat, rstd, g = cache\nheads = cache.o_cache[0]\na = cache.x\n"
                                   "for i, c in ln_cache:\n    pass\nb = logits[0]\nc = cache.block_caches[1]\n")
    assert positional_cache_reads(tmp_path / "x.py") == [1, 2, 4]
