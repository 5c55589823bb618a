"""The build job end to end on the fixture mirror of all 23 sources, read back with pyarrow, `datasets`
and `webdataset`, locally and through a real S3 server."""

from __future__ import annotations

import glob
import hashlib
import io
import json
import os
import re
import subprocess
import sys
import tarfile

import datasets
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest
import webdataset as wds
from support.mirror import kept_rows

from mieb_ray import storage
from mieb_ray.captions import class_table, clean_caption
from mieb_ray.cli import main
from mieb_ray.demo_data.mirror import hub_names, make_mirror
from mieb_ray.errors import UserError
from mieb_ray.pipelines.build import BuildConfig, build
from mieb_ray.sources import PARQUET, WEBDATASET, by_slug

pytestmark = pytest.mark.timeout(600)
ROWS_PER_SHARD = 5


def source_rows(root: str, slug: str) -> dict[int, tuple[bytes, object, object]]:
    """index -> (image bytes, label, own text) straight from the mirror's files, without our readers."""
    source = by_slug(slug)
    out = {}
    if source.layout == PARQUET:
        files = sorted(glob.glob(f"{root}/{source.repo}/data/train-*.parquet"))
        table = pa.concat_tables(pq.read_table(f) for f in files)
        images = table[source.image_column].to_pylist()
        labels = table[source.label_column].to_pylist()
        texts = table["text"].to_pylist() if source.caption_column else [None] * len(labels)
        for i, (image, label, text) in enumerate(zip(images, labels, texts)):
            out[i] = (image["bytes"], label, text)
        return out
    for path in sorted(glob.glob(f"{root}/{source.repo}/train/*.tar")):
        with tarfile.open(path) as tar:
            members = {m.name: tar.extractfile(m).read() for m in tar.getmembers()}
        for name, data in members.items():
            key, ext = name.split(".", 1)
            if ext == source.image_ext:
                out[int(key[1:])] = (data, int(members[f"{key}.cls"]), None)
    return out


def caption_of(slug: str, label, own_text):
    source = by_slug(slug)
    table = class_table(source, hub_names(slug))
    if source.caption_column:
        label = table.source_names.index(label)
        own = clean_caption(own_text) if own_text is not None else ""
        return (own or table.text[label]), -1, table.class_name[label]
    return table.text[label], label, table.class_name[label]


@pytest.fixture(scope="module")
def parquet_build(ray_local, mirror, tmp_path_factory):
    root, written = mirror
    out = str(tmp_path_factory.mktemp("train-parquet"))
    manifest = build(BuildConfig(root, out, rows_per_shard=ROWS_PER_SHARD))
    return out, manifest


def test_parquet_build_of_all_23_sources(parquet_build, mirror):
    out, manifest = parquet_build
    root, written = mirror
    expected = kept_rows(written)
    assert manifest["counts"]["datasets"] == expected
    assert manifest["counts"]["total"] == sum(expected.values())
    assert manifest["counts"]["dropped"]["caltech101"] == written["caltech101"] - expected["caltech101"] >= 1

    table = pq.read_table(sorted(glob.glob(f"{out}/*/*.parquet")))
    assert table.num_rows == sum(expected.values())
    keys = table["key"].to_pylist()
    assert len(set(keys)) == len(keys)
    for slug in written:
        src = source_rows(root, slug)
        rows = table.filter(pc.equal(table["dataset_name"], slug)).to_pylist()
        kept = {i for i, (_, label, _) in src.items() if label not in by_slug(slug).drop}
        assert {int(r["key"].split("/")[1]) for r in rows} == kept, slug
        for r in rows:
            image, label, own = src[int(r["key"].split("/")[1])]
            assert r["image"]["bytes"] == image, r["key"]  # byte for byte, never re-encoded
            assert (r["text"], r["label"], r["class_name"]) == caption_of(slug, label, own), r["key"]
            assert "\n" not in r["text"] and "  " not in r["text"] and "_" not in r["text"]


