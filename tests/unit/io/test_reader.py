"""Planning and reading a source split, and one unit's shards, without Ray."""

from __future__ import annotations

import glob
import os

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from mieb_ray.captions import class_table
from mieb_ray.demo_data.mirror import SCIMMIR_NO_CAPTION, hub_names, label_of, make_mirror
from mieb_ray.errors import UserError
from mieb_ray.io import reader
from mieb_ray.pipelines.shard_builder import ShardBuilder
from mieb_ray.sources import by_slug


def read_unit(source, unit):
    """A source unit's chunks, every column."""
    return reader.read(unit, list(reader.source_columns(source).values()))


@pytest.fixture(scope="module")
def odd_mirror(tmp_path_factory):
    """Split sizes and file counts that do not line up with row groups or shards."""
    root = str(tmp_path_factory.mktemp("odd"))
    make_mirror(root, rows={"dtd": 257, "gtsrb": 25, "cifar10": 12}, datasets=["dtd", "gtsrb", "cifar10"], files=3)
    return root


@pytest.mark.parametrize("slug,rows", [("dtd", 257), ("gtsrb", 25)])
@pytest.mark.parametrize("rows_per_shard", [1, 7, 70, 100, 1000])
def test_units_cover_the_split_exactly_once(odd_mirror, slug, rows, rows_per_shard):
    source = by_slug(slug)
    units, _ = reader.plan_source(source, odd_mirror, rows_per_shard)
    seen = []
    for unit in units:
        # Parquet: rows [k*N, (k+1)*N) of the split; tars: of each tar, so that no tar is read by two units
        assert (unit.lo - (unit.pieces[0].first if source.layout == "webdataset" else 0)) % rows_per_shard == 0
        assert source.layout == "parquet" or len(unit.pieces) == 1
        index = [i for chunk in read_unit(source, unit) for i in chunk["index"].to_pylist()]
        assert all(unit.lo <= i and (unit.hi is None or i < unit.hi) for i in index)
        seen += index
    assert seen == list(range(rows))
    labels = [label for unit in units for chunk in read_unit(source, unit)
              for label in chunk["label"].to_pylist()]
    assert labels == [label_of(source, i) for i in range(rows)]


def datasets_files(repo, split: str) -> list[str]:
    """The split's files as `datasets.load_dataset(repo)` would read them: its own builder, on the folder."""
    import datasets

    return [os.path.relpath(f, repo) for f in datasets.load_dataset_builder(str(repo)).config.data_files[split]]


def test_train_files_skip_the_test_split_in_the_order_datasets_reads_them(tmp_path):
    make_mirror(tmp_path, rows={"fer2013": 24}, datasets=["fer2013"], files=12)
    files = reader.split_files(by_slug("fer2013"), str(tmp_path))  # the train split
    # as strings, the way datasets sorts them: 10.tar before 2.tar
    assert [os.path.basename(f) for f in files] == sorted(f"{i}.tar" for i in range(12))
    assert [os.path.relpath(f, tmp_path / "mteb/wds_fer2013") for f in files] == \
        datasets_files(tmp_path / "mteb/wds_fer2013", "train")


def test_split_files_are_the_ones_datasets_finds(tmp_path):
    make_mirror(tmp_path, rows={"fer2013": 4, "food101": 4}, datasets=["fer2013", "food101"], files=2,
                eval_rows={"fer2013": 5}, eval_files=2)
    fer, food = by_slug("fer2013"), by_slug("food101")
    for source, split in [(fer, "test"), (fer, "train"), (food, "validation"), (food, "train")]:  # by the cards
        repo = tmp_path / source.repo
        assert [os.path.relpath(f, repo) for f in reader.split_files(source, str(tmp_path), split)] == \
            datasets_files(repo, split)
    (tmp_path / fer.repo / "README.md").unlink()  # no card: datasets' own split names, "testing" among them
    (tmp_path / fer.repo / "test").rename(tmp_path / fer.repo / "testing")
    assert [os.path.relpath(f, tmp_path / fer.repo) for f in reader.split_files(fer, str(tmp_path), "test")] == \
        datasets_files(tmp_path / fer.repo, "test") == ["testing/0.tar", "testing/1.tar"]
    with pytest.raises(UserError, match=r"^food101 \(.*mteb/food101\): no test split \(datasets finds: train, "
                                        r"validation\)$"):
        reader.split_files(food, str(tmp_path), "test")

    units, _ = reader.plan_source(fer, str(tmp_path), 2, "test")
    assert [(u.lo, u.hi, u.split) for u in units] == [(0, 2, "test"), (2, 4, "test"), (4, 5, "test")]  # tars of 2 + 3
    assert [i for u in units for c in read_unit(fer, u) for i in c["index"].to_pylist()] == list(range(5))
    units, _ = reader.plan_source(food, str(tmp_path), 2, "validation")
    assert {u.split for u in units} == {"validation"}
    assert all(u.split == "train" for u in reader.plan_source(food, str(tmp_path), 2)[0])


def test_hub_class_names_come_from_the_parquet_metadata(odd_mirror):
    _, names = reader.plan_source(by_slug("cifar10"), odd_mirror, 10)
    assert names == hub_names("cifar10")


