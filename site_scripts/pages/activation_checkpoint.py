"""Generator of the Activation checkpointing page's fragments: the symbol table, the tiny example (gradients
with and without checkpointing compared with ==, and the block forwards counted), the gradient check of
`checkpointed_block_backward`, and the measured memory and time (tools/memory_policies.py, through
site_scripts/memory.py)."""

from unittest import mock

import numpy as np

from transformer import activation_checkpoint
from transformer.activation_checkpoint import checkpointed_block_backward, checkpointed_block_forward
from transformer.block import BLOCK_KEYS, block_forward, block_params
from transformer.model import forward, init_params, loss_and_grads
from tools.memory_policies import owned_bytes

from .. import memory, sections
from ..cache_inventory import BLOCKS, inventory_md
from ..common import md_table, mode
from ..examples import (H_STEP, SEED, TINY_IDS, TINY_TARGETS, biases_moved, default_note, default_run, illustrative,
                        tiny, weighted_sum)


def counted_grads(cfg, dtype):
    """The tiny model's gradients under cfg in dtype, and how many times `block_forward` ran for them."""
    params = init_params(cfg, seed=SEED, dtype=dtype)
    ids, targets = np.array([TINY_IDS]), np.array([TINY_TARGETS])
    with mock.patch.object(activation_checkpoint, "block_forward", wraps=block_forward) as replays:
        _, grads = loss_and_grads(params, ids, targets, cfg)
    return grads, replays.call_count


def bitwise_rows():
    """Per dtype: parameters compared, how many differ in any bit, the largest difference, block forwards
    through activation_checkpoint with checkpointing."""
    cfg = tiny().cfg
    rows = []
    for dtype in (np.float64, np.float32):
        plain, _ = counted_grads(cfg, dtype)
        checked, calls = counted_grads(cfg.with_(checkpoint_blocks=True), dtype)
        differ = [k for k in plain if not np.array_equal(plain[k], checked[k])]
        gap = max(float(np.abs(plain[k].astype(np.float64) - checked[k]).max()) for k in plain)
        rows.append((np.dtype(dtype).name, len(plain), differ, gap, calls))
    return rows


def same_text(rows):
    """What the comparison found, in words: the claim of the page only if every entry of every dtype is equal."""
    if all(not differ for _, _, differ, _, _ in rows):
        return "With checkpointing every gradient entry is the same bits as without, in both dtypes."
    return "**Checkpointing changed** " + "; ".join(f"{', '.join(differ)} in {name}" for name, _, differ, _, _ in rows
                                                    if differ) + "."


def per_block_text(rows, layers):
    counts = sorted({calls / layers for *_, calls in rows})
    return " or ".join({1.0: "once", 2.0: "twice"}.get(c, f"{c:g} times") for c in counts)


def example_md():
    cfg = tiny().cfg
    rows = bitwise_rows()
    cells = [[name, n, len(differ), sections.gap_text(gap), calls, f"{calls / cfg.num_layers:g}"]
             for name, n, differ, gap, calls in rows]
    return "\n".join([
        illustrative(f"ids `{TINY_IDS}`, targets `{TINY_TARGETS}`: the loss's gradients of every parameter, once "
                     "with `checkpoint_blocks=False` and once with `True`, in each dtype."),
        md_table(["dtype", "parameters", "not bitwise equal (`np.array_equal`)", "largest difference",
                  "`block_forward` calls, checkpointed", "per block"], cells),
        f"\n{same_text(rows)} Each of the {cfg.num_layers} blocks runs `block_forward` "
        f"{per_block_text(rows, cfg.num_layers)} per step, counted by wrapping the function that "
        "`checkpointed_block_forward` and `checkpointed_block_backward` call: once in the forward, whose cache is "
        "dropped, and once in the backward's replay.\n",
    ])


def gradcheck_md():
    ex, rng = tiny(), np.random.default_rng(SEED)
    p = biases_moved(block_params(ex.params, 0), rng)
    x = rng.standard_normal((2, ex.cfg.context_len, ex.cfg.emb_dim))
    dy = rng.standard_normal(x.shape)
    dx, grads = checkpointed_block_backward(dy, checkpointed_block_forward(x, p, ex.cfg)[1])
    checks = [("dx", dx, x)] + [(f"d{k}", grads[k], p[k]) for k in BLOCK_KEYS]
    rows = sections.gradcheck_rows(weighted_sum(dy, checkpointed_block_forward, x, p, ex.cfg), checks, H_STEP)
    return (f"The [fake loss](../reference/notation.md#fake-loss) \\(f = \\sum \\operatorname{{Block}}_0(X) \\odot R\\) "
            "through `checkpointed_block_forward` and `checkpointed_block_backward`, on the tiny model's block 0 "
            f"(biases and gains moved off their initial values), with a random input of shape `{x.shape}` and a "
            f"random \\(R\\) (seed {SEED}). The backward replays the block on the kept input; the central differences "
            "move each entry and rerun the forward. The key bias's gradient is zero in exact arithmetic and passes "
            "on the absolute floor.\n\n" + sections.gradcheck_table(rows))