def test_captions_in_the_output_carry_the_fixes(parquet_build):
    out, _ = parquet_build
    texts = set(pq.read_table(sorted(glob.glob(f"{out}/*/*.parquet")), columns=["text"])["text"].to_pylist())
    for caption in ["a photo of a crab.", "a photo of projectile.", "a photo of sunglass.", "mid-distance shapes.",
                    "a close up photo of a 'red and white triangle with bicycle warning' traffic sign.",
                    "a photo of an AM General Hummer SUV 2000.", "a photo of apply eye makeup",
                    "a photo of a utility room.", "a photo of apple pie, a type of food.",
                    "a photo of an Abyssinian, a type of pet.", "histopathology image of lymph node"]:
        assert caption in texts
    assert not any("background" in t for t in texts)


def test_shards_manifest_and_layout(parquet_build):
    out, manifest = parquet_build
    assert manifest["format"] == "mieb-train" and manifest["config"]["rows_per_shard"] == ROWS_PER_SHARD
    on_disk = sorted(os.path.relpath(p, out) for p in glob.glob(f"{out}/*/*.parquet"))
    assert on_disk == [s["path"] for s in manifest["shards"]]
    for shard in manifest["shards"]:
        path = os.path.join(out, shard["path"])
        assert re.fullmatch(r"[a-z0-9_]+/\d{6}\.parquet", shard["path"])
        assert hashlib.sha256(open(path, "rb").read()).hexdigest() == shard["sha256"]
        assert os.path.getsize(path) == shard["bytes"]
        t = pq.read_table(path)
        assert t.num_rows == shard["rows"]
        number = int(shard["path"].split("/")[1].split(".")[0])
        index = [int(k.split("/")[1]) for k in t["key"].to_pylist()]
        assert index == sorted(index) and len(index) <= ROWS_PER_SHARD
        if by_slug(shard["dataset"]).layout == "parquet":  # shard k holds rows [k*N, (k+1)*N); a tar's, of the tar
            assert all(i // ROWS_PER_SHARD == number for i in index)
        assert set(t["dataset_name"].to_pylist()) == {shard["dataset"]} == {shard["path"].split("/")[0]}
    assert not glob.glob(f"{out}/**/*.tmp", recursive=True) and not glob.glob(f"{out}/**/.*", recursive=True)
    assert not os.path.exists(os.path.join(out, "_progress"))  # resume records go once the manifest is written


def test_datasets_reads_the_parquet_output(parquet_build):
    out, manifest = parquet_build
    ds = datasets.load_dataset(out, "cifar100", split="train")
    assert ds.num_rows == manifest["counts"]["datasets"]["cifar100"]
    assert isinstance(ds.features["image"], datasets.Image)
    row = ds[0]
    assert row["image"].size == (32, 32) and row["text"] == "a photo of a crab."
    assert datasets.load_dataset(out, "all", split="train").num_rows == manifest["counts"]["total"]


def test_rebuild_refuses_then_overwrite_is_byte_identical(parquet_build, mirror):
    out, manifest = parquet_build
    root, _ = mirror
    with pytest.raises(UserError, match="already holds a complete build.*--overwrite"):
        build(BuildConfig(root, out, rows_per_shard=ROWS_PER_SHARD))
    again = build(BuildConfig(root, out, rows_per_shard=ROWS_PER_SHARD, overwrite=True))
    assert again == manifest  # same shards, same checksums: the build is reproducible


def test_webdataset_build_from_an_s3_mirror_to_s3(ray_local, s3, mirror, tmp_path):
    root, written = mirror
    slugs = ["imagenet1k", "cifar100", "gtsrb", "caltech101", "scimmir"]
    client = s3.client()
    for slug in slugs:  # upload those repos of the mirror as they are
        repo = os.path.join(root, by_slug(slug).repo)
        for path in glob.glob(f"{repo}/**/*", recursive=True):
            if os.path.isfile(path):
                client.upload_file(path, s3.bucket, "mirror/" + os.path.relpath(path, root))
    out = f"s3://{s3.bucket}/train-wds"
    manifest = build(BuildConfig(f"s3://{s3.bucket}/mirror", out, datasets=slugs, fmt="webdataset", rows_per_shard=8))
    assert manifest["counts"]["datasets"] == {s: n for s, n in kept_rows(written).items() if s in slugs}
    assert client.list_objects_v2(Bucket=s3.bucket, Prefix="train-wds/_progress")["KeyCount"] == 0

    local = tmp_path / "wds"
    pafs.copy_files(f"{s3.bucket}/train-wds", str(local), source_filesystem=storage.filesystem(out)[0])
    assert json.loads((local / "_manifest.json").read_text()) == manifest
    for slug in slugs:
        source = by_slug(slug)
        tars = sorted(glob.glob(f"{local}/{slug}/*.tar"))
        assert [os.path.relpath(t, local) for t in tars] == [s["path"] for s in manifest["shards"]
                                                                if s["dataset"] == slug]
        src = source_rows(root, slug)
        samples = list(wds.WebDataset([str(t) for t in tars], shardshuffle=False))
        assert len(samples) == manifest["counts"]["datasets"][slug]
        for sample in samples:
            assert set(sample) == {"__key__", "__url__", "__local_path__", "cls", "json", "txt",
                                   source.image_ext} - ({"__local_path__"} - set(sample))
            assert "." not in sample["__key__"]
            image, label, own = src[int(sample["__key__"].split("/")[1])]
            assert sample[source.image_ext] == image
            text, out_label, class_name = caption_of(slug, label, own)
            assert sample["txt"].decode() == text and int(sample["cls"]) == out_label
            assert json.loads(sample["json"])["class_name"] == class_name
        # HF's WebDataset builder: one image extension per shard set, every field in every sample
        ds = datasets.load_dataset("webdataset", data_files=[str(t) for t in tars], split="train")
        assert ds.num_rows == len(samples) and set(ds.column_names) >= {"cls", "txt", source.image_ext}


def _built_rows(out) -> list[tuple]:
    table = pq.read_table(sorted(glob.glob(f"{out}/*/*.parquet")))
    return sorted((r["key"], r["text"], r["label"], r["class_name"], r["dataset_name"], r["image"]["bytes"])
                  for r in table.to_pylist())


def test_either_layout_builds_the_same_rows(ray_local, tmp_path, capsys):
    """A tar source read from parquet and parquet sources read from tars (SciMMIR with its own captions): the
    layout is what the repo holds, and the rows are the same whichever it is (keys, text, labels, image bytes)."""
    slugs = ["gtsrb", "cifar100", "scimmir", "caltech101"]
    rows = {"gtsrb": 13, "cifar100": 11, "scimmir": 12, "caltech101": 7}
    built = []
    for name, layouts in [("catalog", None), ("flipped", {"gtsrb": PARQUET, "cifar100": WEBDATASET,
                                                          "scimmir": WEBDATASET})]:
        make_mirror(tmp_path / name, rows=rows, datasets=slugs, layouts=layouts)
        manifest = build(BuildConfig(str(tmp_path / name), str(tmp_path / f"out-{name}"), datasets=slugs,
                                     rows_per_shard=ROWS_PER_SHARD))
        built.append((manifest["counts"], _built_rows(tmp_path / f"out-{name}")))
        printed = capsys.readouterr().out
        assert ("layout changed: expected parquet, found webdataset" in printed) == bool(layouts)
    assert built[0] == built[1]
    counts, table = built[0]
    assert counts["datasets"] == kept_rows(rows) and len(table) == sum(kept_rows(rows).values())
    assert {k.split("/")[0] for k, *_ in table} == set(slugs)


def test_cli_errors_are_one_line(ray_local, mirror, tmp_path, capsys):
    root, _ = mirror
    assert main(["build", "--sources", root, "--out", str(tmp_path / "a"), "--datasets", "cifar10,cifar11"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "unknown dataset 'cifar11'; valid: ucf101, imagenet1k" in err

    (tmp_path / "empty").mkdir()
    assert main(["build", "--sources", str(tmp_path / "empty"), "--out", str(tmp_path / "b"),
                 "--datasets", "dtd"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "dtd: no files under" in err

    assert main(["build", "--sources", root, "--out", str(tmp_path / "c"), "--datasets", "dtd",
                 "--check-counts"]) == 1
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("mieb-ray: error: row count mismatch: dtd: 12 rows, expected 3,760")
    assert not os.path.exists(tmp_path / "c" / "_manifest.json")  # a failed build is not complete


def test_unreadable_tar_fails_naming_the_file(ray_local, mirror, tmp_path, capsys):
    """A shard that breaks while an actor reads it: the CLI still prints one line naming the file."""
    root, _ = mirror
    bad = tmp_path / "mirror"
    repo = by_slug("fer2013").repo
    pafs.copy_files(os.path.join(root, repo), str(bad / repo))
    tar = bad / repo / "train" / "1.tar"
    tar.write_bytes(tar.read_bytes()[:700])  # the first header survives planning, the rest is cut
    assert main(["build", "--sources", str(bad), "--out", str(tmp_path / "out"), "--datasets", "fer2013"]) == 1
    err = capsys.readouterr().err.strip().splitlines()[-1]  # Ray's own INFO lines come before it
    assert err.startswith("mieb-ray: error: unreadable tar file") and "1.tar" in err


def test_error_rows_are_counted_and_the_rate_is_enforced(ray_local, tmp_path):
    root = str(tmp_path / "mirror")
    make_mirror(root, datasets=["gtsrb"], rows={"gtsrb": 20})
    tar = sorted(glob.glob(f"{root}/mteb/wds_gtsrb/train/*.tar"))[1]
    with tarfile.open(tar) as t:
        members = [(m, t.extractfile(m).read()) for m in t.getmembers()]
    with tarfile.open(tar, "w") as t:  # one label outside the 43 classes, one that is not a number
        for i, (m, data) in enumerate(members):
            if m.name.endswith(".cls") and i in (0, 2):
                data = b"43" if i == 0 else b"stop"
                m.size = len(data)
            t.addfile(m, io.BytesIO(data))

    with pytest.raises(UserError, match=r"^2 of 20 rows could not be built \(gtsrb: 2\), more than --max-error-rate 0"):
        build(BuildConfig(root, str(tmp_path / "strict"), datasets=["gtsrb"], max_error_rate=0))
    assert not os.path.exists(tmp_path / "strict" / "_manifest.json")

    manifest = build(BuildConfig(root, str(tmp_path / "lenient"), datasets=["gtsrb"], max_error_rate=0.2))
    assert manifest["counts"]["datasets"] == {"gtsrb": 18} and manifest["counts"]["errors"] == {"gtsrb": 2}
    errors = pq.read_table([os.path.join(tmp_path, "lenient", f) for f in manifest["error_files"]]).to_pylist()
    assert sorted(e["key"] for e in errors) == ["gtsrb/10", "gtsrb/11"]
    assert {e["error"] for e in errors} == {"label 43 outside the 43 classes", "label missing or not in the class list"}


def test_address_goes_before_or_after_the_command(tmp_path):
    from mieb_ray.cli import parser

    p = parser()
    flags = ["--sources", str(tmp_path), "--out", str(tmp_path / "y")]
    assert p.parse_args(["build", *flags, "--address", "auto"]).address == "auto"  # as the README writes it
    assert p.parse_args(["--address", "auto", "build", *flags]).address == "auto"
    assert p.parse_args(["build", *flags]).address is None
    assert p.parse_args(["audit", "--train", str(tmp_path), "--against", "mieb", "--out", "o", "--address",
                         "auto"]).address == "auto"
    assert p.parse_args(["build", *flags, "--verbose"]).verbose and p.parse_args(["--verbose", "build", *flags]).verbose
    assert not p.parse_args(["build", *flags]).verbose


@pytest.mark.timeout(120)
def test_an_unreachable_hub_is_one_line(ray_local, tmp_path):
    """No network: the hub client's ConnectError (not an OSError) is a one-line error, not a traceback."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_HUB_OFFLINE")}
    env["HF_ENDPOINT"] = "http://127.0.0.1:9"  # nothing listens there
    address = ray_local.get_runtime_context().gcs_address
    done = subprocess.run([sys.executable, "-m", "mieb_ray", "build", "--sources", "hf", "--out", str(tmp_path / "o"),
                           "--datasets", "cifar10", "--address", address], env=env, capture_output=True, text=True,
                          timeout=100)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert done.stderr.strip().splitlines()[-1].startswith("mieb-ray: error: cannot list hf://datasets/mteb/cifar10@")
