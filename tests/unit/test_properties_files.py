"""Property tests of the files a run reads back: a checkpoint (train --resume, sample) and an adapter file
(finetune --resume, sample --adapter), each truncated anywhere, with any one bit flipped, or with any field of
its description replaced by any JSON value.

Reading a damaged file either gives back exactly what was saved or raises CheckpointError naming the file:
never another exception, never a half-filled result. A flipped bit can land where nothing reads it (slack in
a zip header); then the file still loads, and must load the same. The examples are derandomized (the same
on every run) and each is one read of a file of a few tens of kilobytes.
"""

import json
import shutil
from dataclasses import fields, is_dataclass

import numpy as np
import pytest

hypothesis = pytest.importorskip(
    "hypothesis", reason="the property tests need hypothesis, part of the test extra (pip install -e '.[test]')")
from hypothesis import given, settings
from hypothesis import strategies as st

from transformer.checkpoint import load_checkpoint, read_npz
from transformer.config import PRESETS, is_finite_number
from transformer.errors import CheckpointError, TransformerError
from transformer.finetune_run import finetune, load_adapter, resumed_finetune_run
from transformer.lora import LoRAConfig
from transformer.model import param_shapes
from transformer.run_state import resumed_run
from transformer.train import train
from transformer.train_config import TrainConfig

MODEL = PRESETS["tiny"]  # vocab_size comes from the corpus
TRAIN = TrainConfig(steps=4, batch_size=2, seq_len=4, warmup=1, eval_every=4, ckpt_every=2, lr=1e-2)


def prop(max_examples):
    """Derandomized (CI cannot flake), no deadline (a shared machine's pauses are not failures), no example
    database written into the tree."""
    return settings(max_examples=max_examples, derandomize=True, deadline=None, database=None)


def stop_at(n):
    def on_step(step, stop):
        if step == n:
            stop.reason = "interrupted"
    return on_step


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    """One folder the examples of a test write into, each over the last (a new folder per example would make
    pytest's numbering of folders slow down the test quadratically)."""
    return tmp_path_factory.mktemp("work")


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A training run and a fine-tuning run, each stopped at step 2 of 4 (so both can resume), and their files."""
    root = tmp_path_factory.mktemp("saved")
    corpus = root / "corpus.txt"
    corpus.write_text("abcd\nbad cab\n" * 20)
    train(corpus, root / "run", MODEL, TRAIN, progress=False, on_step=stop_at(2))
    base = root / "run" / "checkpoint.npz"
    finetune(base, corpus, root / "ft", LoRAConfig(rank=1, alpha=2.0, targets=("q", "v")), TRAIN,
             progress=False, on_step=stop_at(2))
    adapter = root / "ft" / "adapter.npz"
    sha = load_checkpoint(base).extra["corpus_sha256"]
    return Saved({"root": root, "corpus": corpus, "base": base, "adapter": adapter, "sha": sha,
                  "arrays": {base.name: read_npz(base), adapter.name: read_npz(adapter)},
                  "checkpoint_bytes": base.read_bytes(), "adapter_bytes": adapter.read_bytes(),
                  "checkpoint": load_checkpoint(base), "adapter_file": load_adapter(adapter),
                  "run": resumed_run(base, sha)})


class Saved(dict):
    """The saved files and what loading them gave; shown by its folder alone in a failing example's report."""

    def __repr__(self):
        return f"<saved files in {self['root']}>"


def same(a, b) -> bool:
    """Whether two loaded results hold the same content: arrays equal bit for bit with the same dtype, configs,
    tokenizers and samplers equal, recursively through dicts and dataclasses."""
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, np.random.Generator):
        return isinstance(b, np.random.Generator) and a.bit_generator.state == b.bit_generator.state
    if is_dataclass(a):
        return type(a) is type(b) and all(same(getattr(a, f.name), getattr(b, f.name)) for f in fields(a))
    if hasattr(a, "to_dict"):  # a tokenizer
        return type(a) is type(b) and a.to_dict() == b.to_dict()
    return type(a) is type(b) and a == b


