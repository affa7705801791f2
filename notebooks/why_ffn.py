# %% [markdown]
# # Why a block needs its feed-forward network
#
# Attention mixes positions: each output is a weighted average of value
# vectors, with weights that depend on the input. Is that enough to compute a
# function that is not a sum of per-token contributions? A small test:
# sequences of tokens from {0, 1, 2}, labelled 1 when **exactly one** of the
# tokens 1 and 2 appears (an exclusive or of their presence). Every such
# sequence is used: a random part for training, the rest held out.
#
# The models are built from the reference's own forward and backward
# functions. Each has token and position embeddings, one causal attention
# layer (the last position attends over the whole sequence: attention
# pooling) and a linear read-out of that position into two logits. Between the
# attention and the read-out sits any subset of three parts of a transformer
# block: a **LayerNorm**, a ReLU **feed-forward network** (FFN) and a
# **residual** connection around them. That gives eight models:
#
# - **Model A** has none of the three (attention pooling, linear read-out).
# - **Model B** has all three, as in a transformer block: z = a + FFN(LN(a)).
# - The six others leave out one or two (an absent LN or FFN is the identity;
#   the model with only the residual computes z = a + a).
#
# All are trained by full-batch gradient descent on the mean cross-entropy,
# with the settings in the table below (printed from the variables the runs
# use). The tutorial chapter this page reproduces compared only A and B; the
# sections after the sweep answer the questions it left open.

# %% tags=["hide-input"]
import numpy as np

from notebooks import _ffn_models as m
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
    ["`D`", m.D, "model width: embeddings, queries, keys, values, the pooled vector"],
    ["`HEADS`", m.HEADS, "attention heads"],
    ["`F`", m.F, "hidden width of the ReLU feed-forward network"],
    ["`LN_EPS`", f"{m.LN_EPS:g}", "the LayerNorm's epsilon"],
    ["`STEPS`", STEPS, "full-batch gradient-descent steps per run" + (" (shortened: quick mode)" if QUICK else "")],
    ["`SEEDS`", ", ".join(map(str, SEEDS)), "initialisation seeds of the sweep (seed 0 also for the single runs)"],
    ["`RATES`", ", ".join(f"{r:g}" for r in RATES), "learning rates of the sweep (the smallest for the single runs)"],
    ["`CHECK_SEED`, `CHECK_MOVE`, `CHECK_ROWS`", f"{CHECK_SEED}, {CHECK_MOVE:g}, {CHECK_ROWS}",
     "the gradient check: initialisation seed, scale of the move of the 1-D parameters, sequences checked"],
    ["`CLIP`", f"{CLIP:g}", "the repaired variant of model B: the gradients' global norm clipped to this"],
    ["`INIT_SCALE`", f"{INIT_SCALE:g}", "the other variant of model B: its initial weight matrices times this"],
    ["`FAST_RATE`, `LATE_RATE`", f"{FAST_RATE:g}, {LATE_RATE:g}", "the rates at which B's divergences are traced"],
    ["`SPLIT_SEEDS`", ", ".join(map(str, SPLIT_SEEDS)), "seeds of the further train/held-out splits"],
    ["`POWER_ITERS`", POWER_ITERS, "power-iteration steps for each top Hessian eigenvalue"],
    ["`HVP_EPS`, `COARSE_EPS`", f"{HVP_EPS:g}, {COARSE_EPS:g}",
     "step ε of the Hessian-vector products, and the coarser step it is compared with"],
])

# %% [markdown]
# ## The data

# %%
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
# the reference's layers (`embedding_forward`, `attention_forward`,
# `layer_norm_forward`, `linear_forward`, `relu_forward`), and each backward
# consumes the caches of its forward in reverse. Before trusting them, every
# model's hand-chained backward is checked against central differences of its
# loss, for every parameter, with the project's pass rule
# (`transformer.gradcheck.check_passes`).

# %%
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

