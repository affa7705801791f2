"""Generator of the QLoRA page's fragments: the symbol table, one NF4 layer of the tiny model, the checks (QLoRA's
gradients against LoRA's on the decoded base, what a few training steps leave of the base, the optimizer state,
the clipped norm, the quantized model's logits against the float one), the gradient check of the frozen NF4
layer, and the memory section (site_scripts/pages/_qlora_memory.py)."""

import numpy as np

from transformer.data import make_tokenizer, sample_batch
from transformer.finetune import adapter_loss_and_grads, dense_base, frozen_params, quantize_base, weight_bytes
from transformer.finetune_run import FineTuneRun
from transformer.lora import TARGETS, Frozen, LoRAConfig, frozen_linear_backward, frozen_linear_forward, init_adapters
from transformer.model import forward, init_params, param_shapes
from transformer.nf4 import NF4Weight, dequantize, quantize
from transformer.optim import adamw_init, global_norm
from transformer.quantized_linear import ROWS
from transformer.step import train_step
from transformer.train_config import TrainConfig

from .. import sections
from ..common import md_table
from ..examples import H_STEP, SEED, default_note, default_run, illustrative, tiny, weighted_sum
from . import _qlora_memory

CHECK_LORA = LoRAConfig(rank=4, alpha=8.0, targets=tuple(TARGETS))
TRAIN_STEPS = 5
GRAD_CLIP = 1e-3  # small, so that the clip acts on every step of the check


def trained(adapters, seed=SEED + 2, size=0.2):
    rng = np.random.default_rng(seed)
    return {k: size * rng.standard_normal(v.shape) for k, v in adapters.items()}


def symbols_md():
    ex, lora = default_run(), LoRAConfig()
    base = quantize_base(ex.params)
    adapters = init_adapters(param_shapes(ex.cfg), lora, seed=SEED)
    x, q = ex.trace["b0.ln1"], base["b0.wq"]
    w = Frozen(q, adapters["b0.wq.lora_a"], adapters["b0.wq.lora_b"], lora.scale)
    y, cache = frozen_linear_forward(x, w, base["b0.bq"])
    dx, _ = frozen_linear_backward(np.ones_like(y), cache)
    rows = [
        (r"A", "x", x.shape, "block 0's \\(U_1\\)"),
        (r"W", "params['b0.wq']", ex.params["b0.wq"].shape, f"{ex.params['b0.wq'].nbytes:,} bytes in float64"),
        (r"W_{\mathrm{NF4}}", "dequantize(w.base)", dequantize(q).shape,
         f"`b0.wq` as stored: an `NF4Weight` of {q.nbytes:,} bytes"),
        (r"W_A", "w.a", w.a.shape), (r"W_B", "w.bm", w.bm.shape),
        (r"Y", "y", y.shape), (r"\partial\ell/\partial A", "dx", dx.shape),
    ]
    return sections.symbols_md(rows, default_note() + f", adapters of rank {lora.rank} on q and v")


def example_md():
    ex = tiny()
    x, W, b = ex.trace["b0.ln1"][0], ex.params["b0.wq"], ex.params["b0.bq"]
    q = quantize(W)
    decoded = dequantize(q)
    y_nf4, _ = frozen_linear_forward(x, Frozen(q), b)
    y_dec = x @ decoded.astype(x.dtype) + b
    y_float = x @ W + b
    return "\n".join([
        illustrative(f"Block 0's query weight \\(W\\) ({W.size} values, so "
                     f"{'one block holds them all' if W.size <= q.block_size else f'{-(-W.size // q.block_size)} blocks'}), "
                     f"stored with `quantize` (block size {q.block_size}) and decoded with `dequantize`."),
        sections.array_md("W", W), sections.array_md("W_NF4", decoded),
        f"\nThe 4-bit codes pack into {q.packed.nbytes} bytes, the block's scale into a {q.absmax_codes.nbytes}-byte "
        f"code, {q.absmax2.nbytes} bytes of second-level scale and a 4-byte offset: {q.nbytes} bytes against "
        f"{W.astype(np.float32).nbytes} in float32 (the memory section below measures whole models). The largest "
        "error of a weight is "
        f"{float(np.abs(decoded - W).max()):.4f}, and the layer's output through the frozen NF4 layer "
        f"(`frozen_linear_forward`) against:\n",
        md_table(["", "largest gap"],
                 [["a dense layer holding \\(W_{\\mathrm{NF4}}\\)", sections.gap_text(float(np.abs(y_nf4 - y_dec).max()))],
                  ["the float layer holding \\(W\\)", f"{float(np.abs(y_nf4 - y_float).max()):.4f}"]]),
        f"\nThe first may differ by rounding only (the NF4 layer adds its decoded rows {ROWS} at a time); the second "
        "is what quantization costs this layer.\n",
    ])


