"""Command line: python -m transformer {train,finetune,sample,gradcheck,crosscheck,exercise,...} ...

A mistake in the input (a missing corpus, a bad option, a foreign checkpoint)
prints one line, `error: ...`, and exits with status 2; never a traceback.
"""

import argparse
import os
import sys
from dataclasses import fields
from pathlib import Path

import numpy as np

from .config import PRESETS, ModelConfig, preset
from .crosscheck import DEVICES
from .errors import TransformerError
from .exercise_cli import add_exercise_parser, cmd_exercise
from .gpt2_cli import GPT2_COMMANDS, add_gpt2_parsers

CORPUS_ENV = "TRANSFORMER_CORPUS"
# The ModelConfig fields that `train` takes as options (vocab_size comes from the tokenizer). Their help
# is the field's own, read from ModelConfig like TrainConfig's: it is written in one place only.
MODEL_OPTIONS = ("context_len", "emb_dim", "num_heads", "num_layers", "ff_dim", "activation", "tied_head",
                 "head_bias", "attention", "flash_tile", "checkpoint_blocks")
EXIT_USER_ERROR, EXIT_INTERRUPTED, EXIT_CHECK_FAILED = 2, 130, 1
EXIT_TERMINATED = 143  # 128 + SIGTERM, as a shell reports a job that SIGTERM stopped


class Parser(argparse.ArgumentParser):
    """argparse, but a usage mistake is one line (and the usage is a --help away)."""

    def error(self, message):
        self.exit(EXIT_USER_ERROR, f"error: {self.prog}: {message} (see --help)\n")


def _option(name):
    return "--" + name.replace("_", "-")


def non_negative_int(text):
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def add_field_option(group, f, help_suffix=""):
    """Add the option of a config field: --name-with-dashes, its type and choices, and its help. A
    True/False field is a pair of flags, --name and --no-name."""
    if isinstance(f.default, bool):
        group.add_argument(_option(f.name), action=argparse.BooleanOptionalAction, default=None,
                           help=f.metadata["help"] + help_suffix)
        return
    group.add_argument(_option(f.name), type=type(f.default), default=None, choices=f.metadata.get("choices"),
                       help=f.metadata["help"] + help_suffix)


def command_name():
    """The command as the user typed it: `transformer` (the installed console command) or
    `python -m transformer` (everything else, in-process callers included)."""
    return "transformer" if Path(sys.argv[0]).name == "transformer" else "python -m transformer"


def build_parser(prog="python -m transformer"):
    parser = Parser(prog=prog, description="A NumPy reference transformer: train, sample, check.")
    sub = parser.add_subparsers(dest="command", required=True)
    add_train_parser(sub)
    add_finetune_parser(sub)
    add_sample_parser(sub)
    add_gradcheck_parser(sub)
    add_crosscheck_parser(sub)
    add_gpt2_parsers(sub)
    add_exercise_parser(sub)
    return parser


def add_train_parser(sub):
    from .train_config import TrainConfig

    train = sub.add_parser("train", help="train a model on a UTF-8 text corpus",
                           description="Train on a text corpus; checkpoints and metrics go to --out.")
    train.add_argument("--corpus", help=f"UTF-8 text file (default: ${CORPUS_ENV}; "
                                        "with --resume, the run's own corpus)")
    train.add_argument("--out", required=True, help="output folder for checkpoint.npz and metrics.jsonl")
    train.add_argument("--resume", action="store_true",
                       help="continue the run in --out exactly where it stopped (of the settings, "
                            "only --on-nonfinite may change)")
    train.add_argument("--overwrite", action="store_true", help="start a new run in an --out that holds one")
    train.add_argument("--preset", default=None, choices=sorted(PRESETS),
                       help="model size to start from (default: default)")
    train.add_argument("--max-minutes", type=float,
                       help="stop after this many minutes of training (with a checkpoint, resumable)")
    train.add_argument("--no-progress", action="store_true", help="no progress bar")
    model = train.add_argument_group("model (override the preset)")
    for f in fields(ModelConfig):
        if f.name in MODEL_OPTIONS:
            add_field_option(model, f)
    schedule = train.add_argument_group("training (defaults in brackets)")
    for f in fields(TrainConfig):
        add_field_option(schedule, f, f" [{f.default}]")