# %%
table(["outcome", "definition"], [[kind, text] for kind, text in m.DEFINITIONS.items()])
runs = {(parts, lr, s): m.fit(s, lr, parts, X, Y, STEPS) for parts in m.ALL_PARTS for lr in RATES for s in SEEDS}
sweep = {key: m.outcome(run, key[0], sequences, labels, train_idx, STEPS) for key, run in runs.items()}

# %% [markdown]
# ### One run of A and of B, seed 0
#
# Both at the smallest learning rate of the sweep, where the fewest runs
# diverge (plain gradient descent, without clipping).

# %%
LR = min(RATES)
say(f"Learning rate **{LR:g}**, {STEPS} steps.")
fig, ax = plt.subplots(figsize=(7, 4))
for parts, label in [(m.A, "model A (attention pooling, linear read-out)"),
                     (m.B, "model B (with LayerNorm, ReLU FFN, residual)")]:
    ax.semilogy(runs[(parts, LR, 0)].losses, label=label)
ax.set_xlabel("gradient-descent step (full batch of 54)")
ax.set_ylabel("training cross-entropy (nats, log scale)")
ax.set_title("Training on the exclusive-or of presence")
ax.legend()
show(fig)

# %% [markdown]
# ### The census: every sequence, every model
#
# Seed 0 at the same learning rate; each model classifies all 81 sequences.

# %%
def seq_text(i):
    return "".join(map(str, sequences[i]))


def misses(p, parts, held=None):
    held = ~in_train if held is None else held
    wrong = np.flatnonzero(m.predictions(p, sequences, parts) != labels)
    return ", ".join(f"{seq_text(i)}{'*' if held[i] else ''}" for i in wrong) or "none"


def census_row(parts, run):
    out = m.outcome(run, parts, sequences, labels, train_idx, STEPS)
    if out.kind == m.DIVERGED:
        return [parts.name, f"diverged at step {out.steps}", "—", "—", "—", "—"]
    right = m.predictions(run.params, sequences, parts) == labels
    return [parts.name, f"{out.loss:.2e}", f"{right[train_idx].sum()} of {N_TRAIN}",
            f"{right[held_idx].sum()} of {HELD}", f"{right.sum()} of {ALL}", misses(run.params, parts)]


table(["model", "final training loss", "right, training", "right, held out", "right, all",
       "misses (* = held out, never trained on)"], [census_row(parts, runs[(parts, LR, 0)]) for parts in m.ALL_PARTS])

# %% [markdown]
# ### The sweep

# %%
def tally(results):
    kinds = [o.kind for o in results]
    right = [o.right for o in results if o.right is not None]
    spread = f"; right {min(right)}–{max(right)}" if right else ""
    return f"{kinds.count(m.FITTED)} F · {kinds.count(m.STALLED)} S · {kinds.count(m.DIVERGED)} D{spread}"


def sweep_rows(results, label_of):
    models = dict.fromkeys(k[0] for k in results)
    return [[label_of(x), *[tally([results[(x, lr, s)] for s in SEEDS]) for lr in RATES],
             tally([results[(x, lr, s)] for lr in RATES for s in SEEDS])] for x in models]


say(f"Each cell: of the {len(SEEDS)} seeds, how many runs fitted (F), stalled (S) and diverged (D), and the "
    f"range of sequences right of all {ALL} among the runs that did not diverge.")
table(["model", *[f"rate {lr:g}" for lr in RATES], "all rates"], sweep_rows(sweep, lambda parts: parts.name))

# %% [markdown]
# The runs one by one: final training loss, and sequences right of all 81.

# %%
def cell(o):
    if o.kind == m.DIVERGED:
        return f"diverged at step {o.steps}" if o.steps < STEPS else f"diverged: ended at {o.loss:.1e}, above its start"
    return f"{o.loss:.1e}, {o.right}/{ALL}"


