"""tools/checked_by.py: the perturbation rules, the measurement on a small fake package, and the pages' use of
its report."""

import textwrap
import threading
import time
from contextlib import nullcontext
from typing import NamedTuple
from dataclasses import dataclass

import numpy as np
import pytest

from site_scripts import checked
from tools import checked_by
from tools.common import ROOT
from tools.keyed_report import KeyedReport
from tools.perturbations import FACTOR, RULES, changed_in_place, perturb, rules_for, snapshot


# ---------------------------------------------------------------- the rules, one per kind of output

class Pair(NamedTuple):
    value: np.ndarray
    count: int


@dataclass(frozen=True)
class Cache:
    x: np.ndarray
    step: int


def test_floats_are_scaled_wherever_they_are_and_nothing_else_changes():
    value = (np.ones((2, 3)), {"g": np.float32(2.0), "n": 3}, Pair(np.full(2, 4.0), 5), Cache(np.ones(1), 7), 0.5)
    done = perturb(value)
    assert done.rules == {"scaled"} and done.untouched == set()
    arr, grads, pair, cache, half = done.value
    np.testing.assert_array_equal(arr, np.ones((2, 3)) * FACTOR)
    assert grads["g"] == np.float32(2.0 * FACTOR) and grads["g"].dtype == np.float32 and grads["n"] == 3
    assert isinstance(pair, Pair) and pair.count == 5 and pair.value[0] == 4.0 * FACTOR
    assert isinstance(cache, Cache) and cache.step == 7 and cache.x[0] == FACTOR
    assert half == 0.5 * FACTOR
    assert value[0][0, 0] == 1.0  # the original is left alone: a copy is changed


def test_values_without_floats_get_the_rule_of_their_kind():
    ids = np.array([[4, 7], [1, 2]])
    assert perturb(ids).value.tolist() == [[5, 7], [1, 2]] and perturb(ids).rules == {"int off by one"}
    assert perturb(377).value == 376 and perturb(np.int64(0)).value == 1
    assert perturb(True).value is False and perturb(np.array([True, True])).value.tolist() == [False, True]
    assert perturb("To be").value == "Uo be" and perturb(b"\x00ab").value == b"\x01ab"
    assert perturb(("ab", [3])).value == ("`b", [2])
    assert perturb(np.array([[4, 7]], dtype=np.uint8)).value.dtype == np.uint8


def test_a_generator_has_each_item_changed_and_what_no_rule_fits_is_reported():
    done = perturb(x for x in (1.0, 2.0))
    assert list(done.value) == [FACTOR, 2.0 * FACTOR] and done.rules == {"each item yielded", "scaled"}
    none = perturb(None)
    assert none.value is None and none.rules == set() and none.untouched == set()
    thing = object()
    assert perturb(thing).value is thing and perturb(thing).untouched == {"object"}


def test_an_object_of_the_package_has_its_attributes_changed_in_place_and_not_its_parents():
    from transformer.autograd import Tensor

    leaf = Tensor(np.ones(2), requires_grad=True)
    out = leaf * 3.0
    done = perturb(out)
    assert done.value is out and done.rules == {"object changed in place", "scaled"}
    np.testing.assert_array_equal(out.data, 3.0 * FACTOR * np.ones(2))
    np.testing.assert_array_equal(leaf.data, np.ones(2))  # the graph behind it is left alone


def test_what_a_call_changes_in_its_arguments_is_changed_again_and_nothing_else():
    params, grads = {"w": np.ones(3), "n": np.array([4, 5])}, {"w": np.full(3, 0.5)}
    before = snapshot((params, grads))
    params["w"] -= grads["w"]  # the call: an update in place
    assert changed_in_place(before, change=None) == {"changed in place", "scaled"}  # found, not changed
    np.testing.assert_array_equal(params["w"], np.full(3, 0.5))
    assert changed_in_place(before) == {"changed in place", "scaled"}
    np.testing.assert_array_equal(params["w"], np.full(3, 0.5 * FACTOR))
    np.testing.assert_array_equal(grads["w"], np.full(3, 0.5))  # unchanged by the call: left alone
    assert params["n"].tolist() == [4, 5] and changed_in_place(snapshot(params)) == set()


