"""check-sources: one row per source from file metadata, never a crash; the build runs its cheap part first."""

from __future__ import annotations

import glob
import io
import os
import shutil
import tarfile

import pyarrow.parquet as pq
import pytest

from mieb_ray.cli import main
from mieb_ray.demo_data.mirror import make_mirror
from mieb_ray.errors import UserError
from mieb_ray.io import tar
from mieb_ray.pipelines import preflight
from mieb_ray.pipelines.build import BuildConfig, build
from mieb_ray.sources import PARQUET, WEBDATASET, by_slug, select

pytestmark = pytest.mark.timeout(300)
SLUGS = ["gtsrb", "cifar100", "scimmir", "caltech101"]  # tars, parquet, row captions, a dropped class
FLIPPED = {"gtsrb": PARQUET, "cifar100": WEBDATASET, "scimmir": WEBDATASET}


@pytest.fixture(scope="module")
def mirrors(tmp_path_factory):
    """The same rows twice: in the catalog's layouts, and with three sources in the other layout."""
    rows = {"gtsrb": 25, "cifar100": 17, "scimmir": 12, "caltech101": 9}
    same, other = (str(tmp_path_factory.mktemp(n)) for n in ("same", "other"))
    make_mirror(same, rows=rows, datasets=SLUGS, files=3)
    make_mirror(other, rows=rows, datasets=SLUGS, files=3, layouts=FLIPPED)
    return same, other, rows


def by_slug_rows(rows):
    return {r.slug: r for r in rows}


def test_a_good_mirror_is_all_ok_with_exact_rows(mirrors):
    same, _, written = mirrors
    rows = by_slug_rows(preflight.check_sources(select(SLUGS), same, expected=written))
    assert {s: (r.status, r.layout, r.files, r.rows) for s, r in rows.items()} == {
        "gtsrb": ("OK", WEBDATASET, 3, 25), "cifar100": ("OK", PARQUET, 3, 17), "scimmir": ("OK", PARQUET, 3, 12),
        "caltech101": ("OK", PARQUET, 3, 9)}
    assert rows["gtsrb"].reason == "rows by keys" and rows["cifar100"].reason == ""


def test_a_changed_layout_is_a_warning_and_counts_the_same(mirrors):
    _, other, written = mirrors
    rows = by_slug_rows(preflight.check_sources(select(SLUGS), other, expected=written))
    assert {s: (r.status, r.layout, r.rows) for s, r in rows.items()} == {
        "gtsrb": ("WARN", PARQUET, 25), "cifar100": ("WARN", WEBDATASET, 17), "scimmir": ("WARN", WEBDATASET, 12),
        "caltech101": ("OK", PARQUET, 9)}
    assert rows["cifar100"].warnings == ["layout changed: expected parquet, found webdataset"]
    assert rows["gtsrb"].warnings == ["layout changed: expected webdataset, found parquet"]
    table = preflight.render(list(rows.values()))
    assert "layout changed: expected parquet, found webdataset" in table and table.endswith("3 WARN, 0 FAIL")


def test_the_catalogs_counts_and_the_cli_table(mirrors, capsys):
    same, _, _ = mirrors
    assert main(["check-sources", "--sources", same, "--datasets", "gtsrb,cifar100"]) == 1
    out, err = capsys.readouterr()
    assert err.strip() == "mieb-ray: error: 2 sources have other row counts than the catalog's: a mirror of " \
                          "samples? --no-check-counts checks everything else"
    lines = out.strip().splitlines()
    assert lines[0].split()[:3] == ["source", "repo", "layout"] and len(lines) == 5
    assert "17 / 50,000  FAIL" in lines[2] and "25 / 26,640  FAIL" in lines[3]  # catalog order
    assert main(["check-sources", "--sources", same, "--datasets", "gtsrb,cifar100", "--no-check-counts"]) == 0
    assert "2 sources: 2 OK, 0 WARN, 0 FAIL" in capsys.readouterr().out
    # the eval split, and caltech101's train split: 3,060 rows on the hub, 30 of them dropped by the build
    assert preflight.split_rows(by_slug("caltech101"), "train") == 3_060
    row = preflight.check_source(by_slug("gtsrb"), same, split="eval", expected=3)
    assert (row.status, row.rows, row.files) == ("OK", 3, 1)


