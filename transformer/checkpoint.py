"""Checkpoints: one .npz file with everything needed to sample or resume.

Layout (every entry a plain numeric or string array, so numpy can load it with
allow_pickle=False and a checkpoint can never run code):

```text
meta           JSON text: format, version, model config, tokenizer, step,
               training config and the state of the batch sampler
param/<name>   each parameter
adam_m/<name>  AdamW first moments      (absent in a params-only file)
adam_v/<name>  AdamW second moments
```

The file is written to a temporary name beside the target and renamed over it,
so a crash mid-write leaves the previous checkpoint intact.
"""

import json
import os
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .config import ModelConfig
from .data import tokenizer_from_dict
from .errors import CheckpointError, TransformerError
from .model import param_shapes

FORMAT = "numpy-transformer-checkpoint"
VERSION = 1


@dataclass
class Checkpoint:
    """Everything needed to sample from a model or to resume its training.

    Parameters
    ----------
    params : dict
        Parameter name to array.
    cfg : ModelConfig
        The model configuration.
    tokenizer : CharTokenizer or ByteTokenizer
        The tokenizer the model was trained with.
    step : int
        The training step reached.
    opt_state : dict, optional
        The AdamW state, {"m": {...}, "v": {...}, "step": int}; None in a params-only file.
    extra : dict
        The training config, the batch sampler's state and times.
    """
    params: dict
    cfg: ModelConfig
    tokenizer: object
    step: int = 0
    opt_state: dict | None = None  # {"m": {...}, "v": {...}, "step": int}
    extra: dict = field(default_factory=dict)  # training config, sampler state, times


def save_checkpoint(path, ckpt: Checkpoint, write=None) -> Path:
    """Write a checkpoint atomically: a temporary file in the same folder, fsync, then a rename.

    Parameters
    ----------
    path : str or Path
        Where to write; the folder is created if needed.
    ckpt : Checkpoint
        What to write.
    write : callable, optional
        Writes the file's bytes into the open temporary file (see `write_npz_atomically`).

    Returns
    -------
    Path
        The path written.
    """
    path = Path(path)
    meta = {"format": FORMAT, "version": VERSION, "config": ckpt.cfg.to_dict(),
            "tokenizer": ckpt.tokenizer.to_dict(), "step": int(ckpt.step),
            "adam_step": None if ckpt.opt_state is None else int(ckpt.opt_state["step"]),
            "extra": ckpt.extra}
    arrays = {"meta": np.array(json.dumps(meta)), **state_arrays(ckpt.params, ckpt.opt_state)}
    return write_npz_atomically(path, arrays, write)


def state_arrays(params, opt_state) -> dict:
    """The entries `param/<name>`, and `adam_m/<name>` and `adam_v/<name>` unless opt_state is None, of a
    checkpoint (or of fine-tuning's adapter file)."""
    arrays = {f"param/{k}": v for k, v in params.items()}
    if opt_state is not None:
        arrays.update({f"adam_m/{k}": v for k, v in opt_state["m"].items()})
        arrays.update({f"adam_v/{k}": v for k, v in opt_state["v"].items()})
    return arrays


def write_npz(f, arrays):
    """Write arrays into the open binary file f as the bytes of an .npz file (numpy's savez, uncompressed)."""
    np.savez(f, **arrays)


def write_npz_atomically(path, arrays, write=None) -> Path:
    """Write arrays to an .npz file: a temporary file in the same folder, fsync, then a rename, so a crash
    leaves the previous file intact (checkpoints, and fine-tuning's adapter files).

    Parameters
    ----------
    path : str or Path
        The file to write; its folder is created if needed.
    arrays : dict
        Entry name to array.
    write : callable, optional
        Called as write(f, arrays) to write the bytes into the open temporary file f; `write_npz` when None.
        A test of a crash mid-write passes one that stops halfway.

    Returns
    -------
    Path
        The path written.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            (write or write_npz)(f, arrays)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes it private (0600); give it a normal file's mode
        os.replace(tmp, path)
    except OSError as e:  # a full disk, say: name the file it was writing, and leave no half of it behind
        Path(tmp).unlink(missing_ok=True)
        if e.filename is not None or e.errno is None:
            raise
        raise OSError(e.errno, e.strerror, str(path)) from e
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)  # make the rename itself durable
    return path


def _umask():
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _fsync_dir(folder):
    if os.name != "posix":
        return
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def load_checkpoint(path) -> Checkpoint:
    """Read and validate a checkpoint.

    Parameters
    ----------
    path : str or Path
        The checkpoint file.

    Returns
    -------
    Checkpoint
        Its contents.

    Raises
    ------
    CheckpointError
        If the file is missing, truncated, not a checkpoint of this project or of this version, holds
        pickled objects, or does not match its own config; the message says why.
    """
    path = Path(path)
    arrays = read_npz(path)
    meta = _read_meta(path, arrays)
    try:
        cfg = ModelConfig.from_dict(meta["config"])
        tokenizer = tokenizer_from_dict(meta["tokenizer"])
        step = saved_step(meta["step"], "step")
        adam_step = None if meta.get("adam_step") is None else saved_step(meta["adam_step"], "adam_step")
        extra = meta.get("extra", {})
        if not isinstance(extra, dict):
            raise TypeError("extra is not a mapping")
    except (TransformerError, KeyError, TypeError, ValueError, AttributeError) as e:
        raise CheckpointError(f"checkpoint {path} has an invalid description: {e!r}") from None
    if tokenizer.vocab_size != cfg.vocab_size:
        raise CheckpointError(
            f"checkpoint {path}: tokenizer has {tokenizer.vocab_size} symbols, model expects {cfg.vocab_size}")
    params = _read_group(path, arrays, "param", cfg)
    opt_state = None
    if adam_step is not None:
        opt_state = {"m": _read_group(path, arrays, "adam_m", cfg),
                     "v": _read_group(path, arrays, "adam_v", cfg), "step": adam_step}
    return Checkpoint(params, cfg, tokenizer, step, opt_state, extra)


def saved_step(value, name) -> int:
    """A step count read from a file's description: a non-negative integer (JSON has no other kind of step)."""
    if not (isinstance(value, int) and not isinstance(value, bool) and value >= 0):
        raise TypeError(f"{name} must be a non-negative integer, got {value!r}")
    return value