def symbols_md():
    ex = default_run()
    cfg, p, x = ex.cfg, block_params(ex.params, 0), ex.trace["embedding"]
    y, replay = checkpointed_block_forward(x, p, cfg)
    dx, _ = checkpointed_block_backward(np.ones_like(y), replay)
    _, cache = block_forward(x, p, cfg)
    kept = owned_bytes(replay, exclude=p.values())
    rows = [
        (r"X^{(l)}", "replay.x", replay.x.shape, f"block 0's, the one array it keeps ({kept:,} bytes)"),
        (r"X^{(l+1)}", "y", y.shape),
        (r"\operatorname{Block}_l", "checkpointed_block_forward", "function",
         f"block 0; the cache it drops holds {owned_bytes(cache, exclude=p.values()):,} bytes"),
        (r"\partial\ell/\partial X^{(l)}", "dx", dx.shape),
        (r"L", "cfg.num_layers", "int", f"{cfg.num_layers}"),
    ]
    return sections.symbols_md(rows, default_note())


def block_internals(T):
    """Bytes of one block's cache at length T in the memory tool's model (block 0; every block's is the same)."""
    cfg = memory.tool.CONFIG
    params = init_params(cfg, SEED, np.float32)
    ids, _ = memory.tool.batch(T)
    _, cache = forward(params, ids, cfg)
    return owned_bytes(cache.block_caches[0], exclude=params.values())


def measured_md():
    found, lengths = memory.measurements(), memory.lengths()
    cfg = memory.tool.CONFIG
    L = cfg.num_layers
    rows, fractions = [], []
    for T in lengths:
        plain, ckpt = found["materialized", T], found["checkpointed", T]
        internals = block_internals(T)
        cut = (plain.retained - ckpt.retained) / (L * internals)
        fractions.append(cut)
        rows.append([T, memory.mib(L * internals), memory.mib(plain.retained), memory.mib(ckpt.retained),
                     f"{cut:.3f}", memory.mib(plain.step_peak), memory.mib(ckpt.step_peak),
                     f"{ckpt.seconds / plain.seconds:.2f}"])
    banner = (f'!!! warning "Quick run"\n    This build measured {len(lengths)} lengths (SITE_QUICK=1); '
              f"`scripts/site` measures {', '.join(map(str, memory.tool.LENGTHS))}.\n\n") if mode() == "quick" else ""
    holds = all(f >= (L - 1) / L for f in fractions)
    return (banner + f"`tools/memory_policies.py`, materialized attention, on \\(B\\) = {memory.tool.BATCH} windows of a "
            f"model with \\(d\\) = {cfg.emb_dim}, \\(H\\) = {cfg.num_heads}, \\(L\\) = {L}, \\(F\\) = {cfg.ff_dim}, "
            "float32 (the [Flash attention](../model/flash-attention.md#memory-and-time) page has the other "
            "policies). *Block internals* are the bytes of the \\(L\\) block caches `block_forward` returns; "
            "*retained*, what the whole forward keeps for the backward; a *peak*, the most numpy held at once "
            "in one training step above the parameters and AdamW's moments.\n\n"
            + md_table(["\\(T\\)", "block internals (MiB)", "retained (MiB)", "retained, checkpointed (MiB)",
                        "share of the internals cut", "step peak (MiB)", "step peak, checkpointed (MiB)",
                        "time, checkpointed / not"], rows)
            + f"\nThe share cut is (retained − retained checkpointed) / block internals; \\((L-1)/L\\) = "
              f"{(L - 1) / L:.3f} for \\(L\\) = {L}, and the share is "
              + ("at least that at every length measured" if holds else "**below it** at some length")
              + f" ({min(fractions):.3f} to {max(fractions):.3f}). The time ratio is of medians of "
                f"{memory.STEPS} steps on the machine that built this page, and changes with its load; the bytes "
                "do not.\n")


def generate(context):
    inventory = inventory_md("activation_checkpoint", context["repo_url"], runs=("materialized", "checkpointed"),
                             caches=BLOCKS)
    return {"symbols": symbols_md(), "example": example_md(), "gradcheck": gradcheck_md(),
            "measured": measured_md(), "cache-inventory": inventory}