def load_or_refuse(load, path, refusal=CheckpointError):
    """The result of load(path), or None when it raised `refusal` (a CheckpointError naming the file); any other
    exception fails."""
    try:
        return load(path)
    except refusal as e:
        assert not isinstance(e, CheckpointError) or str(path) in str(e), f"the error does not name the file: {e}"
        return None


def flipped(raw: bytes, bit: int) -> bytes:
    damaged = bytearray(raw)
    damaged[bit // 8] ^= 1 << (bit % 8)
    return bytes(damaged)


# ------------------------------------------------------------------ the harness itself

def test_the_comparison_notices_one_changed_entry_a_changed_dtype_and_a_missing_array(saved):
    """Negative control: `same` is what the properties below rest on, so it must see the smallest change."""
    ckpt = saved["checkpoint"]
    assert same(ckpt, load_checkpoint(saved["base"]))
    nudged = {**ckpt.params, "head_b": ckpt.params["head_b"].copy()}
    nudged["head_b"][0] = np.nextafter(nudged["head_b"][0], np.inf)  # one ulp
    retyped = {**ckpt.params, "head_b": ckpt.params["head_b"].astype(np.float64)}
    missing = {k: v for k, v in ckpt.params.items() if k != "head_b"}
    for params in (nudged, retyped, missing):
        assert not same(ckpt, type(ckpt)(params, ckpt.cfg, ckpt.tokenizer, ckpt.step, ckpt.opt_state, ckpt.extra))
    assert not same(ckpt, type(ckpt)(ckpt.params, ckpt.cfg, ckpt.tokenizer, ckpt.step + 1, ckpt.opt_state, ckpt.extra))


def test_a_flipped_bit_in_an_array_is_noticed_by_the_checksum_not_loaded(saved, tmp_path):
    """Negative control: a bit of a parameter's bytes, found by searching the file for them, is refused."""
    raw = saved["checkpoint_bytes"]
    at = raw.find(saved["checkpoint"].params["tok_emb"].tobytes())
    assert at > 0
    path = tmp_path / "c.npz"
    path.write_bytes(flipped(raw, 8 * at + 3))
    with pytest.raises(CheckpointError, match="c.npz"):
        load_checkpoint(path)


# ------------------------------------------------------------------ truncated and bit-flipped files

def checkpoint_loaders(saved):
    """What reads a checkpoint: sample and fine-tuning (load_checkpoint), train --resume (resumed_run)."""
    return [(load_checkpoint, saved["checkpoint"]), (lambda p: resumed_run(p, saved["sha"]), saved["run"])]


@prop(60)
@given(cut=st.integers(0, 10**9))
def test_a_truncated_checkpoint_or_adapter_file_is_refused_by_name(saved, work, cut):
    for name in ("checkpoint_bytes", "adapter_bytes"):
        raw = saved[name]
        path = work / "f.npz"
        path.write_bytes(raw[:cut % len(raw)])
        loaders = checkpoint_loaders(saved) if name == "checkpoint_bytes" else [(load_adapter, None)]
        for load, _ in loaders:
            assert load_or_refuse(load, path) is None  # nothing of a cut file is ever taken


@prop(200)
@given(bit=st.integers(0, 10**9))
def test_a_checkpoint_with_any_bit_flipped_loads_unchanged_or_is_refused(saved, work, bit):
    raw = saved["checkpoint_bytes"]
    path = work / "checkpoint.npz"
    path.write_bytes(flipped(raw, bit % (8 * len(raw))))
    for load, original in checkpoint_loaders(saved):
        loaded = load_or_refuse(load, path)
        assert loaded is None or same(loaded, original)


@prop(200)
@given(bit=st.integers(0, 10**9))
def test_an_adapter_file_with_any_bit_flipped_loads_unchanged_or_is_refused(saved, work, bit):
    raw = saved["adapter_bytes"]
    path = work / "adapter.npz"
    path.write_bytes(flipped(raw, bit % (8 * len(raw))))
    loaded = load_or_refuse(load_adapter, path)
    assert loaded is None or same(loaded, saved["adapter_file"])


@prop(15)
@given(bit=st.integers(0, 10**9))
def test_resuming_from_a_damaged_checkpoint_leaves_the_run_folder_as_it_was(saved, work, bit):
    out = work / "run"
    shutil.rmtree(out, ignore_errors=True)
    shutil.copytree(saved["root"] / "run", out)
    raw = saved["checkpoint_bytes"]
    damaged = flipped(raw, bit % (8 * len(raw)))
    (out / "checkpoint.npz").write_bytes(damaged)
    metrics = (out / "metrics.jsonl").read_bytes()
    try:
        train(saved["corpus"], out, MODEL, TRAIN, resume=True, progress=False, on_step=stop_at(3))
    except CheckpointError:
        assert (out / "checkpoint.npz").read_bytes() == damaged and (out / "metrics.jsonl").read_bytes() == metrics
    else:  # the flip was in slack: the run went on from the same state
        assert load_checkpoint(out / "checkpoint.npz").step == 3


# ------------------------------------------------------------------ descriptions with any field replaced

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.just(10**400) | st.floats() | st.text(max_size=6),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=6)
DELETED = object()


