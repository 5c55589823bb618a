"""What a GPU run needs: a test that needs CUDA or torchvision (the `cuda` and `torchvision` fixtures) skips
without it, except under MIEB_REQUIRE_GPU=1 (bench/gpu_check.sh sets it on a GPU machine), where it fails, so
that a GPU session cannot pass by skipping."""

from __future__ import annotations

import os

import pytest

REQUIRED = os.environ.get("MIEB_REQUIRE_GPU") == "1"


def need(missing: str | None) -> None:
    """Nothing when `missing` is None; else skip the test, or fail it when a GPU run is required."""
    if missing is None:
        return
    if REQUIRED:
        pytest.fail(f"MIEB_REQUIRE_GPU=1, but {missing}")
    pytest.skip(missing)
