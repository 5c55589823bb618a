"""How the mteb suite names an input (its embedding cache's key, the audit's eval key, eval --exclude's match): an
image stored in a dataset by `sha256:` of its bytes, never decoded; a picture a task makes in memory (Compositionality)
by `pixels:` and mteb's own content hash (pixels, mode, size, palette: what tells two pictures apart); a text by
itself."""

from __future__ import annotations

import hashlib

SHA, PIXELS = "sha256:", "pixels:"


def image_key(data: bytes) -> str:
    return SHA + hashlib.sha256(data).hexdigest()


def pixels_key(image) -> str:
    from mteb._content_hashes import hash_image

    return PIXELS + hash_image(image)


def stored_bytes(value: dict) -> bytes | None:
    """The bytes of an undecoded Image value ({bytes, path}); None where it has neither."""
    if value.get("bytes") is not None:
        return value["bytes"]
    if not value.get("path"):
        return None
    with open(value["path"], "rb") as f:
        return f.read()
