"""Where things are, for the tests that read the repository's own files, and what a folder holds."""

from __future__ import annotations

import hashlib
import os
from importlib import resources
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the repository
TESTS = ROOT / "tests"
PICTURES = Path(str(resources.files("mieb_ray.demo_data").joinpath("images")))  # the demo's real pictures


def tree(root) -> dict:
    """Every file under root and its sha256: what a refusal must leave byte for byte."""
    return {os.path.relpath(os.path.join(d, f), root): hashlib.sha256(open(os.path.join(d, f), "rb").read()).digest()
            for d, _, files in os.walk(root) for f in files}


def committed(folder, suffix: str) -> int:
    """How many files ending in `suffix` a job has committed under folder (its hidden temporary files not counted):
    what the tests that kill a worker or a node mid-job wait for."""
    return sum(f.endswith(suffix) and not f.startswith(".") for _, _, fs in os.walk(folder) for f in fs)
