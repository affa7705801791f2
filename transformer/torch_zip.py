"""Read the tensors of a PyTorch checkpoint (`pytorch_model.bin`, written by `torch.save`) without torch, and
without letting its pickle run code.

Since torch 1.6 such a file is a zip archive: `<name>/data.pkl`, a Python pickle of the state dictionary, and
`<name>/data/<key>`, the raw little-endian bytes of each storage. Unpickling an arbitrary pickle can call any
importable function, which is why loading an untrusted checkpoint with `pickle` (or with `torch.load` without
`weights_only`) is unsafe. Here the unpickler resolves only the few names a state dictionary of tensors uses
(an ordered dictionary, the storage types, `torch._utils._rebuild_tensor_v2`): the dictionary to
`collections.OrderedDict`, the others to objects of this module that carry nothing the pickle could change.
Any other name refuses the file, naming it, before anything it names can run. Storages become flat numpy
arrays read from the archive; a tensor is a (copied) strided window of its storage, as torch defines it, each
checked to lie within it. Not read: the format torch.save wrote before torch 1.6 (not a zip archive), storages
numpy has no dtype for (bfloat16) and big-endian ones; each is refused by name.
"""

import io
import pickle
import zipfile
from collections import OrderedDict
from pathlib import Path

import numpy as np

from .errors import CheckpointError

STORAGES = {"FloatStorage": "<f4", "DoubleStorage": "<f8", "HalfStorage": "<f2", "ByteStorage": "u1",
            "BoolStorage": "?", "LongStorage": "<i8", "IntStorage": "<i4"}  # torch's storage types numpy holds


class StorageType(tuple):
    """A storage type the pickle names (`torch.FloatStorage`), as (name,). A tuple with no attributes of its own,
    so that nothing in the pickle can change it."""
    __slots__ = ()


class Storage(tuple):
    """A storage read from the archive, as (its flat array,): only `rebuild_tensor` takes one, and, a tuple with
    no attributes of its own, nothing in the pickle can change it or put another array in its place."""
    __slots__ = ()


class RebuildTensor:
    """What the pickle gets for `torch._utils._rebuild_tensor_v2`: `rebuild_tensor`, behind an object with no
    attributes that the pickle could set."""
    __slots__ = ()

    def __call__(self, storage, offset, size, stride, *_):
        return rebuild_tensor(storage, offset, size, stride)


def rebuild_tensor(storage, offset, size, stride):
    """`torch._utils._rebuild_tensor_v2`'s part that matters here: the window of a storage's flat array that
    starts at element `offset` and steps by `stride`, copied. Refused: anything but a storage, a window that
    reaches past the storage's end, and one with more entries than the storage (a stride of 0 repeating them,
    which a state dictionary does not need and a small file could use to ask for any amount of memory)."""
    size, stride = tuple(size), tuple(stride)
    numbers = (offset, *size, *stride)
    if not (isinstance(storage, Storage) and len(size) == len(stride)
            and all(type(n) is int and n >= 0 for n in numbers)):
        raise CheckpointError(f"a tensor of size {size}, stride {stride} and offset {offset}: not a window of a "
                              "storage")
    flat = storage[0]
    count = int(np.prod(size, dtype=object))
    if count > flat.size:
        raise CheckpointError(f"a tensor of {count} entries from a storage of {flat.size}")
    last = offset + sum((n - 1) * s for n, s in zip(size, stride)) if count else offset - 1
    if last >= flat.size:
        raise CheckpointError(f"a tensor of size {size} reaches element {last} of a storage of {flat.size}")
    window = np.lib.stride_tricks.as_strided(flat[offset:], size, [s * flat.itemsize for s in stride])
    return np.array(window)