table(["model", "rate", *[f"seed {s}" for s in SEEDS]],
      [[parts.name, f"{lr:g}", *[cell(sweep[(parts, lr, s)]) for s in SEEDS]] for parts in m.ALL_PARTS
       for lr in RATES])

# %% [markdown]
# ## Which parts are necessary, which sufficient
#
# A model *learns* the task here when at least one of its runs fits every
# training sequence; it learns it *reliably* when, at its best learning rate,
# at least half of the seeds do. A part is *necessary* when every model that learns has it, and a set of
# parts is *sufficient* when every model that has them learns. The sentences
# below are computed from the sweep's counts.

# %%
def fitted_runs(parts):
    return sum(sweep[(parts, lr, s)].kind == m.FITTED for lr in RATES for s in SEEDS)


def best_rate_fits(parts):
    return max(sum(sweep[(parts, lr, s)].kind == m.FITTED for s in SEEDS) for lr in RATES)


RUNS = len(RATES) * len(SEEDS)
fits = {parts: fitted_runs(parts) for parts in m.ALL_PARTS}
best_fits = {parts: best_rate_fits(parts) for parts in m.ALL_PARTS}


def sentence(learns, how):
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


table(["model", "runs that fit the training set", f"of {RUNS}", "seeds that fit, at the best rate", f"of {len(SEEDS)}"],
      [[p.name, fits[p], RUNS, best_fits[p], len(SEEDS)] for p in m.ALL_PARTS])
say(sentence({p: fits[p] >= 1 for p in fits}, "in at least one run"))
say(sentence({p: 2 * best_fits[p] >= len(SEEDS) for p in fits}, "reliably (half the seeds at the best rate)"))

# %% [markdown]
# ## The argument, checked: model A's pooled vectors
#
# The chapter's explanation of A's failure is an argument: the pooled vector h
# is a weighted average of value vectors; if attention prefers the tokens 1
# and 2 over 0, then "1 only" lands near one point, "2 only" near another,
# "both" between them, so along that line the labels run 1, 0, 1 and no linear
# read-out can separate them. Here it is tested on the vectors A actually
# learned (seed 0, the smallest rate): h is the attention output at the last position,
# the vector A's linear read-out sees. The drawing projects all of them onto
# their two principal axes (numpy's SVD); the marked line joins the centroid of
# the "1 only" sequences to that of the "2 only" ones.

# %%
GROUPS = {"neither": (False, False), "1 only": (True, False), "2 only": (False, True), "both": (True, True)}
group = np.array([next(g for g, key in GROUPS.items() if key == (1 in s, 2 in s)) for s in sequences])
p_a = runs[(m.A, LR, 0)].params
h = m.forward(p_a, sequences, m.A)[1][:, -1]  # (81, D): what A's read-out reads
centred = h - h.mean(0)
_, sv, axes = np.linalg.svd(centred, full_matrices=False)
xy = centred @ axes[:2].T
c1, c2 = (h[group == g].mean(0) for g in ("1 only", "2 only"))
fig, ax = plt.subplots(figsize=(7, 5))
for g, marker in zip(GROUPS, "osD^"):
    for lab, colour in ((0, "tab:blue"), (1, "tab:orange")):
        pick = (group == g) & (labels == lab)
        if pick.any():
            ax.scatter(*xy[pick].T, marker=marker, color=colour, label=f"{g} (label {lab})", alpha=0.8)
ends = (np.array([c1, c2]) - h.mean(0)) @ axes[:2].T
ax.plot(*ends.T, "k--", label="the 1–0–1 line: centroid of 1 only to centroid of 2 only")
ax.set_xlabel(f"first principal axis ({sv[0] ** 2 / (sv ** 2).sum():.0%} of the variance)")
ax.set_ylabel(f"second principal axis ({sv[1] ** 2 / (sv ** 2).sum():.0%} of the variance)")
ax.set_title("Model A's pooled vectors h, all 81 sequences")
ax.legend(fontsize=7)
show(fig)

