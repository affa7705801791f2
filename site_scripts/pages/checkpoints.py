"""Generator of the Checkpoints page: the values its prose shows (docs/training/checkpoints.md binds them) and its
tables. A real checkpoint is written, loaded, written again through a write that fails halfway, and a few files
that loading must refuse are written beside it, all at build time in a temporary folder."""

import errno
import hashlib
import json
import tempfile
from pathlib import Path

import numpy as np

from transformer.checkpoint import FORMAT, VERSION, load_checkpoint, save_checkpoint, write_npz
from transformer.config import PRESETS
from transformer.data import train_val_split
from transformer.errors import CheckpointError
from transformer.model import init_params
from transformer.run_state import new_run
from transformer.step import train_step
from transformer.train_config import TrainConfig

from .. import sections
from ..common import md_table, verdict_text
from ..examples import SEED

LINES = "To be, or not to be, that is the question:\nWhether 'tis nobler in the mind to suffer\n"
REPEATS = 4
TEXT = LINES * REPEATS
STEPS = 3
ELAPSED = 0.0  # the elapsed time the checkpoint records: fixed, so that the page is the same on every machine
REFUSED = [("a file that does not exist", "missing.npz"), ("half of a real checkpoint", "truncated.npz"),
           ("a text file", "notes.txt"), ("another program's .npz", "foreign.npz"),
           ("parameters of another size", "wrong-shapes.npz"), ("an object array (needs pickle)", "pickled.npz")]


def run_to_save():
    """A small run on TEXT after STEPS real training steps, as `train` would save it, and its steps' losses."""
    tc = TrainConfig(steps=STEPS, batch_size=2, seq_len=8, warmup=1, dtype="float64", seed=SEED)
    run = new_run(TEXT, PRESETS["tiny"].with_(context_len=8), tc)
    train_ids, _ = train_val_split(run.tokenizer.encode(TEXT), tc.seq_len)
    losses = [train_step(run, train_ids, tc.seq_len)["loss"] for _ in range(STEPS)]
    return run, train_ids, tc, losses


def make(folder):
    """The checkpoint's path and contents, and the run it came from (run, training split, config, losses)."""
    run, train_ids, tc, losses = run_to_save()
    ckpt = run.checkpoint(ELAPSED, "corpus.txt", hashlib.sha256(TEXT.encode()).hexdigest())
    return save_checkpoint(folder / "checkpoint.npz", ckpt), ckpt, (run, train_ids, tc, losses)


def same_state(loaded, ckpt):
    """Every parameter and moment of `loaded` equal to `ckpt`'s, bit for bit."""
    return all(np.array_equal(loaded.params[k], v) for k, v in ckpt.params.items()) and all(
        np.array_equal(loaded.opt_state[g][k], ckpt.opt_state[g][k]) for g in ("m", "v") for k in ckpt.params)


def layout(path, ckpt):
    """The file's entries, grouped by their prefix, and its meta JSON."""
    with np.load(path, allow_pickle=False) as npz:
        arrays = {k: npz[k] for k in npz.files}
    entries = md_table(["Entry", "Shape", "dtype"], [[f"`{k}`", sections.shape_text(v.shape), str(v.dtype)]
                                                       for k, v in arrays.items()])
    groups = {}
    for k, v in arrays.items():
        prefix = k.split("/")[0] + ("/" if "/" in k else "")
        count, scalars, size = groups.get(prefix, (0, 0, 0))
        groups[prefix] = (count + 1, scalars + v.size, size + v.nbytes)
    summary = md_table(["Entries", "Arrays", "Scalars", "Bytes of data"],
                       [[f"`{p}`" + ("…" if p.endswith("/") else ""), *g] for p, g in groups.items()])
    meta = json.loads(str(arrays["meta"]))
    size = path.stat().st_size
    overhead = size - sum(g[2] for g in groups.values())
    values = {"arrays": len(arrays), "file_bytes": size, "overhead": overhead, "per_entry": round(overhead / len(arrays)),
              "param_bytes": groups["param/"][2], "moment_bytes": groups["adam_m/"][2] + groups["adam_v/"][2],
              "ratio": (groups["param/"][2] + groups["adam_m/"][2] + groups["adam_v/"][2]) / groups["param/"][2],
              "loaded": verdict_text(same_state(load_checkpoint(path), ckpt), False, "")}
    return {"entries": entries, "groups": summary, "meta": "```json\n" + json.dumps(meta, indent=2) + "\n```\n"}, values


def half_write(f, arrays):
    """A write that stops halfway, as a full disk would: half of the file's bytes, then ENOSPC."""
    import io

    buffer = io.BytesIO()
    write_npz(buffer, arrays)
    f.write(buffer.getvalue()[: len(buffer.getvalue()) // 2])
    raise OSError(errno.ENOSPC, "No space left on device")


def crash(path, state):
    """One more step, saved over the checkpoint through a write that fails halfway: what is left."""
    run, train_ids, tc, _ = state
    train_step(run, train_ids, tc.seq_len)
    try:
        save_checkpoint(path, run.checkpoint(ELAPSED, "corpus.txt", ""), write=half_write)
        message = ""
    except OSError as e:
        message = str(e).replace(str(path.parent) + "/", "")
    return {"message": message, "tried_step": run.step, "loaded_step": load_checkpoint(path).step,
            "files": sorted(p.name for p in path.parent.iterdir())}


def refusals(path):
    """What `load_checkpoint` says to files it must refuse, written beside the good checkpoint at path."""
    folder, good = path.parent, path.read_bytes()
    (folder / "truncated.npz").write_bytes(good[: len(good) // 2])
    (folder / "notes.txt").write_text("not a checkpoint")
    np.savez(folder / "foreign.npz", weights=np.zeros(3))
    other = init_params(PRESETS["tiny"].with_(emb_dim=6, num_heads=2), seed=SEED)
    bad = {"format": FORMAT, "version": VERSION, "config": PRESETS["tiny"].to_dict(),
           "tokenizer": {"kind": "char", "chars": "abcde"}, "step": 0, "adam_step": None, "extra": {}}
    np.savez(folder / "wrong-shapes.npz", meta=np.array(json.dumps(bad)), **{f"param/{k}": v for k, v in other.items()})
    np.savez(folder / "pickled.npz", meta=np.array([{"a": 1}], dtype=object))
    cases = []
    for label, name in REFUSED:
        try:
            load_checkpoint(folder / name)
            message = "**loaded without error**"
        except CheckpointError as e:
            message = "`" + str(e).replace(str(folder) + "/", "") + "`"
        cases.append([label, message])
    return md_table(["Given", "`load_checkpoint` says"], cases)


def generate(context):
    with tempfile.TemporaryDirectory() as folder:
        path, ckpt, state = make(Path(folder))
        tables, values = layout(path, ckpt)
        values.update({"losses": state[3], "steps": STEPS, "seed": SEED, "lines": LINES.count("\n"), "repeats": REPEATS,
                       "elapsed": ELAPSED, "crash": crash(path, state)})
        return {"values": values, **tables, "refusals": refusals(path)}
