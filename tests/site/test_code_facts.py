"""The code facts the pages print are read correctly from the code."""

import subprocess
import sys

from site_scripts import code_facts
from site_scripts.code_facts import ROOT, called_by, enclosing_function, named_function


def test_named_function_spans_the_whole_definition():
    name, start, end = named_function("transformer/layernorm.py", "layer_norm_backward")
    lines = (ROOT / "transformer/layernorm.py").read_text().splitlines()
    assert lines[start - 1].startswith("def layer_norm_backward(")
    assert lines[end - 1].strip().startswith("return dx, dg, db")


def test_called_by_finds_every_call_site_with_its_function():
    places = called_by("layernorm:layer_norm_backward")
    assert {(p.path, p.function) for p in places} == {("transformer/block.py", "block_backward"),
                                                      ("transformer/model.py", "backward")}
    for p in places:
        assert "layer_norm_backward(" in (ROOT / p.path).read_text().splitlines()[p.line - 1]
    assert len([p for p in places if p.function == "block_backward"]) == 2  # LN1 and LN2


def test_called_by_tells_apart_functions_of_the_same_name_by_the_imports():
    """model.forward and autograd_model.forward: autograd_memory.py imports both, the second as hand_forward."""
    def lines(unit):
        return {(p.path, p.line) for p in called_by(unit)}

    source = (ROOT / "transformer/autograd_memory.py").read_text().splitlines()
    hand = {("transformer/autograd_memory.py", i) for i, text in enumerate(source, 1) if "= hand_forward(" in text}
    graph = {("transformer/autograd_memory.py", i) for i, text in enumerate(source, 1)
             if "(forward(" in text or " = forward(" in text}
    assert hand and graph
    assert hand <= lines("model:forward") and not hand & lines("autograd_model:forward")
    assert graph <= lines("autograd_model:forward") and not graph & lines("model:forward")
    # torch's loss.backward() is a method: neither model.backward nor the autograd engine's backward
    method = {("transformer/crosscheck.py", i) for i, text in
              enumerate((ROOT / "transformer/crosscheck.py").read_text().splitlines(), 1) if "loss.backward()" in text}
    assert method and not method & (lines("model:backward") | lines("autograd:backward"))


PACKAGE = {
    "a.py": "def f():\n    pass\n\ndef g():\n    f()\n",
    "b.py": "from .a import f\n",  # f re-exported
    "c.py": ("from . import a\nfrom .b import f as af\nfrom transformer.a import g\n\n"
             "def f():\n    pass\n\n"
             "def uses(h, obj):\n    a.f()\n    af()\n    f()\n    g()\n    h()\n    obj.f()\n\n"
             "def lazy():\n    from .a import f\n\n    def inner():\n        f()\n    return inner\n\n"
             "def shadows(g):\n    g()\n    af = print\n    af()\n\n"
             "def nested():\n    def inner():\n        from .a import f as fa\n    fa()\n"),
    "d.py": ("from . import a\nfrom .a import f\nfrom .c import f as cf\n\nclass K:\n    pass\n\n"
             "def hands(run):\n    run(a.f)\n    k = cf\n    run(f)\n    isinstance(k, K)\n    return a.g\n\n"
             "def shadowed(f):\n    run(f)\n"),
}


def test_called_by_resolves_imports_aliases_re_exports_and_local_imports(tmp_path):
    (tmp_path / "transformer").mkdir()
    for name, text in PACKAGE.items():
        (tmp_path / "transformer" / name).write_text(text)

    def calls(unit):
        return [(p.path.rpartition("/")[2], p.line, p.function) for p in called_by(unit, root=tmp_path)]

    assert calls("a:f") == [("a.py", 5, "g"), ("c.py", 9, "uses"), ("c.py", 10, "uses"), ("c.py", 20, "inner")]
    assert calls("c:f") == [("c.py", 11, "uses")]  # its own module's f; obj.f() (line 14) is a method: nobody's
    assert calls("a:g") == [("c.py", 12, "uses")]  # the parameter g (line 24) hides the imported g
    assert [p.unit for p in code_facts.calls_named("af", root=tmp_path)] == ["a:f", ""]  # line 26: the variable
    assert calls("b:f") == []  # b only re-exports a's f
    assert [p.line for p in code_facts.calls_named("f", root=tmp_path)] == [5, 9, 11, 14, 20]  # not af()
    assert [(p.line, p.unit) for p in code_facts.calls_named("fa", root=tmp_path)] == [(31, "")]  # inner's own import


def test_a_function_handed_on_as_a_value_is_found_where_it_is_named(tmp_path):
    """d.py passes a.f on (lines 9 and 11), stores c.f in a variable (10) and returns a.g (13); the class K in
    isinstance (12) is not handed on to be called, and the parameter f of `shadowed` (16) is nobody's."""
    (tmp_path / "transformer").mkdir()
    for name, text in PACKAGE.items():
        (tmp_path / "transformer" / name).write_text(text)

    def named(unit):
        return [(p.path.rpartition("/")[2], p.line, p.function) for p in code_facts.passed_by(unit, root=tmp_path)]

    assert named("a:f") == [("d.py", 9, "hands"), ("d.py", 11, "hands")]  # not its calls in a.py and c.py
    assert named("c:f") == [("d.py", 10, "hands")]
    assert named("a:g") == [("d.py", 13, "hands")]
    assert named("d:K") == []


def test_the_package_hands_on_the_attention_backward_and_the_models_loss_and_grads():
    """block_backward picks attention's backward into a variable and calls that; the training run hands
    model.loss_and_grads (or the autograd engine's, named on the same line under another name) to its shards.
    Neither is a call of the function by its name."""
    def lines(path, text):
        return {(path, i) for i, line in enumerate((ROOT / path).read_text().splitlines(), 1) if text in line}

    def named(unit):
        return {(p.path, p.line) for p in code_facts.passed_by(unit)}

    picked = lines("transformer/block.py", "attn_backward = flash_attention_backward if")
    both = named("attention:attention_backward") & named("flash_attention:flash_attention_backward")
    assert picked and picked <= both
    handed = lines("transformer/run_state.py", "else loss_and_grads")
    assert handed and handed <= named("model:loss_and_grads") & named("autograd_model:loss_and_grads")
    assert not named("nf4:NF4Weight")  # a class named in isinstance checks


def test_the_tests_that_name_a_function_are_found_as_runnable_ids():
    """What a page lists where "checked by" was not measured: the unit tests that name the function."""
    places = code_facts.test_mentions("layer_norm_backward", folder="tests/unit")
    tests = [f"{p.path}::{p.function}" for p in places]
    assert "tests/unit/test_layers.py::test_layer_norm_backward_matches_central_differences_for_dx_dg_db" in tests
    for p in places:
        assert "layer_norm_backward" in (ROOT / p.path).read_text().splitlines()[p.line - 1]
    # Each id is a command that works: run one and see it pass.
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", tests[0]],
                            cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout[-500:]


def test_enclosing_function_of_a_marker():
    lines = (ROOT / "transformer/layernorm.py").read_text().splitlines()
    line = next(i for i, text in enumerate(lines, 1) if "# eq:ln-grad" in text)
    assert enclosing_function("transformer/layernorm.py", line) == "layer_norm_backward"
