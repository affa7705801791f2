"""Generator of the Fine-tuning chapter's quiz (site_scripts/pages/_quiz.py): what LoRA adds and how it
starts, the rank it refuses, what NF4 costs per weight and what QLoRA stores in it, each answer and each wrong
choice computed by the fine-tuning code itself (`adapter_shapes`, `init_adapters` and `merge`, `quantize` and
`payload_bytes`, `quantize_base`)."""

import inspect

import numpy as np

from transformer.config import PRESETS
from transformer.errors import ConfigError
from transformer.finetune import quantize_base
from transformer.lora import LoRAConfig, adapter_shapes, init_adapters, merge
from transformer.model import init_params, param_count, param_shapes
from transformer.nf4 import NF4Weight, payload_bytes, quantize

from ..sections import page_link
from ._quiz import Choice, Question, page

DEFAULT, TINY = PRESETS["default"], PRESETS["tiny"]


def size(shape):
    return int(np.prod(shape))


def adapter_count():
    """The scalars LoRA's defaults add to the default model, summed from `adapter_shapes`, against one adapted
    matrix, one block, and the adapted matrices themselves."""
    lora, shapes = LoRAConfig(), param_shapes(DEFAULT)
    adapters = adapter_shapes(shapes, lora)
    added = sum(size(s) for s in adapters.values())
    adapted = [name.removesuffix(".lora_a") for name in adapters if name.endswith(".lora_a")]
    first = adapted[0]
    one = size(adapters[f"{first}.lora_a"]) + size(adapters[f"{first}.lora_b"])
    block = sum(size(s) for name, s in adapters.items() if name.startswith("b0."))
    full = sum(size(shapes[name]) for name in adapted)
    n_in, n_out = shapes[first]
    return Question(
        "quiz-lora-count",
        f"LoRA with its defaults (rank \\(n_r\\) = {lora.rank}, targets {' and '.join(lora.targets)}) on the default "
        f"model (\\(d\\) = {DEFAULT.emb_dim}, \\(L\\) = {DEFAULT.num_layers} blocks): how many trained scalars do "
        f"the adapters add?",
        (Choice(str(added),
                f"Each adapted weight \\(W\\) {shapes[first]} gets \\(W_A\\) {adapters[first + '.lora_a']} and "
                f"\\(W_B\\) {adapters[first + '.lora_b']}: \\(n_r (n_{{\\mathrm{{in}}}} + n_{{\\mathrm{{out}}}})\\) = "
                f"{lora.rank} × ({n_in} + {n_out}) = {one}. There are {len(adapted)} such weights "
                f"({', '.join(f'`{n}`' for n in adapted)}): {added} scalars, {added / param_count(DEFAULT):.1%} "
                f"of the model's {param_count(DEFAULT)}.", right=True),
         Choice(str(one),
                f"That is one adapted matrix, `{first}`. The targets are adapted in every block: "
                f"{len(adapted)} matrices of {one}."),
         Choice(str(block),
                f"That is block 0's adapters only. Each of the {DEFAULT.num_layers} blocks has its own "
                f"{' and '.join(lora.targets)} projections, and each gets its adapters."),
         Choice(str(full),
                f"That is the size of the adapted matrices themselves, what fine-tuning them fully would train. "
                f"LoRA freezes them and trains two thin factors beside each: {added} scalars, "
                f"{added / full:.0%} of it.")),
        page_link("quiz_finetuning", "lora", "adapter-shapes"), "LoRA: adapters at the real configuration")


