"""`mieb-ray demo`: the whole flow on a laptop, from a fixture mirror of the 23 sources made on the spot."""

from __future__ import annotations

import os
import time

from mieb_ray import storage
from mieb_ray.fixtures.mirror import make_mirror
from mieb_ray.pipelines.build import build


def demo(out: str, rows: int = 40, log=print) -> dict:
    out = os.path.abspath(out)
    mirror, train = os.path.join(out, "mirror"), os.path.join(out, "mieb-train")
    t0 = time.time()
    written = make_mirror(mirror, rows=rows)
    log(f"[demo] fixture mirror of {len(written)} sources ({sum(written.values()):,} rows, the hub's layout) "
        f"in {time.time() - t0:.1f}s: {mirror}")
    manifest = build(mirror, train, rows_per_shard=rows // 2, overwrite=True, log=log)
    log(f"[demo] mieb-train: {manifest['counts']['total']:,} rows in {len(manifest['shards'])} Parquet shards "
        f"at {train} (manifest: {storage.join(train, storage.MANIFEST)})")
    log(f"[demo] read it back: datasets.load_dataset({train!r}, 'cifar100', split='train')")
    return manifest