def gradients_row(ex, targets, adapters):
    base = quantize_base(ex.params)
    _, q_grads = adapter_loss_and_grads(base, adapters, ex.ids, targets, ex.cfg, CHECK_LORA)
    _, d_grads = adapter_loss_and_grads(dense_base(base), adapters, ex.ids, targets, ex.cfg, CHECK_LORA)
    found = [sections.agreement(q_grads[k], d_grads[k]) for k in adapters]
    gap = max(g for g, _ in found)
    verdict = "**FAIL**" if any(v == "**FAIL**" for _, v in found) else "pass"
    return ["QLoRA's adapter gradients = LoRA's on the decoded base (`dense_base`), every adapter",
            "largest gap", sections.gap_text(gap), verdict]


def logits_row(ex):
    adapters = init_adapters(param_shapes(ex.cfg), CHECK_LORA, seed=SEED)
    logits, _ = forward(frozen_params(quantize_base(ex.params), adapters, CHECK_LORA), ex.ids, ex.cfg)
    gap = float(np.abs(logits - ex.trace["logits"]).max())
    return ["QLoRA's logits at step 0 against the float64 model's", "largest gap, and the largest logit",
            f"{gap:.4f} of {float(np.abs(ex.trace['logits']).max()):.4f}", "measured (quantization error)"]


def training_rows():
    """A few clipped AdamW steps of a FineTuneRun on an NF4 base: its bytes, its optimizer state, its norm."""
    ex = tiny()
    text = "to be or not to be, that is the question\n" * 40
    tokenizer = make_tokenizer("char", text)
    cfg = ex.cfg.with_(vocab_size=tokenizer.vocab_size, context_len=8, emb_dim=8, ff_dim=16)
    base = quantize_base(init_params(cfg, seed=SEED, dtype=np.float32))
    before = {n: (p.packed.tobytes() + p.absmax_codes.tobytes() + p.absmax2.tobytes() + np.float32(p.offset).tobytes())
              if isinstance(p, NF4Weight) else p.tobytes() for n, p in base.items()}
    bytes_before = weight_bytes(base)
    lora = LoRAConfig(2, 4.0, ("q", "v", "ff2"))
    adapters = init_adapters(param_shapes(cfg), lora, seed=SEED, dtype=np.float32)
    tc = TrainConfig(steps=TRAIN_STEPS, batch_size=3, seq_len=8, warmup=1, grad_clip=GRAD_CLIP, dtype="float32")
    run = FineTuneRun(cfg, tc, tokenizer, adapters, adamw_init(adapters), np.random.default_rng(SEED), base=base,
                      lora=lora, quantize="nf4")
    ids, norm_gaps, clipped = tokenizer.encode(text), [], 0
    for _ in range(TRAIN_STEPS):
        replay = np.random.default_rng()
        replay.bit_generator.state = run.rng.bit_generator.state
        x, y = sample_batch(ids, tc.batch_size, tc.seq_len, replay)  # the batch this step will draw
        _, expected = adapter_loss_and_grads(base, run.params, x, y, cfg, lora)
        record = train_step(run, ids, tc.seq_len)
        norm_gaps.append(abs(record["grad_norm"] - global_norm(expected)) / global_norm(expected))
        clipped += record["grad_norm"] > GRAD_CLIP
    after = {n: (p.packed.tobytes() + p.absmax_codes.tobytes() + p.absmax2.tobytes() + np.float32(p.offset).tobytes())
             if isinstance(p, NF4Weight) else p.tobytes() for n, p in base.items()}
    changed = [n for n in before if before[n] != after[n]]
    state_keys = set(run.opt_state["m"]) | set(run.opt_state["v"])
    only = state_keys == set(adapters) and not state_keys & set(base)
    worst = max(norm_gaps)
    return [
        [f"the base's bytes after {TRAIN_STEPS} AdamW steps (every array, NF4 codes and scales included)",
         "arrays changed, of " + str(len(before)), str(len(changed)), "pass" if not changed else "**FAIL**"],
        ["the base's size after the steps (`weight_bytes`)", "bytes before → after", f"{bytes_before:,} → "
         f"{weight_bytes(base):,}", "pass" if bytes_before == weight_bytes(base) else "**FAIL**"],
        ["arrays with AdamW moments", "the adapters' names, and no base name", f"{len(state_keys)} of "
         f"{len(adapters)} adapters", "pass" if only else "**FAIL**"],
        ["the norm the clip measured = the adapters' global norm of the same batch", "largest relative gap, "
         "steps where it clipped", f"{worst:.1e}, {clipped} of {TRAIN_STEPS}",
         "pass" if worst < 1e-5 and clipped == TRAIN_STEPS else "**FAIL**"],
    ]