def test_the_control_copies_and_changes_nothing_and_rules_for_copies_nothing():
    value = (np.arange(3.0), {"ids": np.array([2, 3])}, "abc", 5)
    control = perturb(value, change=False)
    assert control.value[0] is not value[0]
    np.testing.assert_array_equal(control.value[0], value[0])
    assert control.value[1:] == (value[1], "abc", 5) or str(control.value) == str(value)
    for v in [value, (np.array([2, 3]), "abc"), None, True]:
        assert rules_for(v) == (perturb(v).rules, perturb(v).untouched)
    assert set(RULES) >= {"scaled", "int off by one", "bool flipped", "text changed", "each item yielded"}


# ---------------------------------------------------------------- the measurement, on a fake package

FAKE = {
    "transformer/__init__.py": "",
    "transformer/fake.py": """
        from dataclasses import dataclass


        def double(x):
            return 2.0 * x


        def half_of_double(x):  # calls double: a test of it calls double too
            return double(x) / 2


        def nothing(x):
            return None


        def unused(x):
            return x


        class Counter:
            def __init__(self):
                self.n = 0

            def size(self):
                return 3


        def step(params):  # updates in place, returns nothing
            params["w"] -= 0.5


        class Box:  # a plain object of the package
            def __init__(self, x):
                self.x = x


        def make_box(x):
            return Box(2.0 * x)


        def ready():
            return True


        @dataclass(frozen=True)
        class Scales:  # a dataclass: its __init__ is wrapped while the object is half made
            s: float

            def total(self):
                return 2 * self.s
    """,
    "tests/test_fake.py": """
        import pytest

        import time

        import numpy as np

        from transformer.fake import Counter, Scales, double, half_of_double, make_box, nothing, ready, step

        AT_IMPORT = nothing(0)  # a call outside any test


        @pytest.fixture(scope="module")
        def four():
            return double(2.0)


        def test_sees_double():
            assert double(1.5) == 3.0


        def test_misses_double():
            assert double(1.0) > 0


        def test_ratio_keeps_the_perturbation():
            assert double(6.0) / double(2.0) == 3.0  # both sides scaled alike: it cannot see a scale


        def test_through_a_fixture(four):
            assert four == 4.0  # no call of its own: it reaches double through the module fixture


        def test_half(four):
            assert half_of_double(1.0) == 1.0


        def test_nothing_and_counter():
            nothing(1)
            assert Counter().size() == 3
            one, two = Scales(1.5), Scales(2.0)  # the second is made before any method returned a number
            assert one.total() + two.total() == 7.0


        def test_step():
            params = {"w": np.ones(2)}
            for _ in range(2):
                step(params)
            assert params["w"][0] == 0.0


        def test_box():
            assert make_box(1.0).x == 2.0


        def test_waits_until_ready():
            while not ready():  # a wrong answer makes it ask for ever
                pass


        def test_waits_on_one_answer():
            answer = ready()
            while not answer:  # a wrong answer makes it wait for ever, asking nothing
                try:
                    time.sleep(0.01)
                except Exception:  # nor can it swallow what stops it
                    pass
    """,
}
UNITS = ["fake:double", "fake:half_of_double", "fake:nothing", "fake:unused", "fake:Counter", "fake:step",
         "fake:make_box", "fake:ready", "fake:Scales"]


@pytest.fixture(scope="module")
def fake(tmp_path_factory):
    folder = tmp_path_factory.mktemp("fake")
    for path, text in FAKE.items():
        (folder / path).parent.mkdir(parents=True, exist_ok=True)
        (folder / path).write_text(textwrap.dedent(text))
    checked_by.add_plugin(folder)
    return folder


@pytest.fixture(scope="module")
def traced(fake):
    return checked_by.trace(fake, UNITS, ["tests"], jobs=1)


def calling(traced, unit):
    return sorted(t.split("::")[1] for t, r in traced[0].items() if unit in r["units"])


