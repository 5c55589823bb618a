"""Other people's tables as embed and audit inputs: every Parquet or tar variant is read into the rows it holds or
stops with one line naming what is wrong, never a traceback.

The reads are the jobs' own (reader.input_files, check_columns, the planner's row counts and tar index,
reader.read for every unit), without Ray: a worker's UserError reaches the user as the same one line.
"""

from __future__ import annotations

import io
import json
import tarfile

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from mieb_ray.errors import UserError
from mieb_ray.io import parquet as parquet_format
from mieb_ray.io import reader
from mieb_ray.io import tar as tar_format

KEYS = [f"k{i}" for i in range(5)]
IMAGES = [bytes([i]) * (10 + i) for i in range(5)]  # opaque bytes: decoding is the encoder's business
IMAGE = pa.struct([("bytes", pa.binary()), ("path", pa.string())])


def read(root: str, rows_per_unit: int = 2, key: str = "key", data: str = "image") -> dict[str, bytes | None]:
    """What the embed job reads of `root`, key -> image bytes, in order."""
    fmt, files = reader.input_files(root)
    columns = reader.TableColumns(key, data).read_as("image")
    reader.check_columns(fmt, files[0], columns)
    reader.read_parquet_layouts(files)
    offsets = {}
    for f in files:
        if f.uri.endswith(".tar"):
            f.rows, offsets[f.uri] = tar_format.index_tar(f.uri, rows_per_unit)
    out = {}
    for unit in reader.plan_table(files, rows_per_unit, offsets):
        for chunk in reader.read(unit, columns):
            out.update(zip(chunk[key].to_pylist(), parquet_format.image_bytes(chunk[data]).to_pylist()))
    return out


def parquet(path, **columns) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table(columns), path, row_group_size=2)