def add_finetune_parser(sub):
    from .finetune import QUANTIZE
    from .finetune_run import FINETUNE_DEFAULTS
    from .lora import TARGETS, LoRAConfig
    from .train_config import TrainConfig

    tune = sub.add_parser("finetune", help="fine-tune a trained model: LoRA adapters, QLoRA, or every parameter",
                          description="Fine-tune the checkpoint --checkpoint on a text corpus. LoRA (the default) "
                                      "trains small adapters beside the frozen base and writes them to "
                                      "--out/adapter.npz; --quantize nf4 stores the base in NF4 while they train "
                                      "(QLoRA); --full trains every parameter into --out/checkpoint.npz.")
    tune.add_argument("--checkpoint", help="the base: a checkpoint.npz written by train (with --resume: "
                                           "the run's own base)")
    tune.add_argument("--corpus", help=f"UTF-8 text file (default: ${CORPUS_ENV}; with --resume, the run's own)")
    tune.add_argument("--out", required=True, help="output folder for adapter.npz (or checkpoint.npz) and "
                                                   "metrics.jsonl")
    tune.add_argument("--resume", action="store_true", help="continue the run in --out exactly where it stopped "
                                                            "(of the settings, only --on-nonfinite may change)")
    tune.add_argument("--overwrite", action="store_true", help="start a new run in an --out that holds one")
    tune.add_argument("--max-minutes", type=float,
                      help="stop after this many minutes of training (with a checkpoint, resumable)")
    tune.add_argument("--no-progress", action="store_true", help="no progress bar")
    lora = tune.add_argument_group("what is trained")
    defaults = LoRAConfig()
    lora.add_argument("--lora-rank", type=int, help=f"r, the adapters' rank [{defaults.rank}]")
    lora.add_argument("--lora-alpha", type=float, help=f"alpha: the correction is scaled by alpha / r [{defaults.alpha:g}]")
    lora.add_argument("--lora-rank-stabilized", action="store_true", default=None,
                      help="scale by alpha / sqrt(r) instead (rsLoRA), so that a larger rank does not learn slower")
    lora.add_argument("--lora-targets", help=f"comma-separated, any of {','.join(TARGETS)} [{','.join(defaults.targets)}]")
    lora.add_argument("--quantize", choices=QUANTIZE, help="store the base's linear weights in NF4 while the "
                                                           "adapters train (QLoRA) [none]")
    lora.add_argument("--learn-from", type=int, help="positions before this one in each window are context, "
                                                     "not learned (their loss gradient is exactly zero) [0]")
    lora.add_argument("--full", action="store_true", help="train every parameter instead of adapters")
    schedule = tune.add_argument_group("training (defaults in brackets)")
    for f in fields(TrainConfig):
        if f.name not in ("tokenizer", "engine"):  # the base's; fine-tuning runs the hand-written backward
            add_field_option(schedule, f, f" [{FINETUNE_DEFAULTS.get(f.name, f.default)}]")


