"""The memory policies measured by tools/memory_policies.py, for the pages that show them (Flash attention,
Activation checkpointing, Training loop).

One run measures the four policies at every length; it takes seconds, and three pages read it, so its result is
kept in build/cache/ under a key of the code it measures (the tool and the transformer units it reaches), the
numpy version and the lengths. The bytes are the same on every run; the times are those of the run that made
the cache, on the machine that built the site. The quick build (SITE_QUICK=1) measures fewer lengths.
"""

from dataclasses import asdict

from tools import memory_policies as tool

from . import depends
from .common import CACHE, ROOT, cached_json, hash_parts, mode, numpy_version

QUICK_LENGTHS = (64, 128, 256)  # the quick build's; the full build measures tool.LENGTHS
STEPS = 3  # timed steps per policy and length (the median is shown)
MIB = 1 << 20
TOOL = ROOT / "tools" / "memory_policies.py"


def lengths():
    return QUICK_LENGTHS if mode() == "quick" else tool.LENGTHS


def measurements():
    """Every Measurement of the run, by (policy, T)."""
    key = hash_parts(TOOL.read_text(), depends.units_text(depends.page_units(TOOL)), numpy_version(),
                     lengths(), STEPS)
    value = cached_json(CACHE / f"memory_policies-{mode()}.json", key,
                        lambda: [asdict(m) for m in tool.measure_all(lengths(), STEPS)])
    return {(m["policy"], m["T"]): tool.Measurement(**m) for m in value}


def mib(n_bytes, decimals=2):
    return f"{n_bytes / MIB:.{decimals}f}"
