# %% [markdown]
# # Training on Tiny Shakespeare: from random characters to the layout of a play
#
# The model this site explains, trained from scratch on the Tiny Shakespeare corpus
# (plays, one character per token) while this page was built, at the
# project's config A. Everything runs in NumPy on the build machine's CPU.

# %% tags=["hide-input"]
import contextlib
import io
import json
import re
from pathlib import Path

import numpy as np

from notebooks._figures import QUICK, plt, say, show, table
from transformer.checkpoint import load_checkpoint
from transformer.config import PRESETS
from transformer.data import TRAIN_FRACTION, load_corpus, sample_batch, train_val_split
from transformer.generate import generate
from transformer.memory import keep_freed_memory
from transformer.model import forward, init_params, param_count
from transformer.run_state import new_run
from transformer.train import train
from transformer.train_config import TrainConfig

keep_freed_memory()  # as the command line does: faster steps, the same numbers (transformer/memory.py)

CORPUS = Path("data/tinyshakespeare/input.txt")
RUN = Path("build/notebook-data") / ("quick" if QUICK else "full") / "shakespeare"  # later pages read it
STEPS = 60 if QUICK else 3000
PROMPT, TEMPERATURE, SAMPLE_SEED, SAMPLE_CHARS = "ROMEO:\n", 0.8, 1, 300

# %% [markdown]
# ## The run
#
# AdamW with a warm-up and a cosine decay, batches of random windows. The
# validation loss is the mean over *every* position of the held-out last part
# of the corpus, not a sample.

# %% tags=["hide-input"]
cfg = PRESETS["A"]
tc = TrainConfig(steps=STEPS, batch_size=32, lr=3e-3, min_lr=3e-4, warmup=200 if not QUICK else 10,
                 eval_every=250 if not QUICK else 20, ckpt_every=STEPS, seed=0, dtype="float32")
table(["setting", "value"], [
    ["model (config A)", f"context {cfg.context_len} characters, width {cfg.emb_dim}, {cfg.num_heads} heads, "
                         f"{cfg.num_layers} blocks, feed-forward width {cfg.ff_dim}"],
    ["steps, batch", f"{tc.steps} steps" + (" (quick mode)" if QUICK else "") + f", {tc.batch_size} windows each"],
    ["learning rate", f"warm-up over {tc.warmup} steps to {tc.lr:g}, cosine down to {tc.min_lr:g}"],
    ["arithmetic, seed", f"{tc.dtype}, {tc.seed}"],
    ["validation", f"every {tc.eval_every} steps, over the whole validation split"],
])
with contextlib.redirect_stdout(io.StringIO()):
    summary = train(CORPUS, RUN, cfg, tc, overwrite=True, progress=False)
records = [json.loads(line) for line in (RUN / "metrics.jsonl").read_text().splitlines()]
steps = [r for r in records if "loss" in r]
evals = [r for r in records if "val_loss" in r]
ckpt = load_checkpoint(RUN / "checkpoint.npz")
say(f"{summary['step']} steps of a {param_count(ckpt.cfg):,}-parameter model (\\(n_V\\) = {ckpt.cfg.vocab_size} "
    f"characters) "
    f"took {steps[-1]['time_s']:.0f} s, at a median {np.median([r['tokens_per_s'] for r in steps]):,.0f} "
    f"training tokens per second. Final validation loss over the whole validation split: "
    f"**{evals[-1]['val_loss']:.4f}** (nats per character).")


# %% [markdown]
# ## The first step's loss
#
# A uniform guess over the vocabulary scores \(\log n_V\). The first step's
# loss is recomputed below from what `train` starts with (the same parameters
# and the same first batch) and split exactly into \(\log n_V\) + spread −
# lead. With \(z\) a row of logits and \(\bar{z}\) its mean, the spread is the
# mean over positions of
# \(\log\big(\tfrac{1}{n_V}\sum_j e^{z_j - \bar{z}}\big)\), never negative
# and zero only when a row's logits are all equal; the lead, the mean of
# \(z_y - \bar{z}\), is how far the target's logit stands above its row's mean.

# %% tags=["hide-input"]
def first_loss_parts():
    text = load_corpus(CORPUS)
    run = new_run(text, cfg, tc)
    train_ids, _ = train_val_split(run.tokenizer.encode(text), cfg.context_len)
    x, y = sample_batch(train_ids, tc.batch_size, cfg.context_len, run.rng)
    z = forward(run.params, x, run.model_cfg)[0].reshape(-1, run.model_cfg.vocab_size).astype(np.float64)
    centred = z - z.mean(axis=-1, keepdims=True)
    spread = np.log(np.exp(centred).mean(axis=-1)).mean()
    lead = centred[np.arange(len(z)), y.reshape(-1)].mean()
    return np.log(run.model_cfg.vocab_size) + spread - lead, spread, lead, np.sqrt(centred.var(axis=-1).mean())