def test_missing_source_and_missing_column_name_the_source(odd_mirror, tmp_path):
    with pytest.raises(UserError, match=r"^food101: no files under .*mteb/food101$"):
        reader.plan_source(by_slug("food101"), odd_mirror, 10)
    make_mirror(tmp_path, datasets=["cifar10"])
    path = sorted(glob.glob(f"{tmp_path}/mteb/cifar10/data/train-*.parquet"))[1]
    table = pq.read_table(path)
    pq.write_table(table.rename_columns(["image" if c == "img" else c for c in table.column_names]), path)
    with pytest.raises(UserError, match=r"^cifar10: .*train-00001-of-00002\.parquet has no column img \(columns: "
                                        r"image, label\)"):
        reader.plan_source(by_slug("cifar10"), str(tmp_path), 10)


def test_corrupt_parquet_footer_names_the_file(tmp_path):
    make_mirror(tmp_path, datasets=["dtd"])
    path = sorted(glob.glob(f"{tmp_path}/mteb/dtd/data/train-*.parquet"))[0]
    with open(path, "r+b") as f:
        f.truncate(100)
    with pytest.raises(UserError, match=r"^unreadable parquet file .*train-00000-of-00002\.parquet"):
        reader.plan_source(by_slug("dtd"), str(tmp_path), 10)


def _rewrite(path: str, **columns) -> None:
    table = pq.read_table(path)
    for name, values in columns.items():
        table = table.set_column(table.column_names.index(name), name, pa.array(values, table.schema.field(name).type))
    pq.write_table(table, path)  # the schema, and so the HF metadata, is kept


def test_bad_rows_become_error_rows_and_nothing_else_is_lost(tmp_path):
    root, out = str(tmp_path / "mirror"), str(tmp_path / "out")
    make_mirror(root, datasets=["cifar10"], rows={"cifar10": 12})
    path = sorted(glob.glob(f"{root}/mteb/cifar10/data/train-*.parquet"))[0]  # rows 0..5
    table = pq.read_table(path)
    labels = table["label"].to_pylist()
    images = table["img"].to_pylist()
    labels[2], labels[4] = 10, None  # outside the 10 classes; missing
    images[3] = {"bytes": b"", "path": "3.png"}
    _rewrite(path, label=labels, img=images)

    source = by_slug("cifar10")
    units, names = reader.plan_source(source, root, 5)
    builder = ShardBuilder({"cifar10": class_table(source, names)}, out, "parquet")
    results = [builder.build(u) for u in units]
    assert sum(r["rows"] for r in results) == 9 and sum(r["errors"] for r in results) == 3
    errors = pq.read_table([os.path.join(out, r["error_file"]) for r in results if r["error_file"]]).to_pylist()
    assert {e["key"]: e["error"] for e in errors} == {
        "cifar10/2": "label 10 outside the 10 classes",
        "cifar10/3": "image missing or empty",
        "cifar10/4": "label missing or not in the class list",
    }
    assert all(e["file"].endswith("train-00000-of-00002.parquet") for e in errors)
    kept = pq.read_table(sorted(glob.glob(f"{out}/cifar10/*.parquet")))
    assert sorted(int(k.split("/")[1]) for k in kept["key"].to_pylist()) == [0, 1, 5, 6, 7, 8, 9, 10, 11]


def test_scimmir_captions_are_the_rows_own_text(tmp_path):
    make_mirror(tmp_path, datasets=["scimmir"], rows={"scimmir": 12})
    source = by_slug("scimmir")
    units, names = reader.plan_source(source, str(tmp_path), 100)
    table = class_table(source, names)
    out = str(tmp_path / "out")
    ShardBuilder({"scimmir": table}, out, "parquet").build(units[0])
    rows = pq.read_table(glob.glob(f"{out}/scimmir/*.parquet")).to_pylist()
    src = pa.concat_tables(pq.read_table(f) for f in sorted(glob.glob(f"{tmp_path}/mteb/SciMMIR/data/train-*")))
    for row, text, cls in zip(rows, src["text"].to_pylist(), src["class"].to_pylist()):
        fallback = table.text[table.source_names.index(cls)]
        assert row["label"] == -1
        assert row["text"] == (" ".join(text.replace("_", " ").split()) if text and text.strip() else fallback)
    for i in SCIMMIR_NO_CAPTION:  # a null and a blank text fall back to the class caption
        assert rows[i]["text"] == table.text[table.source_names.index(src["class"][i].as_py())]
        assert rows[i]["text"].startswith(("a figure of", "a table of"))
    assert any("model v2 on ImageNet across epochs." in r["text"] for r in rows)
    assert pc.all(pc.invert(pc.match_substring(pa.array([r["text"] for r in rows]), "\n"))).as_py()


def test_tars_on_shard_boundaries_are_read_once_each(tmp_path):
    make_mirror(tmp_path, rows={"gtsrb": 25}, datasets=["gtsrb"], tar_rows=5)  # tars of 5, like the hub's 10,000
    source = by_slug("gtsrb")
    units, _ = reader.plan_source(source, str(tmp_path), 5)
    spans = [(0, 5, 1), (5, 10, 1), (10, 15, 1), (15, 20, 1), (20, 25, 1)]
    assert [(u.lo, u.hi, len(u.pieces)) for u in units] == spans
    units, _ = reader.plan_source(source, str(tmp_path), 10)  # units never span tars: still one per tar
    assert [(u.lo, u.hi, len(u.pieces)) for u in units] == spans
    out = str(tmp_path / "out")
    builder = ShardBuilder({"gtsrb": class_table(source)}, out, "parquet")
    units, _ = reader.plan_source(source, str(tmp_path), 1)  # a unit per row of each tar, a shard per unit
    shards = [s["path"] for u in units for s in builder.build(u)["shards"]]
    assert shards == [f"gtsrb/{k:06d}.parquet" for k in range(25)]
