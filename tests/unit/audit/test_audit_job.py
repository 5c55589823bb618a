"""The audit job (mieb_ray/audit/job.py and its phases): planted duplicates found by the detector each change
allows, nothing else flagged by the hashes, near pairs equal to a brute-force search of the same embeddings, the
MIEB eval splits as the eval side, a clean build with --exclude, resume, one-line errors for bad input, and a table
against itself. The hashes and their joins alone: test_fingerprints.py, test_matches.py, test_hamming.py."""

from __future__ import annotations

import hashlib
import io
import json
import os

import numpy as np
import pyarrow.parquet as pq
import pytest
from PIL import Image
from support.biovita import describe
from support.numerics import assert_top_pairs_close
from support.pictures import encode, jpeg
from support.planted import EVAL_TASKS, PLANTS, make_planted, tiles

from mieb_ray import storage
from mieb_ray.audit.job import NEAR_K, AuditConfig, audit
from mieb_ray.cli import main
from mieb_ray.demo_data.biovita import make_biovita_mirror
from mieb_ray.demo_data.mirror import make_mirror
from mieb_ray.evals import registry
from mieb_ray.io import embeddings
from mieb_ray.pipelines.build import BuildConfig, build

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    return make_planted(str(tmp_path_factory.mktemp("planted")))


def _pairs(out: str) -> set[tuple]:
    rows = pq.read_table(os.path.join(out, "contamination.parquet")).to_pylist()
    return {(r["train_key"], r["eval_task"], r["eval_key"], r["method"]) for r in rows}


def test_hash_detectors_find_what_they_must_and_nothing_else(ray_local, planted, tmp_path, capsys):
    out = str(tmp_path / "audit")
    assert main(["audit", "--train", planted["train"], "--against", ",".join(planted["against"]),
                 "--out", out]) == 0
    want = {(t, task, e, m) for t, task, e, kind in planted["planted"] for m in PLANTS[kind] if m != "near"}
    assert _pairs(out) == want  # distinct images are never flagged by a hash
    printed, err = capsys.readouterr()
    count = {m: sum(p[3] == m for p in want) for m in ("exact", "pixels", "pdq")}
    assert (f"[audit] pairs: {count['exact']} exact, {count['pixels']} pixels, {count['pdq']} pdq, near not run"
            in printed.splitlines())
    ours = [line for line in printed.splitlines() if line.startswith("[audit]")]
    assert not [line for line in ours if "{" in line] and "Traceback" not in err  # readable, not a Python dict
    errors = pq.read_table(os.path.join(out, "errors.parquet")).to_pylist()
    assert errors == [{"side": "train", "key": planted["undecodable"], "error": errors[0]["error"]}]
    assert errors[0]["error"].startswith("undecodable image")

    summary = json.loads(open(os.path.join(out, "summary.json")).read())
    first = summary["eval_tasks"][EVAL_TASKS[0]]
    eval_rows = pq.read_metadata(os.path.join(planted["against"][0], "000000.parquet")).num_rows
    assert first["eval_rows"] == eval_rows
    assert first["exact"]["eval_images"] == 1 and first["pixels"]["eval_images"] == 2
    # every plant of the first task, crops off a side and a corner and the 64-px downscale among them
    assert first["pdq"]["eval_images"] == first["any"]["eval_images"] == len(PLANTS)
    assert first["any"]["percent"] == pytest.approx(100 * len(PLANTS) / eval_rows, abs=1e-4)
    assert summary["totals"]["train_rows_flagged"] == len(PLANTS) + 1 and summary["threshold"] is None
    assert set(summary["train_datasets"]) == {"cifar100", "food101"}
    page = open(os.path.join(out, "report.html")).read()
    assert "data:image/jpeg;base64," in page and "cifar100/test/0" in page and "a threshold, not a proof" in page
    # near did not run: a dash in its header, in every table row and for its section, never "0 (0.00%)"
    assert "<span>near pairs <b>\u2014</b></span>" in page and "near pairs <b>0" not in page
    rows = len(summary["eval_tasks"]) + len(summary["train_datasets"])
    assert page.count("<td>\u2014</td>") == page.count("<tr><td>") == rows  # one dash per table row
    assert "near: nearest train images by embedding cosine at or above the threshold (\u2014)</h2><p>not run" in page
    manifest = storage.read_manifest(out)
    assert manifest["format"] == "mieb-audit" and manifest["counts"]["errors"] == 1
    assert not os.path.exists(os.path.join(out, "_hashes")) and not os.path.exists(os.path.join(out, "_progress"))
    capsys.readouterr()
    assert main(["audit", "--train", planted["train"], "--against", planted["against"][0], "--out", out]) == 1
    assert "already holds a complete audit" in capsys.readouterr().err