# %% [markdown]
# Where each group sits along that line, in all D dimensions: t = 0 at the
# "1 only" centroid, t = 1 at the "2 only" one; the distance off the line is
# given as a fraction of the line's length.

# %%
direction = c2 - c1
t = (h - c1) @ direction / (direction @ direction)
off = np.linalg.norm(h - c1 - np.outer(t, direction), axis=1) / np.linalg.norm(direction)
table(["group", "label", "sequences", "t: min", "t: median", "t: max", "off the line: median"],
      [[g, int(labels[group == g][0]), int((group == g).sum()), f"{t[group == g].min():.2f}",
        f"{np.median(t[group == g]):.2f}", f"{t[group == g].max():.2f}", f"{np.median(off[group == g]):.2f}"]
       for g in GROUPS])
between = (t[group == "both"] > 0) & (t[group == "both"] < 1)
say(f"The argument's picture puts every \"both\" sequence between the two ends (0 < t < 1): **{between.sum()} of "
    f"{between.size}** lie there, and \"neither\" is at t = {t[group == 'neither'][0]:.2f}.")

# %% [markdown]
# A stronger failure than a bent line is possible: two sequences with
# different labels whose pooled vectors (nearly) coincide cannot be told
# apart by *any* read-out of h, linear or not. The closest such pairs,
# distances relative to the spread of all the vectors (the root-mean-square
# distance from their mean):

# %%
spread = np.sqrt((centred ** 2).sum(1).mean())
gaps = np.linalg.norm(h[:, None] - h[None], axis=-1) / spread
pairs = sorted((gaps[i, j], i, j) for i in range(ALL) for j in range(i) if labels[i] != labels[j])
NEAR = 0.01  # "nearly coincide": closer than this fraction of the spread
close = [(d, i, j) for d, i, j in pairs if d < NEAR]
table(["sequence", "label", "sequence", "label", "distance / spread"],
      [[seq_text(i), labels[i], seq_text(j), labels[j], f"{d:.1e}"] for d, i, j in pairs[:8]])
say(f"**{len(close)}** pairs of differently labelled sequences lie within {NEAR:.0%} of the spread of each other; the "
    f"{len({k for _, i, j in close for k in (i, j)})} sequences in them a read-out of A's h could tell apart only "
    f"by resolving differences under {NEAR:.0%} of the vectors' spread.")

# %% [markdown]
# The test of the claim: the best linear read-out of these fixed vectors,
# fitted over **all** 81 (training and held out together), against what A's
# own read-out gets. Least squares fits ±1 targets; the logistic regression is
# unpenalised gradient descent, which heads for a separating hyperplane
# whenever one exists. A's own read-out is itself a linear read-out of h, so the
# best of the three is at least A's count; a fitted read-out on its own need not
# be (it optimises a loss, not the count).

# %%
readouts = {"A's own read-out (trained on the 54)": m.predictions(p_a, sequences, m.A),
            "least squares on all 81": m.least_squares_readout(h, labels),
            "logistic regression on all 81": None}
readouts["logistic regression on all 81"], log_loss = m.logistic_readout(h, labels, 2000 if QUICK else 20000)
counts = {name: int((pred == labels).sum()) for name, pred in readouts.items()}
table(["linear read-out of A's h", "right of 81", "misses"],
      [[name, counts[name], ", ".join(seq_text(i) for i in np.flatnonzero(pred != labels)) or "none"]
       for name, pred in readouts.items()])
best, own = max(counts.values()), counts["A's own read-out (trained on the 54)"]
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
# The chapter's one miss was a sequence its random split had left out of
# training. Here model B (seed 0, the smallest rate) is trained again on further random
# splits of the same size, and every miss is marked by whether training ever
# showed it.

