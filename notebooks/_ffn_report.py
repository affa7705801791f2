"""The cells and sentences of the why_ffn page, written from its runs.

Each function turns outcomes the notebook computed (`_ffn_models.Outcome`, counts of fitted runs) into table
cells or one sentence of Markdown, so that a cell of the notebook only says what to compute and what to show.
"""

import numpy as np

from notebooks import _ffn_models as m
from notebooks._figures import plt, say, show


def seq_code(sequence):
    """A sequence of tokens as a code span, `0121`: data, set apart from the words around it."""
    return "`" + "".join(map(str, sequence)) + "`"


def misses(predicted, labels, sequences, held):
    """The wrongly classified sequences, each held-out one marked `*`; "none" when every one is right."""
    wrong = np.flatnonzero(predicted != labels)
    return ", ".join(seq_code(sequences[i]) + ("*" if held[i] else "") for i in wrong) or "none"


def tally(results):
    """How many runs fit the training set, stalled and diverged, and the range of sequences right of those
    that did not diverge."""
    kinds = [o.kind for o in results]
    right = [o.right for o in results if o.right is not None]
    spread = f"; right {min(right)}–{max(right)}" if right else ""
    return (f"{kinds.count(m.FITTED)} fit · {kinds.count(m.STALLED)} stall · {kinds.count(m.DIVERGED)} diverge"
            f"{spread}")


def sweep_rows(results, label_of, seeds, rates):
    """One row per model of results[(model, rate, seed)]: its tally at each rate, then over all rates."""
    models = dict.fromkeys(k[0] for k in results)
    return [[label_of(x), *[tally([results[(x, lr, s)] for s in seeds]) for lr in rates],
             tally([results[(x, lr, s)] for lr in rates for s in seeds])] for x in models]


def run_cell(o, steps, total):
    """One run of the sweep: its final loss and sequences right, or when and how it diverged."""
    if o.kind == m.DIVERGED:
        return f"diverged at step {o.steps}" if o.steps < steps else f"diverged: ended at {o.loss:.1e}, above its start"
    return f"{o.loss:.1e}, {o.right}/{total}"


def parts_sentence(learns, how):
    """Which models learn by the criterion `how`, and the parts that are necessary and sufficient for it."""
    necessary, sufficient = m.necessary_and_sufficient(learns)
    learners = [p.name for p in learns if learns[p]]
    if not learners:
        return f"**{how.capitalize()}**: no model learns the task, so no part is shown necessary or sufficient."
    need = " and ".join(f"the {s[0]}" if len(s) == 1 else "at least one of the " + " or the ".join(s)
                        for s in necessary) or "no part"
    enough = "; ".join("all of " + " + ".join(s) if len(s) > 1 else f"the {s[0]}" if s else "nothing"
                       for s in sufficient) or "no set of parts (not even all three)"
    return (f"**{how.capitalize()}**: {len(learners)} of {len(learns)} models learn the task "
            f"({', '.join(learners)}). Necessary: {need}. Sufficient: {enough}.")


# The models the title speaks of, as filters of `Parts`.
TITLE_GROUPS = {"neither a LayerNorm nor an FFN": lambda p: not p.ln and not p.ffn,
                "a LayerNorm and no FFN": lambda p: p.ln and not p.ffn,
                "an FFN and no LayerNorm": lambda p: p.ffn and not p.ln}


def title_check(fits, runs):
    """The page's title read against the sweep, from {Parts: fitted runs of `runs`}: no model with neither a
    LayerNorm nor an FFN fits the training set, and some model with only one of the two does, for each."""
    counts = {group: (sum(n for p, n in fits.items() if keep(p)), runs * sum(map(keep, fits)))
              for group, keep in TITLE_GROUPS.items()}
    (first, (neither, total)), *rest = counts.items()
    holds = neither == 0 and all(n > 0 for _, (n, _) in rest)
    others = ", and ".join(f"**{n}** of the {t} of those with {group}" for group, (n, t) in rest)
    return (f"The title, read against the sweep: **{neither}** of the {total} runs of the models with {first} fit the "
            f"training set, {others}. "
            + ("The title holds for these runs." if holds else "**These runs do not bear the title out.**"))


def rising_text(sharpness):
    """What the sharpness was once the loss rose: its range where it could be measured."""
    finite = np.abs(sharpness[np.isfinite(sharpness)])
    if finite.size == 0:
        return r", and \(\lvert\Lambda\rvert\) cannot be measured there (the gradient itself overflows)"
    missed = sharpness.size - finite.size
    unmeasured = f" ({missed} point{'s' * (missed > 1)} where the gradient overflows)" if missed else ""
    return rf" and \(\lvert\Lambda\rvert\) is {finite.min():.3g} to {finite.max():.3g}{unmeasured}"


def late_divergence(seed, at, rate, ids, y, iters):
    """Draw and describe the sharpness along model B's run from `seed` at `rate`, which diverged at step `at`:
    every few steps at first, then each of the last ten."""
    every = max(1, at // 40)
    trace = m.sharpness_along(seed, rate, m.B, ids, y, [*range(0, at - 10, every), *range(at - 10, at)], iters)
    steps, losses, sharpness = map(np.array, zip(*trace))
    calm = losses <= losses[0]  # the points before the loss rose above its start
    fig, (upper, lower) = plt.subplots(2, 1, figsize=(7, 6), sharex=True)
    upper.semilogy(steps[calm], losses[calm], "o-")
    upper.set_ylabel("training loss (nats, log)")
    upper.set_title(f"Model B, seed {seed}, rate {rate:g}, until its loss rose above its start")
    lower.plot(steps[calm], np.abs(sharpness[calm]), "o-", label="|Λ|, the largest-magnitude Hessian eigenvalue")
    lower.axhline(2 / rate, color="k", ls="--", label="2 / rate: the stability limit")
    lower.set_xlabel("gradient-descent step")
    lower.set_ylabel("|Λ| (units of 1/rate)")
    lower.legend()
    show(fig)
    first_rise = steps[~calm].min() if (~calm).any() else None
    say(f"Until step {steps[calm].max()} the loss falls or holds, and \\(\\lvert\\Lambda\\rvert\\) has median "
        f"**{np.median(np.abs(sharpness[calm])):.2f}** against the limit 2/{rate:g} = {2 / rate:g}: the run sits at "
        "the edge of stability, as gradient descent above its limit tends to. "
        + (f"From step {first_rise} the loss is above its start{rising_text(sharpness[~calm])}; at step {at} the "
           "loss is no longer finite." if first_rise is not None else f"The loss stops being finite at step {at}."))
