"""The deliberate mistakes that tools/mutants.py plants, one at a time, to see which check notices.

Each mutant is one plausible slip: a term dropped, an axis swapped, a constant
left out. An edit names the function it lives in (or None for module level) and
replaces text that must occur exactly once there, so a mutant that no longer
fits the code stops the run instead of silently testing nothing.

A mutant with `uncatchable` set computes the same numbers as the original (or
differs only where no check can look); the text says why. The run still tries
every check on it and reports what happened.
"""

from dataclasses import dataclass


@dataclass(frozen=True)
class Edit:
    path: str  # relative to the repository root
    function: str | None  # the function whose source holds `old`; None: anywhere in the file
    old: str
    new: str


@dataclass(frozen=True)
class Mutant:
    name: str
    breaks: str  # what the mistake does, in a sentence
    edits: tuple
    uncatchable: str = ""  # why no check can see it, when that is so
    about: str = ""  # "path:function" whose behaviour the edits change, when the first edit names no function

    @property
    def subject(self):
        """(path, function): the function the mistake is in (`about`, else the first edit's function).
        The site shows each mutant beside that function's page."""
        where = self.about or next((f"{e.path}:{e.function}" for e in self.edits if e.function), "")
        if not where:
            raise ValueError(f"mutant {self.name}: no edit names a function, so it needs `about`")
        path, _, function = where.partition(":")
        return path, function.split(".")[0]  # a method's page is its class's


def edit(where, old, new):
    """edit("transformer/layernorm.py:layer_norm_backward", old, new): one replacement."""
    path, _, function = where.partition(":")
    return Edit(path, function or None, old, new)


LN = "transformer/layernorm.py"
ATT = "transformer/attention.py"
FLASH = "transformer/flash_attention.py"
CKPT = "transformer/activation_checkpoint.py"
KV = "transformer/kv_cache.py"
LORA = "transformer/lora.py"
NF4 = "transformer/nf4.py"
QLIN = "transformer/quantized_linear.py"
AG = "transformer/autograd.py"
AGF = "transformer/autograd_functions.py"
SHARDS = "transformer/shard_processes.py"
SCHED = "transformer/scheduler.py"

