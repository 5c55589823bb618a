"""A source split's rows in the order `datasets.load_dataset(repo)` reads them, which is mteb's: its files sorted
as strings (`train/10.tar` before `train/2.tar`, the hub's WebDataset shards are unpadded), rows in file order.
A row's index, mieb-train's key `<slug>/<index>` and every score that depends on row order (the linear probe's
undersampling by index, clustering) follow from it. The mirrors here hold 13 unpadded shards per split: 7 rows
each, so that a misordered split moves rows onto other labels even for a binary task."""

from __future__ import annotations

import io
import json
import os
import tarfile

import datasets
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from support.embedding_fixtures import write_embeddings
from support.mteb_reference import mteb_clustering, mteb_probe

from mieb_ray import storage
from mieb_ray.demo_data.mirror import make_mirror
from mieb_ray.errors import UserError
from mieb_ray.evals import registry
from mieb_ray.evals.clustering import BY_NAME as CLUSTERING
from mieb_ray.evals.job import evaluate
from mieb_ray.evals.probe_tasks import BY_NAME as PROBES
from mieb_ray.io import reader
from mieb_ray.pipelines.build import BuildConfig, build
from mieb_ray.sources import by_slug

SHARDS, PER_SHARD = 13, 7
ROWS = SHARDS * PER_SHARD
SLUGS = ["patchcamelyon", "cifar10"]  # WebDataset, Parquet


@pytest.fixture(scope="module")
def mirror(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("order") / "mirror")
    make_mirror(root, rows=ROWS, datasets=SLUGS, files=SHARDS, eval_rows=ROWS, eval_files=SHARDS, padded=False)
    return root


def theirs(repo: str, split: str) -> list[tuple[bytes, int]]:
    """(image bytes, label) of each row of `load_dataset(repo)[split]`, in its order: mteb's own call."""
    data = datasets.load_dataset(repo, split=split, cache_dir=os.path.join(repo, "..", ".hf", split))
    image = next(c for c, f in data.features.items() if isinstance(f, datasets.Image))
    label = "cls" if "cls" in data.column_names else "label"
    data = data.cast_column(image, datasets.Image(decode=False))
    return [(row[image]["bytes"], row[label]) for row in data]


def ours(source, sources: str, split: str, rows_per_unit: int) -> list[tuple[int, bytes, int]]:
    columns = reader.source_columns(source)
    units, _ = reader.plan_source(source, sources, rows_per_unit, split)
    table = pa.concat_tables(t for u in units for t in reader.read(u, [columns["image"], columns["label"]]))
    return list(zip(table["index"].to_pylist(), [i["bytes"] for i in table["image"].to_pylist()],
                    table["label"].to_pylist()))


@pytest.mark.parametrize("slug", SLUGS)
@pytest.mark.parametrize("split", ["train", "test"])
def test_rows_are_in_the_order_datasets_reads_them(mirror, slug, split):
    source = by_slug(slug)
    files = reader.split_files(source, mirror, split)
    assert [os.path.basename(f).split(".")[0].rsplit("-", 1)[-1] for f in files][:5] == ["0", "1", "10", "11", "12"]
    expected = theirs(os.path.join(mirror, source.repo), split)
    for rows_per_unit in (3, PER_SHARD, 1000):  # units inside a tar, one per tar, whole splits
        assert ours(source, mirror, split, rows_per_unit) == [(i, b, c) for i, (b, c) in enumerate(expected)]


def test_tars_without_a_card_are_ordered_as_datasets_finds_them(tmp_path):
    root = str(tmp_path / "mirror")
    make_mirror(root, rows=ROWS, datasets=["fer2013"], files=SHARDS, eval_rows=ROWS, eval_files=SHARDS, cards=False)
    source = by_slug("fer2013")
    assert not os.path.exists(os.path.join(root, source.repo, "README.md"))
    for split in ("train", "test"):
        expected = theirs(os.path.join(root, source.repo), split)
        assert ours(source, root, split, PER_SHARD) == [(i, b, c) for i, (b, c) in enumerate(expected)]


