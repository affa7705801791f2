# %% [markdown]
# # Attention alone fails an exclusive or; a LayerNorm or a feed-forward network after it can learn it
#
# Attention mixes positions: each output is a weighted average of value
# vectors, with weights that depend on the input. Is that enough to compute a
# function that is not a sum of per-token contributions? A small test:
# sequences of tokens from {0, 1, 2}, labelled 1 when **exactly one** of the
# tokens 1 and 2 appears (an exclusive or of their presence). Every such
# sequence is used: a random part for training, the rest held out.
#
# The models are built from the library's own forward and backward
# functions (the `transformer` package). Each has token and position
# embeddings, one causal attention layer (the last position attends over the
# whole sequence: attention pooling) and a linear read-out of that position
# into two logits. Between the attention and the read-out sits any subset of
# three parts of a transformer block: a **LayerNorm**, a ReLU **feed-forward
# network** (FFN) and a **residual** connection around them. With \(X^{(0)}\)
# the embeddings, that gives eight models:
#
# - **Model A** has none of the three: the read-out sees the attention output
#   \(\operatorname{Attn}(X^{(0)})\) itself.
# - **Model B** has all three, as in the second half of a transformer block:
#   the read-out sees \(\operatorname{Attn}(X^{(0)}) +
#   \operatorname{FFN}(\operatorname{LN}(\operatorname{Attn}(X^{(0)})))\).
# - The six others leave out one or two (an absent LN or FFN is the identity;
#   the model with only the residual reads out \(2\operatorname{Attn}(X^{(0)})\)).
#
# Comparing A with B alone could not say which of the three parts does the
# work, so all eight are trained from several seeds at several learning rates.
# The sections after that sweep test an explanation of A's failure, train B on
# other splits of the data, compare the two conventions for ReLU's derivative
# at 0, and ask why B's training diverges at the larger rates. All models are
# trained by full-batch gradient descent on the mean cross-entropy, with the
# settings in the table below (printed from the variables the runs use).

# %% tags=["hide-input"]
import inspect

import numpy as np

from notebooks import _ffn_models as m
from notebooks import _ffn_report as r
from notebooks._figures import QUICK, plt, say, show, table

N_TRAIN, SPLIT_SEED = 54, 0  # how many sequences train, and the seed of the split
STEPS = 40 if QUICK else 1000
SEEDS = [0, 1] if QUICK else [0, 1, 2, 3, 4, 5]
RATES = [0.25, 0.5, 1.0, 2.0]
CHECK_SEED, CHECK_MOVE, CHECK_ROWS = 7, 0.1, 10  # the gradient check: init seed, 1-D parameters moved, sequences
CLIP = 1.0  # the repaired column of the sweep: gradients clipped to this global norm
INIT_SCALE = 0.5  # the other variant tried: every initial weight matrix times this
FAST_RATE, LATE_RATE = 1.0, 0.5  # the rates of the two divergence studies
SPLIT_SEEDS = [1, 2] if QUICK else [1, 2, 3, 4, 5]  # the other train/held-out splits
POWER_ITERS = 5 if QUICK else 20  # power-iteration steps per top Hessian eigenvalue
HVP_EPS, COARSE_EPS = 1e-6, 1e-4  # the finite-difference step of the Hessian-vector products, and a coarser one