def test_the_trace_finds_direct_indirect_and_fixture_calls(traced):
    assert calling(traced, "fake:double") == ["test_half", "test_misses_double", "test_ratio_keeps_the_perturbation",
                                              "test_sees_double", "test_through_a_fixture"]
    assert calling(traced, "fake:half_of_double") == ["test_half"]
    assert calling(traced, "fake:Counter") == ["test_nothing_and_counter"] == calling(traced, "fake:Scales")
    assert calling(traced, "fake:unused") == []
    assert traced[1]["fake:nothing"]["rules"] == set() and traced[1]["fake:double"]["rules"] == {"scaled"}
    assert traced[1]["fake:step"]["rules"] == {"changed in place", "scaled"}  # seen from its second call on
    assert traced[1]["fake:make_box"]["rules"] == {"object changed in place", "scaled"}


def test_a_perturbed_output_fails_the_tests_that_check_it_and_no_other(fake, traced):
    tests = [t for t, r in traced[0].items() if "fake:double" in r["units"]]
    run = checked_by.perturb(fake, "fake:double", tests)
    # test_half sees it through half_of_double; a ratio of two outputs scaled alike cannot see it
    assert sorted(t.split("::")[1] for t in run["failed"]) == ["test_half", "test_sees_double",
                                                               "test_through_a_fixture"]
    assert run["rules"] == ["scaled"] and run["not_run"] == []
    run = checked_by.perturb(fake, "fake:half_of_double", calling_ids(traced, "fake:half_of_double"))
    assert [t.split("::")[1] for t in run["failed"]] == ["test_half"]
    counter = checked_by.perturb(fake, "fake:Counter", calling_ids(traced, "fake:Counter"))
    assert counter["failed"] and counter["rules"] == ["int off by one"]
    step = checked_by.perturb(fake, "fake:step", calling_ids(traced, "fake:step"), in_place=True)
    assert [t.split("::")[1] for t in step["failed"]] == ["test_step"]
    box = checked_by.perturb(fake, "fake:make_box", calling_ids(traced, "fake:make_box"))
    assert [t.split("::")[1] for t in box["failed"]] == ["test_box"]


def test_a_test_that_a_perturbation_makes_hang_is_stopped_and_counts_as_failing(fake, traced):
    """Two hangs: one that keeps calling the unit (stopped at its budget of calls, at once) and one that waits
    without calling it (stopped at its time limit)."""
    tests = calling_ids(traced, "fake:ready")
    limits = {t: checked_by.test_limits(traced[0][t], "fake:ready") for t in tests}
    assert all(limit.split("\t")[1] == "1010" for limit in limits.values())  # 1000 + 10 times the one call traced
    run = checked_by.perturb(fake, "fake:ready", tests, limits={t: "2\t50" for t in tests})
    assert sorted(t.split("::")[1] for t in run["failed"]) == ["test_waits_on_one_answer", "test_waits_until_ready"]
    assert run["hung"] == run["failed"] and run["seconds"] < 30


def calling_ids(traced, unit):
    return [t for t, r in traced[0].items() if unit in r["units"]]


def test_negative_control_a_perturbation_that_changes_nothing_finds_no_checking_test(fake, traced):
    for unit in ("fake:double", "fake:Counter", "fake:step", "fake:make_box"):
        run = checked_by.perturb(fake, unit, calling_ids(traced, unit), mode="control", in_place=unit == "fake:step")
        assert run["failed"] == [] and run["rules"], unit


def test_units_that_cannot_be_measured_say_why(traced):
    tests, rules = traced
    assert "no unit test calls it" in checked_by.unit_record("fake:unused", tests, rules, None)["reason"]
    nothing = checked_by.unit_record("fake:nothing", tests, rules, None)
    assert not nothing["measured"] and nothing["outside"] == 1 and rules["fake:double"]["outside"] == 0
    assert nothing["reason"] == "it returns nothing a rule can change (None), and changes no array among its arguments"


def test_shards_are_perturbed_alike_so_the_tests_of_sharding_only_use_the_model():
    """The real package: with LayerNorm's backward perturbed, a step's shards run in threads, wrong alike, so a
    sharded step equals one pass and no test of tests/unit/test_parallel.py fails; the tests of worker processes
    skip, and so call nothing. Watched failing (six tests) while worker processes, which import the package
    unwrapped, computed their shards unperturbed."""
    unit = "layernorm:layer_norm_backward"
    with checked_by.project_copy(checked_by.add_plugin) as copy:
        records, _, _ = checked_by.measure(copy, [unit], lambda calls: [unit], 1, log=lambda line: None,
                                           files=["tests/unit/test_parallel.py"])
    record = records[unit]
    assert record["measured"] and len(record["tests"]) >= 5, record  # the threads' tests call it
    in_threads = ("-False-", "float32_gradients_stay_float32", "evaluation_in_threads")
    assert all(any(mark in test for mark in in_threads) for test in record["tests"]), record["tests"]
    assert record["failed"] == [] and record["not_run"] == []