def test_near_pairs_equal_a_brute_force_search_of_the_same_embeddings(ray_local, planted, tiny_clip, tmp_path):
    """The tiny model is random: its cosines say nothing about duplicates, but the engine must return the pairs
    a brute-force search of its embeddings gives (to float32 rounding, either way only where that close)."""
    out, threshold, printed = str(tmp_path / "audit"), 0.97, []
    manifest = audit(AuditConfig(planted["train"], tuple(planted["against"]), out, model=tiny_clip,
                                 threshold=threshold, workers=1), log=printed.append)
    assert manifest["config"]["detectors"] == ["exact", "pixels", "pdq", "near"]
    count = {m: sum(p[3] == m for p in _pairs(out)) for m in ("exact", "pixels", "pdq", "near")}
    assert (f"[audit] pairs: {count['exact']} exact, {count['pixels']} pixels, {count['pdq']} pdq, {count['near']} "
            "near") in printed
    assert "\u2014" not in open(os.path.join(out, "report.html")).read()  # every detector ran
    keys, train = embeddings.read_all(os.path.join(out, "embeddings", "train"))
    rows = pq.read_table(os.path.join(out, "contamination.parquet")).to_pylist()
    sure = doubt = 0
    for n, task in enumerate(EVAL_TASKS):
        eval_keys, vectors = embeddings.read_all(os.path.join(out, "embeddings", f"against-{n}"))
        got = {(r["eval_key"], r["train_key"]): r["score"] for r in rows if r["method"] == "near"
               and r["eval_task"] == task}
        # float64 reference: the engine's float32 sums may differ in the last bits (tests/support/numerics.py)
        counts = assert_top_pairs_close(got, vectors.astype(np.float64) @ train.T.astype(np.float64), eval_keys,
                                        keys, NEAR_K, threshold, atol=1e-6)
        sure, doubt = sure + counts[0], doubt + counts[1]
    assert sure > 0 and doubt <= 0.05 * sure, (sure, doubt)
    near = [r["score"] for r in rows if r["method"] == "near"]
    assert near == sorted(near, reverse=True)