def read_npz(path, what="checkpoint") -> dict:
    """Every array of an .npz file, refusing pickled objects; a missing, truncated, damaged or foreign file is a
    CheckpointError that says which."""
    path = Path(path)
    if path.is_dir():  # a run's folder, say, given for the file it holds: name what it holds
        inside = sorted(str(p) for p in path.glob("*.npz"))
        named = ", ".join(inside[:3]) + (f" and {len(inside) - 3} more .npz files" if len(inside) > 3 else "")
        raise CheckpointError(f"{what} {path} is a directory, not a file" + (f"; it holds {named}" if inside else ""))
    if not path.is_file():
        raise CheckpointError(f"{what} {path} does not exist")
    if not zipfile.is_zipfile(path):  # also what a truncated .npz looks like
        raise CheckpointError(f"{what} {path} is truncated or not an .npz file")
    try:
        with np.load(path, allow_pickle=False) as npz:
            return {k: npz[k] for k in npz.files}
    except ValueError as e:
        if "allow_pickle" in str(e):  # object arrays need pickle, which we refuse
            raise CheckpointError(f"{what} {path} holds pickled objects, which are refused: {e}") from None
        raise CheckpointError(f"{what} {path} is damaged or not an .npz file: {e}") from None
    # A damaged zip makes zipfile and numpy raise almost anything (BadZipFile for a bad checksum, EOFError,
    # NotImplementedError for a flipped compression method, RuntimeError for a flipped encryption flag,
    # zlib.error, MemoryError for a huge shape in a header...), so every one of them is the same refusal.
    except Exception as e:  # noqa: BLE001 (see above: the list of what a damaged file raises is open)
        raise CheckpointError(f"{what} {path} is truncated, damaged or not an .npz file "
                              f"({type(e).__name__}: {e})") from None


def _read_meta(path, arrays) -> dict:
    if "meta" not in arrays or arrays["meta"].dtype.kind != "U":
        raise CheckpointError(f"{path} is not a checkpoint of this project (no description entry)")
    try:
        meta = json.loads(str(arrays["meta"]))
    except json.JSONDecodeError:
        raise CheckpointError(f"{path}: its description is not valid JSON") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        found = meta.get("format") if isinstance(meta, dict) else type(meta).__name__
        raise CheckpointError(f"{path} is not a checkpoint of this project (format {found!r})")
    if meta.get("version") != VERSION:
        raise CheckpointError(
            f"{path} has checkpoint format version {meta.get('version')!r}; this code reads version {VERSION}")
    return meta


def _read_group(path, arrays, group, cfg):
    shapes = param_shapes(cfg)
    found = {k.split("/", 1)[1]: v for k, v in arrays.items() if k.startswith(group + "/")}
    missing = [k for k in shapes if k not in found]
    unexpected = [k for k in found if k not in shapes]
    if missing or unexpected:
        raise CheckpointError(
            f"checkpoint {path} does not match its config: {group} "
            + (f"missing {', '.join(missing[:3])}" if missing else f"unexpected {', '.join(unexpected[:3])}"))
    for name, shape in shapes.items():
        if found[name].shape != shape:
            raise CheckpointError(
                f"checkpoint {path}: {group}/{name} has shape {found[name].shape}, its config needs {shape}")
        if found[name].dtype.kind != "f":
            raise CheckpointError(f"checkpoint {path}: {group}/{name} is not floating point")
    return {name: found[name] for name in shapes}
