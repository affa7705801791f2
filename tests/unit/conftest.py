"""Fixtures of the unit tests (the tests that judge the model; tools/mutants.py runs them in its copies).
Keep this file to fixtures only."""

import pytest

from transformer.config import PRESETS


@pytest.fixture
def tiny_cfg():
    """The 377-parameter preset: small enough for central differences on every entry."""
    return PRESETS["tiny"]


@pytest.fixture
def cfg_a():
    """Preset A (V=65, d=64): large enough for statistics over the initialisation."""
    return PRESETS["A"]