def test_against_the_mieb_eval_splits_then_a_clean_build(ray_local, tmp_path):
    """The fixture mirror reuses each source's pictures in both splits, so eval row i has train row i's bytes:
    the audit must find each such pair, and build --exclude must leave exactly those train rows out."""
    mirror, slugs = str(tmp_path / "mirror"), ["cifar100", "dtd"]
    make_mirror(mirror, rows=6, datasets=slugs, eval_rows=4)
    photos = describe(make_biovita_mirror(mirror))  # 1,329 photos
    train = str(tmp_path / "train")
    built = build(BuildConfig(mirror, train, datasets=slugs, executor="local"), log=lambda _: None)  # the input
    out = str(tmp_path / "audit")
    audit(AuditConfig(train, ("mieb",), out, sources=mirror), log=lambda _: None)
    digest = {}  # brute force: sha256 of every image of both tables
    for root, side in ((train, "train"), (os.path.join(out, "eval-data"), "eval")):
        for dirpath, _, files in os.walk(root):
            for f in files:
                if f.endswith(".parquet") and not f.startswith("_"):
                    for r in pq.read_table(os.path.join(dirpath, f), columns=["key", "image"]).to_pylist():
                        digest.setdefault(hashlib.sha256(r["image"]["bytes"]).hexdigest(), {}) \
                            .setdefault(side, []).append(r["key"])
    # each eval image's task: every registered task that scores its source's eval split (registry.tasks_by_source)
    tasks = {"cifar100": "CIFAR100ZeroShot/CIFAR100/CIFAR100Clustering", "dtd": "DTDZeroShot/DTD"}
    want = {(t, tasks[e.split("/")[0]], e, "exact") for d in digest.values() for t in d.get("train", [])
            for e in d.get("eval", [])}
    got = {p for p in _pairs(out) if p[3] == "exact"}
    assert want and got == want
    flagged = {p[0] for p in _pairs(out)}
    summary = json.loads(open(os.path.join(out, "summary.json")).read())
    assert summary["eval_tasks"]["BioVITAT2IReranking"]["eval_rows"] == photos["corpus"]  # audited against too
    assert all(summary["eval_tasks"][t]["eval_rows"] == 4 for t in tasks["cifar100"].split("/"))  # each task apart

    clean = str(tmp_path / "clean")
    manifest = build(BuildConfig(mirror, clean, datasets=slugs, exclude=out), log=lambda _: None)
    for slug in slugs:
        assert manifest["counts"]["excluded"][slug] == sum(k.startswith(f"{slug}/") for k in flagged)
    before = {k for s in built["shards"] for k in pq.read_table(os.path.join(train, s["path"]))["key"].to_pylist()}
    after = {k for s in manifest["shards"] for k in pq.read_table(os.path.join(clean, s["path"]))["key"].to_pylist()}
    assert after == before - flagged and manifest["config"]["exclude"]["train_keys"] == len(flagged)
    card = open(os.path.join(clean, "README.md")).read()
    assert "mieb-ray audit" in card and f"leaves out the {len(flagged):,} train rows" in card


def test_near_against_mieb_keys_each_table_as_its_hashes_do(tmp_path, tiny_clip):
    """--against mieb with a model: BioVITA's corpus is keyed by its photo ids, the eval splits by their keys; each
    is embedded by its own key, and BioVITA's near pairs are a brute-force search's of those embeddings."""
    from mieb_ray.evals import biovita_data

    mirror, threshold = str(tmp_path / "mirror"), 0.9
    make_mirror(mirror, rows=3, datasets=["dtd"], eval_rows=2)
    make_biovita_mirror(mirror)
    train = str(tmp_path / "train")
    build(BuildConfig(mirror, train, datasets=["dtd"], executor="local"), log=lambda _: None)
    out = str(tmp_path / "audit")
    audit(AuditConfig(train, ("mieb",), out, sources=mirror, model=tiny_clip, threshold=threshold),
          log=lambda _: None)
    ids = [i for f in biovita_data.corpus_files(mirror, biovita_data.SUBSETS[0])
           for i in pq.read_table(f, columns=["id"])["id"].to_pylist()]
    keys, train_vectors = embeddings.read_all(os.path.join(out, "embeddings", "train"))
    assert sorted(keys) == [f"dtd/{i}" for i in range(3)]
    eval_keys, vectors = embeddings.read_all(os.path.join(out, "embeddings", "against-1"))
    assert sorted(eval_keys) == sorted(map(str, ids))
    rows = pq.read_table(os.path.join(out, "contamination.parquet")).to_pylist()
    got = {(r["eval_key"], r["train_key"]): r["score"] for r in rows
           if r["method"] == "near" and r["eval_task"] == biovita_data.TASK}
    sure, _ = assert_top_pairs_close(got, vectors.astype(np.float64) @ train_vectors.T.astype(np.float64), eval_keys,
                                     keys, NEAR_K, threshold, atol=1e-6)
    assert sure > 0


