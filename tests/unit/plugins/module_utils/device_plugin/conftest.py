"""Fixtures for the device plugin's pure helpers: captured Node and Pod objects and plugin logs."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

FIXTURES = Path(__file__).resolve().parent / "fixtures"


def _load(name: str):
    text = (FIXTURES / name).read_text()
    return json.loads(text) if name.endswith(".json") else text


@pytest.fixture
def fixture():
    """Load a fixture by file name; each call returns a fresh copy that a test may modify."""
    return lambda name: copy.deepcopy(_load(name))