def add_sample_parser(sub):
    sample = sub.add_parser("sample", help="generate text from a checkpoint")
    sample.add_argument("--checkpoint", required=True, help="a checkpoint.npz written by train")
    sample.add_argument("--adapter", help="an adapter.npz written by finetune for this checkpoint: sample "
                                          "from the fine-tuned model")
    sample.add_argument("--prompt", default=None,
                        help="text to continue (default: a newline, or the first symbol of the vocabulary)")
    sample.add_argument("--tokens", type=int, default=200, help="how many tokens to generate (default: 200)")
    sample.add_argument("--temperature", type=float, default=1.0,
                        help="divides the logits; 0 picks the most likely token (default: 1.0)")
    sample.add_argument("--top-k", type=int, default=None,
                        help="sample among the k most likely tokens (default: all)")
    sample.add_argument("--seed", type=non_negative_int, default=0,
                        help="seed of the draws; request i of a prompts file uses seed + i (default: 0)")
    serving = sample.add_argument_group(
        "several requests (decoded together over a pool of KV pages; any of these options selects it)")
    serving.add_argument("--prompts-file", help="UTF-8 text file, one prompt per line")
    serving.add_argument("--page-size", type=int, help="positions per KV page (default: 16)")
    serving.add_argument("--pool-pages", type=int,
                         help="pages in the pool (default: enough for every request at once)")
    serving.add_argument("--max-batch", type=int, help="requests decoded together at most (default: 16)")
    serving.add_argument("--keep", type=int, help="tokens replayed when a request reaches the context; "
                                                  "fewer replay less often but see less (default: the whole "
                                                  "context, the same text as without these options)")
    serving.add_argument("--prefix-cache", action="store_true", default=None,
                         help="share the KV pages of prompts that begin alike (a common system prompt is computed once)")
    serving.add_argument("--budget", type=int, help="ids fed per step at most, at least --max-batch: a long prompt is "
                                                    "fed in chunks while the others decode (default: no bound)")
    serving.add_argument("--preempt", action="store_true", default=None,
                         help="start a request when its prompt fits; the youngest gives its pages back when the pool "
                              "runs short (default: start one only when all its pages can be promised)")


def add_choice_option(parser, name="activation", default=None):
    """--activation (or --attention) of gradcheck and crosscheck: the ModelConfig field, with its default
    as a plain value (None: the preset's)."""
    f = next(f for f in fields(ModelConfig) if f.name == name)
    parser.add_argument(_option(name), default=default, choices=f.metadata["choices"],
                        help=f"{f.metadata['help']} (default: {default or 'the preset' + chr(39) + 's'})")


def add_gradcheck_parser(sub):
    from .model import param_count

    check = sub.add_parser("gradcheck", help="compare every gradient with central differences")
    check.add_argument("--preset", default="tiny", choices=["tiny", "gpt2-tiny", "default"],
                       help=f"tiny ({param_count(PRESETS['tiny'])} parameters), gpt2-tiny (GPT-2's layout, "
                            f"{param_count(PRESETS['gpt2-tiny'])}) or default ({param_count(PRESETS['default'])}: "
                            "two forward passes per parameter, so far longer) (default: tiny)")
    add_choice_option(check)
    add_choice_option(check, "attention")
    for f in fields(ModelConfig):
        if f.name in ("tied_head", "head_bias", "flash_tile", "checkpoint_blocks"):
            add_field_option(check, f, " [the preset's]")
    check.add_argument("--batch", type=int, default=2, help="sequences in the batch (default: 2)")
    check.add_argument("--seed", type=non_negative_int, default=0,
                       help="seed of the parameters and the ids (default: 0)")


def add_crosscheck_parser(sub):
    cross = sub.add_parser("crosscheck", help="compare everything with PyTorch on every device found, and the "
                                              "autograd engine's gradients with both",
                           description="Run the same parameters and inputs through NumPy and through "
                                       "PyTorch on each device; compare logits, loss, gradients, "
                                       "intermediates, ten AdamW steps, ten whole training steps and "
                                       "KV-cache decoding. Every gradient is also computed by the autograd "
                                       "engine (transformer/autograd.py) and shown three ways side by side: "
                                       "the hand-written NumPy backward against torch, the engine against "
                                       "torch, and the engine against the hand-written backward. In GPT-2's "
                                       "layout (--activation gelu_tanh --tied-head --no-head-bias) transformers' "
                                       "GPT2LMHeadModel is compared too: logits, loss and a fourth column of "
                                       "gradients.")
    cross.add_argument("--devices", nargs="+", default=list(DEVICES), choices=DEVICES,
                       help="devices to try (default: all); missing ones are listed, not failed")
    cross.add_argument("--dtype", choices=["float32", "float64"], default=None,
                       help="torch dtype (default: float64 where the device has it, else float32)")
    add_choice_option(cross, default="relu")
    for f in fields(ModelConfig):
        if f.name in ("tied_head", "head_bias"):
            add_field_option(cross, f, f" [{f.default}]")
    cross.add_argument("--seed", type=non_negative_int, default=0,
                       help="seed of the parameters and the ids (default: 0)")
    cross.add_argument("--json", metavar="PATH", help="also write the whole report as JSON")
    cross.add_argument("--verbose", action="store_true", help="print every comparison, not only a summary")