def test_resume_hashes_only_what_is_left(ray_local, planted, tmp_path, monkeypatch):
    out = str(tmp_path / "audit")
    config = AuditConfig(planted["train"], tuple(planted["against"]), out)
    first = audit(config, log=lambda _: None)
    from mieb_ray.runtime.job import Job

    rerun_lines = []

    def killed(*args):  # the run dies just before its manifest: hash files and progress records stay
        raise RuntimeError("killed")
    with monkeypatch.context() as patched:
        patched.setattr(Job, "finish", killed)
        with pytest.raises(RuntimeError, match="killed"):
            audit(AuditConfig(planted["train"], tuple(planted["against"]), str(tmp_path / "partial")),
                  log=lambda _: None)
    audit(AuditConfig(planted["train"], tuple(planted["against"]), str(tmp_path / "partial"), resume=True),
          log=rerun_lines.append)
    assert any("3 units already hashed" in line for line in rerun_lines)
    assert _pairs(str(tmp_path / "partial")) == _pairs(out)
    assert first["counts"] == storage.read_manifest(str(tmp_path / "partial"))["counts"]


def test_bad_input_is_one_line(ray_local, planted, tmp_path, capsys):
    import pyarrow as pa

    no_image = tmp_path / "no-image"
    no_image.mkdir()
    pq.write_table(pa.table({"key": ["a"], "text": ["x"]}), no_image / "0.parquet")
    empty = tmp_path / "empty"
    empty.mkdir()
    pq.write_table(pa.table({"key": pa.array([], pa.string()), "image": pa.array([], pa.binary())}),
                   empty / "0.parquet")
    no_weights = tmp_path / "no-weights"
    no_weights.mkdir()
    (no_weights / "config.json").write_text('{"model_type": "clip", "architectures": ["CLIPModel"]}')
    cases = [
        (["--train", str(no_image), "--against", planted["against"][0]], "has no column image"),
        (["--train", planted["train"], "--against", str(empty)], "holds no rows: nothing to audit against"),
        (["--train", planted["train"], "--against", "mieb," + planted["against"][0]], "cannot be combined"),
        (["--train", planted["train"], "--against", planted["against"][0], "--train-embeddings", str(empty)],
         "go together"),
        # before the hashing (an hour at full size), not after it
        (["--train", planted["train"], "--against", planted["against"][0], "--model", str(no_weights)],
         f"model {no_weights} has no weights"),
    ]  # flags out of range and missing paths are refused by the parser (tests/unit/test_flags.py)
    for n, (argv, message) in enumerate(cases):
        capsys.readouterr()
        assert main(["audit", *argv, "--out", str(tmp_path / f"out{n}")]) == 1, argv
        assert not os.path.exists(tmp_path / f"out{n}" / "_hashes"), argv  # nothing hashed
        err = capsys.readouterr().err  # Ray's own log lines of earlier tests may come before ours
        ours = [line for line in err.strip().splitlines() if line.startswith("mieb-ray:")]
        assert len(ours) == 1 and message in ours[0] and "Traceback" not in err, (argv, err)


def test_build_exclude_takes_the_chosen_detectors(tmp_path, capsys):
    """build --exclude leaves out the rows of exact, pixel and pdq pairs by default; near only when asked."""
    from support.contamination import audit_output

    from mieb_ray.pipelines.build import excluded_keys

    out = audit_output(tmp_path / "audit", [("a/1", "a/test/1", "exact"), ("a/2", "a/test/2", "pixels"),
                                            ("a/3", "a/test/3", "pdq"), ("a/4", "a/test/4", "near"),
                                            ("a/3", "a/test/5", "near")])
    assert sorted(excluded_keys(out).to_pylist()) == ["a/1", "a/2", "a/3"]
    assert sorted(excluded_keys(out, ("near",)).to_pylist()) == ["a/3", "a/4"]
    with pytest.raises(SystemExit) as exit_:
        main(["build", "--sources", str(tmp_path), "--out", str(tmp_path / "b"), "--exclude", out,
              "--exclude-detectors", "exact,neer"])
    assert exit_.value.code == 2
    assert "unknown detector 'neer'; valid: exact, pixels, pdq, near" in capsys.readouterr().err


