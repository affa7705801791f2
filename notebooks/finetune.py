# %% [markdown]
# # Fine-tuning on one speaker: LoRA adapts to the speaker and forgets less than full fine-tuning
#
# The model trained on the [Tiny Shakespeare page](shakespeare.md) writes like the corpus as a whole. This
# page trains it further on the lines of one character, in four ways, for the same number of steps on the
# same batches: every parameter (full fine-tuning); [LoRA](../finetuning/lora.md) adapters beside the frozen
# model at two ranks; and [QLoRA](../finetuning/qlora.md), the larger rank over a base whose linear weights
# are stored in [NF4](../finetuning/nf4.md). Each is judged on speeches of
# that character it never trained on, and on the other characters' held-out lines, to see whether it
# forgets what the base knew. The base model itself, not fine-tuned, is the reference line.

# %% tags=["hide-input"]
# depends-on: shakespeare
import inspect
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from notebooks._figures import QUICK, plt, say, show, table
from transformer.checkpoint import load_checkpoint
from transformer.data import TRAIN_FRACTION, load_corpus, sample_batch, speeches
from transformer.finetune import dense_base, quantize_base, weight_bytes
from transformer.finetune_run import FINETUNE_DEFAULTS, FineTuneRun, new_finetune_run, new_full_run
from transformer.generate import generate
from transformer.lora import LoRAConfig, merge
from transformer.memory import keep_freed_memory
from transformer.step import evaluate, train_step
from transformer.train_config import TrainConfig

keep_freed_memory()  # as the command line does: faster steps, the same numbers (transformer/memory.py)

CORPUS = Path("data/tinyshakespeare/input.txt")
BASE = Path("build/notebook-data") / ("quick" if QUICK else "full") / "shakespeare" / "checkpoint.npz"
STEPS = 6 if QUICK else 200
EVAL_EVERY = 2 if QUICK else 20  # the speaker's held-out speeches: a few thousand characters, quick to score
GENERAL_EVERY = 6 if QUICK else 100  # the other held-out text: about 90,000 characters, slower
HOLD_OUT_EVERY = 5  # of the speaker's speeches, the 5th, 10th, 15th, ... are held out
TARGETS = ("q", "k", "v", "o", "ff1", "ff2")  # every linear layer of every block
TIMING_ROUNDS = 3 if QUICK else 30  # steps of each method, taken in turn, for the time per step
PROMPT_SEED, SAMPLE_CHARS, TEMPERATURE = 1, 240, 0.8

# %% [markdown]
# ## The speaker and the split
#
# The base model trained on the first part of the corpus only, its training split. A speaker whose lines
# lie in the rest can be tested on speeches the base has never seen, so the speaker is chosen there: the one
# with the most characters of speech in that part. Only their speeches in that part are used. Evenly spaced
# speeches among them are held out, whole, and the rest are the training text; the other characters' speeches
# in the same part are the general held-out text.

# %% tags=["hide-input"]
text = load_corpus(CORPUS)
cut = int(TRAIN_FRACTION * len(text))  # one character is one token: the base trained on text[:cut]
unseen = [s for s in speeches(text) if s.start >= cut]
spoken = {}
for s in unseen:
    spoken[s.speaker] = spoken.get(s.speaker, 0) + len(s.text)
SPEAKER = max(spoken, key=spoken.get)
theirs = [s for s in unseen if s.speaker == SPEAKER]
held_speeches = theirs[HOLD_OUT_EVERY - 1::HOLD_OUT_EVERY]
train_speeches = [s for i, s in enumerate(theirs) if i % HOLD_OUT_EVERY != HOLD_OUT_EVERY - 1]
other_speeches = [s for s in unseen if s.speaker != SPEAKER]
seen_before = sum(s.speaker == SPEAKER and s.start < cut for s in speeches(text))