def test_a_units_key_moves_with_its_source_and_its_tests_files_not_with_other_code():
    """What a unit's entry depends on (tools/checked_by.unit_key): watched failing with the test files left out."""
    calling = ["tests/unit/test_layers.py::test_a", "tests/unit/test_model.py::test_b"]
    key = checked_by.unit_key("layernorm:layer_norm_backward", calling, ROOT)
    assert key == checked_by.unit_key("layernorm:layer_norm_backward", list(calling), ROOT)
    assert key != checked_by.unit_key("layernorm:layer_norm_forward", calling, ROOT)
    assert key != checked_by.unit_key("layernorm:layer_norm_backward", calling[:1], ROOT)
    with pytest.raises(ValueError, match="defines no no_such"):
        checked_by.unit_source("layernorm:no_such")


def test_a_units_key_holds_code_not_words(tmp_path):
    """A docstring or a comment edited changes no test's outcome, so no entry's key; a line of code does."""
    calling = ["tests/unit/test_layers.py::test_a"]
    for name in ("transformer/layernorm.py", "tests/unit/test_layers.py", *checked_by.MEASURED_BY):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text((ROOT / name).read_text())
    key = checked_by.unit_key("layernorm:layer_norm_backward", calling, tmp_path)
    source = tmp_path / "transformer/layernorm.py"
    text = source.read_text()
    source.write_text(text.replace('"""Gradients', '"""The gradients', 1).replace("  # eq:", "  # equation eq:", 1))
    assert text != source.read_text() and checked_by.unit_key("layernorm:layer_norm_backward", calling, tmp_path) == key
    source.write_text(text.replace("    return dx", "    dx = dx + 0\n    return dx", 1))
    assert checked_by.unit_key("layernorm:layer_norm_backward", calling, tmp_path) != key


def test_a_test_that_fails_on_the_unchanged_code_stops_the_run(tmp_path):
    for path, text in FAKE.items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(textwrap.dedent(text).replace("== 3.0", "== 4.0"))
    checked_by.add_plugin(tmp_path)
    with pytest.raises(RuntimeError, match="fail with the units wrapped and nothing changed"):
        checked_by.trace(tmp_path, UNITS, ["tests"], jobs=1)



def test_two_updates_of_the_report_in_one_process_run_one_after_the_other(monkeypatch):
    """The site build brings the report up to date beside the mutation run, which asks for it too (its unit
    tests of the unchanged code are the trace): the second update waits for the first, and then finds the report
    current, instead of tracing the same tests at the same time. Negative control: without the lock the two
    overlap."""
    events = []

    def fake_update(*args):
        events.append("start")
        time.sleep(0.2)
        events.append("end")
    monkeypatch.setattr(checked_by, "_update", fake_update)
    for lock, expected in ((checked_by.UPDATING, ["start", "end"] * 2), (nullcontext(), ["start"] * 2 + ["end"] * 2)):
        monkeypatch.setattr(checked_by, "UPDATING", lock)
        events.clear()
        both = [threading.Thread(target=checked_by.update) for _ in range(2)]
        for thread in both:
            thread.start()
        for thread in both:
            thread.join()
        assert events == expected

# ---------------------------------------------------------------- the pages' use of the report

UNITS_REPORT = {
    "model:forward": {"measured": True, "reason": "", "rules": ["scaled"], "untouched": [], "seconds": 1.0,
                      "not_run": [], "hung": [], "outside": 0,
                      "tests": ["tests/unit/test_model.py::test_a[relu]", "tests/unit/test_model.py::test_a[gelu]",
                                "tests/unit/test_model.py::test_b"],
                      "failed": ["tests/unit/test_model.py::test_a[gelu]"]},
    "optim:adamw_update": {"measured": False, "reason": "it returns nothing a rule can change (None)", "rules": [],
                           "untouched": [], "seconds": 0.0, "not_run": [], "tests": ["t.py::test_c"], "failed": []}}


