"""The audit's rules, as pure functions on Arrow tables: fingerprint rows, join them, turn nearest neighbours
into pairs, and count what was found. No Ray.

A hash row: key, sha (sha256 of the bytes), pix (sha256 of the pixels; null when undecodable), pdq, pdq_mirror,
pdq_centred, pdq_sides and pdq_quality (the perceptual hash of the pixels, of their mirror and of windows cut off
their centre, a side or a corner, and PDQ's quality: audit/fingerprints.py), part (the join partition), unit and
row (where the image is read again for the report), eval_task (the against side only) and error. Rows are
partitioned by their pixel hash (their byte hash when undecodable): identical bytes decode to identical pixels, so
rows that match either hash always share a partition, and each join task reads its partition of every hash file
and nothing else.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from mieb_ray import formats
from mieb_ray.audit import hamming
from mieb_ray.audit.fingerprints import CENTRED, SIDES, Fingerprint, fingerprint

PDQ_HASHES = ("pdq", "pdq_mirror", "pdq_centred", "pdq_sides")  # columns of 32-byte PDQ hashes, one or more a row
# (train column, eval column) compared, each hash of one with each of the other: the two pictures, one the other's
# mirror; the eval picture a crop of the train one (of up to 10%: centred, off a side or a corner); the train
# picture a crop of the eval one (centred; off a side or a corner)
PDQ_COMPARED = (("pdq", "pdq"), ("pdq", "pdq_mirror"), ("pdq_centred", "pdq"), ("pdq_sides", "pdq"),
                ("pdq", "pdq_centred"), ("pdq", "pdq_sides"))
# the pairs searched from the eval side: its 48 side windows a picture as queries in an index of the train side's
# one hash a picture (4.4M rows: 0.75 GB), not held in the eval side's index, which serves every train batch and
# would grow 8-fold (1M eval rows: 5 GB more)
PDQ_FROM_EVAL = (("pdq", "pdq_sides"),)
PDQ_FROM_TRAIN = tuple(pair for pair in PDQ_COMPARED if pair not in PDQ_FROM_EVAL)
# a table against itself (--against self): every row is searched with and in, so its windows find crops both ways
PDQ_SELF_COMPARED = PDQ_COMPARED[:4]
PDQ_THRESHOLD = 31  # Hamming distance of 256 bits, ThreatExchange's PDQ match distance (bench/calibration/)
MIN_QUALITY = 50  # PDQ hashes of lower quality (flat images) take no part in the pdq detector
HASH_VERSION = 2  # what hash rows hold (1: pdqhash of the pixels, their centre 95% and 90%): --resume keeps its own
HASH_SCHEMA = pa.schema([("key", pa.string()), ("sha", pa.binary(32)), ("pix", pa.binary(32)),
                         ("pdq", pa.binary(32)), ("pdq_mirror", pa.binary(32)),
                         ("pdq_centred", pa.binary(32 * len(CENTRED))), ("pdq_sides", pa.binary(32 * len(SIDES))),
                         ("pdq_quality", pa.int16()), ("part", pa.int32()), ("unit", pa.int32()), ("row", pa.int64()),
                         ("eval_task", pa.string()), ("error", pa.string())])
JOIN_COLUMNS = ["key", "sha", "pix", "eval_task", "error"]  # what the exact and pixels detectors read of hash rows
ERROR_SCHEMA = pa.schema([("side", pa.string()), ("key", pa.string()), ("error", pa.string())])
PAIR_SCHEMA = pa.schema([("train_key", pa.string()), ("eval_task", pa.string()), ("eval_key", pa.string()),
                         ("method", pa.string()), ("score", pa.float64()), ("group", pa.int64())])
GROUP_CAP = 10_000  # pairs one eval picture may make with its copies before they are reported as a group
GROUP_SAMPLE = 5  # keys of each side a group's summary shows


def partition(sha: bytes | None, pix: bytes | None, partitions: int) -> int:
    digest = pix or sha
    return int.from_bytes(digest[:4], "big") % partitions if digest else 0


def hash_rows(keys: list[str], images: list[bytes | None], unit: int, first_row: int, partitions: int,
              eval_task: list[str | None], null_key=lambda row: "null key") -> pa.Table:
    """Hash rows of one chunk of a unit (rows first_row, first_row + 1, ...). A row without a key is an error row,
    null_key(its row) (nothing could name it in a pair, nor leave it out of a build)."""
    prints = [fingerprint(image) if key is not None else Fingerprint(*[None] * 7, null_key(first_row + i))
              for i, (key, image) in enumerate(zip(keys, images))]
    return pa.table({
        "key": pa.array(keys, pa.string()),
        **{c: pa.array([getattr(p, c) for p in prints], HASH_SCHEMA.field(c).type)
           for c in ("sha", "pix", *PDQ_HASHES, "pdq_quality")},
        "part": pa.array([partition(p.sha, p.pix, partitions) for p in prints], pa.int32()),
        "unit": pa.array([unit] * len(keys), pa.int32()),
        "row": pa.array(np.arange(first_row, first_row + len(keys)), pa.int64()),
        "eval_task": pa.array(eval_task, pa.string()),
        "error": pa.array([p.error for p in prints], pa.string()),
    }, schema=HASH_SCHEMA)


def by_partition(table: pa.Table) -> pa.Table:
    """Rows sorted by partition: written with one row group per partition, a join task reads only its own."""
    return table.sort_by([("part", "ascending"), ("unit", "ascending"), ("row", "ascending")])


class Rows:
    """The rows holding each distinct value, in one array (a million tiny arrays cost seconds to ship to each task):
    rows[v] are value v's rows, in order."""

    def __init__(self, codes: np.ndarray, values: int):
        kept = np.flatnonzero(codes >= 0)  # -1: a null, in no value's rows
        self.order = kept[np.argsort(codes[kept], kind="stable")]
        self.start = np.zeros(values + 1, np.int64)
        np.cumsum(np.bincount(codes[kept], minlength=values), out=self.start[1:])

    def __getitem__(self, v: int) -> np.ndarray:
        return self.order[self.start[v]:self.start[v + 1]]

    def __len__(self) -> int:
        return len(self.start) - 1

    def first(self) -> np.ndarray:
        """Each value's first row."""
        return self.order[self.start[:-1]]