# %%
def split_row(split_seed):
    tr, _ = m.split(ALL, N_TRAIN, split_seed)
    held = ~np.isin(np.arange(ALL), tr)
    run = runs[(m.B, LR, 0)] if split_seed == SPLIT_SEED else m.fit(0, LR, m.B, sequences[tr], labels[tr], STEPS)
    out = m.outcome(run, m.B, sequences, labels, tr, STEPS)
    if out.kind == m.DIVERGED:
        return [split_seed, "diverged", "—", "—"], []
    wrong = np.flatnonzero(m.predictions(run.params, sequences, m.B) != labels)
    return [split_seed, out.kind, f"{out.right} of {ALL}", misses(run.params, m.B, held)], [held[i] for i in wrong]


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

# %%
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
# bias), every pre-activation is 0; with relu'(0) = 0 no gradient ever reaches
# that layer and the FFN stays dead, while relu'(0) = 1 lets it learn.

# %%
def dead_start_row(corner):
    p = m.init(0, m.B)
    p["ff1_w"][:], p["ff1_b"][:] = 0.0, 0.0
    for _ in range(STEPS):
        _, g = m.loss_and_grads(p, X, Y, m.B, corner)
        for k in p:
            p[k] -= LR * g[k]
    return [f"relu'(0) = {corner}", f"{np.abs(p['ff1_w']).max():.2e}",
            int((m.predictions(p, sequences, m.B) == labels).sum())]


table(["convention", "largest first-layer weight after training", f"right of {ALL}"],
      [dead_start_row(c) for c in (0, 1)])

# %% [markdown]
# ## Why model B diverges, and a variant that does not
#
# Plain gradient descent on a loss with curvature λ along some direction is
# stable along it only when the rate is below 2/λ. The curvature is measured
# here as the largest-magnitude eigenvalue of the training loss's Hessian, by
# power iteration on Hessian-vector products that are central differences of
# the hand-written gradient, (∇L(θ + εv) − ∇L(θ − εv)) / 2ε; no second
# derivative is written by hand. First, at the initialisation of each seed:

# %%
VARIANTS = ((m.A, 1.0), (m.B, 1.0), (m.B, INIT_SCALE))
lam, lam_again, lam_coarse = ({(parts, scale, s): m.top_hessian_eigenvalue(m.init(s, parts, scale), X, Y, parts,
                                                                          POWER_ITERS, eps, start)
                               for parts, scale in VARIANTS for s in SEEDS}
                              for eps, start in ((HVP_EPS, 0), (HVP_EPS, 1), (COARSE_EPS, 0)))
lam.update({(parts, s): lam[(parts, 1.0, s)] for parts in (m.A, m.B) for s in SEEDS})
table(["seed", "λ, model A", "2/λ, model A", "λ, model B", "2/λ, model B", "B's runs that diverge (rate)",
       f"λ, B with initial weights × {INIT_SCALE:g}"],
      [[s, f"{lam[(m.A, s)]:.1f}", f"{2 / lam[(m.A, s)]:.3f}", f"{lam[(m.B, s)]:.1f}", f"{2 / lam[(m.B, s)]:.3f}",
        ", ".join(f"{lr:g}" for lr in RATES if sweep[(m.B, lr, s)].kind == m.DIVERGED) or "none",
        f"{lam[(m.B, INIT_SCALE, s)]:.1f}"] for s in SEEDS])
