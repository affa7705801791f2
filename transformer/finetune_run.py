"""A fine-tuning run: the training loop of `train`, on the adapters of a frozen base, with its own file.

A run writes into its output folder:

- adapter.npz: the adapters, their AdamW moments and the run's state (the sampler, the step), and the base
  they belong to, named by path and by a hash of its parameters (`finetune.params_sha256`);
- metrics.jsonl: as `train` writes it.

The base checkpoint is read, never written. Resuming reads the base again, checks its hash, quantizes it
again (NF4 is deterministic: the same bytes) and continues exactly where the run stopped.
"""

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from .checkpoint import load_checkpoint, read_npz, saved_step, state_arrays, write_npz_atomically
from .config import ModelConfig, is_int
from .errors import CheckpointError, ConfigError, TransformerError
from .finetune import QUANTIZE, adapter_loss_and_grads, frozen_params, params_sha256, quantize_base
from .lora import LoRAConfig, adapter_shapes, init_adapters
from .model import param_shapes
from .optim import adamw_init
from .parallel import sharded
from .run_folder import ADAPTER_NAME, CHECKPOINT_NAME
from .run_state import Run, restored_state, resumed_run
from .train import run_session, start_session
from .train_config import DTYPES, TrainConfig

# Where fine-tuning's defaults differ from train's: a shorter run at a lower rate, from a trained model.
FINETUNE_DEFAULTS = {"steps": 500, "lr": 1e-3, "min_lr": 1e-4, "warmup": 20, "eval_every": 100, "ckpt_every": 100}
FORMAT = "numpy-transformer-adapter"
VERSION = 1


@dataclass
class AdapterFile:
    """What adapter.npz holds: the adapters and how to rebuild the model they adapt.

    Parameters
    ----------
    adapters : dict
        `<weight>.lora_a` and `<weight>.lora_b` arrays.
    lora : LoRAConfig
        Rank, alpha and targets.
    quantize : str
        "none" or "nf4": what the base's linear weights were stored in while the adapters trained.
    base_path : str
        The base checkpoint, for messages and for --resume.
    base_sha256 : str
        `params_sha256` of the base's parameters.
    base_cfg : ModelConfig
        The base model's configuration.
    step : int
        Steps trained.
    opt_state : dict, optional
        The adapters' AdamW state.
    extra : dict
        The run's training config, sampler state, times, corpus and learn_from.
    """
    adapters: dict
    lora: LoRAConfig
    quantize: str
    base_path: str
    base_sha256: str
    base_cfg: ModelConfig
    step: int = 0
    opt_state: dict | None = None
    extra: dict = field(default_factory=dict)


def save_adapter(path, f: AdapterFile, write=None) -> Path:
    """Write an adapter file atomically (a crash leaves the previous one intact); `write`, when given, writes
    its bytes into the temporary file (see `checkpoint.write_npz_atomically`)."""
    meta = {"format": FORMAT, "version": VERSION, "lora": asdict(f.lora), "quantize": f.quantize,
            "base": {"path": f.base_path, "sha256": f.base_sha256, "config": f.base_cfg.to_dict()},
            "step": int(f.step), "adam_step": None if f.opt_state is None else int(f.opt_state["step"]),
            "extra": f.extra}
    arrays = {"meta": np.array(json.dumps(meta)), **state_arrays(f.adapters, f.opt_state)}
    return write_npz_atomically(path, arrays, write)