def joined(group):
    """Speeches as the corpus lays them out: an empty line between two."""
    return "\n\n".join(s.text for s in group) + "\n"


ckpt = load_checkpoint(BASE)
cfg, tok = ckpt.cfg, ckpt.tokenizer
SEQ_LEN = cfg.context_len
train_ids, held_ids, general_ids = (tok.encode(joined(g)) for g in (train_speeches, held_speeches, other_speeches))
runner_up = sorted(spoken, key=spoken.get)[-2]
say(f"The base trained on the first {TRAIN_FRACTION:.0%} of the corpus. The speaker: **{SPEAKER}**, with "
    f"{spoken[SPEAKER]:,} characters in {len(theirs)} speeches after the base's training text (the next, "
    f"{runner_up}, has {spoken[runner_up]:,}). Their {seen_before} speeches earlier in the corpus, which the base "
    "trained on, are not used.")
table(["text", "speeches", "characters", "what it is for"], [
    [f"{SPEAKER}, training", len(train_speeches), f"{len(train_ids):,}", "every fine-tuning batch is drawn from it"],
    [f"{SPEAKER}, held out", len(held_speeches), f"{len(held_ids):,}",
     f"every {HOLD_OUT_EVERY}th of their speeches: the held-out loss"],
    ["everyone else, held out", len(other_speeches), f"{len(general_ids):,}",
     f"the other speakers' speeches in the same last {1 - TRAIN_FRACTION:.0%}: does fine-tuning forget?"],
])

# %% [markdown]
# ## The four methods
#
# All four start from the same checkpoint, take the same number of steps at the same learning-rate schedule
# (the command line's fine-tuning defaults), and draw the same batches, since each run's sampler starts from
# the same seed. The adapters sit on every linear layer of every block, not only the query and value
# projections: in a model this small the attention projections are a small part of what could change, and
# the [QLoRA paper](https://arxiv.org/abs/2305.14314) (Dettmers et al., 2023) reports that adapters on every
# linear layer of a block were needed to match full fine-tuning in its experiments (quoted, not tested here).
# QLoRA uses the larger rank, so that it differs from "LoRA r=8" only in how the base is stored.

# %%
METHODS = {  # name: (LoRA settings, or None to train every parameter; how the frozen base is stored)
    "full fine-tuning": (None, "none"),
    "LoRA r=2": (LoRAConfig(rank=2, alpha=16, targets=TARGETS), "none"),
    "LoRA r=8": (LoRAConfig(rank=8, alpha=16, targets=TARGETS), "none"),
    "QLoRA r=8": (LoRAConfig(rank=8, alpha=16, targets=TARGETS), "nf4"),
}

# %% tags=["hide-input"]
tc = TrainConfig(steps=STEPS, batch_size=32, lr=FINETUNE_DEFAULTS["lr"], min_lr=FINETUNE_DEFAULTS["min_lr"],
                 warmup=2 if QUICK else FINETUNE_DEFAULTS["warmup"], eval_every=EVAL_EVERY, ckpt_every=STEPS,
                 seed=0, dtype="float32")
NF4_BLOCK = inspect.signature(quantize_base).parameters["block_size"].default  # what quantize="nf4" stores with
table(["method", "what trains", "the frozen base"], [
    [name, "every parameter" if lora is None else
     rf"\(W_A\) and \(W_B\) of rank \(n_r\) = {lora.rank} on {', '.join(f'`{t}`' for t in lora.targets)}; "
     rf"scale \(s_{{\mathrm{{LoRA}}}} = \alpha_{{\mathrm{{LoRA}}}}/n_r\) = {lora.alpha:g} / {lora.rank}",
     "none" if lora is None else
     (f"linear weights in NF4 (blocks of {NF4_BLOCK}, scales double-quantized), the rest float32"
      if quantize == "nf4" else "float32")]
    for name, (lora, quantize) in METHODS.items()])