def _distinct(values: list) -> tuple[list, Rows]:
    """The distinct non-null values, in order of first appearance, and the rows holding each."""
    seen: dict = {}
    codes = np.fromiter((-1 if v is None else seen.setdefault(v, len(seen)) for v in values), np.int64, len(values))
    return list(seen), Rows(codes, len(seen))


def linked_rows(method: str, train: pa.Table, against: pa.Table, train_rows: Rows, eval_values: list[bytes],
                eval_rows: Rows, links) -> tuple[pa.Table, list[dict]]:
    """Pair rows of the links between distinct hash values ((train value, eval value, score) by their positions in
    train_rows and eval_rows), and the groups: an eval value whose rows and linked train rows would make more than
    GROUP_CAP pairs (thousands of copies of one blank frame or placeholder on both sides) is listed as its rows
    once each, the other side's key null, under one group id (from the method and the eval value), instead of
    their product. Every member is still flagged: train_key and eval_key are each row's key."""
    by_eval: dict[int, list] = {}
    for t, e, score in links:
        by_eval.setdefault(e, []).append((t, score))
    pairs: tuple[list, list, list] = ([], [], [])  # train row, eval row, score
    members: tuple[list, list, list] = ([], [], [])  # train row (-1: none), eval row (-1: none), group
    groups = []
    for e, linked in by_eval.items():
        width = sum(len(train_rows[t]) for t, _ in linked)
        if width * len(eval_rows[e]) <= GROUP_CAP:
            for t, score in linked:
                a, b = np.meshgrid(train_rows[t], eval_rows[e], indexing="ij")
                pairs[0].append(a.ravel())
                pairs[1].append(b.ravel())
                pairs[2].append(np.full(a.size, score))
            continue
        group = int.from_bytes(hashlib.sha256(method.encode() + eval_values[e]).digest()[:8], "big", signed=True)
        mine = np.unique(np.concatenate([train_rows[t] for t, _ in linked]))
        members[0].append(np.r_[mine, np.full(len(eval_rows[e]), -1)])
        members[1].append(np.r_[np.full(len(mine), -1), eval_rows[e]])
        members[2].append(np.full(len(mine) + len(eval_rows[e]), group))
        groups.append({"method": method, "group": group, "train_rows": int(len(mine)),
                       "eval_images": int(len(eval_rows[e])), "pairs": int(len(mine) * len(eval_rows[e])),
                       "train_sample": train["key"].take(pa.array(mine[:GROUP_SAMPLE])).to_pylist(),
                       "eval_sample": against["key"].take(pa.array(eval_rows[e][:GROUP_SAMPLE])).to_pylist()})
    cat = lambda parts, dtype: np.concatenate(parts) if parts else np.zeros(0, dtype)  # noqa: E731
    i, j, score = cat(pairs[0], np.int64), cat(pairs[1], np.int64), cat(pairs[2], np.float64)
    mt, me, mg = cat(members[0], np.int64), cat(members[1], np.int64), cat(members[2], np.int64)

    def keys(table: pa.Table, column: str, rows: np.ndarray) -> pa.Array:
        return table[column].take(pa.array(rows, pa.int64(), mask=rows < 0))

    n, m = len(i), len(mt)
    table = pa.table({"train_key": pa.concat_arrays([keys(train, "key", i).combine_chunks(),
                                                     keys(train, "key", mt).combine_chunks()]),
                      "eval_task": pa.concat_arrays([keys(against, "eval_task", j).combine_chunks(),
                                                     keys(against, "eval_task", me).combine_chunks()]),
                      "eval_key": pa.concat_arrays([keys(against, "key", j).combine_chunks(),
                                                    keys(against, "key", me).combine_chunks()]),
                      "method": pa.array([method] * (n + m), pa.string()),
                      "score": pa.array(np.r_[score, np.ones(m)], pa.float64()),
                      "group": pa.array(np.r_[np.zeros(n, np.int64), mg], pa.int64(),
                                        mask=np.r_[np.ones(n, bool), np.zeros(m, bool)])}, schema=PAIR_SCHEMA)
    return table, groups