def load_adapter(path) -> AdapterFile:
    """Read and validate an adapter file.

    Raises
    ------
    CheckpointError
        If the file is missing, truncated, not an adapter file of this version, or its arrays do not
        match its own description.
    """
    path = Path(path)
    arrays = read_npz(path, "adapter file")
    try:
        meta = json.loads(str(arrays["meta"]))
        if meta.get("format") != FORMAT:
            raise CheckpointError(f"{path} is not an adapter file (format {meta.get('format')!r})")
        if meta.get("version") != VERSION:
            raise CheckpointError(f"{path} has adapter format version {meta.get('version')!r}; "
                                  f"this code reads version {VERSION}")
        lora = LoRAConfig(meta["lora"]["rank"], meta["lora"]["alpha"], tuple(meta["lora"]["targets"]),
                          meta["lora"].get("rank_stabilized", False))  # absent from adapters saved before it
        base_cfg = ModelConfig.from_dict(meta["base"]["config"])
        quantize = meta["quantize"]
        if quantize not in QUANTIZE:
            raise ConfigError(f"unknown quantization {quantize!r}")
        shapes = adapter_shapes(param_shapes(base_cfg), lora)
        adam_step = None if meta.get("adam_step") is None else saved_step(meta["adam_step"], "adam_step")
        step = saved_step(meta["step"], "step")
        base_path, base_sha256, extra = meta["base"]["path"], meta["base"]["sha256"], meta.get("extra", {})
        if not (isinstance(base_path, str) and isinstance(base_sha256, str) and isinstance(extra, dict)):
            raise TypeError("the base's path and sha256 must be text and extra a mapping")
    except CheckpointError:
        raise
    except (TransformerError, KeyError, TypeError, ValueError, AttributeError) as e:
        raise CheckpointError(f"adapter file {path} has an invalid description: {e!r}") from None
    groups = {}
    for group in ("param", "adam_m", "adam_v") if adam_step is not None else ("param",):
        found = {k.split("/", 1)[1]: v for k, v in arrays.items() if k.startswith(group + "/")}
        if set(found) != set(shapes) or any(found[k].shape != s for k, s in shapes.items()):
            raise CheckpointError(f"adapter file {path}: its {group} arrays do not match its rank and targets")
        groups[group] = {k: found[k] for k in shapes}
    opt_state = None if adam_step is None else {"m": groups["adam_m"], "v": groups["adam_v"], "step": adam_step}
    return AdapterFile(groups["param"], lora, quantize, base_path, base_sha256, base_cfg, step, opt_state, extra)


def check_base(adapter: AdapterFile, base_params, base_cfg: ModelConfig, base_path):
    """Refuse a base the adapters were not trained on: another shape, or other parameters."""
    if base_cfg.to_dict() != adapter.base_cfg.to_dict():
        raise ConfigError(f"the adapter was trained on a base of another shape ({adapter.base_path}); "
                          f"{base_path} differs in its configuration")
    if params_sha256(base_params) != adapter.base_sha256:
        raise ConfigError(f"the adapter was trained on another base ({adapter.base_path}, parameters "
                          f"{adapter.base_sha256[:12]}); {base_path} holds other parameters")


def stored_base(params, quantize):
    """The frozen base as training and sampling see it: NF4 weights for quantize="nf4"."""
    return quantize_base(params) if quantize == "nf4" else params


@dataclass
class FineTuneRun(Run):
    """A `Run` whose trained parameters are the adapters of a frozen base."""
    base: dict = field(default_factory=dict)  # frozen: arrays, and NF4Weight under quantize="nf4"
    lora: LoRAConfig = field(default_factory=LoRAConfig)
    quantize: str = "none"
    base_path: str = ""
    base_sha256: str = ""
    learn_from: int = 0  # positions before it are context only

    def loss_and_grads(self, x, y):
        def compute(adapters, x, y, cfg):
            return adapter_loss_and_grads(self.base, adapters, x, y, cfg, self.lora, self.learn_from)

        return sharded(self.train_cfg.threads)(compute, self.params, x, y, self.model_cfg)

    def model_params(self):
        return frozen_params(self.base, self.params, self.lora)

    def save(self, path, elapsed_s, corpus_path, corpus_sha256, write=None):
        extra = {**self.extra(elapsed_s, corpus_path, corpus_sha256), "learn_from": self.learn_from}
        save_adapter(path, AdapterFile(self.params, self.lora, self.quantize, self.base_path, self.base_sha256,
                                       self.model_cfg, self.step, self.opt_state, extra), write)


def new_finetune_run(base_path, lora: LoRAConfig, train_cfg: TrainConfig, quantize="none", learn_from=0):
    """A fine-tuning run at step 0: the base read from its checkpoint, adapters with B = 0."""
    if quantize not in QUANTIZE:
        raise ConfigError(f"quantize must be one of {', '.join(QUANTIZE)}, got {quantize!r}")
    ckpt = load_checkpoint(base_path)
    seq_len = train_cfg.seq_len or ckpt.cfg.context_len
    if not (isinstance(learn_from, int) and 0 <= learn_from < seq_len):
        raise ConfigError(f"learn_from must lie in [0, {seq_len}) (the window's positions), got {learn_from!r}")
    dtype = DTYPES[train_cfg.dtype]
    adapters = init_adapters(param_shapes(ckpt.cfg), lora, seed=train_cfg.seed, dtype=dtype)
    return FineTuneRun(ckpt.cfg, train_cfg, ckpt.tokenizer, adapters, adamw_init(adapters),
                       np.random.default_rng(train_cfg.seed), base=stored_base(ckpt.params, quantize), lora=lora,
                       quantize=quantize, base_path=str(base_path), base_sha256=params_sha256(ckpt.params),
                       learn_from=learn_from)


