# %% [markdown]
# # Attention patterns of the trained model: a first-block head reads the previous character
#
# Every head of every block of the model trained on the
# [Tiny Shakespeare page](shakespeare.md), looking at one real line of the
# corpus. Row \(t\) of a map is where position \(t\) looks: its attention
# weights \(\alpha^{(h)}_{tt'}\) over the key positions \(t' \le t\), which
# sum to 1. Everything above the diagonal is exactly zero, because a position
# cannot see the future.


# %% tags=["hide-input"]
# depends-on: shakespeare
from pathlib import Path

import numpy as np

from notebooks._figures import QUICK, plt, say, show, table
from transformer.checkpoint import load_checkpoint
from transformer.data import load_corpus, train_val_split
from transformer.model import forward

RUN = Path("build/notebook-data") / ("quick" if QUICK else "full") / "shakespeare"
HALF = 0.5  # a head "reads the previous character" when it puts more than this share of its weight there

# %% [markdown]
# The line is the first one of the validation split (text the model never
# trained on) that is between 40 characters and the context length long.

# %% tags=["hide-input"]
ckpt = load_checkpoint(RUN / "checkpoint.npz")
cfg, tok = ckpt.cfg, ckpt.tokenizer
text = load_corpus("data/tinyshakespeare/input.txt")
_, val_ids = train_val_split(tok.encode(text), cfg.context_len)
val_text = tok.decode(val_ids)
line = next(s for s in val_text.split("\n") if 40 <= len(s) <= cfg.context_len)
ids = tok.encode(line)

# %% [markdown]
# The weights come from the model's own forward pass, which records every
# block's attention weights in `trace` when it is given one:

# %%
trace = {}
forward(ckpt.params, ids, cfg, trace)
maps = np.stack([trace[f"b{layer}.attention"][0] for layer in range(cfg.num_layers)])  # (L, H, T, T)

# %% tags=["hide-input"]
above = maps[..., np.triu_indices(len(ids), 1)[0], np.triu_indices(len(ids), 1)[1]]
say(f"The line: `{line}` ({len(ids)} characters). Largest weight above the diagonal: {above.max():g}.")

# %% tags=["hide-input"]
ticks = list(range(0, len(ids), 6))
labels = [f"{t} {line[t] if line[t] != ' ' else '␣'}" for t in ticks]
panels = [(layer, head) for layer in range(cfg.num_layers) for head in range(cfg.num_heads)]
rows = (len(panels) + 1) // 2  # two maps side by side, so each is large enough to read
fig, axes = plt.subplots(rows, 2, figsize=(10, 5 * rows), constrained_layout=True, squeeze=False)
for (layer, head), ax in zip(panels, axes.flat, strict=False):
    image = ax.imshow(maps[layer, head], cmap="viridis", vmin=0, vmax=1)
    ax.set_title(f"block {layer}, head {head}", fontsize=12)
    ax.set_xticks(ticks, labels, fontsize=9, rotation=90)
    ax.set_yticks(ticks, labels, fontsize=9)
    ax.set_ylabel("query position (character)")
    ax.set_xlabel("key position (character)")
fig.colorbar(image, ax=axes, shrink=0.3, label="attention weight (0 to 1)")
fig.suptitle("Attention weights of every head, on a validation line")
show(fig, dpi=80)

# %% [markdown]
# ## What some heads do
#
# Three simple measures per head, averaged over the positions of the line
# (from position 1 on, since position 0 can only look at itself): the weight
# on the position itself, on the one just before it, and on the first
# position of the window; and how evenly the head spreads its weight, the
# entropy of a row divided by its largest possible value, \(\log(t+1)\).

# %% tags=["hide-input"]
T = len(ids)
rows, stats = [], {}
for layer in range(cfg.num_layers):
    for head in range(cfg.num_heads):
        a = maps[layer, head]
        self_w = np.mean([a[t, t] for t in range(1, T)])
        prev_w = np.mean([a[t, t - 1] for t in range(1, T)])
        first_w = np.mean([a[t, 0] for t in range(1, T)])
        entropy = np.mean([-(a[t, :t + 1] * np.log(a[t, :t + 1] + 1e-12)).sum() / np.log(t + 1) for t in range(1, T)])
        stats[(layer, head)] = (self_w, prev_w, first_w, entropy)
        rows.append([f"{layer}", f"{head}", f"{self_w:.2f}", f"{prev_w:.2f}", f"{first_w:.2f}", f"{entropy:.2f}"])
table(["block", "head", "on itself", "on the previous character", "on position 0",
       r"spread (entropy / \(\log(t+1)\): 0 one position, 1 uniform)"], rows)

# %% tags=["hide-input"]
def strongest(column):
    return max(stats, key=lambda k: stats[k][column])


readings = []
for column, what in [(1, "the character just before"), (0, "itself"), (2, "the first position of the window")]:
    layer, head = strongest(column)
    readings.append(f"- Block {layer}, head {head} puts on average **{stats[(layer, head)][column]:.0%}** of its "
                    f"weight on {what}, more than any other head.")
layer, head = max(stats, key=lambda k: stats[k][3])
readings.append(f"- Block {layer}, head {head} spreads its weight most evenly (spread {stats[(layer, head)][3]:.2f}): "
                "it averages over the whole prefix rather than pointing at one character.")
say("\n".join(readings) + "\n\nA head that looks at the character just before is the simplest way to use "
    "character pairs (in English, \"q\" is followed by \"u\"). These are averages over one line; the table is the "
    "measurement, and a head's role on other text may differ.")
readers = [(layer, head) for (layer, head), s in stats.items() if layer == 0 and s[1] > HALF]
say(f"The title, read against the table: {len(readers)} head{'s' * (len(readers) != 1)} of block 0 put more than "
    f"{HALF:.0%} of {'their' if len(readers) != 1 else 'its'} weight on the previous character"
    + (f" ({', '.join(f'head {h}' for _, h in readers)}), as the title says." if readers else
       "; **this run does not bear out the title**."))
