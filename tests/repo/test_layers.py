"""The package's shape stays as designed: its layers flow one way and no package has an import cycle
(import-linter, contracts in pyproject.toml), and the code passes the linter (ruff, same file). These run first
(conftest.py), so a violation fails the suite in seconds."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from support.paths import ROOT

BIN = os.path.dirname(sys.executable)


@pytest.mark.parametrize("command", [["lint-imports"], ["ruff", "check", "."]], ids=["layers", "ruff"])
def test_the_code_keeps_its_shape(command):
    done = subprocess.run([os.path.join(BIN, command[0]), *command[1:]], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