def test_self_audit_groups_copies_and_build_keeps_one_of_each(ray_local, tmp_path, capsys):
    """--against self: the rows of one table that are copies of each other, grouped by detector; build --exclude
    of that audit leaves out all but the smallest key of each group (groups sharing a row merged)."""
    from support.planted import write_table

    from mieb_ray.errors import UserError
    from mieb_ray.io.contamination import Flags, flagged_train_keys

    pieces = tiles()
    jpegs = [jpeg(t) for t in pieces[:6]]
    images = {"a/0": jpegs[0], "a/1": jpegs[0], "b/2": jpegs[0],  # the same bytes three times
              "a/3": jpegs[1], "b/4": encode(Image.open(io.BytesIO(jpegs[1])).convert("RGB"), "PNG"),  # same pixels
              "a/5": jpegs[2], "b/6": jpeg(Image.open(io.BytesIO(jpegs[2])).transpose(Image.Transpose.FLIP_LEFT_RIGHT)),
              **{f"c/{i}": jpegs[i] for i in (3, 4, 5)}}  # distinct
    table = write_table(str(tmp_path / "table"), list(images), list(images.values()))
    out = str(tmp_path / "audit")
    assert main(["audit", "--train", table, "--against", "self", "--out", out]) == 0
    printed = capsys.readouterr().out
    assert "[audit] done: build --exclude would leave out 4 of 10 rows" in printed
    found = pq.read_table(os.path.join(out, "duplicates.parquet")).to_pylist()
    groups = {}
    for r in found:
        groups.setdefault((r["method"], r["group"]), set()).add(r["key"])
        assert r["keep"] == (r["key"] == r["group"])
    assert groups == {("exact", "a/0"): {"a/0", "a/1", "b/2"}, ("pixels", "a/0"): {"a/0", "a/1", "b/2"},
                      ("pixels", "a/3"): {"a/3", "b/4"}, ("pdq", "a/0"): {"a/0", "a/1", "b/2"},
                      ("pdq", "a/3"): {"a/3", "b/4"}, ("pdq", "a/5"): {"a/5", "b/6"}}
    assert sorted(flagged_train_keys(out, ("exact",)).to_pylist()) == ["a/1", "b/2"]
    assert sorted(flagged_train_keys(out, ("exact", "pixels", "pdq")).to_pylist()) == ["a/1", "b/2", "b/4", "b/6"]
    summary = json.loads(open(os.path.join(out, "summary.json")).read())
    assert summary["pdq"] == {"groups": 3, "rows_in_groups": 7, "left_out": 4} and summary["left_out_by_default"] == 4
    with pytest.raises(UserError, match="an audit of a table against itself: it flags no eval image"):
        Flags.load(out)
    assert main(["audit", "--train", table, "--against", "self," + table, "--out", str(tmp_path / "x")]) == 1
    assert "--against self cannot be combined with other tables" in capsys.readouterr().err


def test_a_row_without_a_key_is_an_error_row_that_says_where_it_is(ray_local, tmp_path, capsys):
    """A null key named nothing: its row was paired as "None" (and a build could never leave it out). Now it is an
    error row giving its row and file, and the copy it holds pairs with nothing."""
    from support.planted import write_table

    copy = jpeg(tiles()[0])
    table = write_table(str(tmp_path / "table"), ["a/0", None, "a/2"], [copy, copy, jpeg(tiles()[1])])
    out = str(tmp_path / "audit")
    assert main(["audit", "--train", table, "--against", "self", "--out", out]) == 0
    assert "[audit] done: build --exclude would leave out 0 of 3 rows" in capsys.readouterr().out
    assert pq.read_table(os.path.join(out, "duplicates.parquet")).num_rows == 0
    assert pq.read_table(os.path.join(out, "errors.parquet")).to_pylist() == [
        {"side": "train", "key": None, "error": f"null key (column key): row 1 of {table}/000000.parquet"}]