def cmd_crosscheck(args):
    from .crosscheck import run_crosscheck, write_json
    from .crosscheck_report import format_report

    try:
        import torch  # noqa: F401
    except ImportError:
        raise TransformerError("the cross-check needs torch: pip install -e '.[torch]'") from None
    if args.json:
        with open(args.json, "a"):  # fail now, not after the run, if the path cannot be written
            pass
    layout = {k: getattr(args, k) for k in ("tied_head", "head_bias") if getattr(args, k) is not None}
    report = run_crosscheck(args.devices, dtype=args.dtype, activation=args.activation, seed=args.seed, **layout)
    print(format_report(report, verbose=args.verbose))
    if args.json:
        write_json(report, args.json)
    if not report["rows"]:
        raise TransformerError(f"nothing was checked: none of {', '.join(args.devices)} is on this machine")
    return 0 if report["passed"] else EXIT_CHECK_FAILED


def cmd_train(args, hooks=None):
    from .run_folder import CHECKPOINT_NAME
    from .train import train
    from .train_config import TrainConfig

    given = {f.name: getattr(args, f.name) for f in fields(TrainConfig) if getattr(args, f.name) is not None}
    # The one setting --resume takes: what to do at a step that is not finite is a policy, not part of the
    # run's arithmetic, and a run stopped at such a step goes on past it with --on-nonfinite skip.
    policy = given.pop("on_nonfinite", None) if args.resume else None
    model_given = {k: getattr(args, k) for k in MODEL_OPTIONS if getattr(args, k) is not None}
    if args.preset is not None:
        model_given["preset"] = args.preset
    if args.resume and (given or model_given or args.overwrite):
        names = ", ".join(_option(k) for k in [*given, *model_given] + (["overwrite"] if args.overwrite else []))
        raise TransformerError(f"--resume takes the configuration from the checkpoint; drop {names}")
    corpus = args.corpus or os.environ.get(CORPUS_ENV)
    if args.resume and not args.corpus:
        corpus = _corpus_of_run(os.path.join(args.out, CHECKPOINT_NAME)) or corpus
    if not corpus:
        raise TransformerError(f"no corpus: pass --corpus PATH or set {CORPUS_ENV}")
    model_cfg = preset(model_given.pop("preset", "default")).with_(**model_given)
    train_cfg = TrainConfig(**given)
    if not args.resume and train_cfg.warmup >= train_cfg.steps:
        print(f"warning: --warmup {train_cfg.warmup} >= --steps {train_cfg.steps}: "
              "the learning rate never reaches its peak", file=sys.stderr)
    summary = train(corpus, args.out, model_cfg, train_cfg, resume=args.resume, overwrite=args.overwrite,
                    max_minutes=args.max_minutes, progress=False if args.no_progress else None,
                    on_nonfinite=policy, hooks=hooks)
    return report_summary(summary, f"python -m transformer train --resume --out {args.out}")