def hash_pairs(train: pa.Table, against: pa.Table) -> tuple[pa.Table, list[dict]]:
    """The exact (same sha) and pixels (same pixel hash) pairs of two sets of hash rows, one row per pair and
    detector, score 1.0; and the groups of more than GROUP_CAP pairs (linked_rows)."""
    out, groups = [], []
    for method, column in (("exact", "sha"), ("pixels", "pix")):
        t_values, t_rows = _distinct(train[column].to_pylist())
        e_values, e_rows = _distinct(against[column].to_pylist())
        at = {v: n for n, v in enumerate(t_values)}
        links = [(at[v], e, 1.0) for e, v in enumerate(e_values) if v in at]
        table, found = linked_rows(method, train, against, t_rows, e_values, e_rows, links)
        out.append(table)
        groups += found
    return pa.concat_tables(out), groups


def pdq_words(hashes: pa.Array) -> np.ndarray:
    """Fixed-size binary hashes, one or more of 32 bytes a row, as (rows, hashes a row, 4) uint64 words."""
    width = hashes.type.byte_width
    if not len(hashes):
        return np.zeros((0, width // 32, 4), np.uint64)
    flat = np.frombuffer(hashes.buffers()[1], np.uint8)[hashes.offset * width:(hashes.offset + len(hashes)) * width]
    return flat.view(">u8").astype(np.uint64).reshape(len(hashes), width // 32, 4)


def pdq_comparisons(compared: tuple = PDQ_COMPARED) -> int:
    """Hash comparisons per (train, eval) picture: each hash of one column against each of the other."""
    def hashes(column: str) -> int:
        return HASH_SCHEMA.field(column).type.byte_width // 32

    return sum(hashes(a) * hashes(b) for a, b in compared)


def pdq_columns(compared: tuple, side: int) -> list[str]:
    """The hash columns one side of `compared` (0: train, 1: eval) searches with or is searched in; pdq first (it
    tells the pictures apart)."""
    return list(dict.fromkeys(["pdq", *(pair[side] for pair in compared)]))


@dataclass(frozen=True)
class PdqSide:
    """One side's hash rows made ready for the pdq search once (the eval side serves every train batch): the keys
    and eval tasks of the rows of PDQ quality MIN_QUALITY or more, their distinct pictures (the same hashes:
    identical pictures are searched once, so a thousand copies of one frame cost one search; `values`: a digest of
    each picture's hashes) and of those pictures the hash columns it searches with, as (pictures, hashes a row, 4)
    words, and those it is searched in, indexed (hamming.Index of all their hashes: a picture's k hashes are its k
    rows in a row)."""

    table: pa.Table
    values: list
    rows: Rows
    words: dict[str, np.ndarray]
    indexes: dict[str, hamming.Index]


def pdq_side(table: pa.Table, searching: Sequence[str] = (), searched: Sequence[str] = ()) -> PdqSide:
    """`table`'s rows made ready to search with the hash columns `searching` and to be searched in `searched`."""
    table = table.filter(pc.fill_null(pc.greater_equal(table["pdq_quality"], MIN_QUALITY), False))
    # pictures apart by all the hashes searched, not by pdq alone: an edit may keep one hash and change another
    hashes = zip(*(table[c].to_pylist() for c in dict.fromkeys(["pdq", *searching, *searched])))
    values, rows = _distinct([hashlib.sha256(b"".join(h)).digest() for h in hashes])
    first = pa.array(rows.first(), pa.int64())

    def words(column: str) -> np.ndarray:
        return pdq_words(table[column].take(first).combine_chunks())

    return PdqSide(table.select(["key", "eval_task"]), values, rows, {c: words(c) for c in searching},
                   {c: hamming.Index(words(c).reshape(-1, 4)) for c in searched})


def pdq_index(table: pa.Table, compared: tuple = PDQ_FROM_TRAIN, side: int = 1) -> PdqSide:
    """`table`'s rows made ready to be searched in as side `side` of `compared` (1: eval, 0: train)."""
    return pdq_side(table, searched=pdq_columns(compared, side))


def pdq_pairs(train: pa.Table, against: pa.Table, threshold: int = PDQ_THRESHOLD,
              compared: tuple = PDQ_COMPARED) -> tuple[pa.Table, list[dict]]:
    """The pdq pairs of two sets of hash rows: a train image within `threshold` bits of an eval image by any two
    hashes `compared` pairs, both of PDQ quality MIN_QUALITY or more; one pair per (train, eval) row, at its
    smallest distance (of the train side's search where the pictures themselves are within `threshold`): score =
    1 - distance / 256. And the groups of more than GROUP_CAP pairs (linked_rows). Both searches in one process:
    audit/pdq.py runs them as tasks."""
    ahead = tuple(pair for pair in compared if pair not in PDQ_FROM_EVAL)
    found = [pdq_train_pairs(train, pdq_index(against, ahead), threshold, ahead)]
    if len(ahead) < len(compared):
        found.append(pdq_eval_pairs(against, pdq_index(train, PDQ_FROM_EVAL, side=0), threshold))
    return closest(pa.concat_tables([f[0] for f in found])), [g for f in found for g in f[1]]


def pdq_train_pairs(train: pa.Table | PdqSide, against: PdqSide, threshold: int = PDQ_THRESHOLD,
                    compared: tuple = PDQ_FROM_TRAIN) -> tuple[pa.Table, list[dict]]:
    """pdq_pairs of the train rows searching with their hashes in the eval side's index."""
    if not isinstance(train, PdqSide):
        train = pdq_side(train, searching=pdq_columns(compared, 0))
    i, j, d = _each_once([_within(train.words[a], against.indexes[b], len(against.values), threshold)
                        for a, b in compared])
    return linked_rows("pdq", train.table, against.table, train.rows, against.values, against.rows,
                       list(zip(i.tolist(), j.tolist(), (1 - d / 256).tolist())))


def pdq_eval_pairs(against: pa.Table | PdqSide, train: PdqSide,
                   threshold: int = PDQ_THRESHOLD) -> tuple[pa.Table, list[dict]]:
    """pdq_pairs of PDQ_FROM_EVAL: the eval rows searching with their windows in the train side's index
    (pdq_index(train rows, PDQ_FROM_EVAL, side=0): one hash a picture), less the pairs whose own pictures are within
    `threshold` (the train side's search finds those, as the same group where a picture has thousands of copies)."""
    if not isinstance(against, PdqSide):
        against = pdq_side(against, searching=pdq_columns(PDQ_FROM_EVAL, 1))
    j, i, d = _each_once([_within(against.words[b], train.indexes[a], len(train.values), threshold)
                        for a, b in PDQ_FROM_EVAL])
    ours = train.indexes["pdq"].words[i]  # the train side's index holds its pdq hash alone: a row a picture
    apart = np.bitwise_count(ours ^ against.words["pdq"][j, 0]).sum(1) > threshold
    return linked_rows("pdq", train.table, against.table, train.rows, against.values, against.rows,
                       list(zip(i[apart].tolist(), j[apart].tolist(), (1 - d[apart] / 256).tolist())))


def _each_once(found: list[hamming.Result]) -> hamming.Result:
    """The (a, b, distance) of searches, each (a, b) once at its smallest distance."""
    i, j, d = (np.concatenate(x) for x in zip(*found))
    order = np.lexsort((d, j, i))
    i, j, d = i[order], j[order], d[order]
    first = np.ones(len(i), bool)
    first[1:] = (i[1:] != i[:-1]) | (j[1:] != j[:-1])
    return i[first], j[first], d[first]


def closest(pairs: pa.Table) -> pa.Table:
    """Pairs found by several searches, each (train, eval) row once at its highest score; groups' rows as they are."""
    single = pairs.filter(pc.is_null(pairs["group"]))
    if single.num_rows == 0:
        return pairs
    keys = ["train_key", "eval_task", "eval_key", "method"]
    best = single.group_by(keys, use_threads=False).aggregate([("score", "max")]).rename_columns([*keys, "score"])
    best = best.append_column("group", pa.nulls(best.num_rows, pa.int64())).select(PAIR_SCHEMA.names)
    return pa.concat_tables([best.cast(PAIR_SCHEMA), pairs.filter(pc.is_valid(pairs["group"]))])


def _within(words: np.ndarray, index: hamming.Index, pictures: int, threshold: int) -> hamming.Result:
    """(train picture, eval picture, distance) of every hash of `words` ((pictures, hashes a row, 4)) within
    `threshold` of a hash of `index` (the hashes of `pictures` pictures, each picture's in a row)."""
    found = [hamming.within(np.ascontiguousarray(words[:, k]), index, threshold) for k in range(words.shape[1])]
    i, j, d = (np.concatenate(x) for x in zip(*found))
    return i, j // max(1, len(index) // max(1, pictures)), d


def near_rows(scores: np.ndarray, docs: np.ndarray, eval_keys: pa.Array, threshold: float) -> pa.Table:
    """(eval_key, doc, score) of each eval image's nearest train rows (top-k scores and doc ids, best first)
    at cosine >= threshold."""
    q, k = np.nonzero(scores >= threshold) if scores.size else (np.zeros(0, np.int64),) * 2
    return pa.table({"eval_key": eval_keys.take(pa.array(q, pa.int64())),
                     "doc": pa.array(docs[q, k], pa.int64()),
                     "score": pa.array(scores[q, k].astype(np.float64), pa.float64())})


def error_rows(side: str, rows: pa.Table) -> pa.Table:
    """(side, key, error) of the hash rows whose image could not be used."""
    bad = rows.filter(pc.is_valid(rows["error"]))
    return pa.table({"side": pa.array([side] * bad.num_rows, pa.string()), "key": bad["key"],
                     "error": bad["error"]}, schema=ERROR_SCHEMA)


def sort_pairs(pairs: pa.Table) -> pa.Table:
    """By detector (in formats.DETECTORS' order: exact, pixels, pdq, near), then score (highest first), then eval task,
    eval key, train key."""
    order = pc.index_in(pairs["method"], value_set=pa.array(formats.DETECTORS))
    pairs = pairs.append_column("_m", order)
    pairs = pairs.sort_by([("_m", "ascending"), ("score", "descending"), ("eval_task", "ascending"),
                           ("eval_key", "ascending"), ("train_key", "ascending")])
    return pairs.drop_columns(["_m"])


def dataset_of(key: str) -> str:
    """A train key's source: the part before its first '/' (mieb-train keys are `<slug>/<index>`)."""
    return key.split("/", 1)[0] if "/" in key else ""


def tasks_of(eval_task: str | None) -> list[str]:
    """The eval tasks an eval row serves: its eval_task is their names, '/'-joined."""
    return (eval_task or "?").split("/")


def summary(pairs: pa.Table, eval_rows: dict[str, int], train_rows: dict[str, int], groups: list[dict]) -> dict:
    """Per eval task (each MIEB task apart, where a row serves several): its rows, and per detector (and any) the
    pairs and the eval images affected, with their percentage of the task's rows. Per train dataset: its rows and
    the train rows flagged. A group's rows (linked_rows) count as flagged, not as pairs; the groups are listed
    with their counts and samples."""
    rows = pairs.to_pylist()

    def hits(method: str, keep) -> list[dict]:
        return [r for r in rows if keep(r) and method in ("any", r["method"])]

    rows_of: dict[str, int] = {}  # an eval row that serves several tasks ("CIFAR10ZeroShot/CIFAR10") counts in each
    for joined, n in eval_rows.items():
        for task in tasks_of(joined):
            rows_of[task] = rows_of.get(task, 0) + n
    tasks = {}
    for task, n in sorted(rows_of.items()):
        tasks[task] = {"eval_rows": n}
        for method in (*formats.DETECTORS, "any"):
            found = hits(method, lambda r: task in tasks_of(r["eval_task"]) and r["eval_key"] is not None)
            affected = len({r["eval_key"] for r in found})
            tasks[task][method] = {**({"pairs": sum(r["group"] is None for r in found)} if method != "any" else {}),
                                   "eval_images": affected, "percent": round(100 * affected / n, 4) if n else 0.0}
    datasets = {}
    for dataset, n in sorted(train_rows.items()):
        datasets[dataset] = {"train_rows": n}
        for method in (*formats.DETECTORS, "any"):
            found = hits(method, lambda r: r["train_key"] is not None and dataset_of(r["train_key"]) == dataset)
            datasets[dataset][method] = len({r["train_key"] for r in found})
    return {"eval_tasks": tasks, "train_datasets": datasets,
            "totals": {"pairs": {m: sum(r["method"] == m and r["group"] is None for r in rows)
                                 for m in formats.DETECTORS},
                       "groups": {m: sum(g["method"] == m for g in groups) for m in formats.DETECTORS},
                       "train_rows_flagged": len({r["train_key"] for r in rows} - {None}),
                       "eval_images_affected": len({(r["eval_task"], r["eval_key"]) for r in rows
                                                    if r["eval_key"] is not None})},
            "groups": sorted(groups, key=lambda g: -g["pairs"])}
