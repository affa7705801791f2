# %% [markdown]
# # Learning-rate sweep: a short run does best at a middle rate
#
# Short runs of the Tiny Shakespeare model (config A) at several peak
# learning rates, everything else equal, each ended by the validation loss over
# the whole validation split. It shows how sensitive training is to this one
# number. Each point is one run with seed 0. A short sweep says which rate
# learns fastest at first; it does not show which is best for a long run
# such as the [full one](shakespeare.md), whose setting is given at the end.


# %% tags=["hide-input"]
# depends-on: shakespeare
import contextlib
import io
import json
import tempfile
from pathlib import Path

import numpy as np

from notebooks._figures import QUICK, plt, say, show, table
from transformer.checkpoint import load_checkpoint
from transformer.config import PRESETS
from transformer.memory import keep_freed_memory
from transformer.train import train
from transformer.train_config import TrainConfig

keep_freed_memory()  # as the command line does: faster steps, the same numbers (transformer/memory.py)

CORPUS = Path("data/tinyshakespeare/input.txt")
RATES = [3e-4, 1e-3, 3e-3, 1e-2, 3e-2]
STEPS = 15 if QUICK else 400


def sweep_config(lr):
    """The run at peak rate lr: a tenth of the steps of warm-up, then a cosine decay to a tenth of the peak."""
    return TrainConfig(steps=STEPS, batch_size=32, lr=lr, min_lr=lr / 10, warmup=max(1, STEPS // 10),
                       eval_every=STEPS, ckpt_every=STEPS, seed=0, dtype="float32")


def run_at(lr, folder):
    """Train config A at peak rate lr; its final validation loss and the training loss of every step."""
    out = Path(folder) / f"lr-{lr:g}"
    with contextlib.redirect_stdout(io.StringIO()):
        summary = train(CORPUS, out, PRESETS["A"], sweep_config(lr), progress=False)
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return summary["val_loss"], [r["loss"] for r in records if "loss" in r]


def shape_text(losses):
    """Where the lowest validation loss of the sweep lies, and whether the loss falls up to it and rises after."""
    rates = sorted(losses)
    best = min(rates, key=losses.get)
    at = rates.index(best)
    if at in (0, len(rates) - 1):
        return (f"The lowest loss is at {best:g}, an end of the sweep: the sweep does not bracket the best rate, "
                "and the title does not hold for this run.")
    falls = all(losses[a] > losses[b] for a, b in zip(rates[:at], rates[1:at + 1]))
    rises = all(losses[a] < losses[b] for a, b in zip(rates[at:], rates[at + 1:]))
    steady = {True: "from each rate to the next", False: "overall, but not from each rate to the next"}
    return (f"The lowest loss is at {best:g}, inside the sweep, as the title says. From {rates[0]:g} up to it "
            f"the loss falls {steady[falls]}, and above it the loss rises {steady[rises]}.")


# %% tags=["hide-input"]
with tempfile.TemporaryDirectory() as folder:
    results = {lr: run_at(lr, folder) for lr in RATES}
table(["peak learning rate", "validation loss after " + f"{STEPS} steps", "training loss of the last step (one batch)"],
      [[f"{lr:g}", f"{v:.4f}", f"{losses[-1]:.4f}"] for lr, (v, losses) in results.items()])
best = min(results, key=lambda lr: results[lr][0])
say(f"Best of the sweep: **{best:g}**, validation loss {results[best][0]:.4f} after {STEPS} steps "
    f"(warm-up {max(1, STEPS // 10)} steps, then a cosine decay to a tenth of the peak; batch 32; seed 0). "
    + shape_text({lr: v for lr, (v, _) in results.items()}))

# %% tags=["hide-input"]
fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
left.semilogx(RATES, [results[lr][0] for lr in RATES], "o-")
left.set_xlabel("peak learning rate (log scale)")
left.set_ylabel("validation loss (nats per character)")
left.set_title(f"Validation loss after {STEPS} steps")
for lr in RATES:
    losses = np.array(results[lr][1])
    width = min(20, len(losses))
    right.plot(np.arange(width, len(losses) + 1), np.convolve(losses, np.ones(width) / width, "valid"),
               label=f"lr {lr:g}")
right.set_xlabel("optimizer step")
right.set_ylabel(f"training loss, mean of {min(20, STEPS)} steps (nats per character)")
right.set_title("Training loss during each run")
right.legend()
fig.suptitle("Learning-rate sweep, config A on Tiny Shakespeare")
show(fig)

# %% tags=["hide-input"]
full = load_checkpoint(Path("build/notebook-data") / ("quick" if QUICK else "full") / "shakespeare" / "checkpoint.npz")
full_tc = TrainConfig.from_dict(full.extra["train"])
say(f"The full run uses a peak of {full_tc.lr:g} over {full_tc.steps} steps (warm-up {full_tc.warmup}); "
    f"the best rate of this {STEPS}-step sweep is {best:g}. Whether {best:g} would also do better over "
    f"{full_tc.steps} steps is not tested here.")
