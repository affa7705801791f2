"""Generator of the "Find the bug" page: puzzles made from real mistakes of the mutant catalogue
(tools/mutant_catalogue.py). Each puzzle shows a function of the model with one mistake planted in it (its real
source with the mutant's edit applied, at the file's line numbers), and the gradient check of the whole model run
with that function in effect: the parameters whose backward gradient no longer matches central differences. The
answer (the changed line, what it should be, and why) is computed from the mutant, by diffing the two sources."""

import difflib
import inspect
import sys
import textwrap
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np

from tools.mutant_catalogue import MUTANTS, Mutant
from transformer.config import PRESETS
from transformer.finetune import adapter_loss_and_grads
from transformer.gradcheck import ABS_FLOOR, REL_TOL, check_passes, gradcheck_model, numerical_grad, relative_gap
from transformer.lora import TARGETS, LoRAConfig, init_adapters
from transformer.model import init_params, param_shapes

from ..common import md_table
from ..examples import H_STEP, SEED
from ..sections import function_link, page_link
from . import _jacobians as jac
from ._lora_checks import MOVE
from .gradcheck import PERTURB

PAGE = "find_the_bug"
# The puzzles, in the order of the model's steps: each a mistake in a backward function that the gradient
# check catches.
PUZZLES = (
    "layernorm-dx-no-mean-term",
    "layernorm-dg-without-xhat",
    "linear-db-mean-not-sum",
    "relu-mask-reversed",
    "gelu-grad-no-density-term",
    "softmax-grad-no-subtraction",
    "cross-entropy-grad-not-divided-by-n",
    "attention-grad-no-scale",
    "attention-dv-untransposed",
    "flash-backward-no-d",
    "block-grad-drops-residual",
    "position-grad-first-sequence-only",
    "head-bias-grad-wrong-axis",
    "lora-adapter-path-missing-from-dx",
)
CFG = PRESETS["tiny"]
BATCH = 2  # two sequences: a mistake that keeps one sequence's share of a gradient must show
# The model settings under which a puzzle's function runs at all (the tiny preset uses ReLU and materialized
# attention).
SETTINGS = {"gelu-grad-no-density-term": {"activation": "gelu"}, "flash-backward-no-d": {"attention": "flash"}}
# Puzzles in LoRA's code: the check compares the adapters' gradients, the only ones fine-tuning forms.
ADAPTER_PUZZLES = ("lora-adapter-path-missing-from-dx",)
LORA = LoRAConfig(rank=2, alpha=4.0)  # the default targets: adapters on wq and wv of every block
NAMED_PASSES = 20  # a puzzle names the gradients that pass when there are at most this many


@dataclass(frozen=True)
class Answer:
    """Where a puzzle's mistake is: the file's line numbers of the changed lines, as planted and as they should be."""
    path: str
    line: int  # the file's line of the first changed line
    wrong: tuple  # the lines as the puzzle shows them
    right: tuple  # the lines of the real code


@dataclass(frozen=True)
class Puzzle:
    mutant: Mutant
    start: int  # the function's first line in its file
    code: str  # the function's source with the mistake planted
    answer: Answer
    report: dict  # the gradient check: parameter -> (largest absolute gap, relative gap)


def mutant_named(name):
    return next(m for m in MUTANTS if m.name == name)


def first_change(path, start, source, edited):
    """The first block of lines where `edited` differs from `source` (a function's text starting at the file's
    line `start`), found by difflib; a puzzle has one answer, so a second changed block is refused."""
    before, after = source.splitlines(), edited.splitlines()
    changes = [op for op in difflib.SequenceMatcher(None, before, after, autojunk=False).get_opcodes()
               if op[0] != "equal"]
    if len(changes) != 1:
        raise RuntimeError(f"{path}: the mistake changes {len(changes)} places of the function, not one")
    _, i1, i2, j1, j2 = changes[0]
    return Answer(path, start + i1, tuple(after[j1:j2]), tuple(before[i1:i2]))


# ---------------------------------------------------------------- the mistake in effect

def swapped(value, original, replacement):
    """`value` with `original` replaced by `replacement`: the replacement itself, or a tuple holding it; None
    where `value` holds no reference to `original`."""
    if value is original:
        return replacement
    if isinstance(value, tuple) and any(v is original for v in value):
        return tuple(replacement if v is original else v for v in value)
    return None