def checks_md():
    ex = default_run()
    targets = np.random.default_rng(SEED + 1).integers(0, ex.cfg.vocab_size, ex.ids.shape)
    adapters = trained(init_adapters(param_shapes(ex.cfg), CHECK_LORA, seed=SEED))
    rows = [gradients_row(ex, targets, adapters), logits_row(ex)] + training_rows()
    return (f"The first two rows on {default_note()} in float64, adapters of rank {CHECK_LORA.rank} on every "
            f"target (\\(W_B\\) drawn off zero where gradients are compared, seed {SEED + 2}); the others a "
            f"`FineTuneRun` of the tiny model widened to \\(d\\) = 8 on a short text, float32, with the clip at "
            f"{GRAD_CLIP:g} so that it acts. Each step's batch is drawn again from a copy of the run's sampler, so "
            "the norm is computed on the batch the step saw.\n\n"
            + md_table(["Check", "Measured", "Value", "Result"], rows)
            + "\nThe logits' gap is measured, not judged: it is what storing this (untrained) model's linear weights "
              "in 4 bits costs its logits. The adapters then train against the quantized base, whose logits these "
              "are.\n")


def gradcheck_md():
    ex, rng = tiny(), np.random.default_rng(SEED)
    lora = LoRAConfig(rank=2, alpha=4.0, targets=("q",))
    adapters = trained(init_adapters(param_shapes(ex.cfg), lora, seed=SEED))
    w = Frozen(quantize(ex.params["b0.wq"]), adapters["b0.wq.lora_a"], adapters["b0.wq.lora_b"], lora.scale)
    b = ex.params["b0.bq"] + 0.1 * rng.standard_normal(ex.params["b0.bq"].shape)
    x = rng.standard_normal((2, 3, ex.cfg.emb_dim))
    dy = rng.standard_normal((2, 3, w.shape[1]))
    dx, (da, dbm) = frozen_linear_backward(dy, frozen_linear_forward(x, w, b)[1])
    rows = sections.gradcheck_rows(weighted_sum(dy, frozen_linear_forward, x, w, b),
                                   [("dx", dx, x), ("da", da, w.a), ("dbm", dbm, w.bm)], H_STEP)
    return (f"The [fake loss](../reference/notation.md#fake-loss) \\(f = \\sum Y \\odot R\\) of `frozen_linear_forward` "
            f"on the tiny model's `b0.wq` stored in NF4, with adapters of rank {lora.rank} (\\(W_B\\) off zero), a "
            f"random input of shape `{x.shape}` and a random \\(R\\) (seed {SEED}); the NF4 weight is a constant, "
            "and \\(\\partial\\ell/\\partial A\\) goes through its decoded rows.\n\n" + sections.gradcheck_table(rows))


def generate(context):
    return {"symbols": symbols_md(), "example": example_md(), "checks": checks_md(), "gradcheck": gradcheck_md(),
            "memory": _qlora_memory.memory_md()}