def cmd_finetune(args, hooks=None):
    from .finetune_run import FINETUNE_DEFAULTS, finetune, load_adapter
    from .lora import LoRAConfig
    from .run_folder import ADAPTER_NAME, CHECKPOINT_NAME
    from .train_config import TrainConfig

    given = {f.name: getattr(args, f.name) for f in fields(TrainConfig)
             if f.name not in ("tokenizer", "engine") and getattr(args, f.name) is not None}
    lora_given = {k: getattr(args, k) for k in ("lora_rank", "lora_alpha", "lora_targets", "lora_rank_stabilized",
                                                 "quantize", "learn_from")
                  if getattr(args, k) is not None}
    if args.resume:
        policy = given.pop("on_nonfinite", None)
        dropped = [*given, *lora_given] + [k for k in ("overwrite", "full") if getattr(args, k)]
        if dropped:
            raise TransformerError("--resume takes the configuration from the run; drop "
                                   + ", ".join(_option(k) for k in dropped))
        adapter_path, full_path = os.path.join(args.out, ADAPTER_NAME), os.path.join(args.out, CHECKPOINT_NAME)
        full = not os.path.exists(adapter_path) and os.path.exists(full_path)
        if full:
            corpus = args.corpus or _corpus_of_run(full_path)
        else:
            saved = load_adapter(adapter_path).extra
            corpus = args.corpus or saved.get("corpus")
        corpus = corpus or os.environ.get(CORPUS_ENV)
        summary = finetune(args.checkpoint, corpus, args.out, None if full else LoRAConfig(), TrainConfig(),
                           resume=True, max_minutes=args.max_minutes,
                           progress=False if args.no_progress else None, on_nonfinite=policy, hooks=hooks)
        return report_summary(summary, f"python -m transformer finetune --resume --out {args.out}")
    if not args.checkpoint:
        raise TransformerError("no base: pass --checkpoint PATH (a checkpoint.npz written by train)")
    corpus = args.corpus or os.environ.get(CORPUS_ENV)
    if not corpus:
        raise TransformerError(f"no corpus: pass --corpus PATH or set {CORPUS_ENV}")
    train_cfg = TrainConfig(**{**FINETUNE_DEFAULTS, **given})
    if args.full:
        if lora_given:
            raise TransformerError("--full trains every parameter; drop "
                                   + ", ".join(_option(k) for k in lora_given))
        lora = None
    else:
        defaults = LoRAConfig()
        targets = tuple(t.strip() for t in args.lora_targets.split(",")) if args.lora_targets else defaults.targets
        lora = LoRAConfig(defaults.rank if args.lora_rank is None else args.lora_rank,
                          defaults.alpha if args.lora_alpha is None else args.lora_alpha, targets,
                          bool(args.lora_rank_stabilized))
    summary = finetune(args.checkpoint, corpus, args.out, lora, train_cfg, args.quantize or "none",
                       args.learn_from or 0, overwrite=args.overwrite, max_minutes=args.max_minutes,
                       progress=False if args.no_progress else None, hooks=hooks)
    return report_summary(summary, f"python -m transformer finetune --resume --out {args.out}")


def report_summary(summary, resume_command):
    """Print how a training run ended; the exit status (130 when interrupted, 143 when terminated)."""
    val = "" if summary["val_loss"] is None else \
        f", validation loss {summary['val_loss']:.4f} (at step {summary['val_step']})"
    if summary["skipped"]:
        val += f"; {summary['skipped']} batch{'es' * (summary['skipped'] > 1)} skipped (not finite)"
    if summary["stopped"]:
        print(f"stopped ({summary['stopped']}) after step {summary['step']} of {summary['steps']}{val}; "
              f"checkpoint {summary['checkpoint']}; continue with: {resume_command}")
        return {"interrupted": EXIT_INTERRUPTED, "terminated": EXIT_TERMINATED}.get(summary["stopped"], 0)
    print(f"done: {summary['step']} steps in {summary['time_s']:.0f} s{val}; checkpoint {summary['checkpoint']}")
    return 0


