"""A stand-in for torchvision.io's decode_jpeg, for testing our device decoder where torchvision does not import
beside this torch (it needs a matching build): the same call (one tensor or a list, mode, device), decoded by
Pillow, and as torchvision's batched decode, one bad image fails the whole call. `calls` records each call's batch
size; `fail_with`, when set, is raised by every call (a CUDA error, say). Installed only by the tests that ask
for it (the `torchvision_standin` fixture); the real one is tested where it imports
(tests/unit/encode/test_gpu_decode.py, tests/system/test_cuda.py)."""

from __future__ import annotations

import enum
import io
import sys
import types

import numpy as np
import torch
from PIL import Image


class ImageReadMode(enum.Enum):
    UNCHANGED = 0
    GRAY = 1
    RGB = 3


calls: list[int] = []
fail_with: BaseException | None = None


def decode_jpeg(input, mode=ImageReadMode.UNCHANGED, device="cpu"):
    if isinstance(input, list):
        calls.append(len(input))
        if fail_with is not None:
            raise fail_with
        return [_one(t, mode, device) for t in input]
    return decode_jpeg([input], mode, device)[0]


def _one(data: torch.Tensor, mode, device) -> torch.Tensor:
    try:
        with Image.open(io.BytesIO(bytes(data.numpy()))) as im:
            if im.format != "JPEG":
                raise ValueError("not a JPEG")
            rgb = np.array(im.convert("RGB"))
    except Exception as exc:
        raise RuntimeError(f"Error while decoding JPEG: {exc}") from None
    return torch.from_numpy(rgb).permute(2, 0, 1).contiguous().to(device)


def install(monkeypatch) -> types.ModuleType:
    """torchvision and torchvision.io in sys.modules for the test; returns this module (its calls, fail_with)."""
    calls.clear()
    global fail_with
    fail_with = None
    package, module = types.ModuleType("torchvision"), types.ModuleType("torchvision.io")
    module.decode_jpeg, module.ImageReadMode = decode_jpeg, ImageReadMode
    package.io = module
    monkeypatch.setitem(sys.modules, "torchvision", package)
    monkeypatch.setitem(sys.modules, "torchvision.io", module)
    return sys.modules[__name__]