table(["setting", "value", "what it sets"], [
    ["`TOKENS`, `LENGTH`", f"{m.TOKENS}, {m.LENGTH}", "the vocabulary {0, …, TOKENS − 1} and the sequence length"],
    ["`N_TRAIN`, `SPLIT_SEED`", f"{N_TRAIN}, {SPLIT_SEED}", "sequences used for training, the seed that picks them"],
    ["`D`", m.D, r"model width \(d\): embeddings, queries, keys, values, the pooled vector"],
    ["`HEADS`", m.HEADS, r"attention heads \(H\)"],
    ["`F`", m.F, r"hidden width \(F\) of the ReLU feed-forward network"],
    ["`LN_EPS`", f"{m.LN_EPS:g}", r"the LayerNorm's \(\epsilon_{\mathrm{LN}}\)"],
    ["`STEPS`", STEPS, "full-batch gradient-descent steps per run" + (" (shortened: quick mode)" if QUICK else "")],
    ["`SEEDS`", ", ".join(map(str, SEEDS)), "initialisation seeds of the sweep (seed 0 also for the single runs)"],
    ["`RATES`", ", ".join(f"{lr:g}" for lr in RATES), "learning rates of the sweep (the smallest for the single runs)"],
    ["`CHECK_SEED`, `CHECK_MOVE`, `CHECK_ROWS`", f"{CHECK_SEED}, {CHECK_MOVE:g}, {CHECK_ROWS}",
     "the gradient check: initialisation seed, scale of the move of the 1-D parameters, sequences checked"],
    ["`CLIP`", f"{CLIP:g}", "the repaired variant of model B: the gradients' global norm clipped to this"],
    ["`INIT_SCALE`", f"{INIT_SCALE:g}", "the other variant of model B: its initial weight matrices times this"],
    ["`FAST_RATE`, `LATE_RATE`", f"{FAST_RATE:g}, {LATE_RATE:g}", "the rates at which B's divergences are traced"],
    ["`SPLIT_SEEDS`", ", ".join(map(str, SPLIT_SEEDS)), "seeds of the further train/held-out splits"],
    ["`POWER_ITERS`", POWER_ITERS, "power-iteration steps for each top Hessian eigenvalue"],
    ["`HVP_EPS`, `COARSE_EPS`", f"{HVP_EPS:g}, {COARSE_EPS:g}",
     r"step \(\Delta\) of the central differences of the Hessian-vector products, and the coarser step it is "
     "compared with"],
])

# %% [markdown]
# ## The data

# %% tags=["hide-input"]
sequences, labels = m.task()
train_idx, held_idx = m.split(len(sequences), N_TRAIN, SPLIT_SEED)
in_train = np.isin(np.arange(len(sequences)), train_idx)
ALL, HELD = len(sequences), len(held_idx)
X, Y = sequences[train_idx], labels[train_idx]
baseline = max(np.sum(labels == 0), np.sum(labels == 1))  # always answering the commoner label
say(f"{labels.sum()} of the {ALL} sequences have label 1; {labels[train_idx].sum()} of the {N_TRAIN} training "
    f"sequences and {labels[held_idx].sum()} of the {HELD} held out. Always answering the commoner label gets "
    f"**{baseline} of {ALL}** right: the baseline any model must beat.")

# %% [markdown]
# ## The eight models, and their gradient checks
#
# The functions live in `notebooks/_ffn_models.py`: each forward only chains
# the library's layers (`embedding_forward`, `attention_forward`,
# `layer_norm_forward`, `linear_forward`, `relu_forward`), and each backward
# consumes the caches of its forward in reverse. The part that differs between
# the eight models is what follows the attention, forward and backward:

# %% tags=["hide-input"]
say("\n\n".join(f"```python\n{inspect.getsource(f).rstrip()}\n```" for f in (m.block_forward, m.block_backward)))

# %% [markdown]
# Before trusting them, every model's hand-chained backward is checked against
# central differences of its loss, for every parameter, with the project's
# pass rule (`transformer.gradcheck.check_passes`).

# %% tags=["hide-input"]
checks = {parts: m.gradient_check(parts, sequences[:CHECK_ROWS], labels[:CHECK_ROWS], CHECK_SEED, CHECK_MOVE)
          for parts in m.ALL_PARTS}


def mark(flag):
    return "yes" if flag else "—"


def size(parts):
    return sum(v.size for v in m.init(0, parts).values())


table(["model", "LN", "FFN", "residual", "parameters", "gradient check", "largest relative gap"],
      [[parts.name, mark(parts.ln), mark(parts.ffn), mark(parts.res), size(parts), "passes" if ok else "FAILS",
        f"{gap:.1e}"] for parts, (ok, gap) in checks.items()])
say(f"**{sum(ok for ok, _ in checks.values())} of {len(checks)}** backward passes agree with central differences "
    "(the largest gap leaves out the key bias, whose gradient is zero: a softmax ignores a shift shared by all "
    "positions).")

# %% [markdown]
# ## Training every model from every seed at every rate
#
# Every model is trained from every seed at every rate. Each run ends in one
# of three ways, defined as follows (printed from the code that sorts them):

# %% tags=["hide-input"]
table(["outcome", "definition"], [[kind, text] for kind, text in m.DEFINITIONS.items()])
runs = {(parts, lr, s): m.fit(s, lr, parts, X, Y, STEPS) for parts in m.ALL_PARTS for lr in RATES for s in SEEDS}
sweep = {key: m.outcome(run, key[0], sequences, labels, train_idx, STEPS) for key, run in runs.items()}