say(f"{tc.steps} steps of {tc.batch_size} windows of {SEQ_LEN} characters, AdamW with a warm-up of {tc.warmup} "
    f"steps to {tc.lr:g} and a cosine decay to {tc.min_lr:g}, weight decay {tc.weight_decay:g}, gradients "
    f"clipped at a global norm of {tc.grad_clip:g}, {tc.dtype}, seed {tc.seed}. The held-out loss of the speaker "
    f"is measured every {EVAL_EVERY} steps, the general one every {GENERAL_EVERY}, each over every character of "
    f"its text.")

# %% [markdown]
# ## The runs
#
# Each loss is scored on the plain model a run amounts to: LoRA's adapters merged into their frozen base,
# which computes what the adapted model computes with one matrix per layer instead of three, and so scores
# the long held-out text faster. The cell after the curves checks that the two agree.

# %% tags=["hide-input"]
def nbytes(arrays):
    return sum(a.nbytes for a in arrays.values())


def plain_params(run):
    """The parameters of a plain model computing what the run's model does: LoRA's adapters merged into
    their base (QLoRA's into the NF4-decoded one), as `sample --adapter` does; full fine-tuning's own."""
    if isinstance(run, FineTuneRun):
        return merge(dense_base(run.base), run.params, run.lora)
    return run.params


@dataclass
class Outcome:
    """One method's run: its curves (step, loss) and the size of what it holds."""
    run: object
    held: list = field(default_factory=list)  # the speaker's held-out speeches
    general: list = field(default_factory=list)  # everyone else's held-out speeches
    frozen_bytes: int = 0  # the base, NF4 weights at their packed size; nothing for full fine-tuning
    trained_bytes: int = 0
    grad_bytes: int = 0
    adam_bytes: int = 0

    def score(self):
        params = plain_params(self.run)
        self.held.append((self.run.step, evaluate(params, cfg, held_ids, SEQ_LEN)))
        if self.run.step % GENERAL_EVERY == 0 or self.run.step == STEPS:
            self.general.append((self.run.step, evaluate(params, cfg, general_ids, SEQ_LEN)))


def new_run(lora, quantize):
    return new_full_run(BASE, tc) if lora is None else new_finetune_run(BASE, lora, tc, quantize)


def fine_tune(lora, quantize):
    run = new_run(lora, quantize)
    out = Outcome(run, trained_bytes=nbytes(run.params), adam_bytes=nbytes(run.opt_state["m"]) +
                  nbytes(run.opt_state["v"]), frozen_bytes=0 if lora is None else weight_bytes(run.base))
    # The gradients of one batch, drawn by a sampler of its own so that the run's batches stay the same.
    x, y = sample_batch(train_ids, tc.batch_size, SEQ_LEN, np.random.default_rng(1))
    out.grad_bytes = nbytes(run.loss_and_grads(x, y)[1])
    out.score()
    while run.step < STEPS:
        train_step(run, train_ids, SEQ_LEN)
        if run.step % EVAL_EVERY == 0 or run.step == STEPS:
            out.score()
    return out


started = time.perf_counter()
base_held = evaluate(ckpt.params, cfg, held_ids, SEQ_LEN)
base_general = evaluate(ckpt.params, cfg, general_ids, SEQ_LEN)
outcomes = {name: fine_tune(lora, quantize) for name, (lora, quantize) in METHODS.items()}
say(f"The base model, not fine-tuned: {base_held:.4f} nats per character on {SPEAKER}'s held-out speeches, "
    f"{base_general:.4f} on everyone else's. The four runs, with their evaluations, took "
    f"{time.perf_counter() - started:.0f} s on the build machine.")

# %% tags=["hide-input"]
fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
for name, o in outcomes.items():
    left.plot(*zip(*o.held), ".-", label=name)
    right.plot(*zip(*o.general), "o-", label=name)
