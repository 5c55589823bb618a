"""An audit's findings as the jobs that act on them read them: `contamination.parquet` of a complete audit output
(`mieb-ray audit --out`), one row per (train row, eval image, detector) pair, or per member of a group too large to
list as pairs (its other side's key null). `build --exclude` leaves the flagged train rows out; `eval --exclude`
scores again without the flagged eval images (and, for the linear probe, without the flagged train rows)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from mieb_ray import formats, storage
from mieb_ray.errors import UserError


def _manifest(audit: str) -> dict:
    manifest = storage.read_manifest(audit)
    if theirs := formats.other_command(manifest, "audit"):
        raise UserError(f"--exclude {storage.display(audit)} holds the output of {theirs}, not of mieb-ray audit")
    if not formats.AUDIT.holds(manifest):
        raise UserError(f"--exclude {storage.display(audit)} is not a complete audit output (no {storage.MANIFEST} "
                        "of mieb-ray audit)")
    return manifest


def is_self(manifest: dict) -> bool:
    """An audit of a table against itself (`audit --against self`): duplicates.parquet, not pairs."""
    return (manifest.get("config") or {}).get("against") == ["self"]


def read(audit: str, columns: list[str], file: str = formats.PAIRS) -> pa.Table:
    """Columns of an audit output's pairs (train_key, eval_task, eval_key, method, score, group), or of its
    formats.DUPLICATES; one line when `audit` is not a complete audit output, or not of the kind the job needs."""
    manifest = _manifest(audit)
    if is_self(manifest) != (file == formats.DUPLICATES):
        raise UserError(f"--exclude {storage.display(audit)} is an audit of a table against "
                        + ("itself: it flags no eval image" if is_self(manifest) else "eval images, not itself"))
    with storage.open_input(storage.join(audit, file)) as f:
        return pq.read_table(f, columns=columns)


def audited_tasks(audit: str) -> set[str] | None:
    """The eval tasks whose images the audit read (its summary.json's eval_tasks, each MIEB task apart); None
    where it has no summary."""
    path = storage.join(audit, formats.SUMMARY)
    if not storage.exists(path):
        return None
    return set(json.loads(storage.read_text(path)).get("eval_tasks", {}))


def detectors(text: str) -> tuple[str, ...]:
    """A comma-separated list of detectors; one line naming the valid ones for an unknown name."""
    chosen = tuple(d.strip() for d in text.split(",") if d.strip())
    unknown = [d for d in chosen if d not in formats.DETECTORS]
    if unknown or not chosen:
        raise UserError(f"unknown detector {unknown[0]!r}; valid: {', '.join(formats.DETECTORS)}" if unknown
                        else f"no detector given; valid: {', '.join(formats.DETECTORS)}")
    return chosen


def flagged_train_keys(audit: str, by: tuple[str, ...] = formats.DETECTORS) -> pa.Array:
    """The distinct train keys the audit flagged by any of the detectors `by`; of a self audit, every row of
    its groups but the one each keeps (`left_out`)."""
    if is_self(_manifest(audit)):
        return pa.array(left_out(read(audit, ["key", "method", "group"], formats.DUPLICATES), by), pa.string())
    pairs = read(audit, ["train_key", "method"])
    pairs = pairs.filter(pc.and_(pc.is_in(pairs["method"], value_set=pa.array(by, pa.string())),
                                 pc.is_valid(pairs["train_key"])))
    return pc.unique(pairs["train_key"].combine_chunks())


@dataclass(frozen=True)
class Flags:
    """Which detectors flagged each eval image and each train row, and the eval tasks holding each flagged eval
    image (its rows' eval_task: '/'-joined)."""

    eval: dict[str, frozenset[str]]
    train: dict[str, frozenset[str]]
    eval_tasks: dict[str, frozenset[str]] = field(default_factory=dict)

    @staticmethod
    def load(audit: str) -> Flags:
        pairs = read(audit, ["train_key", "eval_task", "eval_key", "method"]).to_pydict()
        found: dict[str, dict[str, set[str]]] = {"eval": {}, "train": {}, "tasks": {}}
        for train, task, evaluated, method in zip(pairs["train_key"], pairs["eval_task"], pairs["eval_key"],
                                                  pairs["method"]):
            for side, key in (("eval", evaluated), ("train", train)):  # a group's row names one side only
                if key is not None:
                    found[side].setdefault(key, set()).add(method)
            if evaluated is not None and task:
                found["tasks"].setdefault(evaluated, set()).update(task.split("/"))
        return Flags(*({k: frozenset(v) for k, v in found[side].items()} for side in ("eval", "train", "tasks")))

    @staticmethod
    def left_out(flags: dict[str, frozenset[str]], keys: list[str]) -> dict[str, int]:
        """How many of `keys` are flagged: by any detector, and by each."""
        counts = {"any": 0}
        for key in keys:
            for method in flags.get(key, ()):
                counts[method] = counts.get(method, 0) + 1
            counts["any"] += key in flags
        return counts


class Components:
    """Union-find over keys; a group's root is its smallest key."""

    def __init__(self):
        self.parent: dict[str, str] = {}

    def find(self, key: str) -> str:
        root = self.parent.setdefault(key, key)
        while root != self.parent[root]:
            root = self.parent[root]
        while key != root:  # path compression
            self.parent[key], key = root, self.parent[key]
        return root

    def union(self, a: str, b: str) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.parent[max(ra, rb)] = min(ra, rb)

    def groups(self) -> dict[str, list[str]]:
        """root -> its keys, sorted, of every group of two or more."""
        out: dict[str, list[str]] = {}
        for key in self.parent:
            out.setdefault(self.find(key), []).append(key)
        return {root: sorted(keys) for root, keys in out.items() if len(keys) > 1}


def left_out(duplicates: pa.Table, by: tuple[str, ...]) -> list[str]:
    """Of a self audit's groups (key, method, group), the rows build --exclude leaves out: all but one of each
    group of the detectors `by`, their groups merged where they share a row; the smallest key stays."""
    found = Components()
    chosen = duplicates.filter(pc.is_in(duplicates["method"], value_set=pa.array(by, pa.string())))
    for key, method, group in zip(*(chosen[c].to_pylist() for c in ("key", "method", "group"))):
        found.union(f"\0{method}\0{group}", key)  # a node per group: groups that share a row merge
    out = []
    for members in found.groups().values():
        out += [k for k in members if not k.startswith("\0")][1:]  # sorted: the smallest key stays
    return sorted(out)