# %% [markdown]
# ### One run of A and of B, seed 0
#
# Both at the smallest learning rate of the sweep, with plain gradient
# descent (no clipping).

# %% tags=["hide-input"]
LR = min(RATES)
diverged_at = {lr: sum(sweep[(p, lr, s)].kind == m.DIVERGED for p in m.ALL_PARTS for s in SEEDS) for lr in RATES}
say(f"Learning rate **{LR:g}**, {STEPS} steps. Over the sweep, {diverged_at[LR]} of the "
    f"{len(m.ALL_PARTS) * len(SEEDS)} runs at this rate diverge, against "
    + ", ".join(f"{diverged_at[lr]} at {lr:g}" for lr in RATES if lr != LR) + ".")
fig, ax = plt.subplots(figsize=(7, 4))
for parts, label in [(m.A, "model A (attention pooling, linear read-out)"),
                     (m.B, "model B (with LayerNorm, ReLU FFN, residual)")]:
    ax.semilogy(runs[(parts, LR, 0)].losses, label=label)
ax.set_xlabel(f"gradient-descent step (full batch of {N_TRAIN})")
ax.set_ylabel("training cross-entropy (nats, log scale)")
ax.set_title("Training on the exclusive-or of presence")
ax.legend()
show(fig)

# %% [markdown]
# ### The census: every sequence, every model
#
# Seed 0 at the same learning rate; each model classifies all 81 sequences.

# %% tags=["hide-input"]
def census_row(parts, run):
    out = m.outcome(run, parts, sequences, labels, train_idx, STEPS)
    if out.kind == m.DIVERGED:
        return [parts.name, f"diverged at step {out.steps}", "—", "—", "—", "—"]
    predicted = m.predictions(run.params, sequences, parts)
    right = predicted == labels
    return [parts.name, f"{out.loss:.2e}", f"{right[train_idx].sum()} of {N_TRAIN}",
            f"{right[held_idx].sum()} of {HELD}", f"{right.sum()} of {ALL}",
            r.misses(predicted, labels, sequences, ~in_train)]


table(["model", "final training loss", "right, training", "right, held out", "right, all",
       "misses (* = held out, never trained on)"], [census_row(parts, runs[(parts, LR, 0)]) for parts in m.ALL_PARTS])

# %% [markdown]
# ### The sweep

# %% tags=["hide-input"]
say(f"Each cell: of the {len(SEEDS)} seeds, how many runs fit the training set, stalled and diverged, and the "
    f"range of sequences right of all {ALL} among the runs that did not diverge.")
table(["model", *[f"rate {lr:g}" for lr in RATES], "all rates"],
      r.sweep_rows(sweep, lambda parts: parts.name, SEEDS, RATES))

# %% [markdown]
# The runs one by one: final training loss, and sequences right of all 81.

# %% tags=["hide-input"]
table(["model", "rate", *[f"seed {s}" for s in SEEDS]],
      [[parts.name, f"{lr:g}", *[r.run_cell(sweep[(parts, lr, s)], STEPS, ALL) for s in SEEDS]]
       for parts in m.ALL_PARTS for lr in RATES])

# %% [markdown]
# ## Which parts are necessary, which sufficient
#
# A model *learns* the task here when at least one of its runs fits every
# training sequence; it learns it *reliably* when, at its best learning rate,
# at least half of the seeds do. A part is *necessary* when every model that learns has it, and a set of
# parts is *sufficient* when every model that has them learns. The sentences
# below are computed from the sweep's counts.

# %% tags=["hide-input"]
RUNS = len(RATES) * len(SEEDS)
fits = {p: sum(sweep[(p, lr, s)].kind == m.FITTED for lr in RATES for s in SEEDS) for p in m.ALL_PARTS}
best_fits = {p: max(sum(sweep[(p, lr, s)].kind == m.FITTED for s in SEEDS) for lr in RATES) for p in m.ALL_PARTS}
table(["model", "runs that fit the training set", f"of {RUNS}", "seeds that fit, at the best rate", f"of {len(SEEDS)}"],
      [[p.name, fits[p], RUNS, best_fits[p], len(SEEDS)] for p in m.ALL_PARTS])
say(r.parts_sentence({p: fits[p] >= 1 for p in fits}, "in at least one run"))
say(r.parts_sentence({p: 2 * best_fits[p] >= len(SEEDS) for p in fits}, "reliably (half the seeds at the best rate)"))