def test_mieb_train_keys_name_the_rows_of_load_dataset(mirror, tmp_path):
    """A user traces `<slug>/<index>` back to row <index> of `load_dataset(repo)["train"]`."""
    out = str(tmp_path / "train")
    build(BuildConfig(mirror, out, datasets=tuple(SLUGS), rows_per_shard=10, executor="local"), log=lambda _: None)
    table = pq.read_table([os.path.join(out, s["path"]) for s in storage.read_manifest(out)["shards"]])
    for slug in SLUGS:
        expected = theirs(os.path.join(mirror, by_slug(slug).repo), "train")
        rows = [r for r in table.select(["key", "image"]).to_pylist() if r["key"].startswith(f"{slug}/")]
        assert sorted(int(r["key"].split("/")[1]) for r in rows) == list(range(ROWS))
        assert all(r["image"]["bytes"] == expected[int(r["key"].split("/")[1])][0] for r in rows)


def test_probe_and_clustering_equal_mteb_on_many_unpadded_shards(mirror, tmp_path):
    """Every metric of the linear probe (mteb's undersampling draws rows by index) and of clustering (row order
    feeds MiniBatchKMeans) equal `mteb.evaluate`'s on the same embeddings, the splits read from 13 shards each."""
    rng = np.random.default_rng(7)
    keys, rows, vectors = [], [], {}
    for slug in SLUGS:
        repo = os.path.join(mirror, by_slug(slug).repo)
        for code, split in ((0, "train"), (1, "test")):
            labels = [label for _, label in theirs(repo, split)]
            centres = rng.normal(size=(max(labels) + 1, 8))
            vectors[slug, code] = {i: (centres[c] + 0.9 * rng.normal(size=8)).astype(np.float32)
                                   for i, c in enumerate(labels)}
            keys += [f"{slug}/{i}" if code == 0 else f"{slug}/{split}/{i}" for i in range(ROWS)]
            rows += list(vectors[slug, code].values())
    images = str(tmp_path / "images")
    write_embeddings(images, keys, np.stack(rows), "image", "float32", 3, {})
    names = ["PatchCamelyon", "CIFAR10", "CIFAR10Clustering"]
    results = evaluate(registry.select(",".join(names)), registry.Options(mirror),
                                      str(tmp_path / "out"), images=images, executor="local", log=lambda _: None)
    for name in names:
        if name in PROBES:
            task = PROBES[name]
            reference = mteb_probe(name, os.path.join(mirror, task.source.repo), task.split,
                                   vectors[task.slug, 0], vectors[task.slug, 1])
        else:
            task = CLUSTERING[name]
            reference = mteb_clustering(name, os.path.join(mirror, task.source.repo), task.split,
                                        vectors[task.slug, 1])
        mine, ref = results[name]["scores"][task.split][0], reference["scores"][task.split][0]
        assert json.dumps(mine, sort_keys=True) == json.dumps(ref, sort_keys=True), name  # NaN (an ap) is NaN


def _retar(path: str, keys: list[str]) -> None:
    """Rewrite a tar's samples under other keys, members and order kept."""
    with tarfile.open(path) as t:
        members = [(m, t.extractfile(m).read()) for m in t.getmembers()]
    with tarfile.open(path, "w") as t:
        old = list(dict.fromkeys(m.name.split(".")[0] for m, _ in members))
        for member, data in members:
            stem, ext = member.name.split(".", 1)
            member.name = f"{keys[old.index(stem)]}.{ext}"
            t.addfile(member, io.BytesIO(data))


def test_keys_that_cannot_count_a_tar_are_one_line(tmp_path):
    """A tar's rows are counted from its keys (clip_benchmark numbers samples s%07d across the split); a read
    that finds otherwise fails naming the file, never shifts rows."""
    root = str(tmp_path / "mirror")
    make_mirror(root, rows=12, datasets=["fer2013"], files=3, eval_rows=3)
    source = by_slug("fer2013")
    tars = os.path.join(root, source.repo, "train")
    _retar(os.path.join(tars, "1.tar"), ["s0000004", "s0000005", "s0000006", "s0000009"])  # a gap: 4 samples
    with pytest.raises(UserError, match=r"^.*train/1\.tar: sample s0000009 is number 3 of the tar, whose keys "
                                        r"start at 4: keys that skip or repeat cannot count its rows$"):
        ours(source, root, "train", 100)
    _retar(os.path.join(tars, "1.tar"), ["s0000004", "s0000005", "s0000006", "s0000007"])
    _retar(os.path.join(tars, "2.tar"), ["s0000009", "s0000010", "s0000011", "s0000012"])  # tar 1 keeps 4 of 5
    with pytest.raises(UserError, match=r"^.*train/1\.tar holds 4, not the 5 samples its keys say \(from 4 to the "
                                        r"next tar's first, 9\)$"):
        ours(source, root, "train", 100)
