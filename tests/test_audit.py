"""mieb-ray audit: planted duplicates found by the detector each change allows, nothing else flagged by the
hashes, near pairs equal to a brute-force search of the same embeddings, the MIEB eval splits as the eval side,
a clean build with --exclude, resume, and one-line errors for bad input."""

from __future__ import annotations

import hashlib
import io
import json
import os

import numpy as np
import pyarrow.parquet as pq
import pytest
from numerics import assert_top_pairs_close
from PIL import Image
from planted import EVAL_TASKS, PLANTS, encode, make_planted, tiles

from mieb_ray import storage
from mieb_ray.audit import fingerprints
from mieb_ray.audit.job import NEAR_K, AuditConfig, audit
from mieb_ray.cli import main
from mieb_ray.fixtures.biovita import make_biovita_mirror
from mieb_ray.fixtures.mirror import make_mirror, picture
from mieb_ray.io import embeddings
from mieb_ray.pipelines.build import BuildConfig, build

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    return make_planted(str(tmp_path_factory.mktemp("planted")))


def _pairs(out: str) -> set[tuple]:
    rows = pq.read_table(os.path.join(out, "contamination.parquet")).to_pylist()
    return {(r["train_key"], r["eval_task"], r["eval_key"], r["method"]) for r in rows}


def _pix(data: bytes) -> bytes:
    return fingerprints.fingerprint(data).pix


def test_pixel_hash_sees_through_containers_and_exif_not_through_lossy_changes():
    tile = tiles()[0]
    jpeg = encode(tile)
    decoded = Image.open(io.BytesIO(jpeg)).convert("RGB")
    assert _pix(encode(decoded, "PNG")) == _pix(jpeg)
    assert _pix(encode(decoded, quality=50)) != _pix(jpeg)
    # stored rotated with an EXIF orientation that turns it back: the same upright pixels
    png = encode(decoded, "PNG")
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90 CW to view
    buf = io.BytesIO()
    decoded.transpose(Image.Transpose.ROTATE_90).save(buf, "PNG", exif=exif.tobytes())
    assert _pix(buf.getvalue()) == _pix(png)
    bad = fingerprints.fingerprint(b"not an image")
    assert bad.sha == hashlib.sha256(b"not an image").digest() and bad.pix is None and bad.pdq is None
    assert bad.error.startswith("undecodable image")
    assert fingerprints.fingerprint(None).error == "no image"


def test_pdq_is_pdqhash_of_the_prepared_pixels():
    """The pdq columns are pdqhash's own hashes, bit for bit, of the pixels prepared as fingerprints.py documents
    it, done here with plain Pillow and numpy: letterbox bars cut off, a box reduction by a whole factor when the
    longer side is at least twice 256, then a resize to a longer side of 256 (box filter down, bilinear up); and
    pdqhash's hashes of their mirror, of their central 95% and 90% (2.5% and 5% cut off each side), and its quality.
    Pillow's filters are the product's, so the expectation is exact."""
    import pdqhash

    def packed(pixels: np.ndarray) -> bytes:
        return np.packbits(pdqhash.compute(np.ascontiguousarray(pixels))[0].astype(np.uint8)).tobytes()

    def cut(pixels: np.ndarray, each_side: float) -> np.ndarray:
        h, w = pixels.shape[:2]
        return pixels[round(h * each_side):h - round(h * each_side), round(w * each_side):w - round(w * each_side)]

    def expected(pixels: np.ndarray) -> tuple:
        return (packed(pixels), packed(pixels[:, ::-1]), packed(cut(pixels, 0.025)), packed(cut(pixels, 0.05)),
                pdqhash.compute(np.ascontiguousarray(pixels))[1])

    def hashed(image: Image.Image) -> tuple:
        got = fingerprints.fingerprint(encode(image, "PNG"))
        return got.pdq, got.pdq_mirror, got.pdq_c95, got.pdq_c90, got.pdq_quality

    box, bilinear = Image.Resampling.BOX, Image.Resampling.BILINEAR
    # (picture, resized to) -> (whole factor reduced by, size hashed, filter); none of these has a bar to cut
    cases = {("astronaut.jpg", None): (1, (256, 256), box),  # 400 x 400
             ("astronaut.jpg", (1300, 700)): (2, (256, 138), box),  # 1300 >= 2 x 256: 650 x 350 first
             ("astronaut.jpg", (90, 120)): (1, (192, 256), bilinear),
             ("text.png", None): (1, (256, 98), box),  # 448 x 172
             ("text.png", (1300, 700)): (2, (256, 138), box),
             ("text.png", (90, 120)): (1, (192, 256), bilinear)}
    for (name, size), (factor, side, resample) in cases.items():
        image = picture(name) if size is None else picture(name).resize(size)
        reduced = image.reduce(factor) if factor > 1 else image
        assert hashed(image) == expected(np.asarray(reduced.resize(side, resample))), (name, size)
    # black bars around a picture, where it was pasted: cut off before hashing, the hashes the picture's own
    plain = picture("coffee.jpg").resize((400, 300))
    framed = Image.new("RGB", (500, 500))
    framed.paste(plain, (50, 100))
    want = expected(np.asarray(plain.resize((256, 192), box)))
    assert hashed(plain) == want and hashed(framed) == want


