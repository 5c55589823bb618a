"""The audit's rules, as pure functions on Arrow tables: fingerprint rows, join them, turn nearest neighbours
into pairs, and count what was found. No Ray.

A hash row: key, sha (sha256 of the bytes), pix (sha256 of the pixels; null when undecodable), pdq, pdq_mirror
and pdq_quality (the perceptual hash of the pixels and of their mirror, and PDQ's quality), part (the join
partition), unit and row (where the image is read again for the report), eval_task (the against side only)
and error. Rows are partitioned by their pixel hash (their byte hash when undecodable): identical bytes
decode to identical pixels, so rows that match either hash always share a partition, and each join task
reads its partition of every hash file and nothing else.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from mieb_ray.audit.fingerprints import fingerprint

METHODS = ("exact", "pixels", "pdq", "near")
PDQ_HASHES = ("pdq", "pdq_mirror", "pdq_c95", "pdq_c90")
# (train hash, eval hash) compared: the pictures, one the mirror of the other, one a centred crop of the other
PDQ_COMPARED = (("pdq", "pdq"), ("pdq", "pdq_mirror"), ("pdq_c95", "pdq"), ("pdq", "pdq_c95"), ("pdq_c90", "pdq"),
                ("pdq", "pdq_c90"))
PDQ_THRESHOLD = 31  # Hamming distance of 256 bits (ThreatExchange's PDQ match distance): bench/audit_calibrate.py
MIN_QUALITY = 50  # PDQ hashes of lower quality (flat images) take no part in the pdq detector
HASH_SCHEMA = pa.schema([("key", pa.string()), ("sha", pa.binary(32)), ("pix", pa.binary(32)),
                         ("pdq", pa.binary(32)), ("pdq_mirror", pa.binary(32)), ("pdq_c95", pa.binary(32)),
                         ("pdq_c90", pa.binary(32)), ("pdq_quality", pa.int16()),
                         ("part", pa.int32()), ("unit", pa.int32()), ("row", pa.int64()),
                         ("eval_task", pa.string()), ("error", pa.string())])
ERROR_SCHEMA = pa.schema([("side", pa.string()), ("key", pa.string()), ("error", pa.string())])
PAIR_SCHEMA = pa.schema([("train_key", pa.string()), ("eval_task", pa.string()), ("eval_key", pa.string()),
                         ("method", pa.string()), ("score", pa.float64())])


def partition(sha: bytes | None, pix: bytes | None, partitions: int) -> int:
    digest = pix or sha
    return int.from_bytes(digest[:4], "big") % partitions if digest else 0


def hash_rows(keys: list[str], images: list[bytes | None], unit: int, first_row: int, partitions: int,
              eval_task: list[str | None]) -> pa.Table:
    """Hash rows of one chunk of a unit (rows first_row, first_row + 1, ...)."""
    prints = [fingerprint(image) for image in images]
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


def hash_pairs(train: pa.Table, against: pa.Table) -> pa.Table:
    """The exact (same sha) and pixels (same pixel hash) pairs of two sets of hash rows, one row per pair and
    detector, score 1.0."""
    out = []
    for method, column in (("exact", "sha"), ("pixels", "pix")):
        left = train.select(["key", column]).filter(pc.is_valid(train[column])).rename_columns(["train_key", "h"])
        right = against.select(["key", "eval_task", column]).filter(pc.is_valid(against[column])) \
            .rename_columns(["eval_key", "eval_task", "h"])
        joined = left.join(right, "h", join_type="inner")
        n = joined.num_rows
        out.append(pa.table({"train_key": joined["train_key"], "eval_task": joined["eval_task"],
                             "eval_key": joined["eval_key"], "method": pa.array([method] * n, pa.string()),
                             "score": pa.array(np.ones(n), pa.float64())}, schema=PAIR_SCHEMA))
    return pa.concat_tables(out)


def pdq_words(hashes: pa.Array) -> np.ndarray:
    """32-byte hashes as (n, 4) uint64 words."""
    flat = np.frombuffer(hashes.buffers()[1], np.uint8)[hashes.offset * 32:(hashes.offset + len(hashes)) * 32]
    return flat.view(">u8").astype(np.uint64).reshape(-1, 4) if len(hashes) else np.zeros((0, 4), np.uint64)


def hamming_within(train: np.ndarray, evals: np.ndarray, threshold: int, block_bytes: int = 64 << 20):
    """Every (train row, eval row, distance) whose Hamming distance is at most `threshold`: all pairs, by
    brute-force popcount over blocks of train rows (train, evals: (n, 4) uint64). Memory: block_bytes of
    distances and one word's XOR."""
    out = ([], [], [])
    rows = max(1, block_bytes // (8 * max(len(evals), 1)))
    for lo in range(0, len(train), rows):
        block = train[lo:lo + rows]
        distance = np.zeros((len(block), len(evals)), np.uint16)
        for w in range(4):
            distance += np.bitwise_count(block[:, w, None] ^ evals[None, :, w])
        i, j = np.nonzero(distance <= threshold)
        out[0].append(i + lo)
        out[1].append(j)
        out[2].append(distance[i, j])
    return tuple(np.concatenate(x) if x else np.zeros(0, np.int64) for x in out)


def pdq_pairs(train: pa.Table, against: pa.Table, threshold: int = PDQ_THRESHOLD) -> pa.Table:
    """The pdq pairs of two sets of hash rows: a train image within `threshold` bits of an eval image by any of
    PDQ_COMPARED (the smallest distance counts), both of PDQ quality MIN_QUALITY or more; score = 1 - distance /
    256."""
    def usable(t: pa.Table) -> pa.Table:
        return t.filter(pc.fill_null(pc.greater_equal(t["pdq_quality"], MIN_QUALITY), False))

    train, against = usable(train), usable(against)
    found = [hamming_within(pdq_words(train[a].combine_chunks()), pdq_words(against[b].combine_chunks()), threshold)
             for a, b in PDQ_COMPARED]
    i, j, d = (np.concatenate(x) for x in zip(*found))
    best = {}
    for a, b, dist in zip(i.tolist(), j.tolist(), d.tolist()):  # one pair per (train, eval), its smaller distance
        best[a, b] = min(dist, best.get((a, b), dist))
    i, j = (np.array([k[n] for k in best], np.int64) for n in (0, 1))
    return pa.table({"train_key": train["key"].take(pa.array(i, pa.int64())),
                     "eval_task": against["eval_task"].take(pa.array(j, pa.int64())),
                     "eval_key": against["key"].take(pa.array(j, pa.int64())),
                     "method": pa.array(["pdq"] * len(best), pa.string()),
                     "score": pa.array([1 - v / 256 for v in best.values()], pa.float64())}, schema=PAIR_SCHEMA)


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
    """By detector (exact, pixels, near), then score (highest first), then eval task, eval key, train key."""
    order = pc.index_in(pairs["method"], value_set=pa.array(METHODS))
    pairs = pairs.append_column("_m", order)
    pairs = pairs.sort_by([("_m", "ascending"), ("score", "descending"), ("eval_task", "ascending"),
                           ("eval_key", "ascending"), ("train_key", "ascending")])
    return pairs.drop_columns(["_m"])


def dataset_of(key: str) -> str:
    """A train key's source: the part before its first '/' (mieb-train keys are `<slug>/<index>`)."""
    return key.split("/", 1)[0] if "/" in key else ""


def summary(pairs: pa.Table, eval_rows: dict[str, int], train_rows: dict[str, int]) -> dict:
    """Per eval task: its rows, and per detector (and any) the pairs and the eval images affected, with their
    percentage of the task's rows. Per train dataset: its rows and the train rows flagged."""
    rows = pairs.to_pylist()

    def hits(method: str, keep) -> list[dict]:
        return [r for r in rows if keep(r) and method in ("any", r["method"])]

    tasks = {}
    for task, n in sorted(eval_rows.items()):
        tasks[task] = {"eval_rows": n}
        for method in (*METHODS, "any"):
            found = hits(method, lambda r: r["eval_task"] == task)
            affected = len({r["eval_key"] for r in found})
            tasks[task][method] = {**({"pairs": len(found)} if method != "any" else {}), "eval_images": affected,
                                   "percent": round(100 * affected / n, 4) if n else 0.0}
    datasets = {}
    for dataset, n in sorted(train_rows.items()):
        datasets[dataset] = {"train_rows": n}
        for method in (*METHODS, "any"):
            found = hits(method, lambda r: dataset_of(r["train_key"]) == dataset)
            datasets[dataset][method] = len({r["train_key"] for r in found})
    return {"eval_tasks": tasks, "train_datasets": datasets,
            "totals": {"pairs": {m: sum(r["method"] == m for r in rows) for m in METHODS},
                       "train_rows_flagged": len({r["train_key"] for r in rows}),
                       "eval_images_affected": len({(r["eval_task"], r["eval_key"]) for r in rows})}}
