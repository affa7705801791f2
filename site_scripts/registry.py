"""Every page of the site, declared once: where it lives, its place in the navigation, and what the
standard anatomy of a component page shows for it.

The hook builds mkdocs' navigation from PAGES, and renders the anatomy into every docs page that holds
the line `<!-- anatomy -->` (see site_scripts/anatomy.py). A page's generator,
site_scripts/pages/<id>.py, is optional: it adds the fragments only that page has (a tiny example, a
symbol table); the fragments every component page has (listings, the connection table of its equations, devices,
where it is used, status, provenance) come from the entry alone. To add a page: write its prose in
docs/, add an entry here, and, if it shows numbers of its own, a generator.

Functions and classes are named as "module:name" of the transformer package, never imported: a page's
cache key follows what its entry names and what its generator imports, so importing them here would
tie every page to every function.
"""

from dataclasses import dataclass


@dataclass(frozen=True)
class Rows:
    """A page's rows of the device cross-check: `select` maps a check (forward, loss, intermediate,
    gradient, kv-cache) to the tensor names it keeps, as shell patterns; `what` says what torch ran."""
    what: str
    select: dict


@dataclass(frozen=True)
class Steps:
    """A page's optimizer or training steps of the cross-check, one row per device and step."""
    check: str  # "adamw step" or "train step"
    what: str


@dataclass(frozen=True)
class Page:
    id: str  # the page's name: its generator, its fragments' folder, its links (page_link)
    path: str  # under docs/ (or the notebook's page under experiments/)
    title: str  # in the navigation
    section: str = ""  # the navigation section; "" for a top-level page
    # "module:name" of what the page explains: "Where is it used?" lists their callers and tests, and a
    # page with functions shows the standard sections read from the code (listings, equations, status).
    functions: tuple = ()
    listings: tuple = ()  # "module:name" listed besides the functions that mark the page's equations
    seeds: tuple = ()  # what the page draws with the site's seed (examples.SEED), for its provenance
    crosscheck: Rows | Steps | None = None
    # Code and files the generator runs in ways its imports do not show (a subprocess, copies of the
    # package): "module:name" units, "transformer" for the whole package, paths of files or folders whose
    # text is hashed (a folder: its .py files), or "mode" for a page whose content differs in the quick
    # build (SITE_QUICK=1). The build refuses a name or a path that does not exist.
    reads: tuple = ()
    notebook: bool = False  # rendered from notebooks/<id>.py (site_scripts/notebooks.py)
    generated: bool = True  # False: a page with no fragments (its text is all prose)
    # Why its generator or notebook must run with nothing beside it ("" : it may run beside others): it times
    # what it runs, or uses every core itself (site_scripts/schedule.py).
    alone: str = ""
    # False: the print edition keeps the page's title and opening paragraph and sends the reader to the site for
    # the rest (the API reference: the docstrings again, long in print and looked things up in online).
    printed: bool = True

    @property
    def units(self):
        """The transformer units the entry names, as (module, name)."""
        return {tuple(u.split(":")) for u in (*self.functions, *self.listings, *self.reads) if ":" in u}


EXAMPLE_SEEDS = ("init_params", "gradient check")  # a page with a tiny example and a gradient check