# %% [markdown]
# ## Why A fails: an argument, checked on A's pooled vectors
#
# One argument for A's failure runs as follows. The pooled vector, the
# attention output at the last position that A's linear read-out sees, is a
# weighted average of value vectors. If attention prefers the tokens 1 and 2
# over 0, then the "1 only" sequences land near one point, the "2 only" ones
# near another and the "both" ones between them, so along that line the labels
# run 1, 0, 1 and no linear read-out can separate them. Here the argument is
# tested on the vectors A actually learned (seed 0, the smallest rate). The
# drawing projects all of them onto their two principal axes (numpy's SVD);
# the marked line joins the centroid of the "1 only" sequences to that of the
# "2 only" ones.

# %% tags=["hide-input"]
GROUPS = {"neither": (False, False), "1 only": (True, False), "2 only": (False, True), "both": (True, True)}
group = np.array([next(g for g, key in GROUPS.items() if key == (1 in s, 2 in s)) for s in sequences])
p_a = runs[(m.A, LR, 0)].params
pooled = m.forward(p_a, sequences, m.A)[1][:, -1]  # (81, D): what A's read-out reads
centred = pooled - pooled.mean(0)
_, sv, axes = np.linalg.svd(centred, full_matrices=False)
xy = centred @ axes[:2].T
c1, c2 = (pooled[group == g].mean(0) for g in ("1 only", "2 only"))
fig, ax = plt.subplots(figsize=(7, 5))
for g, marker in zip(GROUPS, "osD^"):
    for lab, colour in ((0, "tab:blue"), (1, "tab:orange")):
        pick = (group == g) & (labels == lab)
        if pick.any():
            ax.scatter(*xy[pick].T, marker=marker, color=colour, label=f"{g} (label {lab})", alpha=0.8)
ends = (np.array([c1, c2]) - pooled.mean(0)) @ axes[:2].T
ax.plot(*ends.T, "k--", label="the 1–0–1 line: centroid of 1 only to centroid of 2 only")
ax.set_xlabel(f"first principal axis ({sv[0] ** 2 / (sv ** 2).sum():.0%} of the variance)")
ax.set_ylabel(f"second principal axis ({sv[1] ** 2 / (sv ** 2).sum():.0%} of the variance)")
ax.set_title(f"Model A's pooled vectors, all {ALL} sequences")
ax.legend(fontsize=7)
show(fig)

# %% [markdown]
# Where each group sits along that line, in all \(d\) dimensions: the
# position along the line is 0 at the "1 only" centroid and 1 at the "2 only"
# one; the distance off the line is given as a fraction of the line's length.

# %% tags=["hide-input"]
direction = c2 - c1
along = (pooled - c1) @ direction / (direction @ direction)
off = np.linalg.norm(pooled - c1 - np.outer(along, direction), axis=1) / np.linalg.norm(direction)
table(["group", "label", "sequences", "along the line: min", "median", "max", "off the line: median"],
      [[g, int(labels[group == g][0]), int((group == g).sum()), f"{along[group == g].min():.2f}",
        f"{np.median(along[group == g]):.2f}", f"{along[group == g].max():.2f}", f"{np.median(off[group == g]):.2f}"]
       for g in GROUPS])
between = (along[group == "both"] > 0) & (along[group == "both"] < 1)
say(f"The argument's picture puts every \"both\" sequence strictly between the two ends (between 0 and 1 along "
    f"the line): **{between.sum()} of {between.size}** lie there, and \"neither\" is at "
    f"{along[group == 'neither'][0]:.2f}.")

# %% [markdown]
# A stronger failure than a bent line is possible: two sequences with
# different labels whose pooled vectors (nearly) coincide cannot be told
# apart by *any* read-out of them, linear or not. The closest such pairs,
# distances relative to the spread of all the vectors (the root-mean-square
# distance from their mean):

# %% tags=["hide-input"]
spread = np.sqrt((centred ** 2).sum(1).mean())
gaps = np.linalg.norm(pooled[:, None] - pooled[None], axis=-1) / spread
pairs = sorted((gaps[i, j], i, j) for i in range(ALL) for j in range(i) if labels[i] != labels[j])
NEAR = 0.01  # "nearly coincide": closer than this fraction of the spread
close = [(gap, i, j) for gap, i, j in pairs if gap < NEAR]
table(["sequence", "label", "sequence", "label", "distance / spread"],
      [[r.seq_code(sequences[i]), labels[i], r.seq_code(sequences[j]), labels[j], f"{gap:.1e}"]
       for gap, i, j in pairs[:8]])
