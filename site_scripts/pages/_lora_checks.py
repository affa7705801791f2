"""The LoRA page's checks, on the default config in float64: the adapted model at step 0 against the base, the
merged model against the adapted one, the adapters' gradients against the dense model's by the chain rule, and
the loss over part of a window (its logit gradient zero outside the range, the context's targets ignored).

Each check's verdict comes from the numbers it computed; a failed one reads **FAIL**. Tables and values only:
the words are in docs/finetuning/lora.md."""

import numpy as np

from transformer.finetune import adapter_loss_and_grads, frozen_params
from transformer.lora import TARGETS, LoRAConfig, init_adapters, merge
from transformer.model import forward, loss_and_grads, param_shapes
from transformer.softmax import cross_entropy_time_range_backward, cross_entropy_time_range_forward

from .. import sections
from ..common import md_table
from ..examples import SEED, default_run

CHECK_LORA = LoRAConfig(rank=4, alpha=8.0, targets=tuple(TARGETS))  # every target, so every path is checked
MOVE = 0.2  # setting(): how far the adapters move off their start, in standard normal units
MOVED_AT_LEAST = 1e-3  # the merge check means something only if the adapters move a logit by more than this


def setting():
    """The default run's parameters and ids, next-token targets, and adapters as training leaves them."""
    ex = default_run()
    targets = np.random.default_rng(SEED + 1).integers(0, ex.cfg.vocab_size, ex.ids.shape)
    rng = np.random.default_rng(SEED + 2)
    adapters = {k: MOVE * rng.standard_normal(v.shape)
                for k, v in init_adapters(param_shapes(ex.cfg), CHECK_LORA, seed=SEED).items()}
    return ex, targets, adapters


def step0_row(ex):
    """At step 0 (W_B = 0): the adapted logits against the frozen model without adapters (must be equal) and
    against the base model (q, k, v fused there, so equal to rounding)."""
    adapters = init_adapters(param_shapes(ex.cfg), CHECK_LORA, seed=SEED)
    adapted, _ = forward(frozen_params(ex.params, adapters, CHECK_LORA), ex.ids, ex.cfg)
    frozen, _ = forward(frozen_params(ex.params, {}, CHECK_LORA), ex.ids, ex.cfg)
    equal = bool(np.array_equal(adapted, frozen))
    gap, verdict = sections.agreement(adapted, ex.trace["logits"])
    return [["step-0 logits = the frozen base's, no adapters", "`np.array_equal`", str(equal),
             "pass" if equal else "**FAIL**"],
            ["step-0 logits = the base model's `forward`", "largest gap", sections.gap_text(gap), verdict]]


def merge_row(ex, adapters):
    adapted, _ = forward(frozen_params(ex.params, adapters, CHECK_LORA), ex.ids, ex.cfg)
    merged, _ = forward(merge(ex.params, adapters, CHECK_LORA), ex.ids, ex.cfg)
    moved = float(np.abs(adapted - ex.trace["logits"]).max())
    gap, verdict = sections.agreement(merged, adapted)
    return [["merged model's logits = the adapted model's", "largest gap", sections.gap_text(gap),
             verdict if moved > MOVED_AT_LEAST else "**FAIL** (the adapters changed nothing)"]], moved


def chain_rows(ex, targets, adapters):
    """Per adapted weight: the gaps of dA against s (dl/dW_merged) B^T and of dB against s A^T (dl/dW_merged),
    dl/dW_merged the dense model's gradient of that weight in the merged parameters."""
    loss, grads = adapter_loss_and_grads(ex.params, adapters, ex.ids, targets, ex.cfg, CHECK_LORA)
    merged_loss, dense = loss_and_grads(merge(ex.params, adapters, CHECK_LORA), ex.ids, targets, ex.cfg)
    s, rows = CHECK_LORA.scale, []
    for weight in (k[: -len(".lora_a")] for k in adapters if k.endswith(".lora_a")):
        a, bm, dmerged = adapters[f"{weight}.lora_a"], adapters[f"{weight}.lora_b"], dense[weight]
        gap_a, ok_a = sections.agreement(grads[f"{weight}.lora_a"], s * dmerged @ bm.T)
        gap_b, ok_b = sections.agreement(grads[f"{weight}.lora_b"], s * a.T @ dmerged)
        rows.append([f"`{weight}`", sections.gap_text(gap_a), ok_a, sections.gap_text(gap_b), ok_b])
    return rows, abs(loss - merged_loss)


def time_range_rows(ex, targets, adapters):
    """The loss from t_from on: its logit gradient outside the range, and the adapters' gradients when the
    context positions' targets change."""
    T = ex.ids.shape[1]
    learn_from = T // 2
    logits = ex.trace["logits"]
    _, cache = cross_entropy_time_range_forward(logits, targets, learn_from, T - learn_from)
    dlogits = cross_entropy_time_range_backward(1.0, cache)
    outside, inside = dlogits[:, :learn_from], dlogits[:, learn_from:]
    nonzero_out = int(np.count_nonzero(outside))
    _, grads = adapter_loss_and_grads(ex.params, adapters, ex.ids, targets, ex.cfg, CHECK_LORA, learn_from)
    other = targets.copy()
    other[:, :learn_from] = (other[:, :learn_from] + 1) % ex.cfg.vocab_size
    _, grads2 = adapter_loss_and_grads(ex.params, adapters, ex.ids, other, ex.cfg, CHECK_LORA, learn_from)
    same = all(np.array_equal(grads[k], grads2[k]) for k in grads)
    return learn_from, [
        [f"logit gradient at positions 0 to {learn_from - 1} (outside)", "nonzero entries, of "
         f"{outside.size:,}", str(nonzero_out), "pass" if nonzero_out == 0 else "**FAIL**"],
        [f"logit gradient at positions {learn_from} to {T - 1} (inside)", "nonzero entries, of "
         f"{inside.size:,}", f"{np.count_nonzero(inside):,}",
         "pass" if np.count_nonzero(inside) == inside.size else "**FAIL**"],
        ["adapter gradients with the context's targets changed", "`np.array_equal` to the unchanged ones",
         str(same), "pass" if same else "**FAIL**"],
    ]


def checks():
    """(the two tables, their values)."""
    ex, targets, adapters = setting()
    rows = step0_row(ex)
    merged, moved = merge_row(ex, adapters)
    rows += merged
    learn_from, time_rows = time_range_rows(ex, targets, adapters)
    rows += time_rows
    chain, loss_gap = chain_rows(ex, targets, adapters)
    verdicts = [r[-1] for r in rows] + [v for r in chain for v in (r[2], r[4])]
    tables = {"checks": md_table(["Check", "Measured", "Value", "Result"], rows),
              "chain": md_table(["weight", "\\(\\partial\\ell/\\partial W_A\\): largest gap", "result",
                                 "\\(\\partial\\ell/\\partial W_B\\): largest gap", "result"], chain)}
    return tables, {"rank": CHECK_LORA.rank, "alpha": CHECK_LORA.alpha, "seed": SEED + 2, "move": MOVE,
                    "moved": moved, "moved_at_least": MOVED_AT_LEAST, "learn_from": learn_from,
                    "last": int(ex.ids.shape[1] - 1), "loss_gap": loss_gap,
                    "failed": sum("**FAIL**" in v for v in verdicts), "total": len(verdicts),
                    "batch": int(ex.ids.shape[0]), "T": int(ex.ids.shape[1])}
