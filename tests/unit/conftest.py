"""Fixtures of the unit tests (the tests that judge the model; tools/mutants.py runs them in its copies).
Keep this file to fixtures only."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from transformer.config import PRESETS

ROOT = Path(__file__).resolve().parents[2]
CORPUS = Path(os.environ.get("TRANSFORMER_CORPUS", ROOT / "data" / "tinyshakespeare" / "input.txt"))


@pytest.fixture(scope="session")
def corpus():
    """Tiny Shakespeare's path, fetched by scripts/fetch_corpus.py if it is not there yet."""
    if not CORPUS.is_file():
        result = subprocess.run([sys.executable, str(ROOT / "scripts" / "fetch_corpus.py")],
                                capture_output=True, text=True)
        if result.returncode != 0 or not CORPUS.is_file():
            pytest.skip(f"Tiny Shakespeare is not available: {result.stderr.strip()}")
    return CORPUS


@pytest.fixture
def tiny_cfg():
    """The 377-parameter preset: small enough for central differences on every entry."""
    return PRESETS["tiny"]


@pytest.fixture
def cfg_a():
    """Preset A (V=65, d=64): large enough for statistics over the initialisation."""
    return PRESETS["A"]