say(f"**{len(close)}** pairs of differently labelled sequences lie within {NEAR:.0%} of the spread of each other; the "
    f"{len({k for _, i, j in close for k in (i, j)})} sequences in them a read-out of A's pooled vectors could tell "
    f"apart only by resolving differences under {NEAR:.0%} of the vectors' spread.")

# %% [markdown]
# The test of the claim: the best linear read-out of these fixed vectors,
# fitted over **all** 81 (training and held out together), against what A's
# own read-out gets. Least squares fits ±1 targets; the logistic regression is
# unpenalised gradient descent, which heads for a separating hyperplane
# whenever one exists. A's own read-out is itself a linear read-out of the
# pooled vectors, so the best of the three is at least A's count; a fitted
# read-out on its own need not be (it optimises a loss, not the count).

# %% tags=["hide-input"]
OWN = f"A's own read-out (trained on the {N_TRAIN})"
readouts = {OWN: m.predictions(p_a, sequences, m.A),
            f"least squares on all {ALL}": m.least_squares_readout(pooled, labels)}
readouts[f"logistic regression on all {ALL}"], log_loss = m.logistic_readout(pooled, labels, 2000 if QUICK else 20000)
counts = {name: int((pred == labels).sum()) for name, pred in readouts.items()}
table(["linear read-out of A's pooled vectors", f"right of {ALL}", "misses"],
      [[name, counts[name], r.misses(pred, labels, sequences, np.zeros(ALL, bool))] for name, pred in readouts.items()])
best, own = max(counts.values()), counts[OWN]
verdict = ("a linear read-out separates all of them, so for this model the argument's conclusion does not hold: "
           "A's pooled vectors are linearly separable and its shortfall lies elsewhere" if best == ALL else
           f"no read-out found separates them all: the best gets {best} of {ALL}, which is consistent with the "
           "argument (a read-out search that fails does not prove that no separating hyperplane exists)")
say(f"A's own read-out gets **{own} of {ALL}**; the best linear read-out found on the same vectors gets "
    f"**{best} of {ALL}**: {verdict}. The logistic fit ends at a mean log-loss of {log_loss:.3f}; any read-out "
    f"below ln 2 / {ALL} = {np.log(2) / ALL:.4f} would classify every sequence rightly, and on separable vectors "
    "unpenalised gradient descent drives the loss towards 0.")

# %% [markdown]
# ## Other splits
#
# With one random split, a miss may be a sequence that training never showed
# rather than one the model cannot get right. Here model B (seed 0, the
# smallest rate) is trained again on further random splits of the same size,
# and every miss is marked by whether training ever showed it.

# %% tags=["hide-input"]
def split_row(split_seed):
    tr, _ = m.split(ALL, N_TRAIN, split_seed)
    held = ~np.isin(np.arange(ALL), tr)
    run = runs[(m.B, LR, 0)] if split_seed == SPLIT_SEED else m.fit(0, LR, m.B, sequences[tr], labels[tr], STEPS)
    out = m.outcome(run, m.B, sequences, labels, tr, STEPS)
    if out.kind == m.DIVERGED:
        return [split_seed, "diverged", "—", "—"], []
    predicted = m.predictions(run.params, sequences, m.B)
    wrong = np.flatnonzero(predicted != labels)
    return ([split_seed, out.kind, f"{out.right} of {ALL}", r.misses(predicted, labels, sequences, held)],
            [held[i] for i in wrong])


split_rows, split_misses = zip(*(split_row(s) for s in [SPLIT_SEED, *SPLIT_SEEDS]))
table(["split seed", "outcome", "right, all", "misses (* = held out, never trained on)"], split_rows)
missed = [flag for row in split_misses for flag in row]
say(f"Over {len(split_rows)} splits model B misses {len(missed)} sequences in all; **{sum(missed)} of them** were "
    f"held out (never seen in training) and {len(missed) - sum(missed)} were training sequences it failed to fit.")

# %% [markdown]
# ## The ReLU corner convention
#
# ReLU has no derivative at 0; the library's `relu_backward` takes it to be 0
# (the gradient passes where the output is positive). The other convention,
# relu'(0) = 1, lets the gradient through where the input is ≥ 0; it is written
# in `notebooks/_ffn_models.py` (the library's cache holds only the output, so
# it reads the pre-activation) and the library is not changed. Model B is
# trained with both from every seed at the smallest rate; the run also counts the
# pre-activations that were exactly 0, the only place the two can differ.