agree = {v: max(abs(lam[(*v, s)] - lam_again[(*v, s)]) / abs(lam[(*v, s)]) for s in SEEDS) for v in VARIANTS}
coarse = {v: max(abs(lam[(*v, s)] - lam_coarse[(*v, s)]) / abs(lam[(*v, s)]) for s in SEEDS) for v in VARIANTS}
limit_b = max(2 / lam[(m.B, s)] for s in SEEDS)
calm_rates = [lr for lr in RATES if lr > limit_b and all(sweep[(m.B, lr, s)].kind != m.DIVERGED for s in SEEDS)]
small = [abs(lam[(m.B, INIT_SCALE, s)]) for s in SEEDS]
say(f"A second power iteration from another random start agrees to a relative "
    f"{agree[(m.A, 1.0)]:.0e} for A and {agree[(m.B, 1.0)]:.0e} for B, and to {agree[(m.B, INIT_SCALE)]:.0e} for B "
    f"with the smaller start. With the coarser step ε = {COARSE_EPS:g} the values move by up to a relative "
    f"{coarse[(m.A, 1.0)]:.0e} for A (which has no ReLU) and {coarse[(m.B, 1.0)]:.0e} for B: a ReLU corner inside "
    f"the step reads as curvature, which is why ε = {HVP_EPS:g}. Model B starts {min(lam[(m.B, s)] / lam[(m.A, s)] for s in SEEDS):.1f} to "
    f"{max(lam[(m.B, s)] / lam[(m.A, s)] for s in SEEDS):.1f} times as sharp as A from the same seed, and its "
    f"stability limit at the start is at most {limit_b:.3f}, below every rate of the sweep. "
    + (f"Yet no run at {', '.join(f'{lr:g}' for lr in calm_rates)} diverges: the limit at the start is not the "
       "whole story (gradient descent above it first makes the loss rise, and what happens next decides the run). "
       if calm_rates else "")
    + ("The smaller start does not lower the curvature" if min(small) > min(lam[(m.B, s)] for s in SEEDS) else
       "With the smaller start") + f": |λ| is {min(small):.1f} to {max(small):.1f} at the start (B at full scale: "
    f"{min(lam[(m.B, s)] for s in SEEDS):.1f} to {max(lam[(m.B, s)] for s in SEEDS):.1f}).")

# %% [markdown]
# What happens next, in a run of B at `FAST_RATE` (seed 0): the gradient's norm,
# step by step until it overflows. If the run merely oscillated out along one
# sharp direction, the norm would grow by a constant factor per step. B's
# output is a product of several weight matrices (the value and output
# projections, the two FFN layers and the read-out), so once they are large a
# step grows each by roughly the product of the others: then the factor itself
# grows, and the logarithm of the norm grows by a factor. The table, and the
# sentence computed from it, say which happened.

# %%
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

# %%
def late_divergence(seed, at):
    """Trace the sharpness along B's run from `seed` at LATE_RATE, which diverged at step `at`."""
    every = max(1, at // 40)
    trace = m.sharpness_along(seed, LATE_RATE, m.B, X, Y, [*range(0, at - 10, every), *range(at - 10, at)],
                              POWER_ITERS)
    steps_, losses_, lams = map(np.array, zip(*trace))
    calm = losses_ <= losses_[0]  # the points before the loss rose above its start
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(7, 6), sharex=True)
    top.semilogy(steps_[calm], losses_[calm], "o-")
    top.set_ylabel("training loss (nats, log)")
    top.set_title(f"Model B, seed {seed}, rate {LATE_RATE:g}, until its loss rose above its start")
    bottom.plot(steps_[calm], np.abs(lams[calm]), "o-", label="|top Hessian eigenvalue|")
    bottom.axhline(2 / LATE_RATE, color="k", ls="--", label="2 / rate: the stability limit")
    bottom.set_xlabel("gradient-descent step")
    bottom.set_ylabel("|λ|, top Hessian eigenvalue (units of 1/rate)")
    bottom.legend()
    show(fig)
    first_rise = steps_[~calm].min() if (~calm).any() else None
    say(f"Until step {steps_[calm].max()} the loss falls or holds, and |λ| has median "
        f"**{np.median(np.abs(lams[calm])):.2f}** against the limit 2/{LATE_RATE:g} = {2 / LATE_RATE:g}: the run "
        "sits at the edge of stability, as gradient descent above its limit tends to. "
        + (f"From step {first_rise} the loss is above its start{rising_text(lams[~calm])}; at step {at} the loss "
           "is no longer finite." if first_rise is not None else f"The loss stops being finite at step {at}."))


