"""The older GPT-2 checkpoint, pytorch_model.bin, read without torch and without running its pickle
(transformer/torch_zip.py): the same parameters as from model.safetensors, tensors that are windows of a shared
storage read as torch reads them, and a pickle that asks for anything but tensors refused before it runs."""

import io
import json
import os
import pickle
import shutil
import zipfile
from collections import OrderedDict

import numpy as np
import pytest

from transformer.errors import CheckpointError
from transformer.gpt2 import TORCH_WEIGHTS_NAME, WEIGHTS_NAME, load_gpt2
from transformer.torch_zip import Storage, read_torch_zip, rebuild_tensor

torch = pytest.importorskip("torch")

SIZES = {"vocab_size": 50257, "n_positions": 16, "n_embd": 16, "n_layer": 2, "n_head": 2}


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """Two folders of one random GPT-2: model.safetensors (transformers' save_pretrained), and pytorch_model.bin
    (torch.save of a GPT2Model's state, without the prefix, with the causal masks old checkpoints stored)."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(**SIZES, bos_token_id=50256, eos_token_id=50256))
    safe, old = tmp_path_factory.mktemp("safe"), tmp_path_factory.mktemp("old")
    model.save_pretrained(safe)
    shutil.copy(safe / "config.json", old / "config.json")
    state = {k.removeprefix("transformer."): v for k, v in model.state_dict().items() if k != "lm_head.weight"}
    for l in range(SIZES["n_layer"]):
        state[f"h.{l}.attn.bias"] = torch.tril(torch.ones(16, 16, dtype=torch.bool))[None, None]
        state[f"h.{l}.attn.masked_bias"] = torch.tensor(-1e4)
    torch.save(state, old / TORCH_WEIGHTS_NAME)
    return safe, old


def test_pytorch_model_bin_gives_the_same_parameters_as_safetensors(folders):
    safe, old = folders
    (ours, cfg), (again, cfg_again) = load_gpt2(safe), load_gpt2(old)
    assert cfg == cfg_again and list(ours) == list(again)
    assert all(again[k].dtype == np.float32 and np.array_equal(again[k], ours[k]) for k in ours)


def test_windows_of_a_shared_storage_are_read_as_torch_reads_them(tmp_path):
    base = torch.arange(24, dtype=torch.float64).reshape(4, 6)
    tensors = {"whole": base, "transposed": base.t(), "columns": base[:, 1:4], "offset": base[2:, ::2],
               "half": torch.linspace(-2, 2, 5, dtype=torch.float16), "empty": torch.zeros(0, 3)}
    torch.save(tensors, tmp_path / "t.bin")
    read = read_torch_zip(tmp_path / "t.bin")
    assert list(read) == list(tensors)
    for name, tensor in tensors.items():
        assert read[name].dtype == tensor.numpy().dtype and np.array_equal(read[name], tensor.numpy()), name


class RunsCode:
    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def archive_with(path, data_pkl, storages=()):
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("archive/data.pkl", data_pkl)
        for key, data in storages:
            z.writestr(f"archive/data/{key}", data)


@pytest.mark.parametrize("protocol", [2, 4])
def test_a_pickle_that_asks_for_a_function_is_refused_before_it_runs(tmp_path, protocol):
    payload = RunsCode()
    payload.marker = tmp_path / "ran"
    archive_with(tmp_path / "evil.bin", pickle.dumps({"w": payload}, protocol=protocol))
    with pytest.raises(CheckpointError, match=r"asks for (posix|os|nt)\.system.*refused"):
        read_torch_zip(tmp_path / "evil.bin")
    assert not payload.marker.exists()
    payload.marker = tmp_path / "control"
    pickle.loads(pickle.dumps(payload, protocol=protocol))  # the negative control: plain pickle does run it
    assert payload.marker.exists()


def test_damaged_archives_are_refused_by_name(tmp_path):
    torch.save({"w": torch.ones(3, 4)}, tmp_path / "good.bin")
    data = (tmp_path / "good.bin").read_bytes()
    (tmp_path / "cut.bin").write_bytes(data[:len(data) // 2])
    with pytest.raises(CheckpointError, match="cut.bin: not a whole zip archive"):
        read_torch_zip(tmp_path / "cut.bin")
    with zipfile.ZipFile(tmp_path / "good.bin") as z:
        pkl = next(z.read(n) for n in z.namelist() if n.endswith("/data.pkl"))
    archive_with(tmp_path / "lost.bin", pkl)
    with pytest.raises(CheckpointError, match="storage 0 is not in the archive"):
        read_torch_zip(tmp_path / "lost.bin")
    archive_with(tmp_path / "short.bin", pkl, [("0", bytes(20))])
    with pytest.raises(CheckpointError, match="storage 0 holds 20 bytes, 12 elements of FloatStorage need 48"):
        read_torch_zip(tmp_path / "short.bin")
    torch.save({"w": torch.ones(3, dtype=torch.bfloat16)}, tmp_path / "bf16.bin")
    with pytest.raises(CheckpointError, match="BFloat16Storage, which numpy does not hold"):
        read_torch_zip(tmp_path / "bf16.bin")


def test_a_window_past_its_storage_or_larger_than_it_is_refused():
    six = Storage((np.arange(6.0),))
    assert np.array_equal(rebuild_tensor(six, 1, (2, 2), (3, 1)), [[1, 2], [4, 5]])
    with pytest.raises(CheckpointError, match="reaches element 6 of a storage of 6"):
        rebuild_tensor(six, 2, (2, 2), (3, 1))
    with pytest.raises(CheckpointError, match="not a window"):
        rebuild_tensor(six, 0, (2,), (-1,))
    with pytest.raises(CheckpointError, match="a tensor of 100 entries from a storage of 6"):
        rebuild_tensor(six, 0, (100,), (0,))  # a stride of 0: a small file asking for any amount of memory


class Crafted:
    """What a hostile torch.save might hold: `_rebuild_tensor_v2` called on `storage` with the given window."""

    def __init__(self, storage, offset, size, stride):
        self.args = (storage, offset, size, stride, False, OrderedDict())

    def __reduce__(self):
        return torch._utils._rebuild_tensor_v2, self.args


class FakeStorage:
    def __init__(self, n):
        self.n = n


class CraftingPickler(pickle.Pickler):
    def persistent_id(self, obj):
        return ("storage", torch.FloatStorage, "0", "cpu", obj.n) if isinstance(obj, FakeStorage) else None


def crafted_archive(path, state, protocol=2):
    buffer = io.BytesIO()
    CraftingPickler(buffer, protocol=protocol).dump(state)
    archive_with(path, buffer.getvalue(), [("0", np.arange(16, dtype="<f4").tobytes())])
    return path


@pytest.mark.parametrize("protocol", [2, 4])  # 4: names come by STACK_GLOBAL, which find_class also sees
def test_crafted_pickles_are_refused_without_reading_outside_a_storage(tmp_path, protocol):
    storage = FakeStorage(16)
    fine = crafted_archive(tmp_path / "fine.bin", {"w": Crafted(storage, 4, (2, 3), (3, 1))}, protocol)
    assert np.array_equal(read_torch_zip(fine)["w"], np.arange(4, 10, dtype=np.float32).reshape(2, 3))
    cases = {  # a tensor used as another's storage (a 2-D array would make flat bounds meaningless), past the
        # end, repeated without end, a key that is not a name, the storage itself as a value
        "tensor as storage": ({"a": Crafted(storage, 0, (4, 4), (4, 1)),
                               "b": Crafted(Crafted(storage, 0, (4, 4), (4, 1)), 3, (12,), (1,))}, "not a window"),
        "past the end": ({"w": Crafted(storage, 3, (14,), (1,))}, "reaches element 16 of a storage of 16"),
        "repeated": ({"w": Crafted(storage, 0, (2 ** 33,), (0,))}, "8589934592 entries from a storage of 16"),
        "number key": ({1: Crafted(storage, 0, (4,), (1,))}, "not a dictionary of tensors by name"),
    }
    for name, (state, message) in cases.items():
        with pytest.raises(CheckpointError, match=message):
            read_torch_zip(crafted_archive(tmp_path / f"{name}.bin", state, protocol))


def test_a_pickle_cannot_change_the_reader(tmp_path):
    """BUILD on the object the pickle gets for _rebuild_tensor_v2 would set its attributes: it has none."""
    build = (b"\x80\x02ctorch._utils\n_rebuild_tensor_v2\nN}X\x0c\x00\x00\x00__qualname__X\x03\x00\x00\x00bad"
             b"s\x86b.")
    archive_with(tmp_path / "build.bin", build)
    with pytest.raises(CheckpointError, match="cannot be read"):
        read_torch_zip(tmp_path / "build.bin")
    assert rebuild_tensor.__qualname__ == "rebuild_tensor"


def test_a_weight_that_is_not_a_float_is_refused_by_name(folders, tmp_path):
    _, old = folders
    bad = tmp_path / "bad"
    shutil.copytree(old, bad)
    state = read_torch_zip(bad / TORCH_WEIGHTS_NAME)
    state["wpe.weight"] = state["wpe.weight"].astype(np.int64)
    torch.save({k: torch.from_numpy(np.array(v)) for k, v in state.items()}, bad / TORCH_WEIGHTS_NAME)
    with pytest.raises(CheckpointError, match="tensor wpe.weight has dtype int64"):
        load_gpt2(bad)
    assert json.loads((bad / "config.json").read_text())["n_embd"] == 16
    (bad / TORCH_WEIGHTS_NAME).unlink()
    with pytest.raises(CheckpointError, match=f"{WEIGHTS_NAME} \\(or {TORCH_WEIGHTS_NAME}\\) missing"):
        load_gpt2(bad)