# %% tags=["hide-input"]
def corner_row(seed):
    zero, one = runs[(m.B, LR, seed)], m.fit(seed, LR, m.B, X, Y, STEPS, corner=1)
    gap = max(float(np.abs(zero.params[k] - one.params[k]).max()) for k in zero.params)
    same = np.array_equal(m.predictions(zero.params, sequences, m.B), m.predictions(one.params, sequences, m.B))
    return [seed, one.corners, f"{gap:.1e}", f"{zero.losses[-1]:.3e}", f"{one.losses[-1]:.3e}",
            "yes" if same else "no"], gap


corner_rows, corner_gaps = zip(*(corner_row(s) for s in SEEDS))
table(["seed", "exact zeros met", "largest parameter difference", "final loss, relu'(0)=0", "final loss, relu'(0)=1",
       "same predictions"], corner_rows)
say(f"Largest difference between the two conventions' final parameters over the {len(SEEDS)} seeds: "
    f"**{max(corner_gaps):.1e}**" + (" (the runs are bit for bit the same: no pre-activation was ever exactly 0)."
                                     if max(corner_gaps) == 0 else "."))

# %% [markdown]
# Where the convention does matter: a pre-activation that is exactly 0 by
# construction. Started with the FFN's first layer all zeros (weights and
# bias), every pre-activation is 0. With relu'(0) = 0 no gradient reaches that
# layer, so it stays zero whatever the number of steps; relu'(0) = 1 lets a
# gradient through. The training step is plain gradient descent:

# %%
def dead_start(corner):
    """Model B trained from seed 0 with its FFN's first layer zeroed, under the ReLU corner convention `corner`."""
    p = m.init(0, m.B)
    p["ff1_w"][:], p["ff1_b"][:] = 0.0, 0.0
    for _ in range(STEPS):
        _, g = m.loss_and_grads(p, X, Y, m.B, corner)
        for k in p:
            p[k] -= LR * g[k]
    return p


# %% tags=["hide-input"]
dead = {corner: dead_start(corner) for corner in (0, 1)}
dead_right = {c: int((m.predictions(p, sequences, m.B) == labels).sum()) for c, p in dead.items()}
table(["convention", "largest first-layer weight after training", f"right of {ALL}"],
      [[f"relu'(0) = {c}", f"{np.abs(p['ff1_w']).max():.2e}", dead_right[c]] for c, p in dead.items()])
moved = {c: bool(np.abs(p["ff1_w"]).max() > 0) for c, p in dead.items()}
say("From the dead start, the first layer " + ("moved" if moved[0] else "is still exactly zero after training")
    + " with relu'(0) = 0, and " + ("moved" if moved[1] else "is still exactly zero") + " with relu'(0) = 1; "
    f"the two models get {dead_right[0]} and {dead_right[1]} of the {ALL} sequences right.")

# %% [markdown]
# ## Why model B diverges, and two variants
#
# Gradient descent with learning rate \(\eta\) on a loss whose curvature along
# some direction is \(\Lambda\) is stable along that direction only when
# \(\eta < 2/\Lambda\). Here \(\Lambda\) is the largest-magnitude eigenvalue of
# the Hessian of the training loss \(\ell\) with respect to all the
# parameters, stacked into one vector \(\Theta\). It is found by power
# iteration on Hessian-vector products that are central differences of the
# hand-written gradient along a unit vector \(\mathcal{V}\),
# \(\big(\nabla\ell(\Theta + \Delta\mathcal{V}) - \nabla\ell(\Theta - \Delta\mathcal{V})\big)/2\Delta\);
# no second derivative is written by hand. First, at the initialisation of
# each seed:

# %% tags=["hide-input"]
VARIANTS = ((m.A, 1.0), (m.B, 1.0), (m.B, INIT_SCALE))
top, top_again, top_coarse = ({(parts, scale, s): m.top_hessian_eigenvalue(m.init(s, parts, scale), X, Y, parts,
                                                                          POWER_ITERS, eps, start)
                               for parts, scale in VARIANTS for s in SEEDS}
                              for eps, start in ((HVP_EPS, 0), (HVP_EPS, 1), (COARSE_EPS, 0)))