def references(original, replacement):
    """(namespace, key, new value) for every reference to `original` in the loaded transformer modules: a module
    attribute (`from .layernorm import layer_norm_backward` makes one per importing module), or an entry of a
    module-level dict, alone or in a tuple (ACTIVATION_FUNCTIONS holds each activation's pair)."""
    found = []
    for name, module in list(sys.modules.items()):
        if name != "transformer" and not name.startswith("transformer."):
            continue
        space = vars(module)
        for namespace in (space, *(v for v in space.values() if isinstance(v, dict) and v is not space)):
            for key, value in list(namespace.items()):
                new = swapped(value, original, replacement)
                if new is not None:
                    found.append((namespace, key, new))
    return found


@contextmanager
def planted(mutant):
    """The mutated function in effect wherever the package calls the original, restored on leaving."""
    module, _, _ = jac.edited_source(mutant)
    original = getattr(module, mutant.subject[1])
    swaps = references(original, jac.mutated(mutant.name))
    kept = [(namespace, key, namespace[key]) for namespace, key, _ in swaps]
    try:
        for namespace, key, new in swaps:
            namespace[key] = new
        yield
    finally:
        for namespace, key, old in reversed(kept):
            namespace[key] = old


# ---------------------------------------------------------------- the gradient check

def inputs(cfg):
    """Token ids and targets: BATCH random sequences of the whole context."""
    rng = np.random.default_rng(SEED)
    shape = (BATCH, cfg.context_len)
    return rng.integers(0, cfg.vocab_size, shape), rng.integers(0, cfg.vocab_size, shape)


def model_report(cfg):
    """The whole model's gradient check in float64, as the Gradient checking page runs it."""
    ids, targets = inputs(cfg)
    return gradcheck_model(cfg, ids, targets, seed=SEED, h=H_STEP, perturb=PERTURB)


def adapters_report(cfg):
    """The gradient check of fine-tuning: the adapters' gradients (adapter_loss_and_grads) against central
    differences of the adapted model's loss, in float64, as {adapter: (largest absolute gap, relative gap)}. The
    adapters are moved off their start (B = 0) so that every path through them carries a gradient."""
    ids, targets = inputs(cfg)
    base = init_params(cfg, seed=SEED, dtype=np.float64)
    rng = np.random.default_rng(SEED + 1)
    adapters = {k: MOVE * rng.standard_normal(v.shape)
                for k, v in init_adapters(param_shapes(cfg), LORA, seed=SEED).items()}
    _, grads = adapter_loss_and_grads(base, adapters, ids, targets, cfg, LORA)
    report = {}
    for name, value in adapters.items():
        numeric = numerical_grad(lambda: adapter_loss_and_grads(base, adapters, ids, targets, cfg, LORA)[0],
                                 value, H_STEP)
        report[name] = (float(np.abs(grads[name] - numeric).max()), float(relative_gap(grads[name], numeric)))
    return report


def check(name):
    """The gradient check a puzzle is shown with, on the real code (no mistake planted)."""
    cfg = CFG.with_(**SETTINGS.get(name, {}))
    return adapters_report(cfg) if name in ADAPTER_PUZZLES else model_report(cfg)


def failing(report):
    """The rows of a gradient check's report that fail its pass rule."""
    return {k: (gap, rel) for k, (gap, rel) in report.items() if not check_passes(gap, rel)}


def puzzle(name):
    """One puzzle: the mutated function, the answer diffed from the real one, and the failing check. Raises
    when the real code fails the check, or the mistake passes it: then the puzzle would show no evidence."""
    mutant = mutant_named(name)
    if "backward" not in mutant.subject[1]:  # the page says the forward, so the differences, are right
        raise RuntimeError(f"puzzle {name}: its mistake is not in a backward function")
    module, source, edited = jac.edited_source(mutant)
    start = inspect.getsourcelines(getattr(module, mutant.subject[1]))[1]
    if failing(check(name)):
        raise RuntimeError(f"puzzle {name}: the real code fails the gradient check")
    with planted(mutant):
        report = check(name)
    if not failing(report):
        raise RuntimeError(f"puzzle {name}: the gradient check passes with the mistake planted")
    return Puzzle(mutant, start, edited, first_change(mutant.subject[0], start, source, edited), report)


