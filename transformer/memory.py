"""Keep freed memory in the process instead of returning it to the OS.

A training step allocates and frees the same few-megabyte arrays every time.
glibc's malloc hands blocks that large back to the kernel when they are freed
(through munmap, or by trimming the heap), so the next step page-faults every
page back in: at config A that was 40% of the NumPy step (124 ms with the
default settings, 73 ms with the ones below, measured by
`tools/bench_step.py --frameworks numpy --configs A [--default-malloc]`).
Raising the two thresholds keeps the memory mapped and reused. It changes no
result, only where freed memory waits for its next use.
"""

import ctypes

import numpy as np

_M_TRIM_THRESHOLD = -1  # constants from glibc's <malloc.h>
_M_MMAP_THRESHOLD = -3


def keep_freed_memory(threshold_bytes=1 << 30) -> bool:
    """Ask glibc to keep freed blocks below `threshold_bytes` for reuse.

    Returns True when the allocator accepted the setting, False where there
    is no glibc (macOS, Windows, musl), where it is a harmless no-op.
    """
    try:
        # The symbols this process has loaded, the C library's among them; ctypes.util.find_library("c")
        # would start a process (ldconfig) in every process that calls this.
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError, TypeError):  # no mallopt (not glibc), or no CDLL(None) (Windows)
        return False
    ok_mmap = mallopt(_M_MMAP_THRESHOLD, threshold_bytes)
    ok_trim = mallopt(_M_TRIM_THRESHOLD, threshold_bytes)
    return bool(ok_mmap and ok_trim)


def arrays_in(obj):
    """Every ndarray reachable from obj (a cache, a graph's saved values) through tuples, named ones too,
    lists and dicts: what the memory measurements count."""
    if isinstance(obj, np.ndarray):
        yield obj
    elif isinstance(obj, (tuple, list)):
        for item in obj:
            yield from arrays_in(item)
    elif isinstance(obj, dict):
        for item in obj.values():
            yield from arrays_in(item)
