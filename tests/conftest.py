"""Shared fixtures. Keep this file to fixtures only."""

import os

import pytest
import sitebuild

from transformer.config import PRESETS


@pytest.fixture
def tiny_cfg():
    """The 377-parameter preset: small enough for central differences on every entry."""
    return PRESETS["tiny"]


@pytest.fixture
def cfg_a():
    """Preset A (V=65, d=64): large enough for statistics over the initialisation."""
    return PRESETS["A"]


@pytest.fixture(scope="session")
def built_site(tmp_path_factory):
    """The site, built (quick notebooks) once per test session: pytest-xdist's workers share one build."""
    folder = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        folder = folder.parent  # the session's folder, above each worker's own
    try:
        return sitebuild.build_once(folder)
    except RuntimeError as e:
        pytest.fail(str(e))