# ---------------------------------------------------------------- the page

def code_block(lines, start, indent=""):
    """A Python listing numbered from the file's line `start`, indented by `indent` (inside a details block)."""
    body = textwrap.dedent("\n".join(lines))
    fence = [f'``` {{ .python linenums="{start}" }}', *body.splitlines(), "```"]
    return "\n".join(indent + line if line else line for line in fence) + "\n"


def evidence_md(report):
    """The failing rows as a table, then the gradients that pass: named where they are few (they tell where the
    wrong gradient has not reached), else counted."""
    bad = failing(report)
    rows = [[f"`{k}`", f"{rel:.1e}", f"{gap:.1e}"] for k, (gap, rel) in bad.items()]
    passed = [f"`{k}`" for k in report if k not in bad]
    if not passed:
        rest = "None passes."
    elif len(passed) <= NAMED_PASSES:
        rest = f"The other {len(passed)} pass: {', '.join(passed)}."
    else:
        rest = f"The other {len(passed)} pass."
    return (md_table(["Failing gradient", "Relative gap", "Largest absolute gap"], rows)
            + f"\n{len(bad)} of the {len(report)} gradients fail the check. {rest}\n")


def setting_md(name):
    """What the check ran, where it is not the tiny model as it is."""
    if name in ADAPTER_PUZZLES:
        weights = " and ".join(f"`{TARGETS[t]}`" for t in LORA.targets)
        return (f"The check here is fine-tuning's: LoRA adapters of rank {LORA.rank} on {weights} in each block "
                "of the tiny model, whose gradients are compared with central differences of the adapted model's "
                "loss.\n\n")
    changes = SETTINGS.get(name, {})
    return "".join(f"The model runs with `{k}={v!r}`, so that this function is used.\n\n" for k, v in changes.items())


def answer_md(p):
    """The collapsed answer: the changed line as planted and as it should be, and what the mistake does."""
    a, m = p.answer, p.mutant
    where = f"line {a.line}" if len(a.right) == 1 else f"lines {a.line} to {a.line + len(a.right) - 1}"
    listing = function_link(PAGE, a.path, m.subject[1], a.line)
    catalogue = page_link(PAGE, "mutants", f"m-{m.name}")
    return ("??? success \"Answer\"\n\n"
            f"    The mistake is on {where} of `{a.path}`, which reads\n\n{code_block(a.wrong, a.line, '    ')}\n"
            f"    and should read\n\n{code_block(a.right, a.line, '    ')}\n"
            f"    {m.breaks} ([The real `{m.subject[1]}`]({listing}); this mistake is "
            f"[`{m.name}`]({catalogue}) among the planted ones.)\n")


def puzzle_md(number, p):
    path, function = p.mutant.subject
    last = p.start + len(p.code.splitlines()) - 1
    picture = ("The Jacobian this backward implies is [pictured beside the true one](../model/explorer.md#mutants) "
               "on the explorer page.\n\n" if p.mutant.name in jac.MUTANT_CASES else "")
    return (f"### Puzzle {number}: `{function}` {{#puzzle-{number}}}\n\n"
            f"`{path}`, lines {p.start} to {last}, with one mistake in it:\n\n"
            f"{code_block(p.code.splitlines(), p.start)}\n{setting_md(p.mutant.name)}"
            f"{evidence_md(p.report)}\n{picture}"
            "**Which line is wrong, and what should it be?**\n\n" + answer_md(p))


def generate(context):
    puzzles = [puzzle(name) for name in PUZZLES]
    clean = model_report(CFG)
    values = {"puzzles": len(puzzles), "planted": len(MUTANTS), "h": H_STEP, "perturb": PERTURB,
              "rel_tol": REL_TOL, "abs_floor": ABS_FLOOR, "batch": BATCH, "T": CFG.context_len,
              "gradients": len(clean), "clean_passed": len(clean) - len(failing(clean)),
              "pictured": sum(p.mutant.name in jac.MUTANT_CASES for p in puzzles)}
    return {"values": values, "puzzles": "\n".join(puzzle_md(i, p) for i, p in enumerate(puzzles, start=1))}
