"""What an audit writes once its detectors are done, through one writer: the findings (contamination.parquet, or
duplicates.parquet for `--against self`), errors.parquet, summary.json and report.html (against an eval side: its
gallery shows the first REPORT_PAIRS pairs of each detector, both images as thumbnails read again from their
units), then _manifest.json last and the hash files removed after it; and the command's last lines. The files'
names and the manifest's kind are formats.py's.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from mieb_ray import __version__, formats, storage
from mieb_ray.audit import duplicates, matches, report
from mieb_ray.audit.config import MIEB, SELF, AuditConfig
from mieb_ray.audit.hashes import DIR, HashFiles, locate
from mieb_ray.audit.plan import HashUnit, Plan
from mieb_ray.audit.report import thumbnail
from mieb_ray.io import parquet, reader
from mieb_ray.runtime import tasks
from mieb_ray.runtime.job import Job

REPORT_PAIRS = 48  # pairs shown per detector on the page
KEYS = {"train": "train_key", "against": "eval_key"}  # a pair's key of each side


@dataclass(frozen=True)
class Findings:
    """What the detectors found against an eval side."""

    pairs: pa.Table  # matches.PAIR_SCHEMA, in matches.sort_pairs' order
    groups: list[dict]  # of more than matches.GROUP_CAP pairs
    errors: pa.Table  # matches.ERROR_SCHEMA: the images that do not decode
    near: dict  # the near search's statistics; empty when it did not run


def write_pairs(config: AuditConfig, job: Job, plan: Plan, hashed: HashFiles, found: Findings, log) -> dict:
    """The pairs, the errors, summary.json and report.html, then the manifest; return it."""
    eval_rows, train_rows = {}, {}
    for r in hashed.records["against"]:
        for task, n in r["tasks"].items():
            eval_rows[task or "?"] = eval_rows.get(task or "?", 0) + n
    for r in hashed.records["train"]:
        for dataset, n in r["datasets"].items():
            train_rows[dataset] = train_rows.get(dataset, 0) + n
    summary = {**matches.summary(found.pairs, eval_rows, train_rows, found.groups),
               "pdq_threshold": matches.PDQ_THRESHOLD, "threshold": config.threshold if config.near else None,
               "near": found.near or None}
    page = report.render(summary, _gallery(found.pairs, plan, hashed))
    totals = summary["totals"]
    manifest = _commit(job, hashed, {formats.PAIRS: found.pairs, formats.AUDIT_ERRORS: found.errors,
                                     formats.SUMMARY: summary, formats.REPORT: page},
                       {"train": storage.display(config.train), "against": list(config.against),
                        "sources": storage.display(config.sources) if config.against == (MIEB,) else None,
                        "model": config.model, "threshold": config.threshold if config.near else None,
                        "pdq_threshold": matches.PDQ_THRESHOLD,
                        "detectors": list(formats.DETECTORS if config.near else formats.HASH_DETECTORS)},
                       {"train_rows": sum(train_rows.values()), "eval_rows": sum(eval_rows.values()),
                        "pairs": totals["pairs"], "groups": totals["groups"],
                        "train_rows_flagged": totals["train_rows_flagged"], "errors": found.errors.num_rows})
    counts = [f"{totals['pairs'][m]:,} {m}" if m in report.ran(summary) else f"{m} not run" for m in formats.DETECTORS]
    groups = sum(totals["groups"].values())
    log(f"[audit] pairs: {', '.join(counts)}" + (f"; {groups} groups of more than {matches.GROUP_CAP:,} pairs, listed "
                                                  "once each (summary.json)" if groups else ""))
    log(f"[audit] done: {totals['train_rows_flagged']:,} train rows flagged of {sum(train_rows.values()):,}, "
        f"{totals['eval_images_affected']:,} eval images affected; {time.time() - job.t0:.1f}s -> "
        f"{storage.display(config.out)}")
    return manifest


def write_self(config: AuditConfig, job: Job, hashed: HashFiles, links: list, errors: pa.Table, log) -> dict:
    """`--against self`: the groups of copies (duplicates.parquet), the errors and summary.json, then the manifest;
    return it."""
    found = duplicates.table(links)
    rows = sum(r["rows"] for r in hashed.records["train"])
    summary = duplicates.summary(found, rows)
    manifest = _commit(job, hashed, {formats.DUPLICATES: found, formats.AUDIT_ERRORS: errors, formats.SUMMARY: summary},
                       {"train": storage.display(config.train), "against": [SELF],
                        "pdq_threshold": matches.PDQ_THRESHOLD, "detectors": list(formats.HASH_DETECTORS)},
                       {"train_rows": rows, "errors": errors.num_rows,
                        **{m: summary[m] for m in formats.HASH_DETECTORS}})
    log("[audit] groups of copies: " + ", ".join(f"{summary[m]['groups']:,} {m} ({summary[m]['rows_in_groups']:,} "
                                                  f"rows)" for m in formats.HASH_DETECTORS))
    log(f"[audit] done: build --exclude would leave out {summary['left_out_by_default']:,} of {rows:,} rows, one "
        f"kept per group; {time.time() - job.t0:.1f}s -> {storage.display(config.out)}")
    return manifest


def _commit(job: Job, hashed: HashFiles, files: dict[str, pa.Table | dict | str], settings: dict,
            counts: dict) -> dict:
    """Each file (a table as Parquet, a dict as JSON, a page as it is), then the manifest naming them in this
    order, then the hash files removed (not before: a resume may still need them)."""
    for name, content in files.items():
        uri = storage.join(hashed.out, name)
        if isinstance(content, pa.Table):
            storage.commit_file(uri, lambda local, t=content: pq.write_table(t, local))
        else:
            storage.write_bytes(uri, (json.dumps(content, indent=2) + "\n" if isinstance(content, dict)
                                      else content).encode())
    manifest = job.finish({**formats.AUDIT.stamp(), "version": __version__, "config": settings, "files": list(files),
                           "counts": counts, "seconds": round(time.time() - job.t0, 3)}, hashed.paths())
    storage.delete_tree(storage.join(hashed.out, DIR))
    return manifest


@tasks.remote(num_cpus=1)
def _thumbnails(item: HashUnit, rows: list[int]) -> dict[int, str | None]:
    """Thumbnails of the unit's rows at these positions."""
    want, out = set(rows), {}
    unit = item.unit
    for chunk in reader.read(unit, item.columns.read_as("image")):
        for index, image in zip(chunk["index"].to_pylist(), parquet.image_bytes(chunk["image"]).to_pylist()):
            if index - unit.lo in want:
                out[index - unit.lo] = thumbnail(image)
    return out


