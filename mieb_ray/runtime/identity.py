"""An output's identity, and the one rule for reusing an output.

An identity is a dict of everything that decides an output's content: for embeddings the model (its resolved hub
commit, or a model folder's content hash), the input's own identity, the modality, columns, dtype, decode and
preprocessing; for a build its sources (at their revisions, or a mirror's files), datasets, split, format and
shard size. The job writes it in its manifest (`identity`). A job asked to reuse (what `eval --model` embeds, the
eval splits it builds) reuses a complete output only when the identity it would write equals the recorded one,
and its log line says why it reused or redid it; nothing is ever reused by its name or path alone.

An input's identity (of_input) is what its own manifest says of its content, the sha256 of every shard, when it
has one; otherwise its files' paths, sizes and modification times.
"""

from __future__ import annotations

import hashlib
import json

from mieb_ray import storage


def digest(value) -> str:
    """sha256 of `value` as canonical JSON."""
    return hashlib.sha256(json.dumps(value, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def of_files(stamps: dict[str, tuple[int, int | None]], root: str) -> str:
    """The identity of files as a listing describes them (storage.listing): relative path, size, mtime."""
    cut = len(root.rstrip("/")) + 1
    return digest([[uri[cut:] if uri != root else "", size, mtime] for uri, (size, mtime) in sorted(stamps.items())])


def of_input(root: str) -> str:
    """A table's identity: `sha256:<digest>` of its manifest's shards' checksums when its manifest lists them (a
    mieb-train build, an embed output), else `files:<digest>` of its files' paths, sizes and times."""
    manifest = storage.read_manifest(root) if not root.endswith((".parquet", ".tar", ".arrow")) else None
    shards = (manifest or {}).get("shards")
    if isinstance(shards, list) and shards and all(isinstance(s, dict) and isinstance(s.get("sha256"), str)
                                                   and isinstance(s.get("path"), str) for s in shards):
        return "sha256:" + digest(sorted([s["path"], s["sha256"]] for s in shards))
    return "files:" + of_files(storage.listing(root), root)


def _flat(value, prefix: str = "") -> dict:
    if isinstance(value, dict) and value:
        return {k: v for key, item in value.items() for k, v in _flat(item, f"{prefix}{key}.").items()}
    return {prefix.rstrip("."): value}


def _shown(value) -> str | None:
    """A value as a difference shows it: JSON, a long string (a commit, a digest) cut to its first 16
    characters, None when it is too long to say in a line."""
    if isinstance(value, str) and len(value) > 24:
        return json.dumps(value[:16] + "...")
    text = json.dumps(value)
    return text if len(text) <= 40 else None


def differences(old: dict, new: dict) -> str:
    """How `new` differs from `old`, key by key (nested keys dotted): `key old -> new`, or the key alone when a
    value is too long to show; "" when they are equal."""
    old, new = _flat(old), _flat(new)
    said = []
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key), new.get(key)
        if a != b:
            shown = [_shown(a), _shown(b)]
            said.append(f"{key} {shown[0]} -> {shown[1]}" if None not in shown else key)
    return "; ".join(said)


def decide(manifest: dict | None, wanted: dict) -> tuple[bool, str]:
    """(reuse?, why) for a complete output's manifest (None: there is none) against the identity wanted."""
    if manifest is None:
        return False, "nothing there yet"
    had = manifest.get("identity")
    if not isinstance(had, dict):
        return False, "its manifest records no identity (another tool's, or an older mieb-ray's)"
    if had == json.loads(json.dumps(wanted)):
        return True, "made from the same " + ", ".join(sorted(wanted))
    return False, "made from other inputs or settings: " + differences(had, json.loads(json.dumps(wanted)))