def resumed_finetune_run(adapter_path, corpus_sha256, base_path=None):
    """Restore a fine-tuning run from its adapter file, with its base (checked by hash)."""
    f = load_adapter(adapter_path)
    train_cfg, rng = restored_state(f.extra, f.opt_state, f.step, adapter_path, corpus_sha256, "adapter file")
    base_path = base_path or f.base_path
    ckpt = load_checkpoint(base_path)
    check_base(f, ckpt.params, ckpt.cfg, base_path)
    learn_from, seq_len = f.extra.get("learn_from", 0), train_cfg.seq_len or ckpt.cfg.context_len
    if not (is_int(learn_from) and 0 <= learn_from < seq_len):
        raise CheckpointError(f"adapter file {adapter_path} holds learn_from {learn_from!r}; it must lie in [0, {seq_len})")
    return FineTuneRun(ckpt.cfg, train_cfg, ckpt.tokenizer, f.adapters, f.opt_state, rng, f.step,
                       f.extra.get("elapsed_s", 0.0), int(f.extra.get("skipped_batches", 0)),
                       base=stored_base(ckpt.params, f.quantize), lora=f.lora,
                       quantize=f.quantize, base_path=str(base_path), base_sha256=f.base_sha256,
                       learn_from=learn_from)


def new_full_run(base_path, train_cfg: TrainConfig):
    """Full fine-tuning at step 0: every parameter of the base trained, from a copy, with a fresh AdamW
    state. It is a plain `Run`: its checkpoint.npz resumes with `train --resume`."""
    ckpt = load_checkpoint(base_path)
    params = {name: p.astype(DTYPES[train_cfg.dtype], copy=True) for name, p in ckpt.params.items()}
    return Run(ckpt.cfg, train_cfg, ckpt.tokenizer, params, adamw_init(params), np.random.default_rng(train_cfg.seed))


def finetune(base_path, corpus_path, out_dir, lora: LoRAConfig | None, train_cfg: TrainConfig, quantize="none",
             learn_from=0, resume=False, overwrite=False, max_minutes=None, progress=None, on_step=None,
             on_nonfinite=None, hooks=None):
    """Fine-tune the adapters of a base checkpoint on a corpus; the arguments (on_nonfinite and hooks included) and
    the summary are those of `train.train`, plus the base, the LoRA settings, the quantization and learn_from.
    lora=None fine-tunes every parameter instead (full fine-tuning; no quantization, every position learned),
    into checkpoint.npz.

    Raises
    ------
    ConfigError
        As `train`, and for a corpus with symbols the base's tokenizer lacks, or an adapter whose base
        differs (another shape or other parameters).
    CheckpointError
        If the base or the adapter file cannot be read.
    """
    if lora is None:
        if quantize != "none" or learn_from:
            raise ConfigError("full fine-tuning trains the dense base on every position: drop --quantize and "
                              "--learn-from, or give LoRA settings")
        new, resumed, file_name = (lambda text: new_full_run(base_path, train_cfg)), resumed_run, CHECKPOINT_NAME
    else:
        if train_cfg.engine != "handwritten":  # FineTuneRun.loss_and_grads is the hand-written adapters' backward
            raise ConfigError(f"LoRA fine-tuning runs the hand-written backward only, got engine "
                              f"{train_cfg.engine!r}: drop it, or fine-tune every parameter (lora=None), which the "
                              "autograd engine can")
        new, resumed, file_name = (lambda text: new_finetune_run(base_path, lora, train_cfg, quantize, learn_from),
                                   lambda path, sha: resumed_finetune_run(path, sha, base_path), ADAPTER_NAME)
    session = start_session(corpus_path, out_dir, resume, overwrite, max_minutes, new, resumed, file_name,
                            on_nonfinite, hooks)
    return run_session(session, progress, on_step, "finetune")