MUTANTS = (
    # LayerNorm: the three terms of dx, the 1/sigma factor, the gain gradient, the epsilon.
    Mutant("layernorm-dx-no-direct-term",
           "LayerNorm's dx loses its first term, the direct path from x_i to xhat_i.",
           (edit(f"{LN}:layer_norm_backward", "dx = dxhat  #", "dx = np.zeros_like(dxhat)  #"),)),
    Mutant("layernorm-dx-no-mean-term",
           "LayerNorm's dx loses the term that flows through the row mean.",
           (edit(f"{LN}:layer_norm_backward", "dx -= mean_dxhat  #", "dx -= 0.0  #"),)),
    Mutant("layernorm-dx-no-variance-term",
           "LayerNorm's dx loses the term that flows through the row variance.",
           (edit(f"{LN}:layer_norm_backward", "dx -= xhat * mean_dxhat_xhat  #", "dx -= 0.0  #"),)),
    Mutant("layernorm-dx-no-inverse-sigma",
           "LayerNorm's dx is not multiplied by 1/sigma at the end.",
           (edit(f"{LN}:layer_norm_backward", "dx *= rstd  #", "dx *= 1.0  #"),)),
    Mutant("layernorm-dg-without-xhat",
           "The gain's gradient sums dy alone, forgetting the factor xhat (it becomes the shift's gradient).",
           (edit(f"{LN}:layer_norm_backward", 'np.einsum("ni,ni->i", dy2, xhat2)', "dy2.sum(axis=0)"),)),
    Mutant("layernorm-other-epsilon",
           "LayerNorm adds 10 eps instead of eps to the variance. The backward reads 1/sigma from the cache, so "
           "forward and backward agree with each other and only disagree with the true LayerNorm.",
           (edit(f"{LN}:layer_norm_forward", "np.sqrt(var + eps)", "np.sqrt(var + 10 * eps)"),)),
    Mutant("layernorm-mean-over-d-minus-1",
           "LayerNorm divides each row's sum by d - 1 instead of d, so the rows it normalises are not centred.",
           (edit(f"{LN}:layer_norm_forward", 'np.einsum("...i->...", x)[..., None] / d',
                 'np.einsum("...i->...", x)[..., None] / (d - 1)'),)),
    Mutant("layernorm-db-silently-float64",
           "The column of ones that sums the shift's gradient is float64 (np.ones' default): a float32 model gets "
           "float64 shift gradients, a silent upcast.",
           (edit(f"{LN}:layer_norm_backward", "np.ones(len(dy2), dtype=dy2.dtype) @ dy2", "np.ones(len(dy2)) @ dy2"),)),
    # Linear layer.
    Mutant("linear-db-mean-not-sum",
           "The bias gradient averages over the rows instead of summing them.",
           (edit("transformer/linear.py:linear_backward", "db = np.ones(len(dy2), dtype=dy2.dtype) @ dy2",
                 "db = np.ones(len(dy2), dtype=dy2.dtype) @ dy2 / len(dy2)"),)),
    Mutant("linear-db-silently-float64",
           "The column of ones that sums the bias gradient's rows is float64 (np.ones' default), so a float32 "
           "model gets float64 bias gradients: the same numbers to float32 rounding, a silent upcast.",
           (edit("transformer/linear.py:linear_backward", "np.ones(len(dy2), dtype=dy2.dtype) @ dy2",
                 "np.ones(len(dy2)) @ dy2"),)),
    # Activations.
    Mutant("relu-mask-omitted",
           "ReLU's backward lets every gradient through, as if it were the identity.",
           (edit("transformer/activations.py:relu_backward", "dx = dy * np.sign(y)", "dx = dy * 1.0"),)),
    Mutant("relu-mask-reversed",
           "ReLU's backward passes the gradient where the input was negative and stops it where positive.",
           (edit("transformer/activations.py:relu_backward", "dx = dy * np.sign(y)", "dx = dy * (y <= 0)"),)),
    Mutant("relu-gradient-one-at-zero",
           "ReLU's derivative at exactly x = 0 is taken as 1 instead of 0 (the cache keeps x to tell 0 from "
           "negative); a NaN input still gives a NaN gradient.",
           (edit("transformer/activations.py:relu_forward", "cache = y", "cache = x"),
            edit("transformer/activations.py:relu_backward", "dx = dy * np.sign(y)",
                 "dx = dy * np.where(y == 0, 1.0, np.sign(np.maximum(y, 0)))")),
           uncatchable="ReLU has no derivative at 0, so either value is a convention. Central differences at "
                       "x = 0 give 1/2, which matches neither; and an input that is exactly 0.0 does not occur "
                       "in a model with random real-valued weights, so no gradient entry changes."),
    Mutant("gelu-grad-no-density-term",
           "GELU's derivative keeps Phi(x) and drops the x phi(x) term.",
           (edit("transformer/activations.py:gelu_backward", "dy * (phi_cdf + x_phi)", "dy * phi_cdf"),)),
    Mutant("gelu-erf-imported-with-the-package",
           "scipy.special, whose erf GELU uses, is imported with the package instead of at GELU's first call: "
           "every number is the same, and every process that never reaches GELU waits for the import.",
           (edit("transformer/activations.py", "import numpy as np\n", "import numpy as np\nimport scipy.special\n"),),
           about="transformer/activations.py:gelu_forward"),  # the import it delays happens at its first call
    Mutant("gelu-tanh-grad-no-cubic-term",
           "The tanh GELU's derivative forgets that z holds a cubic: z' is taken as sqrt(2/pi), without its "
           "3 0.044715 x^2.",
           (edit("transformer/activations.py:gelu_tanh_backward",
                 "(1.0 + 3.0 * _TANH_CUBIC * x_inner * x_inner)", "1.0"),)),
    Mutant("gelu-tanh-grad-sech-as-tanh",
           "The tanh GELU's derivative writes tanh' as 1 - tanh instead of 1 - tanh^2.",
           (edit("transformer/activations.py:gelu_tanh_backward", "sech2 = 1.0 - tanh * tanh", "sech2 = 1.0 - tanh"),)),
    # GPT-2's layout: the tied head and the checkpoint's names.
    Mutant("tied-head-grad-not-added",
           "With the head tied to the token table, tok_emb gets only the embedding's gradient: the head's share "
           "is computed and dropped.",
           (edit("transformer/model.py:backward", 'grads["tok_emb"] += dhead_w.T', 'grads["tok_emb"] += 0.0'),)),
    Mutant("gpt2-c-attn-split-k-first",
           "A GPT-2 checkpoint's c_attn is split as k, q, v instead of q, k, v.",
           (edit("transformer/gpt2.py", 'QKV = ("q", "k", "v")', 'QKV = ("k", "q", "v")'),),
           about="transformer/gpt2.py:hf_names"),
    Mutant("torch-zip-strides-as-bytes",
           "The older GPT-2 checkpoint's tensors are read with torch's strides, which count elements, taken as "
           "numpy's, which count bytes: every window steps through the wrong part of its storage.",
           (edit("transformer/torch_zip.py:rebuild_tensor", "[s * flat.itemsize for s in stride]", "list(stride)"),)),
    # GPT-2's tokenizer.
    Mutant("bpe-first-merge-lost",
           "GPT-2's tokenizer skips two lines of vocab.bpe instead of its version line alone: the merge of rank 0 "
           "(a space and t) is lost and every other rank is one lower.",
           (edit("transformer/bpe.py:GPT2Tokenizer.__init__", ".splitlines()[1:]", ".splitlines()[2:]"),)),
    # Softmax and cross-entropy.
    Mutant("softmax-grad-no-subtraction",
           "Softmax's backward forgets to subtract sum_j dp_j p_j, as if each probability moved alone.",
           (edit("transformer/softmax.py:softmax_backward", "dx = dp - row_dot", "dx = dp.copy()"),)),
    Mutant("softmax-no-max-shift",
           "Softmax exponentiates the scores without subtracting the row maximum first. The result is the "
           "same until a score passes about 709, where exp overflows.",
           (edit("transformer/softmax.py:softmax_forward", "p = x - row_max", "p = x.copy()"),)),
    Mutant("cross-entropy-grad-not-divided-by-n",
           "The cross-entropy gradient is not divided by the number of positions N, so it is the gradient of "
           "the sum while the loss is the mean.",
           (edit("transformer/softmax.py:cross_entropy_backward", "dlogits = probs * (dloss / n)",
                 "dlogits = probs * dloss"),)),
    # Attention.
    Mutant("attention-no-causal-mask",
           "The causal mask is not added to the scores, so each position also attends to later ones. Forward "
           "and backward stay consistent.",
           (edit(f"{ATT}:attention_forward",
                 "scores += causal_mask(x.shape[1], np.dtype(scores.dtype), column_major=True)", "scores += 0.0"),)),
    Mutant("attention-grad-no-scale",
           "The backward forgets the 1/sqrt(d_h) scale in dq; the forward still applies it.",
           (edit(f"{ATT}:attention_backward", "dq = (dscores @ k) * scale", "dq = dscores @ k"),)),
    Mutant("attention-dv-untransposed",
           "dv multiplies by the attention matrix instead of its transpose: each value gets the weights of the "
           "wrong queries.",
           (edit(f"{ATT}:attention_backward", "dv = att.transpose(0, 1, 3, 2) @ dheads", "dv = att @ dheads"),)),
    Mutant("attention-key-bias-grad-zeroed",
           "The key bias gets a gradient of exactly zero instead of the computed one (a frozen key bias still gets "
           "none).",
           (edit(f"{ATT}:qkv_backward", "    return dx, grads",
                 '    grads["bk"] = None if grads["bk"] is None else np.zeros_like(grads["bk"])\n    return dx, grads'),),
           uncatchable="The true gradient of the key bias is zero: q.bk adds the same number to every score of "
                       "a query's row, and softmax ignores a constant added to a row. The computed dbk is zero "
                       "up to rounding (about 1e-17), so replacing it by an exact zero changes nothing a "
                       "tolerance can see."),
    # Flash attention.
    Mutant("flash-no-rescale",
           "The online softmax does not rescale the running sum and the partial output when a tile raises a "
           "row's maximum: the terms of earlier tiles keep their old, too large, weights.",
           (edit(f"{FLASH}:flash_core_forward", "rescale = np.exp(m_old - m_new)", "rescale = np.ones_like(m_new)"),)),
    Mutant("flash-tile-one-key-short",
           "Each tile of the forward stops one key early, so the last key of every tile is never attended to.",
           (edit(f"{FLASH}:flash_core_forward", "stop = min(start + tile, T)", "stop = min(start + tile - 1, T)"),)),
    Mutant("flash-backward-no-d",
           "The tiled backward drops the row term D = rowsum(dO * O) of the softmax's backward: dS = P dP "
           "instead of P (dP - D).",
           (edit(f"{FLASH}:flash_core_backward", "ds = p * (dp - big_d[..., start:, None])", "ds = p * dp"),)),
    # Activation checkpointing.
    Mutant("checkpoint-replays-from-the-output",
           "The checkpointed block keeps its output instead of its input, so the backward replays the block "
           "on the wrong activations.",
           (edit(f"{CKPT}:checkpointed_block_forward", "return y, BlockReplay(x, p, cfg)",
                 "return y, BlockReplay(y, p, cfg)"),)),
    Mutant("checkpoint-reuses-the-forward-cache",
           "The checkpointed block keeps the forward's whole cache and the backward reuses it instead of "
           "replaying: the gradients are right, but nothing is saved, the memory policy silently off.",
           (edit(f"{CKPT}:checkpointed_block_forward", "y, _ = block_forward(x, p, cfg, trace)",
                 "y, kept = block_forward(x, p, cfg, trace)"),
            edit(f"{CKPT}:checkpointed_block_forward", "return y, BlockReplay(x, p, cfg)",
                 "return y, BlockReplay(x, p, kept)"),
            edit(f"{CKPT}:checkpointed_block_backward", "_, cache = block_forward(replay.x, replay.p, replay.cfg)",
                 "cache = replay.cfg"))),
    # The block.
    Mutant("block-grad-drops-residual",
           "The block's backward drops the residual path around the feed-forward network: dh = dFFN instead "
           "of dy + dFFN.",
           (edit("transformer/block.py:block_backward", "dh = dy + dh_ffn", "dh = dh_ffn"),)),
    # Embeddings.
    Mutant("embedding-grad-fancy-index",
           "The token-table gradient is written with fancy-index assignment, which keeps one contribution per "
           "row: a token that occurs twice gets only one of its gradients.",
           (edit("transformer/embedding.py:embedding_backward",
                 "np.add.at(dtok_emb.reshape(-1), entries, dx.reshape(-1))",
                 "dtok_emb.reshape(-1)[entries] += dx.reshape(-1)"),)),
    Mutant("embedding-grad-index-wraps",
           "The token table's flat index id * d + j is computed in the ids' own dtype: with uint8 ids it wraps "
           "around past 255, and the gradient lands in the wrong rows.",
           (edit("transformer/embedding.py:embedding_backward", "rows = ids.reshape(-1, 1).astype(np.intp)",
                 "rows = ids.reshape(-1, 1)"),)),
    Mutant("position-grad-first-sequence-only",
           "The position-table gradient takes the first sequence of the batch instead of summing over all.",
           (edit("transformer/embedding.py:embedding_backward", "dx.reshape(-1, T, d).sum(axis=0)",
                 "dx.reshape(-1, T, d)[0]"),)),
    # The full model.
    Mutant("head-bias-grad-wrong-axis",
           "The output head's bias gradient is summed over the positions (axis 1) and then taken from the "
           "first sequence, instead of summed over the batch and the positions.",
           (edit("transformer/model.py:backward", 'grads["head_b"] = dhead_b',
                 'grads["head_b"] = dlogits.sum(axis=1)[0]'),)),
    Mutant("xavier-fan-in-only",
           "Initialisation draws from +-sqrt(6/fan_in) instead of +-sqrt(6/(fan_in + fan_out)).",
           (edit("transformer/model.py:init_params", "np.sqrt(6.0 / (fan_in + fan_out))",
                 "np.sqrt(6.0 / fan_in)"),)),
    Mutant("targets-not-shifted",
           "The training batches' targets are the inputs themselves instead of the next tokens.",
           (edit("transformer/data.py:sample_batch", "y = data[starts[:, None] + offsets + 1]",
                 "y = data[starts[:, None] + offsets]"),)),
    # The optimizer.
    Mutant("adamw-no-bias-correction",
           "AdamW skips the bias correction of both moments, so early steps are too small.",
           (edit("transformer/optim.py:adamw_param", "bias1 = 1.0 - cfg.beta1 ** t", "bias1 = 1.0"),
            edit("transformer/optim.py:adamw_param", "bias2_sqrt = math.sqrt(1.0 - cfg.beta2 ** t)",
                 "bias2_sqrt = 1.0")), about="transformer/optim.py:adamw_update"),  # adamw_update's per-parameter step
    Mutant("adamw-eps-inside-sqrt",
           "AdamW adds eps under the square root, sqrt(v + eps), instead of after it.",
           (edit("transformer/optim.py:adamw_param", "np.sqrt(v) / bias2_sqrt + cfg.eps",
                 "np.sqrt(v + cfg.eps) / bias2_sqrt"),), about="transformer/optim.py:adamw_update"),
    Mutant("weight-decay-on-layernorm-gains",
           "Weight decay also pulls the LayerNorm gains towards zero.",
           (edit("transformer/optim.py", '"ff2_w", "head_w")', '"ff2_w", "head_w", "ln1_g", "ln2_g", "lnf_g")'),),
           about="transformer/optim.py:is_decayed"),  # the edit is in DECAYED_SUFFIXES, which is_decayed reads
    Mutant("clipping-per-tensor",
           "Clipping scales each gradient by its own norm instead of all of them by the global norm.",
           (edit("transformer/optim.py:clip_grads", "return {k: g * scale for k, g in grads.items()}, norm",
                 "return {k: g * min(1.0, max_norm / (np.linalg.norm(g) + 1e-6)) for k, g in grads.items()}, "
                 "norm"),)),
    Mutant("warmup-starts-at-zero",
           "Warm-up counts from 0: the first step has learning rate 0 and the peak is reached one step late.",
           (edit("transformer/optim.py:lr_at", "peak_lr * (step + 1) / warmup_steps",
                 "peak_lr * step / warmup_steps"),)),
    # The training loop and the input checks.
    Mutant("validation-only-at-the-end",
           "The periodic tasks run after the last step only: no validation loss and no checkpoint every "
           "eval_every and ckpt_every steps along the way.",
           (edit("transformer/train.py:is_due", "return step % every == 0 or step == steps", "return step == steps"),)),
    Mutant("is-int-accepts-bool",
           "The one integer check forgets that bool is an int, so steps=True trains one step and top_k=True "
           "keeps one token.",
           (edit("transformer/config.py:is_int", "isinstance(value, (int, np.integer)) and not isinstance(value, bool)",
                 "isinstance(value, (int, np.integer))"),)),
    # NF4 and the NF4 linear layer.
    Mutant("nf4-nibble-order-swapped",
           "Packing puts the second code of a pair in the high nibble instead of the first. Unpacking still reads "
           "the first from the high nibble, so every pair of weights comes back swapped.",
           (edit(f"{NF4}:pack", "(codes[0::2] << 4) | codes[1::2]", "(codes[1::2] << 4) | codes[0::2]"),)),
    Mutant("nf4-offset-not-added-back",
           "Decoding the double-quantized scales forgets to add the offset back: every scale is off by the mean "
           "of the scales.",
           (edit(f"{NF4}:NF4Weight.scales", "* second + self.offset", "* second"),)),
    Mutant("nf4-absmax-not-divided",
           "Block-wise quantization does not divide a full block by its absmax: small weights are rounded against "
           "a code meant for [-1, 1], and most fall to its 0.",
           (edit(f"{NF4}:quantize_blocks", "scaled = np.clip(blocks * (np.float32(1) / np.maximum(absmax, "
                                           "np.float32(1e-38)))[:, None], -1, 1)",
                 "scaled = np.clip(blocks, -1, 1)"),)),
    Mutant("nf4-wrong-quantile-offset",
           "The positive half of the NF4 code starts at the quantile 1 - 1/32 instead of the QLoRA paper's "
           "midpoint, so its values are not bitsandbytes' and not the page's table.",
           (edit(f"{NF4}:nf4_code", "float32_linspace(NF4_OFFSET, 0.5, 9)", "float32_linspace(0.96875, 0.5, 9)"),)),
    Mutant("nf4-layer-last-rows-dropped",
           "The NF4 layer's forward loops only over whole groups of rows: the input rows past the last whole "
           "group never reach the output.",
           (edit(f"{QLIN}:nf4_linear_forward", "for start in range(0, q.shape[0], rows):",
                 "for start in range(0, q.shape[0] - rows + 1, rows):"),)),
    Mutant("nf4-layer-dx-from-the-first-rows",
           "The NF4 layer's backward decodes the first group of rows of W for every group, so each group of dx "
           "is computed with the wrong rows of the weight.",
           (edit(f"{QLIN}:nf4_linear_backward", "weight_rows(q, start, stop, scales)",
                 "weight_rows(q, 0, stop - start, scales)"),)),
    # Generation.
    Mutant("kv-cache-position-off-by-one",
           "Decoding with the KV cache gives the new token the position embedding of the next slot (pos + 1).",
           (edit("transformer/generate.py:decode_batch", 'params["pos_emb"][positions]',
                 'params["pos_emb"][positions + 1]'),)),
    # Serving: the page table, the pool, the replay, batching.
    Mutant("page-table-off-by-one-page",
           "The page table is read one logical page early: position p is looked up in page p // S - 1, which "
           "for the first page wraps round to the request's last page.",
           (edit(f"{KV}:PagedCache.slot", "self.pages[pos // self.pool.page_size]",
                 "self.pages[pos // self.pool.page_size - 1]"),)),
    Mutant("page-returned-twice",
           "Releasing a request hands its pages back but keeps them in its page table, so a replay appends new "
           "pages after stale ones and a second release returns the same pages again.",
           (edit(f"{KV}:PagedCache.release", "pages, self.pages, self.length = self.pages, [], 0",
                 "pages, self.length = self.pages, 0"),)),
    Mutant("pool-accepts-a-double-return",
           "The pool takes back a page that is not leased, so the same page can be leased to two requests.",
           (edit(f"{KV}:PagePool.give_back", "if page not in self.leased:", "if False:"),
            edit(f"{KV}:PagePool.give_back", "self.leased.remove(page)", "self.leased.discard(page)"))),
    Mutant("replay-from-the-wrong-offset",
           "At the context limit the request replays one token fewer than `keep`.",
           (edit("transformer/scheduler.py:Scheduler.retire", "r.restart(len(r.ids) - self.keep)",
                 "r.restart(len(r.ids) - self.keep + 1)"),)),
    Mutant("request-reads-another-requests-pages",
           "A batched step gathers each request's keys and values through another request's page table.",
           (edit(f"{KV}:PagePool.table", "for r, own in enumerate(tables):",
                 "for r, own in enumerate(tables[::-1]):"),)),
    Mutant("batched-decoding-without-the-own-mask",
           "Batched decoding lets every request attend to the padding up to the longest request's length.",
           (edit("transformer/generate.py:decode_batch", "np.where(np.arange(longest) < lengths[:, None], 0.0, -np.inf)",
                 "np.zeros((len(caches), longest))"),)),
    Mutant("sampling-groups-ignore-top-k",
           "The scheduler draws together the requests that share a temperature, with the top-k of the first.",
           (edit("transformer/scheduler.py:Scheduler.draw",
                 "alike.setdefault((r.request.temperature, r.request.top_k), [])",
                 "alike.setdefault((r.request.temperature,), [])"),
            edit("transformer/scheduler.py:Scheduler.draw",
                 "for (temperature, top_k), group in alike.items():",
                 "for (temperature,), group in alike.items():\n            top_k = group[0].request.top_k"))),
    Mutant("rows-drawn-with-one-generator",
           "Drawing several rows at once, every row takes its uniform draw from the first row's generator.",
           (edit("transformer/generate.py:sample_rows", "for row, rng in zip(cdf, rngs)]",
                 "for row, rng in zip(cdf, [rngs[0]] * len(rngs))]"),)),
    Mutant("rows-shifted-by-the-batch-max",
           "Drawing several rows at once, every row is shifted by the largest logit of the whole batch instead "
           "of its own, so at a tiny temperature every row but the one holding it is -inf everywhere.",
           (edit("transformer/generate.py:sample_rows", "z = (z - z.max(axis=-1, keepdims=True)) / temperature",
                 "z = (z - z.max()) / temperature"),)),
    Mutant("sampling-draws-from-an-infinite-logit",
           "A +inf logit (a diverged model's output) is let through to the draw, which then returns token 0 "
           "(or the argmax the first +inf) instead of refusing it.",
           (edit("transformer/generate.py:sample_rows", "undrawable = np.isnan(z) | np.isposinf(z)",
                 "undrawable = np.isnan(z)"),)),
    Mutant("sliding-window-one-token-short",
           "Once the text outgrows the context, the full recomputation sees one token less than the context holds.",
           (edit("transformer/generate.py:window_logits", "ids[-cfg.context_len:]", "ids[-cfg.context_len + 1:]"),)),
    # Fine-tuning: LoRA's start, its scale and gradients, and the frozen base.
    Mutant("lora-b-initialised-randomly",
           "B starts random like A, so the adapted model is not the base model at step 0.",
           (edit(f"{LORA}:init_adapters", "adapters[name] = np.zeros(shape, dtype=dtype)",
                 "adapters[name] = rng.uniform(-0.1, 0.1, size=shape).astype(dtype)"),)),
    Mutant("lora-scale-dropped",
           "The forward adds (x A) B without the factor alpha / r; the backward and merge keep it.",
           (edit(f"{LORA}:frozen_linear_forward", "y += w.scale * rows_matmul(xa, w.bm)", "y += rows_matmul(xa, w.bm)"),)),
    Mutant("lora-grad-a-without-scale",
           "dA is formed from dy B^T without the factor alpha / r.",
           (edit(f"{LORA}:frozen_linear_backward", "dxa = w.scale * rows_matmul(dy, w.bm.T)", "dxa = rows_matmul(dy, w.bm.T)"),
            edit(f"{LORA}:frozen_linear_backward", "dx += rows_matmul(dxa, w.a.T)",
                 "dx += w.scale * rows_matmul(dxa, w.a.T)"))),
    Mutant("lora-adapter-path-missing-from-dx",
           "dx of an adapted layer carries the frozen weight's part only, not the adapters'.",
           (edit(f"{LORA}:frozen_linear_backward", "dx += rows_matmul(dxa, w.a.T)", "dx += 0.0"),)),
    Mutant("lora-merge-forgets-the-scale",
           "Merging folds A B into W without alpha / r: the merged model is not the adapted one.",
           (edit(f"{LORA}:merge", "params[weight] + lora.scale * adapters[name]", "params[weight] + adapters[name]"),)),
    Mutant("gradient-formed-for-the-frozen-base",
           "The weights without adapters are passed on unwrapped, so the backward forms their full gradient "
           "x^T dy (time and memory) although nothing trains them.",
           (edit("transformer/finetune.py:frozen_params", "out[name] = Frozen(p)", "out[name] = p"),)),
    Mutant("finetune-learns-the-context-positions",
           "learn_from is ignored: the loss counts every position of the window.",
           (edit("transformer/finetune.py:adapter_loss_and_grads", "    if learn_from:", "    if False:"),)),
    Mutant("qlora-base-ignores-block-size2",
           "quantize_base drops the caller's block_size2: every weight's scales are double-quantized in groups of "
           "256, whatever was asked.",
           (edit("transformer/finetune.py:quantize_base", "quantize(p, block_size, block_size2=block_size2)",
                 "quantize(p, block_size)"),)),
    Mutant("qlora-bytes-count-nf4-as-float32",
           "weight_bytes counts an NF4 weight at the size of its float32 decoding, so the memory tables claim no "
           "saving for the base.",
           (edit("transformer/finetune.py:weight_bytes", "sum(p.nbytes for p in base.values())",
                 "sum(4 * int(np.prod(p.shape)) if isinstance(p, NF4Weight) else p.nbytes for p in base.values())"),)),
    Mutant("qlora-base-rounds-the-rest-to-float32",
           "quantize_base hands the arrays it does not quantize (embeddings, LayerNorms, biases) back in float32: "
           "a float64 model loses precision outside the NF4 weights.",
           (edit("transformer/finetune.py:quantize_base", "else p  # eq:qlora-base",
                 "else p.astype(np.float32)  # eq:qlora-base"),)),
    # The autograd engine: the three classic slips of a tape.
    Mutant("autograd-broadcast-not-undone",
           "unbroadcast only sums the leading axes numpy added, not the size-1 axes it stretched: a (B, T, 1) "
           "operand such as LayerNorm's mean receives the gradient of one entry of the row, not the row's sum.",
           (edit(f"{AG}:unbroadcast", "    if stretched:", "    if False:"),)),
    Mutant("autograd-topological-order-reversed",
           "backward runs the rules from the leaves to the root: a node's rule runs before its users have "
           "added their gradient into it.",
           (edit(AG, "for node in reversed(order):", "for node in order:"),), about=f"{AG}:backward"),
    Mutant("autograd-graph-not-freed",
           "backward leaves every node's parents and rule in place: a kept loss holds its whole graph, and "
           "self-referencing rules leak a graph a step.",
           (edit(AG, "node.parents, node.rule = (), None", "pass"),), about=f"{AG}:backward"),
    # The autograd engine's NaN and freed-graph rules: the same refusals as the hand-written layers'.
    Mutant("autograd-relu-backward-stops-nan",
           "The engine's ReLU multiplies the gradient by the mask out > 0, which is False for NaN: a NaN input "
           "gets a zero gradient (train --engine autograd would take a finite step from a NaN).",
           (edit(f"{AGF}:relu", "g * np.sign(out)", "g * (out > 0)"),)),
    Mutant("autograd-softmax-lets-a-fully-masked-row-through",
           "The engine's softmax does not refuse a row of -inf scores: the row becomes NaN.",
           (edit(f"{AGF}:detach_max", "    check_not_fully_masked(row_max, what)", "    pass"),)),
    Mutant("autograd-second-backward-is-silent",
           "A backward through a graph an earlier backward freed runs without a word and passes no gradient "
           "to the leaves.",
           (edit(f"{AG}:check_not_freed", "    if freed:", "    if False:"),)),
    # Reliability: the overflow-safe norm, the all-or-nothing step, NaN semantics, one run per folder.
    Mutant("global-norm-squares-before-scaling",
           "The global norm squares the entries first: huge finite gradients overflow to an infinite norm, and "
           "clipping would zero them.",
           (edit("transformer/optim.py:global_norm", "s = math.ldexp(1.0, math.frexp(largest)[1] - 1)", "s = 1.0"),)),
    Mutant("global-norm-multiplies-by-the-inverse",
           "The global norm scales by 1/s instead of dividing by s: the same bits, until the gradients are "
           "subnormal and 1/s overflows to inf in their dtype, and the norm is NaN.",
           (edit("transformer/optim.py:global_norm", "scaled = g / s", "scaled = g * (1.0 / s)"),)),
    Mutant("global-norm-scale-not-multiplied-back",
           "The root of the scaled squares is returned without the factor s: the norm of gradients far from 1 "
           "is off by that power of two.",
           (edit("transformer/optim.py:global_norm", "return s * math.sqrt(total)", "return math.sqrt(total)"),)),
    Mutant("adamw-commits-a-non-finite-gradient",
           "AdamW no longer checks the gradients: a NaN gradient is written into its parameter and moments.",
           (edit("transformer/optim.py:adamw_update", "    if bad is not None:\n        raise NonFiniteError(f\"the "
                 "gradient", "    if False:\n        raise NonFiniteError(f\"the gradient"),)),
    Mutant("train-step-ignores-a-nan-loss",
           "A step does not check its loss: a NaN loss with finite gradients is trained through.",
           (edit("transformer/step.py:finite_loss_and_grads", "    if not math.isfinite(loss):", "    if False:"),)),
    Mutant("stop-keeps-the-sampler-past-the-bad-batch",
           "Stopping at a step that is not finite saves the sampler after the bad batch: the checkpoint is not "
           "the last good step, and a resume silently skips the batch.",
           (edit("transformer/train.py:Session.refuse", "        run.rng.bit_generator.state = sampler_state\n",
                 ""),)),
    Mutant("run-folder-not-locked",
           "The folder lock is never taken: two runs into one --out overwrite each other's files.",
           (edit("transformer/runlock.py:FolderLock.acquire", "        if fcntl is None:", "        if True:"),)),
    Mutant("relu-backward-stops-nan",
           "ReLU's backward multiplies by the mask y > 0, which is False for NaN: a NaN input gets a zero gradient.",
           (edit("transformer/activations.py:relu_backward", "dx = dy * np.sign(y)", "dx = dy * (y > 0)"),)),
    Mutant("softmax-lets-a-fully-masked-row-through",
           "A row of -inf scores is not refused: its softmax is NaN.",
           (edit("transformer/softmax.py:check_not_fully_masked", "    if masked.any():", "    if False:"),)),
    Mutant("shards-weighted-equally",
           "A batch cut into shards averages the shards' means with equal weights, though a batch that does not "
           "divide evenly gives them different numbers of windows: the loss and gradients are off.",
           (edit("transformer/parallel.py:Sharded.__call__", "weights = [(b - a) / len(x) for a, b in rows]",
                 "weights = [1 / len(rows) for a, b in rows]"),)),
    Mutant("shard-parameters-shared-once",
           "The parameters are copied into the workers' shared memory only when its layout changes, at the first "
           "step: every later step, the workers compute their shards with the first step's parameters.",
           (edit(f"{SHARDS}:ShardWorkers.share", "        for name, array in params.items():\n"
                 "            np.copyto(self.params[name], array)",
                 "            for name, array in params.items():\n"
                 "                np.copyto(self.params[name], array)"),)),
    Mutant("shard-gradients-all-read-from-the-first-worker",
           "The parent reads every worker's gradients where the first worker wrote its own: with three shards or "
           "more, one shard's gradients count twice and another's not at all.",
           (edit(f"{SHARDS}:ShardWorkers.__call__", "(loss, self.grads[i])", "(loss, self.grads[0])"),)),
    Mutant("shard-workers-kept-after-a-failed-step",
           "A step cut short in the parent (its own shard fails, or Ctrl-C) leaves the workers running with their "
           "answers unread, and the next step takes those answers, the old batch's, for its own.",
           (edit(f"{SHARDS}:ShardWorkers.__call__", "self.close(now=len(answers) < len(shards))", "pass"),)),
    Mutant("exercise-start-overwrites-the-readers-file",
           "`exercise start` writes its skeleton over a file that exists without --force: the reader's work is lost.",
           (edit("transformer/exercise_cli.py:cmd_exercise", "if target.exists() and not args.force:", "if False:"),)),
    Mutant("exercise-numbers-never-differ",
           "The grader's comparison of the reader's numbers with the reference's ignores the gap: a wrong forward "
           "or gradient passes the tiny example and PyTorch.",
           (edit("transformer/exercise_checks.py:same", "if (gap > tol and worst > floor) or",
                 "if (gap > tol and worst > floor and False) or"),)),
    Mutant("exercise-central-differences-not-compared",
           "The grader computes central differences but never fails on them: a backward that is not the derivative "
           "of its forward passes that check.",
           (edit("transformer/exercise_checks.py:pair_checks", "            if not check_passes(",
                 "            if False and not check_passes("),)),
    Mutant("padding-keeps-the-pages-leftovers",
           "A batched step reads past each request's length whatever an earlier request left in its last page: "
           "a NaN or an infinity there survives the mask and reaches every request of the batch.",
           (edit("transformer/kv_cache.py:BatchStep.read", "            if past.any():", "            if False:"),)),
    Mutant("lora-scale-alpha-only",
           "The adapters' correction is scaled by alpha instead of alpha / r: r times too large, and every check "
           "that reads the scale from the same property agrees with it.",
           (edit(f"{LORA}:LoRAConfig.scale", "return self.alpha / (math.sqrt(self.rank) if self.rank_stabilized "
                 "else self.rank)", "return self.alpha"),)),
    Mutant("rslora-scale-over-r",
           "Rank-stabilized LoRA scales by alpha / r like plain LoRA instead of alpha / sqrt(r).",
           (edit(f"{LORA}:LoRAConfig.scale", "math.sqrt(self.rank) if self.rank_stabilized", "self.rank if "
                 "self.rank_stabilized"),)),
    Mutant("autograd-cross-entropy-picks-by-one-hot",
           "The engine's cross-entropy picks each target's log-probability by multiplying with a one-hot array: a "
           "class whose logit is -inf gives 0 * -inf = NaN, where the hand-written loss is finite.",
           (edit("transformer/autograd_model.py:cross_entropy",
                 "return -embedding(log_probs.reshape((n * n_v, 1)), rows).sum() * (1.0 / n)",
                 "return -(log_probs * np.eye(n_v, dtype=z.data.dtype)[np.asarray(targets).reshape(-1)]).sum() "
                 "* (1.0 / n)"),)),
    Mutant("time-range-takes-any-shape",
           "The time-range cross-entropy takes logits that are not windows: two-dimensional logits fail inside "
           "with an IndexError, and targets of another shape with a broadcasting error, not the library's error.",
           (edit("transformer/softmax.py:cross_entropy_time_range_forward",
                 "    if logits.ndim != 3 or targets.shape != logits.shape[:2]:", "    if False:"),)),
    Mutant("nf4-overflow-called-non-finite",
           "A finite float64 weight too large for float32 is cast first and then refused as not finite: the "
           "message names the wrong problem.",
           (edit(f"{NF4}:quantize", "    if largest > float(np.finfo(np.float32).max):", "    if False:"),)),
    Mutant("clipping-takes-a-negative-max-norm",
           "clip_grads takes a negative max_norm: the factor max_norm / norm is negative and every gradient's sign "
           "flips, so a step climbs the loss.",
           (edit("transformer/optim.py:clip_grads",
                 "    if max_norm is not None and not (is_finite_number(max_norm) and max_norm > 0):",
                 "    if False:"),)),
    Mutant("flash-takes-any-tile",
           "Flash attention takes a tile that is not a positive integer: 0 stops range() inside, a negative one "
           "leaves every row's sum at 0 and the output NaN without an error.",
           (edit(f"{FLASH}:flash_core_forward", "    check_tile(tile)\n", ""),)),
    Mutant("gelu-of-minus-infinity-is-nan",
           "GELU at x = -inf computes x Phi(x) = -inf * 0 = NaN instead of its limit 0: a diverged model's "
           "infinite pre-activation becomes a NaN.",
           (edit("transformer/activations.py:gelu_forward", "    y[phi_cdf == 0] = 0", "    pass"),)),
    Mutant("gelu-slope-at-infinity-is-nan",
           "GELU's derivative at x = +-inf computes x phi(x) = inf * 0 = NaN instead of its limit 0, so the "
           "slope is NaN where it is 1 or 0.",
           (edit("transformer/activations.py:gelu_backward", "    x_phi[phi_pdf == 0] = 0", "    pass"),)),
    Mutant("config-takes-any-size",
           "ModelConfig takes a size of 10**30: the mistake surfaces later, as an allocation that fails or an index "
           "that overflows, instead of at the config, by name.",
           (edit("transformer/config.py:check_size", "    if value > MAX_SIZE:", "    if False:"),)),
    Mutant("sigterm-kills-the-run-at-once",
           "SIGTERM is left to its default: a run stopped by `timeout` or a scheduler dies at once, and every step "
           "since the last periodic checkpoint is lost.",
           (edit("transformer/train.py:StopRequest.__enter__", "for sig in self.REASONS}",
                 "for sig in self.REASONS if sig == signal.SIGINT}"),)),
    Mutant("chunk-sees-its-later-tokens",
           "A chunk fed with `extend` lets each of its tokens attend to the chunk's later tokens too: the cache and "
           "the logits are no longer the prompt's.",
           (edit("transformer/generate.py:extend", "<= (start + np.arange(n))[:, None]", "<= (start + n - 1)"),)),
    Mutant("prefix-key-of-the-page-alone",
           "A page is found by its own tokens alone, not by every token before it: a page holding the same tokens "
           "after another beginning is shared, though its keys and values are not the same.",
           (edit("transformer/prefix_cache.py:PrefixPool.lookup", "tuple(tokens[:end])", "tuple(tokens[end - S:end])"),
            edit("transformer/prefix_cache.py:PrefixPool.register", "tuple(tokens[:(i + 1) * S])",
                 "tuple(tokens[i * S:(i + 1) * S])"))),
    Mutant("prefix-page-freed-while-shared",
           "A shared page goes back to the free list when the first of its readers lets it go: the next lease "
           "overwrites keys and values another request still reads.",
           (edit("transformer/prefix_cache.py:PrefixPool.give_back", "        if self.refs[page]:\n            return",
                 "        if False:\n            return"),)),
    Mutant("prefix-last-token-not-computed",
           "A request whose whole prompt is in cached pages adopts them all, and has no token left to compute the "
           "logits of its next token from.",
           (edit("transformer/scheduler.py:Scheduler.admit", "self.pool.lookup(r.text[:-1])",
                 "self.pool.lookup(r.text)"),)),
    Mutant("chunk-ignores-the-budget",
           "A prompt is fed whole whatever the budget: one step does all of a long prompt's work while the decoding "
           "requests wait.",
           (edit(f"{SCHED}:Scheduler.plan", "n = 1 if r.decoding else min(r.unfed, budget)",
                 "n = 1 if r.decoding else r.unfed"),)),
    Mutant("preempt-the-oldest",
           "When the pool runs short the oldest running request gives its pages back, not the youngest.",
           (edit(f"{SCHED}:Scheduler.plan", "victim = max(self.running, key=lambda x: x.order)",
                 "victim = min(self.running, key=lambda x: x.order)"),)),
    Mutant("preempted-request-readmitted-at-once",
           "A request that gave way in a step may be admitted again in the same step (with a prefix cache it "
           "adopts its own pages again), and gives way again at the next.",
           (edit(f"{SCHED}:Scheduler.admit", " and self.waiting[0] not in gone:", ":"),)),
    Mutant("restart-keeps-decoding",
           "A request that restarts (a replay, or a preemption) still counts as decoding, so it is fed one id "
           "instead of its text.",
           (edit(f"{SCHED}:Running.restart", "self.start, self.logits, self.decoding = start, None, False",
                 "self.start, self.logits = start, None"),)),
    Mutant("promise-counts-shared-pages-once",
           "Without preemption, a page shared by several requests is counted once in the promise: a request that "
           "replays lets go of its copy while another still reads it, and the pool runs dry.",
           (edit(f"{SCHED}:Scheduler.admit",
                 "sum(self.pages_needed(r.request) for r in self.running) - len(held)",
                 "sum(self.pages_needed(r.request) - len(r.cache.pages) for r in self.running)"),
            edit(f"{SCHED}:Scheduler.admit", "else self.pages_needed(r.request)",
                 "else self.pages_needed(r.request) - len(shared) + revived"),
            edit(f"{SCHED}:Scheduler.admit", "promised += self.pages_needed(r.request) - len(set(r.cache.pages) - held)",
                 "promised += self.pages_needed(r.request) - len(r.cache.pages)"))),
    Mutant("decoded-pages-not-named",
           "Only the pages a prompt fills are named for the prefix cache: a conversation's next turn, whose text "
           "begins with the last turn's answer, computes the answer's pages again.",
           (edit(f"{SCHED}:Scheduler.feed", "if r.cache.length % self.pool.page_size == 0:", "if False:"),)),
    Mutant("release-first-page-first",
           "A cache gives its pages back first page first: a prefix cache then takes back a text's first page "
           "before its later ones, which can no longer be found without it.",
           (edit(f"{KV}:PagedCache.release", "for page in reversed(pages):", "for page in pages:"),)),
)