def adapters_start():
    """How far the adapted model starts from the base: `merge` of freshly drawn adapters gives the base back
    exactly, because `init_adapters` zeroes every W_B (and draws W_A)."""
    lora = LoRAConfig(rank=2)
    params = init_params(TINY, seed=0)
    adapters = init_adapters(param_shapes(TINY), lora, seed=0)
    merged = merge(params, adapters, lora)
    moved = max(float(np.abs(merged[name] - params[name]).max()) for name in params)
    a = max(float(np.abs(v).max()) for name, v in adapters.items() if name.endswith(".lora_a"))
    b = max(float(np.abs(v).max()) for name, v in adapters.items() if name.endswith(".lora_b"))
    if moved != 0 or b != 0 or a == 0:
        raise ValueError("the adapters no longer start with W_B = 0: rewrite this question")
    limit = 1 / np.sqrt(TINY.emb_dim)
    return Question(
        "quiz-lora-start",
        "Right after `init_adapters`, how does the adapted model's output differ from the base model's?",
        (Choice("Not at all: \\(W_B\\) starts at zero, so the correction \\(s_{\\mathrm{LoRA}}\\, x W_A W_B\\) is 0",
                f"Every entry of every \\(W_B\\) is 0, while \\(W_A\\) is drawn uniform in "
                f"\\(\\pm 1/\\sqrt{{n_{{\\mathrm{{in}}}}}}\\) (largest entry here {a:.4f}). Merging the fresh "
                f"adapters into the tiny model gives its weights back exactly: the largest difference is {moved:g}.",
                right=True),
         Choice("Not at all, because \\(W_A\\) starts at zero",
                f"The zero is on the other side: \\(W_A\\) is drawn, its entries up to {a:.4f} here (within "
                f"\\(\\pm\\){limit:g}), and \\(W_B\\) is 0. With both at zero, neither would ever get a gradient, "
                f"since each one's gradient is a product with the other."),
         Choice("By a little: both adapters start small and random",
                f"Only \\(W_A\\) is random (entries up to {a:.4f}); the largest entry of any \\(W_B\\) is {b:g}. "
                f"Starting exactly at the base model means fine-tuning begins from what the base already does."),
         Choice(f"By the scale: \\(s_{{\\mathrm{{LoRA}}}} = \\alpha_{{\\mathrm{{LoRA}}}}/n_r\\) = {lora.scale:g} "
                f"multiplies the output",
                f"The scale {lora.scale:g} multiplies the correction \\(x W_A W_B\\) only, never the base's output, "
                f"and the correction is 0 at the start.")),
        page_link("quiz_finetuning", "lora", "eq-lora-init"), "LoRA: the adapters' start")


def rank_too_large():
    """What `adapter_shapes` does with a rank above a targeted weight's smaller side: the error it raises, read
    from a call on the tiny model."""
    rank = TINY.emb_dim + 1
    try:
        adapter_shapes(param_shapes(TINY), LoRAConfig(rank=rank))
    except ConfigError as e:
        refusal = str(e)
    else:
        raise ValueError(f"adapter_shapes accepted rank {rank} on the tiny model: rewrite this question")
    d = TINY.emb_dim
    return Question(
        "quiz-lora-rank",
        f"On the tiny model (\\(d\\) = {d}, so \\(W_q\\) is {d} × {d}), you ask for LoRA rank \\(n_r\\) = {rank} "
        f"on q and v. What happens?",
        (Choice("`adapter_shapes` refuses it with a `ConfigError`",
                f"It says: `{refusal}`. \\(W_A W_B\\) is a {d} × {d} matrix, so its rank is at most {d}: a larger "
                f"\\(n_r\\) buys nothing, and it would train more numbers than the weight itself holds.", right=True),
         Choice(f"It trains \\(W_A\\) {(d, rank)} and \\(W_B\\) {(rank, d)} per adapted weight",
                f"That would be {rank * 2 * d} scalars to correct a weight of {d * d}, and their product could not "
                f"have rank {rank} anyway: it is {d} × {d}. `adapter_shapes` refuses: `{refusal}`."),
         Choice(f"The rank is lowered to {d} without a word",
                f"Nothing is lowered silently: `adapter_shapes` raises, so the mistake is seen when the run starts. "
                f"It says: `{refusal}`.")),
        page_link("quiz_finetuning", "lora", "command-line"), "LoRA: the command line and its refusals")


