"""keep_freed_memory (transformer/memory.py): it asks glibc's malloc to keep freed blocks, and starts no process
to find it (ctypes.util.find_library would run ldconfig in every process that calls it)."""

import subprocess
import sys

import pytest

PROBE = """
import sys
started = []
sys.addaudithook(lambda event, args: started.append(event) if event in ("subprocess.Popen", "os.fork",
                                                                         "os.posix_spawn", "os.system") else None)
from transformer.memory import keep_freed_memory
print(keep_freed_memory(), started)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt: Linux")
def test_keep_freed_memory_reaches_mallopt_without_starting_a_process():
    import platform

    if platform.libc_ver()[0] != "glibc":
        pytest.skip("not glibc")
    result = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, check=True)
    assert result.stdout.split() == ["True", "[]"]
