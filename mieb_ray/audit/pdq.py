"""The pdq detector's search: every train x eval pair within matches.PDQ_THRESHOLD bits, exactly, two ways. The
eval side's PDQ hashes it is searched in (the picture's, its mirror's, its centred windows') are read once into
the object store and indexed once (matches.pdq_index: about 790 bytes a row), then a CPU task per batch of train
hash files, each file read once, searches it with each train picture's hashes (its own and its windows':
matches.PDQ_FROM_TRAIN) by multi-index hashing (audit/hamming.py). Then the other way (matches.PDQ_FROM_EVAL: a
train picture cropped from an eval one off a side or a corner): the train side's own hashes indexed once (about
170 bytes a row), searched by a task per batch of eval hash files with their side windows. For `--against self`,
the train side is searched against itself (matches.PDQ_SELF_COMPARED).
"""

from __future__ import annotations

import time

import pyarrow as pa
import pyarrow.compute as pc

from mieb_ray.audit import duplicates, matches
from mieb_ray.audit.hashes import HashFiles, read_columns
from mieb_ray.runtime import tasks

PDQ_BATCH_ROWS = 100_000  # train hash rows one pdq task reads


def _read(uris: list[str], compared: tuple, side: int) -> pa.Table:
    """The columns one side of `compared` needs (0: train, 1: eval) of some hash files."""
    return read_columns(uris, ["key", "eval_task", *matches.pdq_columns(compared, side), "pdq_quality"])


@tasks.remote(num_cpus=1)
def _indexed(uris: list[str], compared: tuple, side: int = 1) -> matches.PdqSide:
    """The side every batch of the other is searched in, read and made ready once."""
    return matches.pdq_index(_read(uris, compared, side), compared, side)


@tasks.remote(num_cpus=1)
def _batch_pairs(uris: list[str], against: matches.PdqSide) -> tuple[pa.Table, list[dict]]:
    return matches.pdq_train_pairs(_read(uris, matches.PDQ_FROM_TRAIN, 0), against)


@tasks.remote(num_cpus=1)
def _eval_batch_pairs(uris: list[str], train: matches.PdqSide) -> tuple[pa.Table, list[dict]]:
    return matches.pdq_eval_pairs(_read(uris, matches.PDQ_FROM_EVAL, 1), train)


@tasks.remote(num_cpus=1)
def _batch_links(uris: list[str], every: matches.PdqSide) -> list:
    compared = matches.PDQ_SELF_COMPARED
    return duplicates.pdq_links(matches.pdq_train_pairs(_read(uris, compared, 0), every, compared=compared)[0])


def batches(hashed: HashFiles, cpus: float, side: str = "train") -> list[list[str]]:
    """One side's hash files in batches (each file read once): at most PDQ_BATCH_ROWS rows, and at least two batches
    a CPU of the cluster at its largest, so that the search, the audit's longest step, spreads over all of them
    (the full audit's 4.4M train rows in 100,000-row batches were 45 tasks of 40 minutes each, whatever the
    cluster: bench/full_size.py). cpus: what the cluster has at its largest (the job's placement says)."""
    total = sum(r["rows"] for r in hashed.records[side])
    size = max(1, min(PDQ_BATCH_ROWS, -(-total // max(1, int(2 * cpus)))))
    out, batch, rows = [], [], 0
    for uri, r in zip(hashed.uris(side), hashed.records[side]):
        batch.append(uri)
        rows += r["rows"]
        if rows >= size:
            out.append(batch)
            batch, rows = [], 0
    return out + ([batch] if batch else [])


def pairs(hashed: HashFiles, cpus: float, log) -> tuple[pa.Table, list[dict]]:
    """The pdq pairs, and the groups of more than matches.GROUP_CAP pairs."""
    t0 = time.time()
    against = _indexed.remote(hashed.uris("against"), matches.PDQ_FROM_TRAIN)
    train = _indexed.remote(hashed.uris("train"), matches.PDQ_FROM_EVAL, 0)
    ahead, back = batches(hashed, cpus), batches(hashed, cpus, "against")
    found = tasks.get([_batch_pairs.remote(b, against) for b in ahead]
                      + [_eval_batch_pairs.remote(b, train) for b in back])
    table = matches.closest(pa.concat_tables([f[0] for f in found] or [matches.PAIR_SCHEMA.empty_table()]))
    groups = _merged([g for f in found for g in f[1]])
    single = pc.sum(pc.is_null(table["group"])).as_py() or 0
    log(f"[audit] pdq (Hamming distance <= {matches.PDQ_THRESHOLD} of 256 bits): {single} pairs"
        + (f" and {len(groups)} groups" if groups else "") + f" from {len(ahead)} train and {len(back)} eval "
        f"batches in {time.time() - t0:.1f}s")
    return table, groups


def _merged(groups: list[dict]) -> list[dict]:
    """One entry per group id: a group found by several train batches (its rows in each) counted once."""
    out: dict[int, dict] = {}
    for g in groups:
        if g["group"] in out:
            seen = out[g["group"]]
            seen["train_rows"] += g["train_rows"]
            seen["pairs"] = seen["train_rows"] * seen["eval_images"]
            seen["train_sample"] = (seen["train_sample"] + g["train_sample"])[:matches.GROUP_SAMPLE]
        else:
            out[g["group"]] = dict(g)
    return list(out.values())


def links(hashed: HashFiles, cpus: float) -> list:
    """`--against self`: the ("pdq", key, key) links of every train batch searched against the whole train side."""
    every = _indexed.remote(hashed.uris("train"), matches.PDQ_SELF_COMPARED)
    return [link for found in tasks.get([_batch_links.remote(b, every) for b in batches(hashed, cpus)])
            for link in found]
