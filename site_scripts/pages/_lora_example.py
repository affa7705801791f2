"""The LoRA page's worked numbers: the tiny example's adapted query projection (its forward at step 0, the
backward of that layer inside the whole model's backward, one AdamW step), and one step at several ranks
on the default config, which shows how the scale alpha / r sizes the update.

Values and tables only; the page's words are in docs/finetuning/lora.md."""

from dataclasses import dataclass

import numpy as np

from transformer.finetune import adapter_loss_and_grads, frozen_params
from transformer.lora import Frozen, FrozenCache, LoRAConfig, frozen_linear_forward, init_adapters
from transformer.model import backward, forward, param_shapes
from transformer.optim import AdamWConfig, adamw_init, adamw_update, is_decayed
from transformer.softmax import cross_entropy_backward, cross_entropy_forward

from .. import sections
from ..common import md_table
from ..examples import SEED, TINY_IDS, TINY_TARGETS, default_run, tiny
from ..prose import num

EXAMPLE_LORA = LoRAConfig(rank=2, alpha=4.0, targets=("q", "v"))  # the tiny model is 4 wide
EXAMPLE_LR = 1e-2  # one AdamW step of the example
LAYER = "b0.wq"  # the layer the example shows: block 0's query projection
RANKS = (1, 2, 4, 8, 16, 32)  # one step at each rank, on the default config (d = 32)
RANK_ALPHA = LoRAConfig().alpha  # alpha fixed while the rank changes, as LoRAConfig's default


# ---------------------------------------------------------------- ∂ℓ/∂Y of one layer inside the model's backward

@dataclass(frozen=True)
class RecordedCache:
    """The cache of a Recorded layer: it keeps the upstream gradient the model's backward hands the layer."""
    cache: FrozenCache
    seen: dict

    def linear_backward(self, dy):
        self.seen["dy"] = dy
        return self.cache.linear_backward(dy)


@dataclass(frozen=True)
class Recorded:
    """A frozen weight that computes its layer as the weight it wraps does (linear.py hands a weight that is not
    an array its input) and records the layer's upstream gradient ∂ℓ/∂Y, which no trace of the model keeps."""
    weight: Frozen
    seen: dict

    @property
    def shape(self):
        return self.weight.shape

    def linear_forward(self, x, b):
        y, cache = self.weight.linear_forward(x, b)
        return y, RecordedCache(cache, self.seen)


@dataclass(frozen=True)
class LayerBackward:
    """The example layer's backward inside the whole model's, at step 0."""
    dy: np.ndarray  # ∂ℓ/∂Y, as the model's backward handed it to the layer
    xa: np.ndarray  # A W_A
    dxa: np.ndarray  # ∂ℓ/∂(A W_A) = s dY W_B^T
    da: np.ndarray
    dbm: np.ndarray
    grads: dict  # adapter_loss_and_grads' gradients of every adapter


def layer_backward(ex, adapters):
    """Run the adapted tiny model forward and back with its query projection recorded."""
    lora, ids, targets = EXAMPLE_LORA, np.array([TINY_IDS]), np.array([TINY_TARGETS])
    params, seen = frozen_params(ex.params, adapters, lora), {}
    params[LAYER] = Recorded(params[LAYER], seen)
    logits, cache = forward(params, ids, ex.cfg)
    _, xent = cross_entropy_forward(logits, targets)
    da, dbm = backward(cross_entropy_backward(1.0, xent), cache, embeddings=False)[LAYER]
    _, grads = adapter_loss_and_grads(ex.params, adapters, ids, targets, ex.cfg, lora)
    w = params[LAYER].weight
    dy = seen["dy"][0]
    xa = ex.trace["b0.ln1"][0] @ w.a
    return LayerBackward(dy, xa, lora.scale * dy @ w.bm.T, da, dbm, grads)


def db_entry(bw, k, j):
    """One entry of ∂ℓ/∂W_B written out from the arrays shown; an error if it disagrees with the code."""
    s = EXAMPLE_LORA.scale
    value = s * bw.xa[:, k] @ bw.dy[:, j]
    if abs(value - bw.dbm[k, j]) > 1e-12 * max(1.0, abs(value)):
        raise RuntimeError("the LoRA page's ∂ℓ/∂W_B by hand disagrees with frozen_linear_backward")
    terms = " + ".join(f"{num(a)} × {num(b)}" for a, b in zip(bw.xa[:, k], bw.dy[:, j], strict=True))
    return {"k": k, "j": j, "s": s, "terms": terms, "value": value, "returned": bw.dbm[k, j]}