def rising_text(lams):
    """What the sharpness was once the loss rose: its range where it could be measured."""
    finite = np.abs(lams[np.isfinite(lams)])
    if finite.size == 0:
        return ", and |λ| cannot be measured there (the gradient itself overflows)"
    missed = lams.size - finite.size
    unmeasured = f" ({missed} point{'s' * (missed > 1)} where the gradient overflows)" if missed else ""
    return f" and |λ| is {finite.min():.3g} to {finite.max():.3g}{unmeasured}"


late = [s for s in SEEDS if sweep[(m.B, LATE_RATE, s)].kind == m.DIVERGED
        and 100 < sweep[(m.B, LATE_RATE, s)].steps < STEPS]
if late:
    late_divergence(late[0], sweep[(m.B, LATE_RATE, late[0])].steps)
else:
    say(f"No run of B at {LATE_RATE:g} diverges between step 100 and the last in this sweep.")

# %% [markdown]
# Two variants, each over the same seeds and rates as the original, which
# stays in the table. The first starts smaller: every initial weight matrix
# times `INIT_SCALE` (its starting curvature is the last column of the table
# of λ above), with plain gradient descent as before. The second keeps the
# initialisation and clips the gradients to a global norm of `CLIP` with the
# library's `transformer.optim.clip_grads` before each step: a clipped step is
# at most `rate × CLIP` long, so the parameters can no longer multiply their
# way to an overflow in a few steps.

# %%
def variant(**how):
    return {(lr, s): m.outcome(m.fit(s, lr, m.B, X, Y, STEPS, **how), m.B, sequences, labels, train_idx, STEPS)
            for lr in RATES for s in SEEDS}


clipped, smaller = variant(clip=CLIP), variant(scale=INIT_SCALE)
both = {**{("B, plain gradient descent", lr, s): sweep[(m.B, lr, s)] for lr in RATES for s in SEEDS},
        **{(f"B, initial weights × {INIT_SCALE:g}", lr, s): o for (lr, s), o in smaller.items()},
        **{(f"B, gradients clipped at {CLIP:g}", lr, s): o for (lr, s), o in clipped.items()}}
table(["model B", *[f"rate {lr:g}" for lr in RATES], "all rates"], sweep_rows(both, str))

# %% [markdown]
# ## What the runs show, and what they do not
#
# The sentences below are written from the counts above.

# %%
def count(results, kind):
    return sum(o.kind == kind for o in results)


plain_b, clip_b = [sweep[(m.B, lr, s)] for lr in RATES for s in SEEDS], list(clipped.values())
a_right = [o.right for lr in RATES for s in SEEDS if (o := sweep[(m.A, lr, s)]).right is not None]
say(f"Model A fits the training set in {fits[m.A]} of {RUNS} runs; those that do not diverge get "
    f"{min(a_right)} to {max(a_right)} of the {ALL} sequences right, against {baseline} for always answering the "
    f"commoner label. Model B fits it in {fits[m.B]} of {RUNS}. Plain gradient descent diverges in "
    f"{count(plain_b, m.DIVERGED)} of B's {RUNS} runs; clipped at {CLIP:g}, in {count(clip_b, m.DIVERGED)}, and "
    f"{count(clip_b, m.FITTED)} of {RUNS} fit the training set.")
say(m.reliability_text(clipped, f"clipped at {CLIP:g}", SEEDS, RATES))
say(m.reliability_text(smaller, f"started at {INIT_SCALE:g} times the weights", SEEDS, RATES))
say("What the experiment cannot say: it is one small task with one width, one depth and one number of steps, "
    "trained by full-batch gradient descent; a model that fails here may represent the function and not be "
    "found by this optimiser at these settings. \"Necessary\" and \"sufficient\" above are statements about "
    "these runs, not theorems about the architectures.")