class StateUnpickler(pickle.Unpickler):
    """Unpickles a state dictionary of tensors, and nothing else (see the module's text)."""

    def __init__(self, file, archive, prefix):
        super().__init__(file)
        self.archive, self.prefix, self.storages = archive, prefix, {}

    def find_class(self, module, name):
        if (module, name) == ("collections", "OrderedDict"):
            return OrderedDict
        if (module, name) == ("torch._utils", "_rebuild_tensor_v2"):
            return RebuildTensor()
        if module == "torch" and name in STORAGES:
            return StorageType((name,))
        if module == "torch" and name.endswith("Storage"):
            raise CheckpointError(f"tensors of torch.{name}, which numpy does not hold "
                                  f"(it reads {', '.join(STORAGES)})")
        raise CheckpointError(f"the pickle asks for {module}.{name}, which a state dictionary of tensors does not "
                              "use: refused (unpickling it could run code)")

    def persistent_load(self, pid):
        """A storage: ("storage", its type, its key in the archive, its device, its number of elements). At most
        the bytes those elements need are read, so a compressed entry cannot unpack to more."""
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage" and isinstance(pid[1], StorageType)
                and isinstance(pid[2], str) and type(pid[4]) is int and pid[4] >= 0):
            raise CheckpointError(f"the pickle refers to {pid!r}, not to a storage")
        _, (kind,), key, _, count = pid
        if key not in self.storages:
            dtype, path = np.dtype(STORAGES[kind]), f"{self.prefix}data/{key}"
            try:
                info = self.archive.getinfo(path)
            except KeyError:
                raise CheckpointError(f"storage {key} is not in the archive ({path} missing)") from None
            need = count * dtype.itemsize
            if info.file_size < need:
                raise CheckpointError(f"storage {key} holds {info.file_size} bytes, {count} elements of {kind} need "
                                      f"{need}")
            with self.archive.open(info) as f:
                self.storages[key] = Storage((np.frombuffer(f.read(need), dtype, count),))
        return self.storages[key]


def read_torch_zip(path) -> dict:
    """The tensors of a `torch.save` zip archive, by name, as numpy arrays.

    Parameters
    ----------
    path : str or Path

    Returns
    -------
    dict
        Tensor name to array, in the file's order.

    Raises
    ------
    CheckpointError
        If the file is not a zip archive (torch before 1.6 wrote another format) or is truncated, its pickle
        asks for anything but tensors, a storage is missing or short, or the result is not a dictionary of
        tensors; the message names the problem.
    """
    path = Path(path)
    try:
        with zipfile.ZipFile(path) as archive:
            state = load_state(archive)
    except zipfile.BadZipFile as e:
        raise CheckpointError(f"{path}: not a whole zip archive ({e}); torch.save before torch 1.6 wrote another "
                              "format") from None
    except CheckpointError as e:
        raise CheckpointError(f"{path}: {e}") from None
    except Exception as e:  # noqa: BLE001  a malformed pickle or archive fails in many ways, each refused alike
        raise CheckpointError(f"{path}: its pickle or archive cannot be read ({type(e).__name__}: {e})") from None
    if not (isinstance(state, dict) and all(isinstance(k, str) and isinstance(v, np.ndarray) and v.flags.writeable
                                            for k, v in state.items())):
        raise CheckpointError(f"{path}: not a dictionary of tensors by name")
    return dict(state)


def load_state(archive):
    """What the archive's data.pkl holds, its storages read from the archive."""
    pickles = [n for n in archive.namelist() if n.endswith("/data.pkl") and n.count("/") == 1]
    if len(pickles) != 1:
        raise CheckpointError(f"a torch archive holds one <name>/data.pkl; found {len(pickles)}")
    prefix = pickles[0][:-len("data.pkl")]
    if prefix + "byteorder" in archive.namelist() and archive.read(prefix + "byteorder").strip() != b"little":
        raise CheckpointError("its storages are big-endian; this reader takes little-endian ones")
    return StateUnpickler(io.BytesIO(archive.read(pickles[0])), archive, prefix).load()
