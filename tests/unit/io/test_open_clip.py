"""open_clip's trainer reads a WebDataset mieb-train as it is: its sample count from sizes.json for one dataset and
for all 23 (whichever comes first), and its pipeline yields every row once, a decoded image and its caption.

open_clip's own functions run: `open_clip_train.data` where it imports, else the copy in tests/support/open_clip_data.py
(open_clip_torch 3.3.0; torchvision does not import here). Which one ran is printed (`pytest -s`) and named in
the assertion messages. Builds run in this process (executor="local"): no Ray.
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
import tarfile

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image
from support.open_clip_data import SOURCE, get_dataset_size, train_samples

from mieb_ray import storage
from mieb_ray.pipelines.build import BuildConfig, build
from mieb_ray.sources import SOURCES

pytestmark = pytest.mark.timeout(300)
ROWS_PER_SHARD = 5


def quiet(*_):
    pass


@pytest.fixture(scope="module")
def wds_build(mirror, tmp_path_factory):
    out = str(tmp_path_factory.mktemp("train-wds-open-clip"))
    print(f"open_clip reading logic: {SOURCE}")
    return out, build(BuildConfig(mirror[0], out, fmt="webdataset", rows_per_shard=ROWS_PER_SHARD, executor="local"),
                      log=quiet)


def by_dataset(out: str, manifest: dict) -> dict[str, list[str]]:
    shards: dict[str, list[str]] = {}
    for s in manifest["shards"]:
        shards.setdefault(s["dataset"], []).append(os.path.join(out, s["path"]))
    return shards


def braces(paths: list[str]) -> str:
    """One dataset's shards in brace notation, as a user writes --train-data: DIR/<slug>-{000000..00000K}.tar."""
    stem = paths[0].removesuffix("000000.tar")
    assert paths == [f"{stem}{k:06d}.tar" for k in range(len(paths))], paths  # numbered from 0 without a gap
    return f"{stem}{{000000..{len(paths) - 1:06d}}}.tar"


def sizes_files(out: str) -> dict[str, dict]:
    return {os.path.relpath(os.path.join(d, f), out): json.load(open(os.path.join(d, f)))
            for d, _, files in os.walk(out) for f in files if f == "sizes.json"}


def test_open_clip_counts_one_dataset_and_all_23(wds_build):
    out, manifest = wds_build
    shards = by_dataset(out, manifest)
    counts = manifest["counts"]["datasets"]
    assert len(shards) == len(SOURCES) == 23
    for slug, paths in shards.items():
        assert get_dataset_size(braces(paths)) == (counts[slug], len(paths)), (SOURCE, slug)
        assert get_dataset_size("::".join(paths)) == (counts[slug], len(paths)), (SOURCE, slug)
    # every dataset first in turn: its folder's sizes.json must know every other dataset's shards
    every = [braces(paths) for paths in shards.values()]
    for i in range(len(every)):
        assert get_dataset_size("::".join(every[i:] + every[:i])) == (manifest["counts"]["total"],
                                                                      len(manifest["shards"])), SOURCE
    # one sizes.json per dataset folder, the same, holding exactly the build's shards
    expected = {os.path.basename(s["path"]): s["rows"] for s in manifest["shards"]}
    assert sizes_files(out) == {f"{slug}/sizes.json": expected for slug in shards}


def members_by_key(out: str, manifest: dict) -> dict[str, tuple[str, bytes, str]]:
    """key -> (image extension, image bytes, caption), read with tarfile, by the key each sample's .json names."""
    rows = {}
    for s in manifest["shards"]:
        with tarfile.open(os.path.join(out, s["path"])) as tar:
            members = {m.name: tar.extractfile(m).read() for m in tar.getmembers()}
        for name, data in members.items():
            if name.endswith(".json"):
                key = json.loads(data)["key"]
                assert name == f"{key}.json" and key not in rows, name
                ext, image = next((e, members[f"{key}.{e}"]) for e in ("jpg", "png", "webp") if f"{key}.{e}" in members)
                rows[key] = (ext, image, members[f"{key}.txt"].decode())
    return rows