def tiny_example():
    """(tables, values) of the tiny example: forward at step 0, the layer's backward, one AdamW step."""
    ex, lora = tiny(), EXAMPLE_LORA
    adapters = init_adapters(param_shapes(ex.cfg), lora, seed=SEED)
    x, W, b = ex.trace["b0.ln1"][0], ex.params[LAYER], ex.params["b0.bq"]
    a, bm = adapters[f"{LAYER}.lora_a"], adapters[f"{LAYER}.lora_b"]
    y0, _ = frozen_linear_forward(x, Frozen(W, a, bm, lora.scale), b)
    base = x @ W + b
    bw = layer_backward(ex, adapters)
    k, j = (int(n) for n in np.unravel_index(np.abs(bw.dbm).argmax(), bw.dbm.shape))
    zero_a = [n for n in bw.grads if n.endswith(".lora_a") and not bw.grads[n].any()]
    after = {n: v.copy() for n, v in adapters.items()}
    adamw_update(after, bw.grads, adamw_init(adapters), EXAMPLE_LR, AdamWConfig())
    a1, bm1 = after[f"{LAYER}.lora_a"], after[f"{LAYER}.lora_b"]
    y1, _ = frozen_linear_forward(x, Frozen(W, a1, bm1, lora.scale), b)
    correction = lora.scale * (x @ a1) @ bm1
    tables = {"x": sections.array_md("A", x, row_label="position"), "w": sections.array_md("W", W),
              "a": sections.array_md("W_A", a), "bm": sections.array_md("W_B", bm),
              "y0": sections.array_md("Y", y0, row_label="position"),
              "dy": sections.array_md("∂ℓ/∂Y", bw.dy, row_label="position"),
              "xa": sections.array_md("A W_A (xa)", bw.xa, row_label="position"),
              "dbm": sections.array_md("∂ℓ/∂W_B (dbm)", bw.dbm),
              "bm1": sections.array_md("W_B after one step", bm1),
              "correction": sections.array_md("correction", correction, row_label="position"),
              "y1": sections.array_md("Y after one step", y1, row_label="position")}
    moved = np.abs(bm1) / EXAMPLE_LR
    values = {"rank": lora.rank, "alpha": lora.alpha, "scale": lora.scale, "lr": EXAMPLE_LR,
              "targets": list(lora.targets), "step0_equal": bool(np.array_equal(y0, base)),
              "dxa_max": float(np.abs(bw.dxa).max()), "entry": db_entry(bw, k, j),
              "dbm_gap": float(np.abs(bw.dbm - bw.grads[f"{LAYER}.lora_b"]).max()),
              "da_max": float(np.abs(bw.da).max()), "zero_a": len(zero_a),
              "lora_a": sum(n.endswith(".lora_a") for n in bw.grads),
              "moved_gap": float(np.abs(moved - 1).max()), "dy0": float(np.abs(bw.dy[0]).max()),
              "a_unchanged": bool(np.array_equal(a1, a)), "a_decayed": is_decayed(f"{LAYER}.lora_a"),
              "y1_gap": float(np.abs(y1 - (base + correction)).max())}
    return tables, values


# ---------------------------------------------------------------- one step at several ranks

def one_step(ex, targets, rank):
    """W_A and W_B of the default run's b0.wq after one AdamW step from the start, at this rank."""
    lora = LoRAConfig(rank=rank, alpha=RANK_ALPHA, targets=LoRAConfig().targets)
    adapters = init_adapters(param_shapes(ex.cfg), lora, seed=SEED)
    _, grads = adapter_loss_and_grads(ex.params, adapters, ex.ids, targets, ex.cfg, lora)
    adamw_update(adapters, grads, adamw_init(adapters), EXAMPLE_LR, AdamWConfig())
    return adapters[f"{LAYER}.lora_a"], adapters[f"{LAYER}.lora_b"]


def ranks():
    """(table, values): the size of the first step's update at each rank, with alpha / r and with alpha / √r."""
    ex = default_run()
    targets = np.random.default_rng(SEED + 1).integers(0, ex.cfg.vocab_size, ex.ids.shape)
    rows, sizes, moved = [], {}, []
    for r in RANKS:
        a, bm = one_step(ex, targets, r)
        product = np.linalg.norm(a @ bm)
        plain, stable = (LoRAConfig(rank=r, alpha=RANK_ALPHA, rank_stabilized=rs).scale for rs in (False, True))
        sizes[r] = (plain * product, stable * product)
        moved.append(np.abs(bm) / EXAMPLE_LR)
        rows.append([r, f"{plain:g}", f"{product:.4f}", f"{sizes[r][0]:.4f}", f"{sizes[r][1]:.4f}"])
    alpha = "\\alpha_{\\mathrm{LoRA}}"
    table = md_table(["\\(n_r\\)", f"\\(s_{{\\mathrm{{LoRA}}}} = {alpha}/n_r\\)", "\\(\\lVert W_A W_B \\rVert\\)",
                      f"\\(\\lVert ({alpha}/n_r)\\, W_A W_B \\rVert\\) (LoRA)",
                      f"\\(\\lVert ({alpha}/\\sqrt{{n_r}})\\, W_A W_B \\rVert\\) (rsLoRA)"], rows)
    lo, hi = RANKS[0], RANKS[-1]
    stable = [s for _, s in sizes.values()]
    return table, {"alpha": RANK_ALPHA, "lr": EXAMPLE_LR, "lo": lo, "hi": hi, "layer": LAYER,
                   "targets": list(LoRAConfig().targets), "moved_lo": float(min(m.min() for m in moved)),
                   "moved_hi": float(max(m.max() for m in moved)), "shrink": sizes[lo][0] / sizes[hi][0],
                   "sqrt": float(np.sqrt(hi / lo)), "stable_lo": min(stable), "stable_hi": max(stable)}