def test_a_mirror_of_samples_ends_by_naming_no_check_counts(mirror, capsys):
    """Every source of the fixture mirror holds fewer rows than the hub: the table, then one line that says so
    and names the flag that checks the rest; with it, all pass."""
    root, written = mirror
    n = len(written)
    assert main(["check-sources", "--sources", root]) == 1
    out, err = capsys.readouterr()
    assert out.strip().splitlines()[-1] == f"{n} sources: 0 OK, 0 WARN, {n} FAIL"
    assert err.strip().splitlines() == [f"mieb-ray: error: {n} sources have other row counts than the catalog's: a "
                                        "mirror of samples? --no-check-counts checks everything else"]
    assert "Traceback" not in out + err
    assert main(["check-sources", "--sources", root, "--no-check-counts"]) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1] == f"{n} sources: {n} OK, 0 WARN, 0 FAIL"


def test_other_failures_come_first_and_the_counts_are_still_named(mirrors, tmp_path, capsys):
    same, _, _ = mirrors
    root = _copy(same, tmp_path, "cifar100")  # gtsrb is missing; cifar100 holds 17 rows of 50,000
    assert main(["check-sources", "--sources", root, "--datasets", "gtsrb,cifar100"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("mieb-ray: error: gtsrb: no files under ")
    assert err[0].endswith("(and 1 more sources failed, see the table); 1 source has other row counts than the "
                           "catalog's (--no-check-counts skips that check)")
    more = preflight.check_sources(select(["gtsrb"]), same, expected={"gtsrb": 3})  # 25 rows: not a sample
    assert preflight.error(more) == "1 source has other row counts than the catalog's: --no-check-counts checks " \
                                    "everything else"


def _copy(src: str, dst, slug: str) -> str:
    import shutil

    shutil.copytree(os.path.join(src, by_slug(slug).repo), os.path.join(dst, by_slug(slug).repo))
    return str(dst)


def test_each_failure_is_a_row_with_its_reason(mirrors, tmp_path):
    same, _, written = mirrors
    root = str(tmp_path)
    for slug in SLUGS:
        _copy(same, tmp_path, slug)
    cifar = sorted(glob.glob(f"{root}/mteb/cifar100/data/train-*.parquet"))
    table = pq.read_table(cifar[1])
    pq.write_table(table.rename_columns(["image" if c == "img" else c for c in table.column_names]), cifar[1])
    with open(sorted(glob.glob(f"{root}/mteb/Caltech101/data/train-*.parquet"))[0], "r+b") as f:
        f.truncate(100)
    names = tmp_path / "mteb/wds_gtsrb/classnames.txt"
    names.write_text("".join(names.read_text().splitlines(keepends=True)[:-1]))  # 42 names for 43 classes
    shutil.rmtree(tmp_path / "mteb/SciMMIR")  # scimmir: a repo of tars without labels (no card: split folders)
    for split in ("train", "test"):
        (tmp_path / "mteb/SciMMIR" / split).mkdir(parents=True)
        with tarfile.open(tmp_path / "mteb/SciMMIR" / split / "0.tar", "w") as t:
            info = tarfile.TarInfo("s0000000.png")
            info.size = 3
            t.addfile(info, io.BytesIO(b"png"))
    rows = by_slug_rows(preflight.check_sources(select(SLUGS + ["dtd"]), root, expected=written))
    assert {s: r.status for s, r in rows.items()} == dict.fromkeys(SLUGS + ["dtd"], "FAIL")
    assert rows["cifar100"].fails == ["train-00001-of-00003.parquet has no column img (columns: image, fine_label, "
                                      "coarse_label)"]
    assert rows["caltech101"].fails[0].startswith("unreadable parquet file ")
    assert rows["gtsrb"].fails == ["42 class names in the source, 43 in the catalog"]
    assert rows["scimmir"].fails == ["first sample s0000000 has no label member (cls, class; members: png)"]
    assert rows["scimmir"].warnings == ["layout changed: expected parquet, found webdataset"]
    assert rows["dtd"].fails[0].startswith("no files under ")
    assert rows["dtd"].layout is None and "- / 3,760" in preflight.render([rows["dtd"]])


def test_hub_class_names_out_of_order_warn_and_a_moved_rename_fails(mirrors, tmp_path):
    same, _, written = mirrors
    root = _copy(same, tmp_path, "cifar100")
    path = sorted(glob.glob(f"{root}/mteb/cifar100/data/train-*.parquet"))[0]
    table = pq.read_table(path)
    meta = table.schema.metadata[b"huggingface"].replace(b'"apple", "aquarium_fish"', b'"aquarium_fish", "apple"')
    pq.write_table(table.replace_schema_metadata({b"huggingface": meta}), path)
    row = preflight.check_source(by_slug("cifar100"), root, expected=None)
    assert row.status == "WARN" and row.warnings == [
        "class name 0 is 'aquarium_fish' in the source, 'apple' in the catalog"]
    meta = meta.replace(b'"cra"', b'"crab"')  # the catalog's rename of label 26 no longer lines up
    pq.write_table(table.replace_schema_metadata({b"huggingface": meta}), path)
    row = preflight.check_source(by_slug("cifar100"), root, expected=None)
    assert row.status == "FAIL" and row.fails == ["renames expects label 26 to be 'cra' but the source has 'crab'"]


def test_the_last_member_is_found_from_the_tail(tmp_path):
    path = tmp_path / "t.tar"
    with tarfile.open(path, "w") as t:
        for name, size in [("s0000000.cls", 1), ("s0000000.jpg", 10), ("s0000001.cls", 1), ("s0000001.jpg", 3 << 20)]:
            info = tarfile.TarInfo(name)
            info.size = size
            t.addfile(info, io.BytesIO(b"\0" * size))
    assert tar.last_member(str(path)) == "s0000001.jpg"  # 3 MB past the 1 MB first look
    assert tar.last_member(str(path), max_tail=1 << 20) is None
    assert tar.first_sample(str(path)) == {"__key__": "s0000000", "cls": b"\0", "jpg": b"\0" * 10}


def test_the_build_checks_the_sources_before_anything(mirrors, tmp_path, capsys):
    """No Ray needed: the build stops in the check, prints the table and writes nothing."""
    same, _, _ = mirrors
    out = tmp_path / "out"
    with pytest.raises(UserError, match=r"^food101: no files under .*"
                                        r"\(and 1 more sources failed, see the table\)$"):
        build(BuildConfig(same, str(out), datasets="gtsrb,dtd,food101"))
    printed = capsys.readouterr().out
    assert "food101" in printed and "gtsrb" in printed and "3 sources: 1 OK, 0 WARN, 2 FAIL" in printed
    assert not out.exists()


def test_the_hub_path_through_a_faulty_fake_hub(mirrors, tmp_path, monkeypatch):
    """`--sources hf` reads the same metadata as the mirror it serves, retries and all (tail reads included).
    Every 5th request fails: at every 3rd, with hundreds of requests, some read fails its 6 tries by chance."""
    from support import fakehub

    from mieb_ray import hubfs, storage

    same, _, written = mirrors
    config = fakehub.write_config(str(tmp_path / "fakehub.json"), root=same, every=5, log=str(tmp_path / "log"))
    monkeypatch.setenv(hubfs.ENV_FS, fakehub.FACTORY)
    monkeypatch.setenv(fakehub.ENV_CONFIG, config)
    monkeypatch.setenv(hubfs.ENV_RETRY_WAIT, "0.01")
    storage.reset_clients()
    try:
        hub = preflight.check_sources(select(SLUGS), "hf", expected=written)
    finally:
        storage.reset_clients()
    local = preflight.check_sources(select(SLUGS), same, expected=written)
    assert [(r.slug, r.status, r.layout, r.files, r.rows, r.reason) for r in hub] == \
        [(r.slug, r.status, r.layout, r.files, r.rows, r.reason) for r in local]
    assert os.path.getsize(tmp_path / "log") > 0  # faults were injected
