# Copyright: contributors to the kubegpu.node collection
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Fixtures shared by the plugin tests."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def cuda_repo(tmp_path_factory) -> tuple[Path, dict[str, str]]:
    """The signed stand-in of NVIDIA's CUDA repository (tests/aptrepo/specs/cuda-driver.yml), built once: its root
    (good/, wrong-key/, good/later/, good.asc, wrong.asc) and keys.json."""
    out = tmp_path_factory.mktemp("aptrepo") / "root"
    said = subprocess.run(
        [sys.executable, "-m", "aptrepo", "build", str(TESTS / "aptrepo/specs/cuda-driver.yml"), str(out)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(TESTS)},
        check=False,
    )
    assert said.returncode == 0, said.stderr
    return out, json.loads(said.stdout)
