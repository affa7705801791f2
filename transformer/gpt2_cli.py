"""The commands that bring GPT-2 checkpoints in and out: `import-gpt2` and `export-gpt2`.

    transformer import-gpt2 PATH --out runs/gpt2      a Hugging Face GPT-2 folder -> runs/gpt2/checkpoint.npz
    transformer export-gpt2 --checkpoint runs/gpt2/checkpoint.npz --out gpt2-again

The imported checkpoint carries GPT-2's tokenizer, so `sample`, `finetune` (LoRA or QLoRA) and the others
take it as they take one written by `train`.
"""

from pathlib import Path

from .errors import TransformerError


def add_gpt2_parsers(sub):
    imp = sub.add_parser("import-gpt2", help="read a Hugging Face GPT-2 folder into a checkpoint the other "
                                             "commands take",
                         description="Read config.json and model.safetensors of a GPT-2 (as transformers "
                                     "writes them; or the older pytorch_model.bin, whose pickle is read without "
                                     "running it) into --out/checkpoint.npz, with GPT-2's tokenizer.")
    imp.add_argument("path", help="the folder holding config.json and model.safetensors (or pytorch_model.bin)")
    imp.add_argument("--out", required=True, help="output folder for checkpoint.npz")
    imp.add_argument("--overwrite", action="store_true", help="replace a checkpoint already in --out")
    exp = sub.add_parser("export-gpt2", help="write a checkpoint in GPT-2's layout as a Hugging Face folder",
                         description="Write config.json and model.safetensors that transformers' "
                                     "GPT2LMHeadModel.from_pretrained reads.")
    exp.add_argument("--checkpoint", required=True, help="a checkpoint.npz of a model in GPT-2's layout")
    exp.add_argument("--out", required=True, help="output folder for config.json and model.safetensors")


def cmd_import_gpt2(args):
    from .bpe import GPT2Tokenizer
    from .checkpoint import Checkpoint, save_checkpoint
    from .gpt2 import load_gpt2
    from .run_folder import CHECKPOINT_NAME

    target = Path(args.out) / CHECKPOINT_NAME
    if target.exists() and not args.overwrite:
        raise TransformerError(f"{target} exists; pass --overwrite to replace it")
    tokenizer = GPT2Tokenizer()  # before the weights: a missing tokenizer file stops the import early
    params, cfg = load_gpt2(args.path)
    if tokenizer.vocab_size != cfg.vocab_size:
        raise TransformerError(f"the model has {cfg.vocab_size} tokens, GPT-2's tokenizer {tokenizer.vocab_size}")
    save_checkpoint(target, Checkpoint(params, cfg, tokenizer, extra={"imported_from": str(Path(args.path).resolve())}))
    count = sum(p.size for p in params.values())
    print(f"imported {count} parameters ({cfg.num_layers} blocks, d = {cfg.emb_dim}) into {target}")
    return 0


def cmd_export_gpt2(args):
    from .checkpoint import load_checkpoint
    from .gpt2 import save_gpt2

    ckpt = load_checkpoint(args.checkpoint)
    save_gpt2(args.out, ckpt.params, ckpt.cfg)
    print(f"wrote {args.out}/config.json and model.safetensors")
    return 0


GPT2_COMMANDS = {"import-gpt2": cmd_import_gpt2, "export-gpt2": cmd_export_gpt2}
