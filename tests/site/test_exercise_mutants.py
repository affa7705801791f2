"""Every planted mistake of the mutation catalogue (tools/mutant_catalogue.py) in a function an exercise asks for,
made in the reference solution of that exercise, fails the grader, and fails the property that mistake breaks.

EXPECTED is this file's own reading of each mistake (what it breaks, so which property must fail), written from
the mutant's description, not from the grader's output."""

import pytest

from site_scripts.registry import PAGES
from tools.mutant_catalogue import MUTANTS
from transformer.exercises import EXERCISES, grade, load, solution

EXPECTED = {
    "linear-db-mean-not-sum": "central differences (linear)",
    "linear-db-silently-float64": "shapes and dtypes (linear)",
    "relu-mask-omitted": "central differences (relu)",
    "relu-mask-reversed": "central differences (relu)",
    "relu-backward-stops-nan": "NaN passes through",
    "gelu-grad-no-density-term": "central differences (gelu)",
    "gelu-tanh-grad-no-cubic-term": "central differences (gelu_tanh)",
    "gelu-tanh-grad-sech-as-tanh": "central differences (gelu_tanh)",
    "layernorm-dx-no-direct-term": "central differences (layer_norm)",
    "layernorm-dx-no-mean-term": "each row of dx sums to zero",
    "layernorm-dx-no-variance-term": "central differences (layer_norm)",
    "layernorm-dx-no-inverse-sigma": "central differences (layer_norm)",
    "layernorm-dg-without-xhat": "central differences (layer_norm)",
    "layernorm-other-epsilon": "the tiny example's numbers (layer_norm)",  # a forward mistake its backward follows
    "layernorm-mean-over-d-minus-1": "the tiny example's numbers (layer_norm)",
    "layernorm-db-silently-float64": "shapes and dtypes (layer_norm)",
    "softmax-grad-no-subtraction": "central differences (softmax)",
    "softmax-no-max-shift": "rows sum to one, without overflow",
    "cross-entropy-grad-not-divided-by-n": "central differences (cross_entropy)",
    "attention-no-causal-mask": "causal: later positions are not seen",
    "attention-grad-no-scale": "central differences (attention)",
    "attention-dv-untransposed": "central differences (attention)",
    "block-grad-drops-residual": "central differences (block)",
    "embedding-grad-fancy-index": "central differences (embedding)",  # repeated ids lose all but one addition
    "embedding-grad-index-wraps": "ids of a small integer type",
    "position-grad-first-sequence-only": "central differences (embedding)",
    "adamw-no-bias-correction": "ten steps equal the reference's",
    "adamw-eps-inside-sqrt": "ten steps equal the reference's",
    "adamw-commits-a-non-finite-gradient": "a non-finite gradient changes nothing",
    "clipping-per-tensor": "clipping by one factor",
    "global-norm-squares-before-scaling": "the global norm, without overflow",
    "global-norm-scale-not-multiplied-back": "the global norm, without overflow",
    "global-norm-multiplies-by-the-inverse": "the global norm, without overflow",  # 1/s overflows for subnormals
    "kv-cache-position-off-by-one": "token by token equals the full forward",
    "batched-decoding-without-the-own-mask": "batched requests each get their own logits",
    "flash-no-rescale": "every tile size equals softmax attention",
    "flash-tile-one-key-short": "every tile size equals softmax attention",
    "nf4-nibble-order-swapped": "two codes per byte",
    "nf4-absmax-not-divided": "block-wise absmax quantization",
    "nf4-wrong-quantile-offset": "the NF4 code",
    "gelu-of-minus-infinity-is-nan": "infinities go to the limits (gelu)",
    "gelu-slope-at-infinity-is-nan": "infinities go to the limits (gelu)",
    "clipping-takes-a-negative-max-norm": "clipping by one factor",
    "flash-takes-any-tile": "a tile that is not a positive integer is refused",
}
# The mistakes in an exercise's functions that no grading could see, and why.
SKIPPED = {
    "relu-gradient-one-at-zero": "uncatchable (the catalogue says why): ReLU's slope at exactly 0 is a convention",
    "gelu-erf-imported-with-the-package": "a module-level import, outside the functions; every number the same",
}


def in_exercise(mutant):
    """The exercise whose functions hold the mutant's subject, or None."""
    return next((e for e in EXERCISES.values() if mutant.subject in
                 {(f"transformer/{m}.py", n) for m, n in e.functions}), None)


def mutated(exercise, mutant):
    text = solution(exercise)
    for e in mutant.edits:
        assert text.count(e.old) == 1, f"{mutant.name}: its edit does not fit the solution of {exercise.name}"
        text = text.replace(e.old, e.new)
    return text


def test_every_mutant_in_an_exercise_is_expected_or_skipped_with_a_reason():
    inside = {m.name for m in MUTANTS if in_exercise(m)}
    assert inside == set(EXPECTED) | set(SKIPPED) and not set(EXPECTED) & set(SKIPPED)
    assert all(m.uncatchable for m in MUTANTS if m.name == "relu-gradient-one-at-zero")


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_the_grader_fails_the_property_each_mutant_breaks(tmp_path, name):
    mutant = next(m for m in MUTANTS if m.name == name)
    exercise = in_exercise(mutant)
    path = tmp_path / f"{exercise.name}.py"
    path.write_text(mutated(exercise, mutant))
    failed = {r.property: r for r in grade(exercise, load(path, exercise)) if not r.passed}
    assert EXPECTED[name] in failed, f"{name} fails {sorted(failed)}"
    assert failed[EXPECTED[name]].read.startswith(exercise.page)


def test_each_exercise_points_at_the_page_that_lists_its_functions():
    listed = {(f"transformer/{u.split(':')[0]}.py", u.split(":")[1]): p.path
              for p in PAGES for u in (*p.functions, *p.listings)}
    for e in EXERCISES.values():
        pages = {listed.get((f"transformer/{m}.py", n)) for m, n in e.functions} - {None}
        assert pages == {e.page}, f"{e.name}: {pages}"
