"""The audit job: which train rows duplicate an eval image, by four detectors (exact, pixels, pdq, near: the same
bytes, the same pixels, a perceptual hash, CLIP cosine), each reported apart.

check    the flags (audit/config.py); embeddings of two models refused before anything is hashed
plan     driver: the train table and the eval tables (`mieb`: the MIEB eval splits, built into OUT/eval-data by
         the build job through the same readers, and reused); units of rows of one file (audit/plan.py)
hash     the job's one stage, per unit: each image's sha256, pixel hash and PDQ hashes, committed as a Parquet
         file sorted by join partition (one row group each), then its progress record (audit/hashes.py,
         audit/fingerprints.py, runtime/)
join     a CPU task per partition: its row group of every hash file, joined on each hash (audit/join.py,
         audit/matches.py)
pdq      every train x eval pair within PDQ_THRESHOLD bits, exactly: the eval side's PDQ hashes read once into the
         object store and indexed once (matches.pdq_index: about 790 bytes a row), then a CPU task per batch of
         train hash files, each file read once, searched by multi-index hashing; and the other way, the train
         side's own hashes indexed once (about 170 bytes a row) and a task per batch of eval hash files searching
         with their side windows (audit/pdq.py, audit/hamming.py)
near     with embeddings: the top-k engine, the train embeddings as the corpus (every row its own group) and
         each eval embedding shard as a query block, reduced to each eval image's nearest train rows; pairs
         at cosine >= threshold (audit/near.py)
write    contamination.parquet, errors.parquet, summary.json, report.html, then _manifest.json last
         (audit/outputs.py)

`--against self` hashes the train table alone, links its rows by join and pdq within it, and writes the groups of
copies instead (duplicates.parquet: audit/duplicates.py). The driver holds units, refs, statistics and the pairs
found, never an image, a hash table or an embedding. `--resume` skips the units whose hash file an earlier run
committed with the same settings. The hash, join, pdq and near tasks run on Ray, or in this process for a small
audit (runtime/placement.py).
"""

from __future__ import annotations

import dataclasses
import re
import time

import pyarrow as pa

from mieb_ray.audit import hashes, join, matches, near, outputs, pdq, plan
from mieb_ray.audit.config import DEFAULT_THRESHOLD, MIEB, SELF, AuditConfig
from mieb_ray.audit.hashes import HashFiles
from mieb_ray.audit.near import NEAR_K, near_pairs
from mieb_ray.encode.model import pinned
from mieb_ray.io import embeddings
from mieb_ray.runtime import placement, tasks
from mieb_ray.runtime.cluster import RunContext
from mieb_ray.runtime.job import Job

# what the CLI, the tests and bench/ import from the job
__all__ = ["DEFAULT_THRESHOLD", "NEAR_K", "AuditConfig", "audit", "near_pairs"]

LOCAL_BYTES = 256 << 20  # at most this many bytes of tables audit in this process under --executor auto


def audit(config: AuditConfig, log=print, ctx: RunContext | None = None) -> dict:
    """Run the audit on Ray or in this process; return the manifest. ctx: the command's Ray (None: RunContext())."""
    config.check()
    if config.model:  # a model that cannot embed images fails now, not after the hashing
        config = dataclasses.replace(config, revision=pinned(config.model, config.revision)[0])
    ctx = ctx or RunContext()  # one for every stage: the Ray the hashing brought up is the near search's
    if config.train_embeddings:  # before any hashing: embeddings of two models are refused at once
        for note in embeddings.check_inputs({"train": config.train_embeddings, "eval": config.against_embeddings},
                                            config.allow_mixed_models):
            log(f"[audit] warning: {note}")
    job = Job("audit", config.out, "a complete audit", re.compile(rf"^{hashes.DIR}/"), config.resume,
              config.overwrite, log, inputs=(config.train, *[t for t in config.against if t not in (MIEB, SELF)]))
    with job:  # its hold on the output ends with the run, however it ends
        job.start()
        train, against = plan.train_side(config), plan.against_side(config, log, ctx)
        size = train.size() + against.size()
        where = placement.choose(config.executor, f"{size / 2 ** 20:,.0f} MiB of tables, more than "
                                 f"{LOCAL_BYTES >> 20} MiB" if size > LOCAL_BYTES else None,
                                 f"{size / 2 ** 20:,.1f} MiB of tables", ctx)
        log(f"[audit] {where.describe()}")
        with tasks.using(where.mode, where.ctx):
            work = plan.cut(train, against)
            done = job.earlier({u.name: u.unit.identity for u in work.units}, work.settings())
            log(f"[audit] {work.rows:,} rows: {len(work.of('train'))} train units, {len(work.of('against'))} eval "
                f"units, {work.partitions} join partitions; {len(done)} units already hashed")
            hashed = hashes.hash_all(config.out, work, job, done, where.mode, where.ctx)
            if config.alone:
                return _copies(config, job, hashed, where.cpus(), log)
            joined, errors, groups = join.pairs(hashed, log)
            similar, more = pdq.pairs(hashed, where.cpus(), log)
            found, near_info = [joined, similar], {}
            if config.near:
                close, near_info = near.pairs(config, work, hashed, log, where.ctx)
                found.append(close)
            findings = outputs.Findings(matches.sort_pairs(pa.concat_tables(found)), groups + more, errors, near_info)
            return outputs.write_pairs(config, job, work, hashed, findings, log)


def _copies(config: AuditConfig, job: Job, hashed: HashFiles, cpus: float, log) -> dict:
    """`--against self`: the train rows linked by each detector (the join partitions, then pdq of every train batch
    against the whole table), written as groups of copies."""
    t0 = time.time()
    links, errors = join.links(hashed)
    links += pdq.links(hashed, cpus)
    log(f"[audit] {len(links):,} links between copies in {time.time() - t0:.1f}s")
    return outputs.write_self(config, job, hashed, links, errors, log)