def nf4_bytes():
    """The bytes per weight of NF4, measured on block 0's feed-forward weight of the default model by
    `quantize` and equal to `payload_bytes`, against forgetting the scales, keeping them in float32, and
    giving each 4-bit code a byte of its own."""
    w = init_params(DEFAULT, seed=0)["b0.ff1_w"]
    n = w.size
    stored = quantize(w).nbytes
    if stored != payload_bytes(n):
        raise ValueError("quantize's bytes differ from payload_bytes: rewrite this question")
    codes = -(-n // 2)  # two 4-bit codes to a byte
    scales = stored - codes
    plain = payload_bytes(n, double=False)
    blocks = (plain - codes) // 4
    block_size = inspect.signature(quantize).parameters["block_size"].default
    return Question(
        "quiz-nf4-bytes",
        f"Block 0's `ff1_w` of the default model, {w.shape[0]} × {w.shape[1]} = {n} weights, is stored in NF4 with "
        f"blocks of {block_size} and double quantization, as QLoRA stores it. How many bytes per weight does it take?",
        (Choice(f"{stored / n:.4f}",
                f"`quantize` stores {stored} bytes ({8 * stored / n:.2f} bits a weight): {codes} bytes of codes, two "
                f"4-bit codes to a byte, and {scales} bytes for the {blocks} blocks' scales, each an 8-bit code, "
                f"with their own float32 scale and offset.", right=True),
         Choice(f"{codes / n:.4f}",
                f"Four bits a weight counts the codes alone. Each block of {block_size} weights also needs its "
                f"absmax scale: {scales} bytes more here."),
         Choice(f"{plain / n:.4f}",
                f"That keeps the {blocks} scales in float32, four bytes each ({4 * blocks} bytes). Double "
                f"quantization stores each in one byte: {stored} bytes in all instead of {plain}."),
         Choice(f"{(n + scales) / n:.4f}",
                f"That gives each 4-bit code a byte of its own. Two codes share a byte, the first in the high "
                f"nibble: {codes} bytes of codes, not {n}.")),
        page_link("quiz_finetuning", "nf4", "eq-nf4-payload"), "NF4 and double quantization: bytes")


def qlora_base():
    """What QLoRA stores in NF4, read from `quantize_base` run on the tiny model: the linear layers' weights
    alone, against every parameter, every matrix, and the adapters."""
    params = init_params(TINY, seed=0)
    stored = quantize_base(params)
    nf4 = [name for name, p in stored.items() if isinstance(p, NF4Weight)]
    kept = [name for name in stored if name not in nf4]
    tables = [name for name in kept if np.ndim(params[name]) == 2]
    kinds = sorted({name.rsplit(".", 1)[-1] for name in nf4})
    return Question(
        "quiz-qlora-base",
        "QLoRA stores the frozen base in NF4. Which of its parameters does `quantize_base` store that way?",
        (Choice("The weights of the linear layers",
                f"{', '.join(f'`{k}`' for k in kinds)}: in the tiny model {len(nf4)} of its {len(stored)} "
                f"arrays. The biases, the LayerNorms' gains and shifts and the embedding tables grow with \\(d\\), "
                f"not \\(d^2\\), and stay as they are.", right=True),
         Choice("Every parameter of the base",
                f"{len(kept)} arrays of the tiny model stay as they were: the biases, the LayerNorms and the "
                f"embedding tables, small beside the weights."),
         Choice("Every matrix, the embedding tables included",
                f"The tables {', '.join(f'`{t}`' for t in tables)} are matrices too, but no linear layer multiplies "
                f"by them: a lookup reads a few of their rows, and they stay as they are."),
         Choice("The base's weights and the LoRA adapters",
                "The adapters are what is trained: they, their gradients and their AdamW moments stay in full "
                "precision. Only the frozen base is quantized.")),
        page_link("quiz_finetuning", "qlora", "eq-qlora-base"), "QLoRA: the stored base")


def questions():
    """The quiz's questions, in the order of the chapter's pages."""
    return [adapter_count(), adapters_start(), rank_too_large(), nf4_bytes(), qlora_base()]


def generate(context):
    return page(questions())
