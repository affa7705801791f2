"""Read the tensors of a PyTorch checkpoint (`pytorch_model.bin`, written by `torch.save`) without torch, and
without letting its pickle run code.

Since torch 1.6 such a file is a zip archive: `<name>/data.pkl`, a Python pickle of the state dictionary, and
`<name>/data/<key>`, the raw little-endian bytes of each storage. Unpickling an arbitrary pickle can call any
importable function, which is why loading an untrusted checkpoint with `pickle` (or with `torch.load` without
`weights_only`) is unsafe. Here the unpickler resolves only the few names a state dictionary of tensors uses
(an ordered dictionary, the storage types, `torch._utils._rebuild_tensor_v2`), each to a function of this
module; any other name in the pickle refuses the file, naming it. Storages become numpy arrays read from the
archive; a tensor is a (copied) strided window of its storage, as torch defines it.
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


class Storage:
    """A storage type named by the pickle (`torch.FloatStorage`): only its dtype is kept."""

    def __init__(self, name):
        self.name, self.dtype = name, np.dtype(STORAGES[name])


def rebuild_tensor(storage, offset, size, stride, *_):
    """`torch._utils._rebuild_tensor_v2`'s part that matters here: the window of `storage` (a flat array) that
    starts at element `offset` and steps by `stride`, copied; a window past the storage's end is refused."""
    size, stride = tuple(size), tuple(stride)
    numbers = (offset, *size, *stride)
    if not (isinstance(storage, np.ndarray) and len(size) == len(stride)
            and all(isinstance(n, int) and n >= 0 for n in numbers)):
        raise CheckpointError(f"a tensor of size {size}, stride {stride} and offset {offset}: not a window of a "
                              "storage")
    last = offset + sum((n - 1) * s for n, s in zip(size, stride)) if all(size) else offset - 1
    if last >= storage.size:
        raise CheckpointError(f"a tensor of size {size} reaches element {last} of a storage of {storage.size}")
    window = np.lib.stride_tricks.as_strided(storage[offset:], size, [s * storage.itemsize for s in stride])
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
            return rebuild_tensor
        if module == "torch" and name in STORAGES:
            return Storage(name)
        if module == "torch" and name.endswith("Storage"):
            raise CheckpointError(f"tensors of torch.{name}, which numpy does not hold "
                                  f"(it reads {', '.join(STORAGES)})")
        raise CheckpointError(f"the pickle asks for {module}.{name}, which a state dictionary of tensors does not "
                              "use: refused (unpickling it could run code)")

    def persistent_load(self, pid):
        """A storage: ("storage", its type, its key in the archive, its device, its number of elements)."""
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage" and isinstance(pid[1], Storage)):
            raise CheckpointError(f"the pickle refers to {pid!r}, not to a storage")
        _, kind, key, _, count = pid
        if key not in self.storages:
            path = f"{self.prefix}data/{key}"
            try:
                data = self.archive.read(path)
            except KeyError:
                raise CheckpointError(f"storage {key} is not in the archive ({path} missing)") from None
            if len(data) < count * kind.dtype.itemsize:
                raise CheckpointError(f"storage {key} holds {len(data)} bytes, {count} elements of {kind.name} need "
                                      f"{count * kind.dtype.itemsize}")
            self.storages[key] = np.frombuffer(data, kind.dtype, count)
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
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError) as e:
        raise CheckpointError(f"{path}: its pickle cannot be read ({type(e).__name__}: {e})") from None
    if not isinstance(state, dict) or not all(isinstance(v, np.ndarray) for v in state.values()):
        raise CheckpointError(f"{path}: not a dictionary of tensors")
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