def test_open_clip_pipeline_yields_every_row_once_with_image_and_caption(wds_build):
    out, manifest = wds_build
    every = "::".join(os.path.join(out, s["path"]) for s in manifest["shards"])
    seen: list[str] = []
    pairs = list(train_samples(every, seen))
    rows = members_by_key(out, manifest)
    assert len(rows) == manifest["counts"]["total"] > 0
    assert sorted(seen) == sorted(rows) and len(pairs) == len(seen), SOURCE  # every row, once
    assert {ext for ext, _, _ in rows.values()} == {"jpg", "png", "webp"}  # each of the catalog's extensions met
    for key, (image, text) in zip(seen, pairs):
        _, data, caption = rows[key]
        assert isinstance(image, Image.Image) and image.mode == "RGB", (SOURCE, key)
        assert np.array_equal(np.asarray(image), np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))), key
        assert text == caption != "", (SOURCE, key)


def fake_audit(path, keys: list[str]) -> str:
    """A complete audit output flagging `keys`: what --exclude reads."""
    os.makedirs(path)
    pq.write_table(pa.table({"train_key": keys, "method": ["exact"] * len(keys)}),
                   os.path.join(path, "contamination.parquet"))
    storage.write_manifest(str(path), {"format": "mieb-audit"})
    return str(path)


def tar_rows(path: str) -> int:
    with tarfile.open(path) as tar:
        return sum(m.name.endswith(".txt") for m in tar.getmembers())


def test_sizes_json_follows_overwrite_exclude_and_stale_files(mirror, tmp_path):
    """sizes.json holds the shards on disk: after --overwrite with fewer datasets and another shard size, with
    rows left out by --exclude, and after an unfinished run's leftovers (an old-name tar, a shard of another size,
    another dataset's sizes.json) are swept at the end of a resumed run."""
    root, out = mirror[0], str(tmp_path / "out")
    build(BuildConfig(root, out, datasets=("cifar10", "gtsrb"), fmt="webdataset", rows_per_shard=5,
                      executor="local"), log=quiet)
    audit = fake_audit(tmp_path / "audit", ["gtsrb/0", "gtsrb/7"])
    again = BuildConfig(root, out, datasets=("gtsrb",), fmt="webdataset", rows_per_shard=4, exclude=audit,
                        executor="local")
    manifest = build(dataclasses.replace(again, overwrite=True), log=quiet)
    os.remove(os.path.join(out, "_manifest.json"))  # as if the run stopped before its manifest
    for leftover in ("gtsrb/000000.tar", "gtsrb/gtsrb-000099.tar", "cifar10/sizes.json"):
        os.makedirs(os.path.dirname(os.path.join(out, leftover)), exist_ok=True)
        open(os.path.join(out, leftover), "wb").write(b"stale")
    resumed = build(dataclasses.replace(again, resume=True), log=quiet)
    for m in (manifest, resumed):
        assert m["counts"]["excluded"] == {"gtsrb": 2}
        expected = {os.path.basename(s["path"]): s["rows"] for s in m["shards"]}
        assert sizes_files(out) == {"gtsrb/sizes.json": expected}
        assert sorted(os.listdir(os.path.join(out, "gtsrb"))) == sorted([*expected, "sizes.json"])
        assert {name: tar_rows(os.path.join(out, "gtsrb", name)) for name in expected} == expected
        first = m["shards"][0]
        assert get_dataset_size(os.path.join(out, first["path"])) == (first["rows"], 1), SOURCE
        assert sum(expected.values()) == m["counts"]["total"] == m["counts"]["datasets"]["gtsrb"]
    assert not os.listdir(os.path.join(out, "cifar10"))


def test_sizes_json_on_s3(s3, mirror):
    out = f"s3://{s3.bucket}/open-clip-wds"
    manifest = build(BuildConfig(mirror[0], out, datasets=("cifar10", "gtsrb"), fmt="webdataset", rows_per_shard=5,
                                 executor="local"), log=quiet)
    expected = {os.path.basename(s["path"]): s["rows"] for s in manifest["shards"]}
    listed = [u for u in storage.list_files(out) if u.endswith("/sizes.json")]
    assert sorted(listed) == [storage.join(out, f"{slug}/sizes.json") for slug in ("cifar10", "gtsrb")]
    assert all(json.loads(storage.read_text(u)) == expected for u in listed)