top.update({(parts, s): top[(parts, 1.0, s)] for parts in (m.A, m.B) for s in SEEDS})
table(["seed", r"\(\Lambda\), model A", r"\(2/\Lambda\), model A", r"\(\Lambda\), model B", r"\(2/\Lambda\), model B",
       "B's runs that diverge (rate)", rf"\(\Lambda\), B with initial weights × {INIT_SCALE:g}"],
      [[s, f"{top[(m.A, s)]:.1f}", f"{2 / top[(m.A, s)]:.3f}", f"{top[(m.B, s)]:.1f}", f"{2 / top[(m.B, s)]:.3f}",
        ", ".join(f"{lr:g}" for lr in RATES if sweep[(m.B, lr, s)].kind == m.DIVERGED) or "none",
        f"{top[(m.B, INIT_SCALE, s)]:.1f}"] for s in SEEDS])
agree = {v: max(abs(top[(*v, s)] - top_again[(*v, s)]) / abs(top[(*v, s)]) for s in SEEDS) for v in VARIANTS}
coarse = {v: max(abs(top[(*v, s)] - top_coarse[(*v, s)]) / abs(top[(*v, s)]) for s in SEEDS) for v in VARIANTS}
limit_b = max(2 / top[(m.B, s)] for s in SEEDS)
calm_rates = [lr for lr in RATES if lr > limit_b and all(sweep[(m.B, lr, s)].kind != m.DIVERGED for s in SEEDS)]
small = [abs(top[(m.B, INIT_SCALE, s)]) for s in SEEDS]
full_b = [top[(m.B, s)] for s in SEEDS]
sharper = [top[(m.B, s)] / top[(m.A, s)] for s in SEEDS]
say(f"A second power iteration from another random start agrees to a relative "
    f"{agree[(m.A, 1.0)]:.0e} for A and {agree[(m.B, 1.0)]:.0e} for B, and to {agree[(m.B, INIT_SCALE)]:.0e} for B "
    rf"with the smaller start. With the coarser step \(\Delta\) = {COARSE_EPS:g} the values move by up to a relative "
    f"{coarse[(m.A, 1.0)]:.0e} for A (which has no ReLU) and {coarse[(m.B, 1.0)]:.0e} for B: a ReLU corner inside "
    rf"the step reads as curvature, which is why \(\Delta\) = {HVP_EPS:g}. Model B starts {min(sharper):.1f} to "
    f"{max(sharper):.1f} times as sharp as A from the same seed, and its stability limit at the start is at most "
    f"{limit_b:.3f}, " + ("below every rate of the sweep. " if limit_b < min(RATES) else "within the sweep's rates. ")
    + (f"Yet no run at {', '.join(f'{lr:g}' for lr in calm_rates)} diverges: the limit at the start is not the "
       "whole story (gradient descent above it first makes the loss rise, and what happens next decides the run). "
       if calm_rates else "")
    + ("The smaller start does not lower the curvature" if min(small) > min(full_b) else "With the smaller start")
    + rf": \(\lvert\Lambda\rvert\) is {min(small):.1f} to {max(small):.1f} at the start (B at full scale: "
    f"{min(full_b):.1f} to {max(full_b):.1f}).")

# %% [markdown]
# What happens next, in a run of B at `FAST_RATE` (seed 0): the gradient's norm,
# step by step until it overflows. If the run merely oscillated out along one
# sharp direction, the norm would grow by a constant factor per step. B's
# output is a product of several weight matrices (the value and output
# projections, the two FFN layers and the read-out), so once they are large a
# step grows each by roughly the product of the others: then the factor itself
# grows, and the logarithm of the norm grows by a factor. The table, and the
# sentence computed from it, say which happened.

# %% tags=["hide-input"]
blow = m.fit(0, FAST_RATE, m.B, X, Y, STEPS)
log_norm = np.log10(blow.norms)
table(["step", "training loss", "gradient norm", "log₁₀ norm", "growth of log₁₀ norm"],
      [[i, f"{blow.losses[i]:.3g}", f"{blow.norms[i]:.3g}", f"{log_norm[i]:.2f}",
        f"× {log_norm[i] / log_norm[i - 1]:.2f}" if i and log_norm[i - 1] > 1 and np.isfinite(log_norm[i]) else ""]
       for i in range(len(blow.norms))])
growth = [log_norm[i] / log_norm[i - 1] for i in range(1, len(log_norm))
          if log_norm[i - 1] > 1 and np.isfinite(log_norm[i])]