def _gallery(pairs: pa.Table, plan: Plan, hashed: HashFiles) -> list[dict]:
    """The first REPORT_PAIRS pairs of each detector, with both images as thumbnails."""
    single = pairs.filter(pc.is_null(pairs["group"]))
    shown = [r for m in formats.DETECTORS for r in single.filter(pc.equal(single["method"], m)).slice(0, REPORT_PAIRS)
             .to_pylist()]
    if not shown:
        return []
    where = {}  # (side, key) -> (unit number, row)
    for side, key_field in KEYS.items():
        keys = pa.array(sorted({r[key_field] for r in shown}), pa.string())
        located = tasks.get(locate.remote(hashed.uris(side), keys, ["unit", "row"]))
        for k, u, row in zip(*(located[c].to_pylist() for c in ("key", "unit", "row"))):
            where.setdefault((side, k), (u, row))
    by_unit = {}
    for (side, _), (u, row) in where.items():
        by_unit.setdefault((side, u), set()).add(row)
    units = {side: plan.of(side) for side in KEYS}
    fetched = tasks.get([_thumbnails.remote(units[side][u], sorted(rows)) for (side, u), rows in by_unit.items()])
    thumbs = {(side, u, row): uri for ((side, u), _), got in zip(by_unit.items(), fetched) for row, uri in got.items()}
    for r in shown:
        for side, key_field in KEYS.items():
            u, row = where.get((side, r[key_field]), (None, None))
            r[f"{side}_image"] = thumbs.get((side, u, row))
    return shown