for ax, base in ((left, base_held), (right, base_general)):
    ax.axhline(base, color="grey", linestyle="--", label="base model, not fine-tuned")
    ax.set_xlabel("fine-tuning step")
    ax.set_ylabel("held-out loss (nats per character)")
    ax.legend()
left.set_title(f"{SPEAKER}'s held-out speeches")
right.set_title("Everyone else's held-out speeches")
fig.suptitle(f"Fine-tuning the Tiny Shakespeare model on {SPEAKER}")
show(fig)

# %% tags=["hide-input"]
adapted = {name: o for name, o in outcomes.items() if isinstance(o.run, FineTuneRun)}
gaps = {name: abs(evaluate(o.run.model_params(), cfg, held_ids, SEQ_LEN) - o.held[-1][1])
        for name, o in adapted.items()}
say(f"At step {STEPS}, the held-out loss of {SPEAKER} through each run's own forward (the frozen base with its "
    f"adapters beside it, as training computes it) differs from that of its merged model by at most "
    f"{max(gaps.values()):.1e} ({', '.join(f'{n}: {g:.1e}' for n, g in gaps.items())}), float32 rounding.")

# %% tags=["hide-input"]
rows = []
for name, o in outcomes.items():
    low_step, low = min(o.held, key=lambda p: p[1])
    rows.append([name, f"{o.held[0][1]:.4f}", f"{low:.4f} (step {low_step})", f"{o.held[-1][1]:.4f}",
                 f"{o.held[-1][1] - base_held:+.4f}", f"{o.general[-1][1]:.4f}",
                 f"{o.general[-1][1] - base_general:+.4f}"])
table(["method", f"{SPEAKER}, step 0", f"{SPEAKER}, lowest", f"{SPEAKER}, step {STEPS}", "change from the base",
       f"everyone else, step {STEPS}", "change from the base"], rows)
final = {name: o.held[-1][1] for name, o in outcomes.items()}
best = min(final, key=final.get)
forgot = {name: o.general[-1][1] - base_general for name, o in outcomes.items()}
say(f"After {STEPS} steps the lowest loss on {SPEAKER}'s held-out speeches is that of **{best}**, {final[best]:.4f} "
    f"against the base's {base_held:.4f}. On everyone else's held-out lines the loss changed by "
    + ", ".join(f"{forgot[n]:+.4f} ({n})" for n in outcomes) + ". QLoRA's first point, "
    f"{outcomes['QLoRA r=8'].held[0][1]:.4f}, is {outcomes['QLoRA r=8'].held[0][1] - base_held:+.4f} from the "
    "base's: its base is the NF4-rounded one.")
above = [name for name in outcomes if final[name] > base_held]
if above:
    say("Ended above the base on the speaker's held-out speeches, after a lowest point earlier in the run: "
        + ", ".join(f"{n} (lowest {min(p[1] for p in outcomes[n].held):.4f} at step "
                    f"{min(outcomes[n].held, key=lambda p: p[1])[0]})" for n in above) + ".")
adapts = all(final[n] < base_held for n in adapted)
forgets_less = all(forgot[n] < forgot["full fine-tuning"] for n in adapted)
say(f"The title, read against the table: the adapters ({', '.join(adapted)}) end "
    + ("below" if adapts else "not all below") + f" the base on {SPEAKER}'s held-out speeches, and on everyone "
    f"else's their loss changes by {min(forgot[n] for n in adapted):+.4f} to {max(forgot[n] for n in adapted):+.4f} "
    f"against {forgot['full fine-tuning']:+.4f} for full fine-tuning. "
    + ("The title holds for this run." if adapts and forgets_less else "**This run does not bear the title out.**"))

# %% [markdown]
# ## What each method holds, and what a step costs
#
# Sizes are the `nbytes` of the arrays each run really holds: the frozen base (its NF4 weights at their
# packed size, codes and scales), the trained parameters, the gradients of one batch (from the run's own
# `loss_and_grads`) and AdamW's two moments. Activations, which every method keeps during a step, are not
# counted. The time of a step is the median wall time of `train_step` (a batch, the forward, the backward, the
# clipping and the update) over fresh runs of the four methods taking their steps in turn, so that other work
# on the build machine slows each method alike.