def test_edited_copies_of_real_pictures_are_found_and_distinct_tiles_are_not():
    """The default threshold on edits of the suite with other parameters than bench/calibration/audit_calibrate.py's:
    no tile found, every copy found but at most one crop (a 7% crop falls between the 5% and 10% crop hashes; the
    bench measures 0.94 recall at either)."""
    from PIL import ImageEnhance, ImageOps

    from mieb_ray.audit import matches

    def box(image, side):
        canvas = Image.new("RGB", (image.width, image.height + 2 * side))
        canvas.paste(image, (0, side))
        return canvas

    def central(image, cut):
        w, h = image.size
        return image.crop((round(w * cut / 2), round(h * cut / 2), w - round(w * cut / 2), h - round(h * cut / 2)))

    edits = {"jpeg q40": lambda im: encode(im, quality=40),
             "resize x0.6": lambda im: encode(im.resize((im.width * 3 // 5, im.height * 3 // 5))),
             "centred crop 7%": lambda im: encode(central(im, 0.07), "PNG"),
             "mirror": lambda im: encode(ImageOps.mirror(im), "PNG"),
             "brightness +15%": lambda im: encode(ImageEnhance.Brightness(im).enhance(1.15)),
             "contrast -15%": lambda im: encode(ImageEnhance.Contrast(im).enhance(0.85)),
             "letterbox 12%": lambda im: encode(box(im, im.height * 12 // 100), "PNG"),
             "grayscale": lambda im: encode(ImageOps.grayscale(im).convert("RGB"), "PNG"),
             "WebP q60": lambda im: encode(im, "WEBP", quality=60),
             "resize x0.7 + jpeg q60": lambda im: encode(im.resize((im.width * 7 // 10, im.height * 7 // 10)),
                                                          quality=60)}
    names = ("astronaut.jpg", "chelsea.jpg", "coffee.jpg", "rocket.jpg", "china.jpg")
    train_keys, train_images, eval_keys, eval_images = [], [], [], []
    for name in names:
        train_keys.append(name)
        train_images.append(encode(picture(name), "PNG"))
        for edit, make in edits.items():
            eval_keys.append(f"{name} | {edit}")
            eval_images.append(make(picture(name)))
    for image in ("brick.jpg", "grass.jpg", "coins.jpg", "flower.jpg"):  # tiles of pictures not on the train side
        w, h = picture(image).size
        for j in range(2):
            for i in range(2):
                eval_keys.append(f"{image} tile {i}{j}")
                eval_images.append(encode(picture(image).crop((i * w // 2, j * h // 2, (i + 1) * w // 2,
                                                                (j + 1) * h // 2))))
    train = matches.hash_rows(train_keys, train_images, 0, 0, 1, [None] * len(train_keys))
    against = matches.hash_rows(eval_keys, eval_images, 0, 0, 1, ["T"] * len(eval_keys))
    found = {(p["train_key"], p["eval_key"]) for p in matches.pdq_pairs(train, against)[0].to_pylist()}
    want = {(name, f"{name} | {edit}") for name in names for edit in edits}
    missed = want - found
    assert found <= want and len(missed) <= 1 and all("crop" in e for _, e in missed), (missed, found - want)
    assert all(q >= matches.MIN_QUALITY for q in train["pdq_quality"].to_pylist())


def test_pdq_pairs_equal_a_brute_force_search():
    """Every (train, eval) pair within the threshold by any compared pair of hashes (picture, mirror, central
    crops), and no other, at its smallest distance: against a search of all pairs on unpacked bits; flat images
    (low quality) take no part."""
    import pyarrow as pa

    from mieb_ray.audit import matches

    rng = np.random.default_rng(3)

    def noisy(bits, p):
        return bits ^ (rng.random(bits.shape) < p).astype(np.uint8)

    def random(n):
        return rng.integers(0, 2, (n, 256), dtype=np.uint8)

    base = random(40)
    train = {"pdq": np.concatenate([base, noisy(base[:20], 0.1)]), "pdq_c95": random(60), "pdq_c90": random(60)}
    evals = {"pdq": np.concatenate([noisy(base[::2], 0.08), random(30)]), "pdq_mirror": random(50),
             "pdq_c95": random(50), "pdq_c90": random(50)}
    evals["pdq_mirror"][-5:] = noisy(train["pdq"][-5:], 0.05)  # found through the mirror only
    evals["pdq_c90"][-10:-5] = noisy(train["pdq"][30:35], 0.05)  # the train image is a crop of the eval one
    train["pdq_c95"][40:45] = noisy(evals["pdq"][25:30], 0.05)  # the eval image is a crop of the train one
    train["pdq_mirror"] = random(60)
    quality = np.full(60, 100)
    quality[7] = 10

    def table(hashes, prefix, q):
        packed = lambda b: pa.array([np.packbits(r).tobytes() for r in b], pa.binary(32))  # noqa: E731
        n = len(hashes["pdq"])
        return pa.table({"key": [f"{prefix}{i}" for i in range(n)], "eval_task": ["T"] * n,
                         **{c: packed(hashes[c]) for c in matches.PDQ_HASHES},
                         "pdq_quality": pa.array(q, pa.int16())})

    got, groups = matches.pdq_pairs(table(train, "t", quality), table(evals, "e", [100] * 50), threshold=40)
    assert groups == [] and got["group"].null_count == got.num_rows
    want = {}
    for i in range(60):
        for j in range(50):
            d = min(int((train[a][i] != evals[b][j]).sum()) for a, b in matches.PDQ_COMPARED)
            if d <= 40 and quality[i] >= matches.MIN_QUALITY:
                want[f"t{i}", f"e{j}"] = 1 - d / 256
    assert dict(zip(zip(got["train_key"].to_pylist(), got["eval_key"].to_pylist()), got["score"].to_pylist())) == want
    assert len(want) > 35 and not any(k[0] == "t7" for k in want)
    assert {("t55", "e45"), ("t30", "e40"), ("t40", "e25")} <= set(want)
    none = table({c: train[c][:0] for c in train}, "t", [])  # no usable row on one side (all flat, or none)
    assert matches.pdq_pairs(none, table(evals, "e", [100] * 50))[0].num_rows == 0


@pytest.mark.parametrize("threshold", [0, 15, 16, 31, 40, 47])
def test_the_indexed_pdq_search_finds_what_brute_force_finds(threshold, monkeypatch):
    """Multi-index hashing (hamming._indexed) against every pair's distance (hamming.brute_force): the same
    (train, eval, distance) triples, each once, on random hashes, copies planted at every distance up to the
    threshold and just past it, repeated rows, and hashes whose chunks crowd into a few values (for which within()
    searches by brute force: its result is the same)."""
    from mieb_ray.audit import hamming

    brute_force = hamming.brute_force
    rng = np.random.default_rng(threshold)

    def words(n):
        return rng.integers(0, 2**63, (n, 4), dtype=np.uint64) * np.uint64(2) + rng.integers(0, 2, (n, 4),
                                                                                             dtype=np.uint64)

    def flipped(row, bits):
        out = row.copy()
        for b in rng.choice(256, bits, replace=False):
            out[b // 64] ^= np.uint64(1) << np.uint64(b % 64)
        return out

    train, evals = words(300), words(700)
    for k, bits in enumerate(range(threshold + 3)):  # planted copies, 0 to threshold + 2 bits away
        evals[k] = flipped(train[k], bits)
    evals[600:610] = evals[0]  # one eval picture many times
    train[290:300] = train[5]
    crowded = train.copy(), evals.copy()
    for side in crowded:  # half of every hash the same on both sides: all pairs are candidates in 8 chunks
        side[:, :2] = np.uint64(0x0123_4567_89AB_CDEF)

    def triples(found):
        return sorted(zip(*(x.tolist() for x in found)))

    brute = []
    monkeypatch.setattr(hamming, "brute_force", lambda *a: brute.append(a) or brute_force(*a))
    for ours, theirs in ((train, evals), crowded):
        want = triples(brute_force(ours, theirs, threshold))
        index = hamming.Index(theirs)
        got = triples(hamming._indexed(ours, index, threshold))
        assert got == want and len(set((i, j) for i, j, _ in got)) == len(got)
        assert triples(hamming.within(ours, index, threshold)) == want
        assert len(brute) == (ours is not train)  # the index for random hashes, brute force for crowded ones
        # the planted copies within the threshold, and the repeated rows' pairs
        assert {(k, k) for k in range(threshold + 1)} <= {(i, j) for i, j, _ in want} and (0, 609, 0) in want
        assert (295, 5) in {(i, j) for i, j, _ in want} or threshold < 5
    assert triples(hamming.within(train[:0], hamming.Index(evals), threshold)) == []
    assert triples(hamming.within(train, hamming.Index(evals[:0]), threshold)) == []


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
    assert first["pdq"]["eval_images"] == 6
    assert first["any"]["percent"] == pytest.approx(100 * 6 / eval_rows, abs=1e-4)
    assert summary["totals"]["train_rows_flagged"] == 7 and summary["threshold"] is None
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
        # float64 reference: the engine's float32 sums may differ in the last bits (tests/numerics.py)
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
    photos = make_biovita_mirror(mirror)  # 1,329 photos
    train = str(tmp_path / "train")
    built = build(BuildConfig(mirror, train, datasets=slugs), log=lambda _: None)
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
    assert summary["eval_tasks"][tasks["cifar100"]]["eval_rows"] == 4

    clean = str(tmp_path / "clean")
    manifest = build(BuildConfig(mirror, clean, datasets=slugs, exclude=out), log=lambda _: None)
    for slug in slugs:
        assert manifest["counts"]["excluded"][slug] == sum(k.startswith(f"{slug}/") for k in flagged)
    before = {k for s in built["shards"] for k in pq.read_table(os.path.join(train, s["path"]))["key"].to_pylist()}
    after = {k for s in manifest["shards"] for k in pq.read_table(os.path.join(clean, s["path"]))["key"].to_pylist()}
    assert after == before - flagged and manifest["config"]["exclude"]["train_keys"] == len(flagged)
    card = open(os.path.join(clean, "README.md")).read()
    assert "mieb-ray audit" in card and f"leaves out the {len(flagged):,} train rows" in card


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
    cases = [
        (["--train", str(no_image), "--against", planted["against"][0]], "has no column image"),
        (["--train", planted["train"], "--against", str(empty)], "holds no rows: nothing to audit against"),
        (["--train", planted["train"], "--against", "mieb," + planted["against"][0]], "cannot be combined"),
        (["--train", planted["train"], "--against", planted["against"][0], "--train-embeddings", str(empty)],
         "go together"),
    ]  # flags out of range and missing paths are refused by the parser (tests/test_flags.py)
    for n, (argv, message) in enumerate(cases):
        capsys.readouterr()
        assert main(["audit", *argv, "--out", str(tmp_path / f"out{n}")]) == 1, argv
        err = capsys.readouterr().err  # Ray's own log lines of earlier tests may come before ours
        ours = [line for line in err.strip().splitlines() if line.startswith("mieb-ray:")]
        assert len(ours) == 1 and message in ours[0] and "Traceback" not in err, (argv, err)


def test_build_exclude_takes_the_chosen_detectors(tmp_path, capsys):
    """build --exclude leaves out the rows of exact, pixel and pdq pairs by default; near only when asked."""
    from test_linear_probe import audit_output

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


def test_thousands_of_copies_on_both_sides_make_one_group_not_a_million_pairs(tmp_path):
    """A placeholder image 3,000 times in train and 500 times in eval (1.5M pairs per detector) and a blank frame
    1,000 times on each side: each is one group, its rows listed once each, every member flagged by --exclude."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from mieb_ray.audit import matches
    from mieb_ray.io.contamination import Flags, flagged_train_keys

    placeholder, blank = encode(picture("coffee.jpg").resize((64, 48))), encode(Image.new("RGB", (32, 32)), "PNG")
    copy = encode(picture("rocket.jpg"))
    rows = {"train": ([placeholder] * 3000 + [blank] * 1000 + [copy]), "eval": ([placeholder] * 500 + [blank] * 1000
                                                                                 + [copy])}
    train, against = (matches.hash_rows([f"{side}/{i}" for i in range(len(images))], images, 0, 0, 1,
                                        [None if side == "train" else "T"] * len(images))
                      for side, images in rows.items())
    exact, groups = matches.hash_pairs(train, against)
    similar, more = matches.pdq_pairs(train, against)
    pairs = pa.concat_tables([exact, similar])
    assert pairs.num_rows < 20_000  # not 2 x 1.5M + 2 x 1M pairs, nor the 1.5M pdq ones
    by_method = {(g["method"], g["eval_images"]): g for g in groups + more}
    assert by_method["exact", 500]["train_rows"] == 3000 and by_method["exact", 500]["pairs"] == 1_500_000
    assert by_method["pixels", 1000]["train_rows"] == 1000  # the blank frame: exact and pixels, not pdq (flat)
    assert ("pdq", 1000) not in by_method and by_method["pdq", 500]["train_rows"] == 3000
    assert len(by_method["exact", 500]["train_sample"]) == matches.GROUP_SAMPLE
    single = pairs.filter(pa.compute.is_null(pairs["group"])).to_pylist()
    assert {(p["train_key"], p["eval_key"], p["method"]) for p in single} == {
        ("train/4000", "eval/1500", m) for m in ("exact", "pixels", "pdq")}  # the one copy: a pair, as ever
    grouped = pairs.filter(pa.compute.is_valid(pairs["group"]))
    assert grouped.filter(pa.compute.equal(grouped["method"], "exact")).num_rows == 3000 + 500 + 1000 + 1000

    os.makedirs(tmp_path / "audit")  # every member flagged: build --exclude and eval --exclude read them
    pq.write_table(pairs, tmp_path / "audit" / "contamination.parquet")
    storage.write_manifest(str(tmp_path / "audit"), {"format": "mieb-audit"})
    assert len(flagged_train_keys(str(tmp_path / "audit"))) == 4001
    flags = Flags.load(str(tmp_path / "audit"))
    assert len(flags.eval) == 1501 and None not in flags.eval and flags.train["train/0"] == {"exact", "pixels", "pdq"}
    summary = matches.summary(pairs, {"T": 1501}, {"train": 4001}, groups + more)
    assert summary["totals"]["pairs"] == {"exact": 1, "pixels": 1, "pdq": 1, "near": 0}
    assert summary["totals"]["groups"] == {"exact": 2, "pixels": 2, "pdq": 1, "near": 0}
    assert summary["eval_tasks"]["T"]["any"]["eval_images"] == 1501
    assert summary["totals"]["train_rows_flagged"] == 4001


def test_self_audit_groups_copies_and_build_keeps_one_of_each(ray_local, tmp_path, capsys):
    """--against self: the rows of one table that are copies of each other, grouped by detector; build --exclude
    of that audit leaves out all but the smallest key of each group (groups sharing a row merged)."""
    from planted import _write

    from mieb_ray.errors import UserError
    from mieb_ray.io.contamination import Flags, flagged_train_keys

    pieces = tiles()
    jpeg = [encode(t) for t in pieces[:6]]
    images = {"a/0": jpeg[0], "a/1": jpeg[0], "b/2": jpeg[0],  # the same bytes three times
              "a/3": jpeg[1], "b/4": encode(Image.open(io.BytesIO(jpeg[1])).convert("RGB"), "PNG"),  # same pixels
              "a/5": jpeg[2], "b/6": encode(Image.open(io.BytesIO(jpeg[2])).transpose(Image.Transpose.FLIP_LEFT_RIGHT)),
              **{f"c/{i}": jpeg[i] for i in (3, 4, 5)}}  # distinct
    table = _write(str(tmp_path / "table"), list(images), list(images.values()))
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