def key_paths(value, prefix=()):
    """Every path of keys into nested dicts, outermost first."""
    if not isinstance(value, dict):
        return []
    return [p for k, v in value.items() for p in [(*prefix, k), *key_paths(v, (*prefix, k))]]


def edited(meta, path, value):
    meta = json.loads(json.dumps(meta))
    *outer, last = path
    target = meta
    for k in outer:
        target = target[k]
    if value is DELETED:
        del target[last]
    else:
        target[last] = value
    return meta


def rewritten(saved, source, folder, data):
    """The file `source` with one field of its description (the JSON entry meta) replaced or deleted."""
    arrays = saved["arrays"][source.name]
    meta = json.loads(str(arrays["meta"]))
    path = data.draw(st.sampled_from(key_paths(meta)), label="field")
    value = data.draw(st.one_of(st.just(DELETED), JSON), label="value")
    target = folder / source.name
    np.savez(target, **{**arrays, "meta": np.array(json.dumps(edited(meta, path, value)))})  # no fsync: a scratch file
    return target


@prop(150)
@given(data=st.data())
def test_a_checkpoint_description_with_any_field_replaced_loads_consistently_or_is_refused(saved, work, data):
    path = rewritten(saved, saved["base"], work, data)
    ckpt = load_or_refuse(load_checkpoint, path)
    if ckpt is not None:  # accepted: then every part agrees with the config it came with
        assert {k: v.shape for k, v in ckpt.params.items()} == param_shapes(ckpt.cfg)
        assert ckpt.tokenizer.vocab_size == ckpt.cfg.vocab_size and isinstance(ckpt.step, int)
        assert isinstance(ckpt.extra, dict)
    run = load_or_refuse(lambda p: resumed_run(p, saved["sha"]), path, TransformerError)
    if run is not None:
        assert run.step < run.train_cfg.steps and same(run.params, saved["run"].params)
        assert is_finite_number(run.elapsed_s)


@prop(100)
@given(data=st.data())
def test_an_adapter_description_with_any_field_replaced_loads_consistently_or_is_refused(saved, work, data):
    path = rewritten(saved, saved["adapter"], work, data)
    adapter = load_or_refuse(load_adapter, path)
    if adapter is not None:
        assert same(adapter.adapters, saved["adapter_file"].adapters) and isinstance(adapter.step, int)
        assert isinstance(adapter.extra, dict)
    run = load_or_refuse(lambda p: resumed_finetune_run(p, saved["sha"], saved["base"]), path, TransformerError)
    if run is not None:
        assert run.step < run.train_cfg.steps and is_finite_number(run.elapsed_s)