# %% tags=["hide-input"]
def step_times(rounds):
    """Median seconds of one `train_step` of each method, the methods taking one step each in turn."""
    runs = {name: new_run(lora, quantize) for name, (lora, quantize) in METHODS.items()}
    times = {name: [] for name in runs}
    for _ in range(rounds):
        for name, run in runs.items():
            start = time.perf_counter()
            train_step(run, train_ids, SEQ_LEN)
            times[name].append(time.perf_counter() - start)
    return {name: float(np.median(t)) for name, t in times.items()}


step_s = step_times(TIMING_ROUNDS)
table(["method", "trained parameters", "frozen base (bytes)", "trained weights (bytes)", "gradients (bytes)",
       "AdamW moments (bytes)", "total (bytes)", f"time per step (ms, median of {TIMING_ROUNDS})"],
      [[name, f"{sum(p.size for p in o.run.params.values()):,}", *(f"{n:,}" for n in (
          o.frozen_bytes, o.trained_bytes, o.grad_bytes, o.adam_bytes,
          o.frozen_bytes + o.trained_bytes + o.grad_bytes + o.adam_bytes)), f"{1000 * step_s[name]:.0f}"]
       for name, o in outcomes.items()])
full, lora8, qlora8 = outcomes["full fine-tuning"], outcomes["LoRA r=8"], outcomes["QLoRA r=8"]
share = sum(p.size for p in lora8.run.params.values()) / sum(p.size for p in full.run.params.values())
say(f"LoRA r=8 trains {share:.1%} of the parameters full fine-tuning trains; its gradients and moments take "
    f"{lora8.grad_bytes + lora8.adam_bytes:,} bytes against {full.grad_bytes + full.adam_bytes:,}. QLoRA's frozen "
    f"base takes {qlora8.frozen_bytes:,} bytes against LoRA's {lora8.frozen_bytes:,} "
    f"({qlora8.frozen_bytes / lora8.frozen_bytes:.1%}); the embeddings, biases and LayerNorms stay float32. A step "
    f"of LoRA r=8 took {step_s['LoRA r=8'] / step_s['full fine-tuning']:.2f} times as long as one of full "
    f"fine-tuning, and a step of QLoRA {step_s['QLoRA r=8'] / step_s['LoRA r=8']:.2f} times as long as one of LoRA "
    "r=8 (QLoRA decodes its NF4 weights, a block of rows at a time, in every forward and backward).")

# %% [markdown]
# ## Samples before and after
#
# The same prompt, temperature and sampler seed for every model: the base, then each fine-tuned one (LoRA's
# adapters merged into its base, QLoRA's into the NF4-decoded one, as `sample --adapter` does).

# %% tags=["hide-input"]
PROMPT = f"{SPEAKER}:\n"
say(f"Prompt {PROMPT!r}, {SAMPLE_CHARS} characters at temperature {TEMPERATURE:g}, sampler seed {PROMPT_SEED}.")
models = {"the base, not fine-tuned": ckpt.params, **{name: plain_params(o.run) for name, o in outcomes.items()}}
for label, params in models.items():
    ids = generate(params, cfg, tok.encode(PROMPT), SAMPLE_CHARS, temperature=TEMPERATURE, seed=PROMPT_SEED)
    print(f"--- {label} ---\n{PROMPT}{tok.decode(ids)}\n")

# %% [markdown]
# ## What this does not show
#
# Each method ran once, with one seed and one learning-rate schedule shared by all; a rate tuned for each
# might order them differently, and this page does not test that. The held-out speeches are a few thousand
# characters, so a small difference between two curves may not survive another seed or another split.