ratios = np.diff(log_norm[np.isfinite(log_norm)])  # log10 of the norm's growth factor per step
say(f"Once the norm passes 10, the logarithm of the norm grows by × {min(growth):.2f} to × {max(growth):.2f} per "
    f"step, and the norm itself by a factor of 10^{ratios[-len(growth):].min():.2g} to 10^{ratios.max():.3g}: "
    + ("a factor that itself grows, which one sharp direction (a constant factor per step) cannot give."
       if min(growth) > 1 and np.all(np.diff(ratios[-len(growth):]) > 0) else
       "not the steadily growing factor of parameters that multiply; the account above does not fit this run.")
    if growth else "The norm never passes 10 before the run ends; the account above is not tested by this run.")

# %% [markdown]
# A divergence late in a run, at `LATE_RATE`, may take another route: the run
# first learns, and is thrown out later. The sharpness along such a run (the
# first B run at `LATE_RATE` that diverges after step 100), measured every few
# steps:

# %% tags=["hide-input"]
late = [s for s in SEEDS if sweep[(m.B, LATE_RATE, s)].kind == m.DIVERGED
        and 100 < sweep[(m.B, LATE_RATE, s)].steps < STEPS]
if late:
    r.late_divergence(late[0], sweep[(m.B, LATE_RATE, late[0])].steps, LATE_RATE, X, Y, POWER_ITERS)
else:
    say(f"No run of B at {LATE_RATE:g} diverges between step 100 and the last in this sweep.")

# %% [markdown]
# Two variants, each over the same seeds and rates as the original, which
# stays in the table. The first starts smaller: every initial weight matrix
# times `INIT_SCALE` (its starting curvature is the last column of the table
# of \(\Lambda\) above), with plain gradient descent as before. The second
# keeps the initialisation and clips the gradients to a global norm of `CLIP`
# with the library's `transformer.optim.clip_grads` before each step: a
# clipped step is at most \(\eta\) times `CLIP` long, so the parameters can no
# longer multiply their way to an overflow in a few steps.

# %% tags=["hide-input"]
def variant(**how):
    return {(lr, s): m.outcome(m.fit(s, lr, m.B, X, Y, STEPS, **how), m.B, sequences, labels, train_idx, STEPS)
            for lr in RATES for s in SEEDS}


clipped, smaller = variant(clip=CLIP), variant(scale=INIT_SCALE)
both = {**{("B, plain gradient descent", lr, s): sweep[(m.B, lr, s)] for lr in RATES for s in SEEDS},
        **{(f"B, initial weights × {INIT_SCALE:g}", lr, s): o for (lr, s), o in smaller.items()},
        **{(f"B, gradients clipped at {CLIP:g}", lr, s): o for (lr, s), o in clipped.items()}}
table(["model B", *[f"rate {lr:g}" for lr in RATES], "all rates"], r.sweep_rows(both, str, SEEDS, RATES))

# %% [markdown]
# ## What the runs show, and what they do not
#
# The sentences below are written from the counts above.

# %% tags=["hide-input"]
def count(results, kind):
    return sum(o.kind == kind for o in results)


plain_b, clip_b = [sweep[(m.B, lr, s)] for lr in RATES for s in SEEDS], list(clipped.values())
a_right = [o.right for lr in RATES for s in SEEDS if (o := sweep[(m.A, lr, s)]).right is not None]
say(f"Model A fits the training set in {fits[m.A]} of {RUNS} runs; "
    + (f"those that do not diverge get {min(a_right)} to {max(a_right)} of the {ALL} sequences right, "
       if a_right else "every one of them diverges, ")
    + f"against {baseline} for always answering the commoner label. Model B fits it in {fits[m.B]} of {RUNS}. "
    f"Plain gradient descent diverges in {count(plain_b, m.DIVERGED)} of B's {RUNS} runs; clipped at {CLIP:g}, in "
    f"{count(clip_b, m.DIVERGED)}, and {count(clip_b, m.FITTED)} of {RUNS} fit the training set.")
say(r.title_check(fits, RUNS))
say(r.parts_sentence({p: 2 * best_fits[p] >= len(SEEDS) for p in fits}, "reliably (half the seeds at the best rate)"))
say(m.reliability_text(clipped, f"clipped at {CLIP:g}", SEEDS, RATES))
say(m.reliability_text(smaller, f"started at {INIT_SCALE:g} times the weights", SEEDS, RATES))
say("What the experiment cannot say: it is one small task with one width, one depth and one number of steps, "
    "trained by full-batch gradient descent; a model that fails here may represent the function and not be "
    "found by this optimiser at these settings. \"Necessary\" and \"sufficient\" above are statements about "
    "these runs, not theorems about the architectures.")