def _corpus_of_run(ckpt_path):
    """The corpus path a run recorded (None if it recorded none).

    A missing or unreadable checkpoint is a CheckpointError here: there is nothing to resume,
    and saying so beats asking for a corpus that would not help.
    """
    from .checkpoint import load_checkpoint

    return load_checkpoint(ckpt_path).extra.get("corpus")


def cmd_sample(args):
    from .checkpoint import load_checkpoint
    from .generate import generate

    ckpt = load_checkpoint(args.checkpoint)
    if args.adapter:
        ckpt.params = adapted_model(ckpt, args)
    prompt = args.prompt
    if prompt is None:
        prompt = "\n" if ckpt.tokenizer.kind != "char" or "\n" in ckpt.tokenizer.chars else ckpt.tokenizer.chars[0]
    serving = (args.prompts_file, args.page_size, args.pool_pages, args.max_batch, args.keep, args.prefix_cache,
               args.budget, args.preempt)
    if any(option is not None for option in serving):
        return sample_together(ckpt, args, [prompt] if args.prompts_file is None else read_prompts(args))
    prompt_ids = ckpt.tokenizer.encode(prompt)
    new = generate(ckpt.params, ckpt.cfg, prompt_ids, args.tokens, temperature=args.temperature,
                   top_k=args.top_k, seed=args.seed)
    print(prompt + ckpt.tokenizer.decode(new))
    return 0


def adapted_model(ckpt, args):
    """The checkpoint's parameters with the adapter of --adapter merged in, after checking it belongs to them."""
    from .finetune import dense_base
    from .finetune_run import check_base, load_adapter, stored_base
    from .lora import merge

    adapter = load_adapter(args.adapter)
    check_base(adapter, ckpt.params, ckpt.cfg, args.checkpoint)
    # The adapters learned beside the base as it was stored while they trained (NF4 for QLoRA).
    base = dense_base(stored_base(ckpt.params, adapter.quantize))
    dtype = ckpt.params["tok_emb"].dtype
    return {name: p.astype(dtype) for name, p in merge(base, adapter.adapters, adapter.lora).items()}