recomputed, spread, lead, sigma = first_loss_parts()
log_v = np.log(ckpt.cfg.vocab_size)
say(f"The first step's training loss, {steps[0]['loss']:.4f}, is "
    f"{'above' if steps[0]['loss'] > log_v else 'below'} \\(\\log n_V\\) = {log_v:.4f} "
    f"(\\(n_V\\) = {ckpt.cfg.vocab_size}). "
    f"Recomputed: {recomputed:.4f} (the run computes in {tc.dtype}, this in float64 from its logits). The spread "
    f"is {spread:.4f} and the lead {lead:.4f}, so the loss is {spread - lead:+.4f} from \\(\\log n_V\\): the untrained "
    f"logits vary with a standard deviation of {sigma:.3f} within a row (the spread is close to half their "
    f"variance, {sigma ** 2 / 2:.4f}), and nothing has yet trained them to put the target above the rest.")

# %% tags=["hide-input"]
def running_mean(values, width=50):
    width = min(width, len(values))
    return np.convolve(values, np.ones(width) / width, mode="valid"), width


loss = np.array([r["loss"] for r in steps])
smooth, width = running_mean(loss)
fig, (by_step, by_time) = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
by_step.plot([r["step"] for r in steps], loss, color="lightgrey", label="training loss, each step")
by_step.plot([r["step"] for r in steps][width - 1:], smooth, label=f"training loss, mean of {width} steps")
by_step.plot([r["step"] for r in evals], [r["val_loss"] for r in evals], "o-", label="validation loss (whole split)")
by_step.set_xlabel("optimizer step")
by_step.set_ylabel("cross-entropy (nats per character)")
by_step.legend()
step_time = {r["step"]: r["time_s"] for r in steps}
by_time.plot([r["time_s"] for r in steps][width - 1:], smooth, label=f"training loss, mean of {width} steps")
by_time.plot([step_time.get(r["step"], r["time_s"]) for r in evals], [r["val_loss"] for r in evals], "o-",
             label="validation loss (whole split)")
by_time.set_xlabel("wall time on the build machine (s)")
by_time.legend()
fig.suptitle("Config A on Tiny Shakespeare")
show(fig)

# %% tags=["hide-input"]
table(["step", "wall time (s)", "validation loss"],
      [[r["step"], f"{step_time.get(r['step'], r['time_s']):.0f}", f"{r['val_loss']:.4f}"] for r in evals])

# %% [markdown]
# ## Samples before and after
#
# The same prompt, temperature and sampler seed, first from the parameters as
# initialised (before any step), then from the trained ones.

# %% tags=["hide-input"]
SPEAKER_LINE = re.compile(r"^[A-Z][A-Z ]*[A-Z]:$", flags=re.M)  # how the corpus opens a speech: "KING HENRY VI:"
tok = ckpt.tokenizer
untrained = init_params(ckpt.cfg, seed=tc.seed, dtype=np.float32)
say(f"Prompt {PROMPT!r}, {SAMPLE_CHARS} characters at temperature {TEMPERATURE:g}, sampler seed {SAMPLE_SEED}; "
    f"the untrained parameters are `init_params` with seed {tc.seed}.")
samples = {label: tok.decode(generate(params, ckpt.cfg, tok.encode(PROMPT), SAMPLE_CHARS, temperature=TEMPERATURE,
                                      seed=SAMPLE_SEED))
           for label, params in [("before training", untrained), ("after training", ckpt.params)]}
for label, sample in samples.items():
    lines = (PROMPT + sample).split("\n")
    wrapped = "\n".join(line[i:i + 80] for line in lines for i in range(0, max(len(line), 1), 80))
    print(f"--- {label} (lines longer than 80 characters wrapped) ---\n{wrapped}\n")
speakers = {label: len(SPEAKER_LINE.findall(sample)) for label, sample in samples.items()}
say(f"Lines that open a speech as the corpus does (a name in capitals and a colon), after the prompt: "
    f"**{speakers['before training']}** before training, **{speakers['after training']}** after. "
    + ("The trained model lays its text out as a play, which the untrained one does not."
       if speakers["after training"] > 0 and speakers["before training"] == 0 else
       "**This run does not bear out the title**: the trained sample opens no more speeches than the untrained one."))

# %% [markdown]
# ## Against a figure a reader may know
#
# Character-level models of this corpus are a common first exercise. The
# outside figure below is quoted from its source, not rerun here; model sizes,
# budgets, machines and the way the loss is estimated differ, so read it as a
# landmark, not a race.

# %% tags=["hide-input"]
NANOGPT = "https://github.com/karpathy/nanoGPT#quick-start"
table(["model", "loss", "source"], [
    [f"this page: config A, NumPy, {summary['step']} steps in {steps[-1]['time_s']:.0f} s",
     f"{evals[-1]['val_loss']:.2f} (validation, whole split)", "this build"],
    ["nanoGPT's character-level Shakespeare model in its small CPU setting (4 layers, 4 heads, width 128, context "
     "64, batch 12, 2000 iterations, \"about ~3 minutes\")", "1.88, quoted (the README does not say whether "
     "training or validation loss; its estimate uses 20 batches)", f"[nanoGPT README, quick start]({NANOGPT}); "
     "quoted, not rerun"],
    [r"a uniform guess over the vocabulary, \(\log n_V\)", f"{np.log(ckpt.cfg.vocab_size):.2f}", "computed"],
])
corpus_chars = len(load_corpus(CORPUS))
seen = summary["step"] * tc.batch_size * cfg.context_len
say(f"The corpus has {corpus_chars:,} characters; the run saw {seen:,} training positions, about "
    f"{seen / (TRAIN_FRACTION * corpus_chars):.1f} passes over the training split.")