def tar(path, samples: list[dict[str, bytes]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w") as t:
        for sample in samples:
            for name, data in sample.items():
                info = tarfile.TarInfo(name)
                info.size = len(data)
                t.addfile(info, io.BytesIO(data))


CLEAN = dict(zip(KEYS, IMAGES))
structs = pa.array([{"bytes": b, "path": f"{k}.jpg"} for k, b in zip(KEYS, IMAGES)], IMAGE)


def _parquet_cases():
    """(name, writer of the input under a folder, what it reads: CLEAN, another dict, or the error's words)."""
    return [
        ("struct images", lambda d: parquet(d / "a.parquet", key=KEYS, image=structs), CLEAN),
        ("binary images", lambda d: parquet(d / "a.parquet", key=KEYS, image=pa.array(IMAGES, pa.binary())), CLEAN),
        ("large_binary images", lambda d: parquet(d / "a.parquet", key=pa.array(KEYS, pa.large_string()),
                                                  image=pa.array(IMAGES, pa.large_binary())), CLEAN),
        ("extra columns", lambda d: parquet(d / "a.parquet", key=KEYS, image=structs, other=list(range(5))), CLEAN),
        ("two files", lambda d: (parquet(d / "a.parquet", key=KEYS[:3], image=IMAGES[:3]),
                                 parquet(d / "b.parquet", key=KEYS[3:], image=IMAGES[3:])), CLEAN),
        ("a null image", lambda d: parquet(d / "a.parquet", key=KEYS, image=[None, *IMAGES[1:]]),
         {**CLEAN, "k0": None}),
        ("no rows", lambda d: parquet(d / "a.parquet", key=pa.array([], pa.string()),
                                      image=pa.array([], pa.binary())), {}),
        ("no key column", lambda d: parquet(d / "a.parquet", id=KEYS, image=IMAGES), "has no column key"),
        ("no image column", lambda d: parquet(d / "a.parquet", key=KEYS, picture=IMAGES), "has no column image"),
        ("not parquet", lambda d: (d.mkdir(), (d / "a.parquet").write_bytes(b"PAR1 not really" * 10)), "a.parquet"),
        ("truncated parquet", lambda d: (parquet(d / "a.parquet", key=KEYS, image=structs),
                                         (d / "a.parquet").write_bytes((d / "a.parquet").read_bytes()[:-40])),
         "a.parquet"),
        ("an empty file", lambda d: (d.mkdir(), (d / "a.parquet").write_bytes(b"")), "a.parquet"),
        ("parquet and tars", lambda d: (parquet(d / "a.parquet", key=KEYS, image=IMAGES),
                                        tar(d / "b.tar", [{"k0.jpg": IMAGES[0]}])), "mixes .parquet and .tar"),
        ("a foreign manifest", lambda d: (parquet(d / "a.parquet", key=KEYS, image=IMAGES),
                                          (d / "_manifest.json").write_text('{"format": "mieb-train"}')), CLEAN),
        ("a manifest that is not JSON", lambda d: (parquet(d / "a.parquet", key=KEYS, image=IMAGES),
                                                   (d / "_manifest.json").write_text("{")), CLEAN),
    ]


def _tar_cases():
    good = [{f"{k}.jpg": b, f"{k}.txt": b"a caption"} for k, b in zip(KEYS, IMAGES)]
    return [
        ("jpg members", lambda d: tar(d / "a.tar", good), CLEAN),
        ("png and webp members", lambda d: tar(d / "a.tar", [{f"{k}.{'png' if i % 2 else 'webp'}": b}
                                                            for i, (k, b) in enumerate(CLEAN.items())]), CLEAN),
        ("a json member", lambda d: tar(d / "a.tar", [{**s, f"{k}.json": b'{"label": 1}'}
                                                     for s, k in zip(good, KEYS)]), CLEAN),
        ("a json member that is not JSON", lambda d: tar(d / "a.tar", [{**s, f"{k}.json": b"{"}
                                                                      for s, k in zip(good, KEYS)]), "json"),
        ("a sample without its image", lambda d: tar(d / "a.tar", [*good[:2], {"k2.txt": b"only text"}, *good[3:]]),
         {**CLEAN, "k2": None}),
        ("not a tar", lambda d: (d.mkdir(), (d / "a.tar").write_bytes(b"not a tar file " * 100)), "a.tar"),
        ("truncated tar", lambda d: (tar(d / "a.tar", good),
                                     (d / "a.tar").write_bytes((d / "a.tar").read_bytes()[:700])), "a.tar"),
        ("an empty tar file", lambda d: (d.mkdir(), (d / "a.tar").write_bytes(b"")), "a.tar"),
    ]


@pytest.mark.parametrize("name, write, expected", _parquet_cases() + _tar_cases(),
                         ids=[c[0] for c in _parquet_cases() + _tar_cases()])
def test_a_foreign_table_reads_its_rows_or_fails_in_one_line(tmp_path, name, write, expected):
    root = tmp_path / "in"
    write(root)
    if isinstance(expected, str):
        with pytest.raises(UserError) as caught:
            read(str(root))
        message = str(caught.value)
        assert expected in message and "\n" not in message, message
    else:
        assert read(str(root)) == expected


def test_a_manifest_of_another_tool_is_not_trusted(tmp_path):
    """A `mieb-train` manifest without the fields a build writes: the folder's files are read instead."""
    root = tmp_path / "in"
    parquet(root / "a.parquet", key=KEYS, image=IMAGES)
    (root / "_manifest.json").write_text(json.dumps({"format": "mieb-train", "config": "x", "shards": "a.parquet"}))
    assert read(str(root)) == CLEAN


@pytest.mark.parametrize("mark", ["_manifest.json", "_lease.json", "_progress/unit.json"])
def test_an_output_of_ours_inside_an_input_folder_is_refused_not_read_as_rows(tmp_path, mark):
    """An audit or build written inside the table's folder (an --out inside the --input, done or running): its
    Parquet files were read as rows of the table (an audit's duplicates.parquet: "has no column image"; a build's
    shards: every row twice)."""
    root = tmp_path / "in"
    parquet(root / "a.parquet", key=KEYS, image=IMAGES)
    parquet(root / "sub" / "audit" / "duplicates.parquet", key=KEYS, image=IMAGES)
    (root / "sub" / "audit" / mark).parent.mkdir(parents=True, exist_ok=True)
    (root / "sub" / "audit" / mark).write_text("{}")
    with pytest.raises(UserError, match=rf"^{root}/sub/audit inside the input {root} is an output of mieb-ray \(it "
                                        rf"holds {mark.split('/')[0]}\), not part of the table: point --input at the "
                                        r"table's own files, and --out outside them$"):
        reader.input_files(str(root))
    (root / "sub" / "audit" / mark).unlink()  # a folder of tables, no output: read as such
    assert [f.rel for f in reader.input_files(str(root))[1]] == ["a.parquet", "sub/audit/duplicates.parquet"]


@pytest.mark.parametrize(("groups", "cuts"), [
    ([1000] * 5, [1000, 2000, 3000, 4000, 5000]),
    ([300] * 7 + [90], [1500, 2190]),
    ([4000, 10, 10], [1333, 2666, 4000, 4020]),
])
def test_each_row_group_is_read_once_however_the_units_fall(tmp_path, monkeypatch, groups, cuts):
    """pyarrow reads whole row groups: a unit that began inside one (units of 1,783 rows, a 224 px model's, over
    mieb-train's groups of 1,000) read it again beside the unit before. Units end at the groups, at most
    rows_per_unit rows each; a group bigger than that is cut in even pieces, each of which reads it all."""
    keys = [f"k{i}" for i in range(sum(groups))]
    writer = pq.ParquetWriter(tmp_path / "t.parquet", pa.schema([("key", pa.string()), ("image", pa.binary())]))
    at = 0
    for n in groups:
        writer.write_table(pa.table({"key": keys[at:at + n], "image": [b"x"] * n}))
        at += n
    writer.close()
    read_groups = []
    real = pq.ParquetFile.read_row_groups
    monkeypatch.setattr(pq.ParquetFile, "read_row_groups",
                        lambda self, batch, **kw: read_groups.extend(batch) or real(self, batch, **kw))
    _, files = reader.input_files(str(tmp_path / "t.parquet"))
    reader.read_parquet_layouts(files)
    assert [u.hi for u in reader.plan_table(files, 1783)] == cuts
    assert list(read(str(tmp_path / "t.parquet"), 1783)) == keys  # every row, once, in order
    pieces = {i: -(-n // 1783) for i, n in enumerate(groups)}  # a group of more than 1,783 rows: the fewest pieces
    assert sorted(read_groups) == [i for i in range(len(groups)) for _ in range(pieces[i])]


def test_a_table_of_image_files_reads_their_bytes(tmp_path):
    """`datasets`' to_parquet keeps an Image column of local files by path (bytes null), as does a column of paths:
    the reader takes each file's bytes as `datasets` decodes it, an absolute path as it is and a relative one from
    the table's folder (they were all "missing image"). A file that is not there stays missing."""
    import datasets

    files = {key: tmp_path / "pictures" / f"{key}.jpg" for key in KEYS[:3]}
    for (key, path), data in zip(files.items(), IMAGES):
        path.parent.mkdir(exist_ok=True)
        path.write_bytes(data)
    (tmp_path / "hf").mkdir()
    datasets.Dataset.from_dict({"key": list(files), "image": [str(p) for p in files.values()]}) \
        .cast_column("image", datasets.Image()).to_parquet(str(tmp_path / "hf" / "t.parquet"))
    assert all(r["bytes"] is None for r in pq.read_table(tmp_path / "hf" / "t.parquet")["image"].to_pylist())
    assert read(str(tmp_path / "hf")) == dict(zip(KEYS[:3], IMAGES[:3]))
    parquet(tmp_path / "pictures" / "t.parquet", key=KEYS[:4], image=[f"{k}.jpg" for k in KEYS[:4]])  # k3.jpg: none
    assert read(str(tmp_path / "pictures" / "t.parquet")) == {**dict(zip(KEYS[:3], IMAGES[:3])), KEYS[3]: None}
    # the other way `datasets` writes a dataset to disk is not a table this reads: said so
    datasets.load_dataset("parquet", data_files=str(tmp_path / "hf" / "t.parquet"), split="train",
                          cache_dir=str(tmp_path / "cache")).save_to_disk(str(tmp_path / "saved"))
    with pytest.raises(UserError, match=r"^no \.parquet or \.tar files under .*saved \(it is a `datasets` "
                                        r"save_to_disk folder: write the dataset with Dataset\.to_parquet to read "
                                        r"it\)$"):
        read(str(tmp_path / "saved"))