def read_prompts(args):
    """The prompts of --prompts-file, one per line; an empty file or an empty line is refused."""
    if args.prompt is not None:
        raise TransformerError("give --prompt or --prompts-file, not both")
    try:
        with open(args.prompts_file, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise TransformerError(f"cannot read the prompts file {args.prompts_file}: {e}") from None
    if not lines:
        raise TransformerError(f"the prompts file {args.prompts_file} holds no prompt")
    empty = [i + 1 for i, line in enumerate(lines) if not line]
    if empty:
        raise TransformerError(f"line {empty[0]} of the prompts file {args.prompts_file} is empty")
    return lines


def sample_together(ckpt, args, prompts):
    """Decode every prompt together with the scheduler over a pool of pages; print each continuation."""
    from .kv_cache import PagePool
    from .prefix_cache import PrefixPool
    from .scheduler import Request, serve

    cfg, page_size = ckpt.cfg, 16 if args.page_size is None else args.page_size
    requests = [Request(ckpt.tokenizer.encode(p), args.tokens, args.temperature, args.top_k, args.seed + i)
                for i, p in enumerate(prompts)]
    if args.pool_pages is None:  # every request at once, up to a whole context each
        pool_pages = len(requests) * -(-cfg.context_len // page_size) if page_size >= 1 else 1
    else:
        pool_pages = args.pool_pages
    pool = (PrefixPool if args.prefix_cache else PagePool)(cfg, pool_pages, page_size, ckpt.params["tok_emb"].dtype)
    keep = cfg.context_len if args.keep is None else args.keep
    serve(ckpt.params, cfg, pool, requests, 16 if args.max_batch is None else args.max_batch, keep, args.budget,
          bool(args.preempt))
    for i, (prompt, request) in enumerate(zip(prompts, requests)):
        if len(requests) > 1:
            print(f"==> request {i + 1} of {len(requests)} <==")
        print(prompt + ckpt.tokenizer.decode(request.new))
    return 0


def cmd_gradcheck(args):
    from .gradcheck import ABS_FLOOR, REL_TOL, check_passes, gradcheck_model
    from .model import param_shapes

    given = ("activation", "attention", "tied_head", "head_bias", "flash_tile", "checkpoint_blocks")
    cfg = preset(args.preset).with_(**{k: getattr(args, k) for k in given if getattr(args, k) is not None})
    if args.batch < 1:
        raise TransformerError(f"--batch must be at least 1, got {args.batch}")
    rng = np.random.default_rng(args.seed)
    shape = (args.batch, cfg.context_len)
    ids, targets = rng.integers(0, cfg.vocab_size, shape), rng.integers(0, cfg.vocab_size, shape)
    report = gradcheck_model(cfg, ids, targets, seed=args.seed, perturb=0.1)
    shapes = param_shapes(cfg)
    tile = f" (tile {cfg.flash_tile})" if cfg.attention == "flash" else ""
    policies = f"{cfg.attention} attention{tile}" + (", checkpointed blocks" if cfg.checkpoint_blocks else "")
    head = ("tied head" if cfg.tied_head else "own head") + ("" if cfg.head_bias else " without bias")
    print(f"float64 central differences (h = 1e-5), {cfg.activation}, {head}, {policies}, ids {shape}; "
          f"pass: relative gap < {REL_TOL:g} or absolute gap < {ABS_FLOOR:g}")
    print(f"{'parameter':<12} {'shape':<10} {'max abs gap':>12} {'relative gap':>13}  result")
    failed = 0
    for name, (abs_gap, rel_gap) in report.items():
        ok = check_passes(abs_gap, rel_gap)
        failed += not ok
        shape_text = "x".join(map(str, shapes[name]))
        # A gradient that is zero in exact arithmetic (the key bias) has a
        # meaningless relative gap: it passes on the absolute floor instead.
        result = "FAIL" if not ok else "pass" if rel_gap < REL_TOL else "pass (gradient ~0)"
        print(f"{name:<12} {shape_text:<10} {abs_gap:>12.2e} {rel_gap:>13.2e}  {result}")
    print(f"{len(report) - failed} of {len(report)} parameters pass")
    return EXIT_CHECK_FAILED if failed else 0


COMMANDS = {"train": cmd_train, "finetune": cmd_finetune, "sample": cmd_sample, "gradcheck": cmd_gradcheck,
            "crosscheck": cmd_crosscheck, **GPT2_COMMANDS,
            "exercise": cmd_exercise}
TRAINING = ("train", "finetune")  # the commands that run the training loop, and take its hooks


def main(argv=None, hooks=None):
    """Run one command line; the exit status.

    Parameters
    ----------
    argv : list of str, optional
        The arguments after the program's name; sys.argv's when None.
    hooks : transformer.train.Hooks, optional
        What the training loop of train and finetune calls at its moments (a fault injector's seam); none by
        default.

    Returns
    -------
    int
        0, or EXIT_USER_ERROR for a mistake in the input (one line on stderr), EXIT_INTERRUPTED after Ctrl-C,
        EXIT_CHECK_FAILED for a check that failed.
    """
    args = build_parser(command_name()).parse_args(argv)
    from .memory import keep_freed_memory

    keep_freed_memory()  # faster steps, same results: see memory.py
    try:
        if args.command in TRAINING:
            return COMMANDS[args.command](args, hooks)
        return COMMANDS[args.command](args)
    except TransformerError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_USER_ERROR
    except OSError as e:  # a path the user gave cannot be read or written
        where = f": {e.filename}" if e.filename else ""
        print(f"error: {e.strerror or e}{where}", file=sys.stderr)
        return EXIT_USER_ERROR
    except KeyboardInterrupt:  # a second Ctrl-C during training, or Ctrl-C while sampling
        print("interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