def test_against_mieb_covers_the_tasks_mteb_scores_and_their_clean_scores(tmp_path, tiny_clip, capsys):
    """--against mieb reads every MIEB eval image, the tasks mteb scores included (read by mteb's loaders, keyed as
    the eval's collect pass keys them): the train rows that copy STS12's, STS13's and FGVCAircraft's test images are
    found, an image both STS tasks hold counts in each, the summary is per MIEB task, and eval --exclude with that
    audit leaves those images out of STS13VisualSTS's clean scores."""
    from support.hub_tasks import sts, tasks_misc
    from support.mteb_tasks import ours

    mirror = str(tmp_path / "mirror")
    sts.write_sts12(mirror)
    sts.write_sts13(mirror)
    tasks_misc.write_fgvc_aircraft(mirror)
    repos = {"STS12VisualSTS": "mteb/rendered-sts12", "STS13VisualSTS": "mteb/rendered-sts13",
             "FGVCAircraft": "mteb/FGVCAircraft"}
    test_images = {}  # brute force: the bytes of each task's test split, independently of mteb
    for task, repo in repos.items():
        [path] = [os.path.join(d, f) for d, _, fs in os.walk(os.path.join(mirror, repo)) for f in fs
                  if f.startswith("test-") and f.endswith(".parquet")]
        table = pq.read_table(path)
        for column in [c for c in table.column_names if c in ("image", "sentence1", "sentence2")]:
            for value in table[column].to_pylist():
                test_images.setdefault(value["bytes"], set()).add(task)
    shared = next(b for b, holders in test_images.items() if len(holders) == 2)
    copies = [shared] + [b for b, holders in test_images.items() if holders == {"FGVCAircraft"}][:2] \
        + [b for b, holders in test_images.items() if holders == {"STS13VisualSTS"}][:1]
    make_mirror(mirror, rows=len(copies), datasets=["dtd"], eval_rows=1,
                image_bytes=lambda source, i: copies[i])  # dtd's train row i copies an mteb task's test image
    train = str(tmp_path / "train")
    build(BuildConfig(mirror, train, datasets=["dtd"], executor="local"), log=lambda _: None)  # the input
    out = str(tmp_path / "audit")
    lines = []
    audit(AuditConfig(train, ("mieb",), out, sources=mirror), log=lines.append)

    order = list(registry.BY_NAME["mteb"].tasks)  # a row's tasks, in registry order
    want = {(f"dtd/{i}", "/".join(sorted(test_images[b], key=order.index)), "sha256:" + hashlib.sha256(b).hexdigest(),
             "exact") for i, b in enumerate(copies)}
    assert {p for p in _pairs(out) if p[1] != "DTDZeroShot/DTD" and p[3] == "exact"} == want
    assert any(f"of the {len(order)} MIEB tasks mteb scores are not audited against" in line and
               "holds no data of" in line for line in lines)
    summary = json.loads(open(os.path.join(out, "summary.json")).read())["eval_tasks"]
    assert {t: summary[t]["exact"]["eval_images"] for t in repos} == \
        {"STS12VisualSTS": 1, "STS13VisualSTS": 2, "FGVCAircraft": 2}
    assert summary["STS13VisualSTS"]["eval_rows"] == len({b for b, h in test_images.items() if "STS13VisualSTS" in h})

    result = ours(["STS13VisualSTS"], mirror, tiny_clip, str(tmp_path / "eval"), exclude=out)["STS13VisualSTS"]
    assert result["mieb_ray"]["clean"]["left_out"]["eval"]["exact"] == 2