def as_report(units, path=None):
    report = KeyedReport(path or "/nonexistent/checked-by.json")
    report.entries = {u: {"key": "k", "commit": "abc", "value": v} for u, v in units.items()}
    return report


def test_a_page_lists_the_tests_that_fail_with_their_command_and_those_that_only_use_it(monkeypatch):
    monkeypatch.setattr(checked, "report", lambda log=print: as_report(UNITS_REPORT))
    text = checked.checked_md("model:forward", [])
    assert "Of the 2 unit tests that call it, directly or not, **1 fails**" in text
    assert "| `test_a` (cases gelu) | `pytest tests/unit/test_model.py::test_a` |" in text
    assert "| Checked by (measured: fails when its output is perturbed) | Run it |" in text
    assert "Uses it (calls it, and passes with its output perturbed): `test_a` (cases relu), `test_b`." in text
    assert RULES["scaled"] in text
    assert "hung" not in text and "outside any test" not in text


def test_a_page_says_which_tests_hung_and_what_the_measurement_cannot_see(monkeypatch):
    forward = UNITS_REPORT["model:forward"]
    hung = {"model:forward": {**forward, "hung": forward["failed"], "outside": 2}}
    monkeypatch.setattr(checked, "report", lambda log=print: as_report(hung))
    text = checked.checked_md("model:forward", [])
    assert "Of the tests that fail, `test_a` (cases gelu) hung with the perturbation" in text
    assert "called 2 times outside any test" in text


def test_a_page_says_why_a_function_was_not_measured(monkeypatch):
    from site_scripts.code_facts import Place

    monkeypatch.setattr(checked, "report", lambda log=print: as_report(UNITS_REPORT))
    text = checked.checked_md("optim:adamw_update", [Place("tests/unit/test_optim.py", 3, "test_d")])
    assert "**not measured**: it returns nothing a rule can change (None)" in text
    assert "name it in their code (read, not measured): `test_d`" in text and "Run it" not in text


def test_a_pages_key_holds_the_printed_entries_of_its_own_functions_only(tmp_path, monkeypatch):
    def keys(units, *names):
        as_report(units, tmp_path / "r.json").save()
        monkeypatch.setattr(checked_by, "REPORT", tmp_path / "r.json")
        return checked.key_text(names)

    changed = {**UNITS_REPORT, "optim:adamw_update": {**UNITS_REPORT["optim:adamw_update"], "failed": ["t.py::test_c"]}}
    assert keys(UNITS_REPORT, "model:forward") == keys(changed, "model:forward")
    assert keys(UNITS_REPORT, "model:forward", "optim:adamw_update") != keys(changed, "model:forward",
                                                                               "optim:adamw_update")
    # how long measuring a function took is printed nowhere: a new report that differs only there reruns no page
    slower = {**UNITS_REPORT, "model:forward": {**UNITS_REPORT["model:forward"], "seconds": 9.0}}
    assert keys(UNITS_REPORT, "model:forward") == keys(slower, "model:forward")


def test_the_full_model_page_says_which_tests_check_forward(built_mode):
    """The comparison with the KV cache's decoding sees a scaled forward; the causality and batch-of-one tests
    compare forward with itself, so they cannot."""
    from site_scripts import build

    text = (build.fragments_dir(built_mode) / "model" / "used.md").read_text()  # built_site's
    forward = text[text.index("**`forward`**"):text.index("**`backward`**")]
    checking, using = forward.split("Uses it", 1)
    assert "| `test_kv_cache_logits_equal_full_recomputation` | `pytest tests/unit/test_generate.py::" in checking
    for name in ("test_future_tokens_do_not_change_earlier_logits", "test_single_sequence_logits_equal_batch_of_one"):
        assert f"`{name}`" in using and name not in checking


def test_a_pages_key_moves_with_the_rules_wording_that_its_checked_by_lines_print(monkeypatch):
    unit = ["layernorm:layer_norm_backward"]
    before = checked.key_text(unit)
    rule = next(iter(checked.RULES))
    monkeypatch.setitem(checked.RULES, rule, checked.RULES[rule] + ", reworded")
    assert checked.key_text(unit) != before