PAGES = (
    Page("home", "index.md", "Home"),
    Page("tokenizer", "model/tokenizer.md", "Tokenizer", "Model",
         functions=("data:make_tokenizer", "data:CharTokenizer", "data:ByteTokenizer", "bpe:GPT2Tokenizer",
                    "bpe:pre_tokenize"),
         listings=("data:CharTokenizer", "data:ByteTokenizer", "data:make_tokenizer", "bpe:byte_to_char",
                   "bpe:char_class", "bpe:pre_tokenize", "bpe:GPT2Tokenizer")),
    Page("embeddings", "model/embeddings.md", "Embeddings", "Model",
         functions=("embedding:embedding_forward", "embedding:embedding_backward"), seeds=EXAMPLE_SEEDS,
         crosscheck=Rows("torch indexing (`tok_emb[ids] + pos_emb[:T]`) and autograd",
                         {"intermediate": ("embedding",), "gradient": ("tok_emb", "pos_emb")})),
    Page("linear", "model/linear.md", "Linear / ReLU / GELU / Initialisation", "Model",
         functions=("linear:linear_forward", "linear:linear_backward", "activations:relu_forward",
                    "activations:relu_backward", "activations:gelu_forward", "activations:gelu_backward"), seeds=EXAMPLE_SEEDS,
         crosscheck=Rows("torch's `@`, `F.relu` and autograd (the feed-forward and head layers)",
                         {"gradient": ("*.ff1_w", "*.ff1_b", "*.ff2_w", "*.ff2_b", "head_w", "head_b")})),
    Page("layernorm", "model/layernorm.md", "LayerNorm", "Model",
         functions=("layernorm:layer_norm_forward", "layernorm:layer_norm_backward"), seeds=EXAMPLE_SEEDS,
         crosscheck=Rows("torch's `F.layer_norm` and autograd",
                         {"intermediate": ("*.ln1", "*.ln2", "lnf"), "gradient": ("*ln*",)})),
    Page("softmax", "model/softmax.md", "Softmax & Cross-Entropy", "Model",
         functions=("softmax:softmax_forward", "softmax:softmax_backward", "softmax:cross_entropy_forward",
                    "softmax:cross_entropy_backward"), listings=("softmax:check_not_fully_masked",),
         seeds=EXAMPLE_SEEDS,
         crosscheck=Rows("torch's `F.cross_entropy` (the logits and the loss)", {"forward": ("*",), "loss": ("*",)})),
    Page("attention", "model/attention.md", "Attention", "Model",
         functions=("attention:attention_forward", "attention:attention_backward"), seeds=EXAMPLE_SEEDS,
         crosscheck=Rows("torch matmuls, a masked `torch.softmax` and autograd",
                         {"intermediate": ("*.attention",),
                          "gradient": ("*.wq", "*.bq", "*.wk", "*.bk", "*.wv", "*.bv", "*.wo", "*.bo")})),
    # The memory figure and table measure each policy at fewer lengths in the quick build.
    Page("flash_attention", "model/flash-attention.md", "Flash attention", "Model",
         functions=("flash_attention:flash_attention_forward", "flash_attention:flash_attention_backward",
                    "flash_attention:flash_core_forward", "flash_attention:flash_core_backward"),
         listings=("flash_attention:tile_scores", "flash_attention:diagonal_mask", "flash_attention:FlashCache"),
         seeds=EXAMPLE_SEEDS, reads=("mode", "reports/gpt2-cost.json"),
         crosscheck=Rows("the torch mirror with `torch.nn.functional.scaled_dot_product_attention(is_causal=True)` "
                         "and autograd (the whole model); our tiled core against torch's own flash kernel "
                         "(`sdpa_kernel(SDPBackend.FLASH_ATTENTION)`; float16 on CUDA)",
                         {"flash": ("*",), "flash kernel": ("*",)})),
    Page("block", "model/block.md", "Transformer Block", "Model",
         functions=("block:block_forward", "block:block_backward"), listings=("block:block_params",), seeds=EXAMPLE_SEEDS,
         crosscheck=Rows("the torch mirror of a block (`torch_block`) and autograd",
                         {"intermediate": ("*.out",), "gradient": ("b[0-9]*.*",)})),
    Page("model", "model/full-model.md", "Full Model", "Model",
         functions=("model:forward", "model:backward", "model:loss_and_grads", "model:param_count"),
         listings=("model:param_shapes", "model:check_ids", "model:check_params", "model:backward",
                   "model:check_targets", "model:loss_and_grads", "config:is_int", "config:check_size"), seeds=EXAMPLE_SEEDS,
         crosscheck=Rows("the torch mirror (`torch_forward`, `F.cross_entropy`) and autograd",
                         {"forward": ("*",), "loss": ("*",), "gradient": ("*",)})),
    Page("explorer", "model/explorer.md", "Forward and backward, explored", "Model",
         seeds=("init_params", "biases and gains moved")),
    Page("gpt2", "model/gpt2.md", "The same model as GPT-2", "Model",
         functions=("gpt2:from_hf", "gpt2:to_hf", "gpt2:load_gpt2", "gpt2:save_gpt2", "gpt2:read_safetensors",
                    "gpt2:write_safetensors", "crosscheck_hf:check_transformers",
                    "torch_zip:read_torch_zip"),
         listings=("gpt2:hf_names", "gpt2:drop_mask_buffers", "gpt2:config_from_hf", "gpt2_cli:cmd_import_gpt2",
                   "torch_zip:StateUnpickler", "torch_zip:rebuild_tensor"),
         seeds=("the random GPT-2",), reads=("reports/gpt2-cost.json",)),
    Page("quiz_model", "model/quiz.md", "Quiz: the model", "Model"),
    Page("optim", "training/optim.md", "AdamW / Learning rate / Clipping", "Training",
         functions=("optim:adamw_update", "optim:lr_at", "optim:clip_grads"),
         listings=("optim:is_decayed", "optim:adamw_init", "optim:adamw_update", "optim:global_norm"),
         seeds=("init_params",),
         crosscheck=Steps("adamw step", "Our `adamw_update` against `torch.optim.AdamW` with the same decay groups, "
                          "both fed our gradients, for ten steps; every parameter is compared after each step.")),
    Page("training", "training/loop.md", "Training loop & data", "Training",
         functions=("data:sample_batch", "step:train_step", "step:evaluate", "train:train", "train:training_loop"),
         listings=("data:train_val_split", "data:eval_windows", "step:train_step", "step:finite_loss_and_grads",
                   "step:evaluate",
                   "train:train", "train:training_loop", "train:is_due", "train:Session", "train:Hooks",
                   "train:StopRequest",
                   "run_folder:RunFolder", "runlock:FolderLock",
                   "shard_processes:ShardWorkers", "shard_processes:serve"),
         seeds=("training and sampling",),
         crosscheck=Steps("train step", "Ten whole training steps on each side, each with its own "
                          "gradients (NumPy backward against torch autograd) and its own AdamW; every parameter "
                          "is compared after each step.")),
    Page("activation_checkpoint", "training/activation-checkpointing.md", "Activation checkpointing", "Training",
         functions=("activation_checkpoint:checkpointed_block_forward",
                    "activation_checkpoint:checkpointed_block_backward"),
         listings=("activation_checkpoint:BlockReplay",), seeds=EXAMPLE_SEEDS, reads=("mode", "reports/gpt2-cost.json"),
         crosscheck=Rows("the torch mirror with every block wrapped in `torch.utils.checkpoint.checkpoint` and "
                         "autograd", {"checkpointed": ("*",)})),
    Page("checkpoints", "training/checkpoints.md", "Checkpoints", "Training",
         functions=("checkpoint:save_checkpoint", "checkpoint:load_checkpoint"),
         listings=("checkpoint:save_checkpoint", "checkpoint:load_checkpoint"), seeds=("init_params",)),
    Page("quiz_training", "training/quiz.md", "Quiz: training", "Training"),
    # Fine-tuning: LoRA, then (the NF4 page's place) NF4 and double quantization, then QLoRA. Both pages run the
    # command line in-process and train small models; the QLoRA page measures fewer configs in the quick build.
    Page("lora", "finetuning/lora.md", "LoRA", "Fine-tuning",
         functions=("lora:frozen_linear_forward", "lora:frozen_linear_backward", "lora:init_adapters", "lora:merge",
                    "finetune:adapter_loss_and_grads", "softmax:cross_entropy_time_range_forward",
                    "softmax:cross_entropy_time_range_backward"),
         listings=("lora:LoRAConfig", "lora:adapter_shapes", "lora:Frozen", "lora:FrozenCache",
                   "finetune:frozen_params", "finetune:adapter_loss_and_grads"),
         seeds=EXAMPLE_SEEDS + ("training and sampling",),
         crosscheck=Rows("the torch mirror with every weight `W + (alpha / r) A B`, A and B torch leaf tensors, and "
                         "autograd (every target adapted, rank 4); the loss over part of a window against "
                         "`F.cross_entropy` over the same positions", {"lora": ("*",), "time range": ("*",)})),
    # bitsandbytes, where installed, is the independent implementation the NF4 page compares with.
    Page("nf4", "finetuning/nf4.md", "NF4 and double quantization", "Fine-tuning",
         functions=("nf4:quantize", "nf4:dequantize", "nf4:NF4Weight", "nf4:nf4_code", "nf4:dynamic_code",
                    "nf4:pack", "nf4:unpack", "nf4:dequantize_range", "nf4:payload_bytes",
                    "quantized_linear:nf4_linear_forward", "quantized_linear:nf4_linear_backward"),
         listings=("nf4:float32_linspace", "quantized_linear:weight_rows"), seeds=("weights", "inputs")),
    Page("qlora", "finetuning/qlora.md", "QLoRA", "Fine-tuning",
         functions=("finetune:quantize_base", "finetune:dense_base", "finetune:weight_bytes",
                    "finetune_run:stored_base"),
         listings=("finetune:dense_base", "finetune:weight_bytes", "finetune_run:stored_base"),
         seeds=EXAMPLE_SEEDS + ("training and sampling",), reads=("mode",), alone="it times the steps of each config",
         crosscheck=Rows("the torch mirror on the decoded NF4 weights (constants) with `W + (alpha / r) A B`, A and B "
                         "torch leaf tensors, and autograd, learning from the middle of the window",
                         {"qlora": ("*",)})),
    Page("quiz_finetuning", "finetuning/quiz.md", "Quiz: fine-tuning", "Fine-tuning"),
    Page("sampling", "generation/sampling.md", "Sampling", "Generation",
         functions=("generate:sample_next", "generate:sample_rows", "generate:generate"),
         listings=("generate:generate", "generate:window_logits"),
         seeds=("init_params", "sampling")),
    Page("kvcache", "generation/kv-cache.md", "KV cache", "Generation",
         functions=("generate:decode_step", "generate:decode_batch", "generate:prefill", "generate:extend",
                    "kv_cache:KVCache",
                    "kv_cache:PagedCache", "kv_cache:PagePool"),
         listings=("generate:decode_step", "kv_cache:BatchStep"), seeds=("init_params",),
         reads=("mode", "reports/gpt2-cost.json"),  # the quick build's decoding benchmark measures fewer cells
         alone="it times the decoding benchmark",
         crosscheck=Rows("our `decode_step`, one token at a time, against torch's full causal forward over "
                         "the whole sequence", {"kv-cache": ("*",)})),
    # Its run lengths are fewer in the quick build.
    Page("serving", "generation/serving.md", "Serving several requests", "Generation",
         functions=("scheduler:Scheduler", "scheduler:Running", "scheduler:serve", "prefix_cache:PrefixPool"),
         listings=("scheduler:Request", "scheduler:Running", "scheduler:serve"),
         seeds=("init_params", "sampling"), reads=("mode",), alone="it times the replay of the requests and the serving benchmark",
         crosscheck=Rows("our `Scheduler` (several requests over pages, across the context limit) against torch's "
                         "full causal forward over each window a token was drawn from", {"paged": ("*",)})),
    Page("quiz_generation", "generation/quiz.md", "Quiz: generation", "Generation"),
    # Learning by doing: the exercises the reader writes and `transformer exercise check` grades
    # (transformer/exercises/), and puzzles made from the mutation catalogue.
    Page("exercises", "learn/exercises.md", "Implement it yourself", "Learn by doing",
         functions=("exercise_grade:grade", "exercise_checks:pair_checks", "exercise_files:skeleton",
                    "exercise_cli:cmd_exercise"),
         listings=("exercise_checks:same", "exercise_checks:pair_checks", "exercise_files:imports",
                   "exercise_cli:cmd_exercise"), reads=("tools/mutant_catalogue.py",)),
    # The puzzles are for the site, where their answers stay folded: print keeps the page's opening only.
    Page("find_the_bug", "learn/find-the-bug.md", "Find the bug", "Learn by doing", seeds=EXAMPLE_SEEDS,
         reads=("tools/mutant_catalogue.py",), printed=False),
    Page("shakespeare", "experiments/shakespeare.md", "Training on Tiny Shakespeare", "Experiments", notebook=True,
         alone="it times its training (tokens per second)"),
    Page("attention_maps", "experiments/attention_maps.md", "Attention patterns", "Experiments", notebook=True),
    Page("why_ffn", "experiments/why_ffn.md", "What attention needs after it", "Experiments", notebook=True),
    Page("lr_sweep", "experiments/lr_sweep.md", "Learning-rate sweep", "Experiments", notebook=True),
    Page("gradcheck_by_hand", "experiments/gradcheck_by_hand.md", "Gradient checking by hand", "Experiments",
         notebook=True),
    Page("finetune", "experiments/finetune.md", "Fine-tuning on one speaker", "Experiments", notebook=True,
         alone="it times the steps of each way to fine-tune"),
    Page("gradcheck", "verification/gradcheck.md", "Gradient checking", "Verification",
         functions=("gradcheck:numerical_grad", "gradcheck:relative_gap", "gradcheck:gradcheck_model"),
         listings=("gradcheck:relative_gap", "gradcheck:check_passes", "gradcheck:gradcheck_model"),
         seeds=("inputs",)),
    Page("crosscheck", "verification/crosscheck.md", "Cross-check on devices", "Verification",
         functions=("crosscheck:run_crosscheck", "crosscheck:check_device", "crosscheck_rows:compare"),
         listings=("crosscheck_rows:compare", "crosscheck:check_device", "crosscheck:run_crosscheck")),
    # Its step times are measured once per change of the code they time, and fewer in the quick build.
    Page("autograd", "verification/autograd.md", "Hand-written backward and autograd", "Verification",
         functions=("autograd:backward", "autograd:unbroadcast", "autograd:topological_order",
                    "custom_gradient:custom_op"),
         listings=("autograd:check_not_freed", "autograd_functions:relu", "autograd_functions:detach_max",
                   "autograd_functions:softmax", "autograd_model:layer_norm", "autograd_model:cross_entropy"),
         seeds=EXAMPLE_SEEDS + ("inputs",), reads=("mode",), alone="it times the steps of both engines",
         crosscheck=Rows("the tape's gradients (`autograd_model.loss_and_grads`, float64 NumPy) against the torch "
                         "mirror's autograd", {"autograd": ("*",)})),
    # It runs the command line in subprocesses, and prints where each test it cites is defined.
    Page("bad_inputs", "verification/bad-inputs.md", "Bad inputs", "Verification", reads=("cli:main", "tests")),
    # It runs the command line in subprocesses, through tools/fault_inject.py, which gives the loop its hooks.
    Page("faults", "verification/faults.md", "What survives a fault", "Verification",
         reads=("transformer", "tools/fault_inject.py")),
    # The mutation report (tools/mutants.py) is brought up to date before any page's key is computed.
    Page("mutants", "verification/mutants.md", "Are the checks good enough?", "Verification",
         reads=("reports/mutants.json", "tools/mutants.py", "tools/mutant_catalogue.py"),
         alone="it computes the mutation report's stale entries on every core"),
    Page("notation", "reference/notation.md", "Notation", "Reference", generated=False),
    Page("api", "reference/api.md", "API", "Reference", generated=False, printed=False),
    Page("configuration", "reference/configuration.md", "Configuration", "Reference"),
    Page("cli", "reference/cli.md", "Command line", "Reference"),
    # It lists which pages have a generator, and sums up the measured "checked by" (tools/checked_by.py).
    Page("architecture", "reference/architecture.md", "How the site is built", "Reference",
         reads=("site_scripts/pages", "reports/checked-by.json", "tools/perturbations.py")),
)

BY_ID = {page.id: page for page in PAGES}
PAGE_PATHS = {page.id: page.path for page in PAGES}


def nav():
    """mkdocs' `nav`: the pages in order, grouped by section."""
    out, sections = [], {}
    for page in PAGES:
        if not page.section:
            out.append({page.title: page.path})
            continue
        if page.section not in sections:
            sections[page.section] = []
            out.append({page.section: sections[page.section]})
        sections[page.section].append({page.title: page.path})
    return out
