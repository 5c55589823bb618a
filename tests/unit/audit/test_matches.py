"""The audit's hash joins (mieb_ray/audit/matches.py): edited copies of real pictures (crops off any side or corner,
either side cropped from the other, downscales to 64 px among them) found at the default pdq threshold and distinct
pictures not; pdq pairs equal a
brute-force search of every pair; thousands of copies on both sides make one group, not a million pairs, and every
member is flagged."""

from __future__ import annotations

import os

import numpy as np
import pytest
from PIL import Image
from support.pictures import encode, jpeg

from mieb_ray import storage
from mieb_ray.demo_data.mirror import picture

pytestmark = pytest.mark.timeout(600)


def test_edited_copies_of_real_pictures_are_found_and_distinct_pictures_are_not():
    """The default threshold on edits of the suite with other parameters than bench/calibration/audit_calibrate.py's,
    crops at shares between the windows' among them: every copy found with its original, and nothing else: not the
    quadrants of the same pictures, nor tiles of pictures not on the train side."""
    from PIL import ImageEnhance, ImageOps

    from mieb_ray.audit import matches

    def box(image, side):
        canvas = Image.new("RGB", (image.width, image.height + 2 * side))
        canvas.paste(image, (0, side))
        return canvas

    def cut(image, left=0.0, right=0.0, top=0.0, bottom=0.0):
        w, h = image.size
        return image.crop((round(w * left), round(h * top), w - round(w * right), h - round(h * bottom)))

    def small(image, side):
        return image.resize((side, side * image.height // image.width), Image.Resampling.LANCZOS)

    edits = {"jpeg q40": lambda im: jpeg(im, 40),
             "resize x0.6": lambda im: jpeg(im.resize((im.width * 3 // 5, im.height * 3 // 5))),
             "centred crop 7%": lambda im: encode(cut(im, 0.035, 0.035, 0.035, 0.035), "PNG"),
             "crop 6% off the left": lambda im: encode(cut(im, left=0.06), "PNG"),
             "crop 2.5% off the right": lambda im: jpeg(cut(im, right=0.025)),
             "crop 8.5% off the top": lambda im: encode(cut(im, top=0.085), "PNG"),
             "crop 4% off the bottom": lambda im: jpeg(cut(im, bottom=0.04)),
             "crop 3% off the top left corner": lambda im: encode(cut(im, left=0.03, top=0.03), "PNG"),
             "crop 9% off the bottom right corner": lambda im: jpeg(cut(im, right=0.09, bottom=0.09)),
             "downscale to 64 px": lambda im: encode(small(im, 64), "PNG"),
             "downscale to 64 px + jpeg q75": lambda im: jpeg(small(im, 64), 75),
             "crop 6% off the left + downscale to 128 px + jpeg q75": lambda im: jpeg(small(cut(im, left=0.06), 128),
                                                                                     75),
             "mirror": lambda im: encode(ImageOps.mirror(im), "PNG"),
             "brightness +15%": lambda im: jpeg(ImageEnhance.Brightness(im).enhance(1.15)),
             "contrast -15%": lambda im: jpeg(ImageEnhance.Contrast(im).enhance(0.85)),
             "letterbox 12%": lambda im: encode(box(im, im.height * 12 // 100), "PNG"),
             "grayscale": lambda im: encode(ImageOps.grayscale(im).convert("RGB"), "PNG"),
             "WebP q60": lambda im: encode(im, "WEBP", quality=60),
             "resize x0.7 + jpeg q60": lambda im: jpeg(im.resize((im.width * 7 // 10, im.height * 7 // 10)), 60)}

    def quadrants(name):
        w, h = picture(name).size
        return {f"{name} tile {i}{j}": picture(name).crop((i * w // 2, j * h // 2, (i + 1) * w // 2, (j + 1) * h // 2))
                for j in range(2) for i in range(2)}

    names = ("astronaut.jpg", "chelsea.jpg", "coffee.jpg", "rocket.jpg", "china.jpg")
    train_keys, train_images, eval_keys, eval_images = [], [], [], []
    for name in names:
        train_keys.append(name)
        train_images.append(encode(picture(name), "PNG"))
        for edit, make in edits.items():
            eval_keys.append(f"{name} | {edit}")
            eval_images.append(make(picture(name)))
    # quadrants of the train side's pictures, and of pictures not on it: distinct pictures
    for name in (*names, "brick.jpg", "grass.jpg", "coins.jpg", "flower.jpg"):
        for key, tile in quadrants(name).items():
            eval_keys.append(key)
            eval_images.append(jpeg(tile))
    # the other way: train images cropped from eval pictures off a side or a corner
    cropped = {"crop 7% off the right": lambda im: jpeg(cut(im, right=0.07)),
               "crop 4.5% off the bottom left corner": lambda im: encode(cut(im, left=0.045, bottom=0.045), "PNG")}
    for name in ("coins.jpg", "flower.jpg"):
        eval_keys.append(name)
        eval_images.append(encode(picture(name), "PNG"))
        for edit, make in cropped.items():
            train_keys.append(f"{name} | {edit}")
            train_images.append(make(picture(name)))
    train = matches.hash_rows(train_keys, train_images, 0, 0, 1, [None] * len(train_keys))
    against = matches.hash_rows(eval_keys, eval_images, 0, 0, 1, ["T"] * len(eval_keys))
    found = {(p["train_key"], p["eval_key"]) for p in matches.pdq_pairs(train, against)[0].to_pylist()}
    want = {(name, f"{name} | {edit}") for name in names for edit in edits}
    want |= {(f"{name} | {edit}", name) for name in ("coins.jpg", "flower.jpg") for edit in cropped}
    assert found == want, (want - found, found - want)
    assert all(q >= matches.MIN_QUALITY for q in train["pdq_quality"].to_pylist())


@pytest.mark.parametrize("compared", ["PDQ_COMPARED", "PDQ_SELF_COMPARED"])
def test_pdq_pairs_equal_a_brute_force_search(compared):
    """Every (train, eval) row within the threshold by any two hashes compared (the pictures, one's mirror, a train
    picture's windows, an eval picture's windows: two searches), and no other, once, at its smallest distance (of
    the train side's search where the pictures themselves are within it): against a
    search of all pairs of all hashes on unpacked bits. Flat images (low quality) take no part; rows with one pdq
    hash but other windows are searched apart; rows alike in every hash are all reported."""
    import pyarrow as pa

    from mieb_ray.audit import matches

    compared = getattr(matches, compared)
    rng = np.random.default_rng(3)
    hashes = {c: matches.HASH_SCHEMA.field(c).type.byte_width // 32 for c in matches.PDQ_HASHES}

    def noisy(bits, p):
        return bits ^ (rng.random(bits.shape) < p).astype(np.uint8)

    def side(n):
        return {c: rng.integers(0, 2, (n, k, 256), dtype=np.uint8) for c, k in hashes.items()}

    train, evals = side(60), side(50)
    evals["pdq"][:20, 0] = noisy(train["pdq"][:40:2, 0], 0.08)  # the pictures
    evals["pdq_mirror"][45:, 0] = noisy(train["pdq"][55:, 0], 0.05)  # one the mirror of the other
    for k, (t, e) in enumerate(zip(range(30, 35), range(40, 45))):  # the eval picture a crop of the train one
        train["pdq_sides"][t, 7 * k] = noisy(evals["pdq"][e, 0], 0.05)
    train["pdq_centred"][40:45, 2] = noisy(evals["pdq"][25:30, 0], 0.05)
    evals["pdq_centred"][35:40, 3] = noisy(train["pdq"][20:25, 0], 0.05)  # the train picture a crop of the eval one
    for k, (t, e) in enumerate(zip(range(10, 14), range(30, 34))):  # ... off a side or a corner (the other search)
        evals["pdq_sides"][e, 11 * k] = noisy(train["pdq"][t, 0], 0.05)
    evals["pdq_sides"][2, 5] = noisy(train["pdq"][4, 0], 0.02)  # closer than the pictures (e2 is t4's): once
    train["pdq_centred"][31, 1] = noisy(evals["pdq"][9, 0], 0.05)  # found both ways: once, at the closer
    evals["pdq_sides"][9, 2] = noisy(train["pdq"][31, 0], 0.02)
    train["pdq"][50] = train["pdq"][30]  # the pdq hash of row 30, not its windows
    train["pdq_centred"][50] = train["pdq_centred"][30]
    for c in hashes:  # row 51 alike row 31 in every hash
        train[c][51] = train[c][31]
    quality = np.full(60, 100)
    quality[7] = 10

    def table(bits, prefix, q):
        n = len(q)
        packed = {c: pa.array([np.packbits(row).tobytes() for row in bits[c]], matches.HASH_SCHEMA.field(c).type)
                  for c in hashes}
        return pa.table({"key": [f"{prefix}{i}" for i in range(n)], "eval_task": ["T"] * n, **packed,
                         "pdq_quality": pa.array(q, pa.int16())})

    got, groups = matches.pdq_pairs(table(train, "t", quality), table(evals, "e", [100] * 50), threshold=40,
                                    compared=compared)
    assert groups == [] and got["group"].null_count == got.num_rows
    def distance(i, j, pairs):
        return min(int((train[a][i][:, None] != evals[b][j][None, :]).sum(-1).min()) for a, b in pairs)

    want = {}
    for i in range(60):
        for j in range(50):
            # a pair whose pictures are within the threshold is the train side's search's, at its distance
            d = distance(i, j, compared if distance(i, j, [("pdq", "pdq")]) > 40 else matches.PDQ_FROM_TRAIN)
            if d <= 40 and quality[i] >= matches.MIN_QUALITY:
                want[f"t{i}", f"e{j}"] = 1 - d / 256
    pairs = list(zip(got["train_key"].to_pylist(), got["eval_key"].to_pylist()))
    assert dict(zip(pairs, got["score"].to_pylist())) == want and len(pairs) == len(want)
    assert len(want) > 35 and not any(k[0] == "t7" for k in want)
    assert {("t0", "e0"), ("t55", "e45"), ("t30", "e40"), ("t51", "e41"), ("t40", "e25"), ("t4", "e2"),
            ("t31", "e9")} <= set(want)
    assert ("t50", "e40") not in want
    assert (("t20", "e35") in want) == (("t11", "e31") in want) == (compared == matches.PDQ_COMPARED)
    none = table({c: train[c][:0] for c in train}, "t", [])  # no usable row on one side (all flat, or none)
    assert matches.pdq_pairs(none, table(evals, "e", [100] * 50), compared=compared)[0].num_rows == 0


def test_thousands_of_copies_on_both_sides_make_one_group_not_a_million_pairs(tmp_path):
    """A placeholder image 3,000 times in train and 500 times in eval (1.5M pairs per detector) and a blank frame
    1,000 times on each side: each is one group, its rows listed once each, every member flagged by --exclude."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from mieb_ray.audit import matches
    from mieb_ray.io.contamination import Flags, flagged_train_keys

    placeholder, blank = jpeg(picture("coffee.jpg").resize((64, 48))), encode(Image.new("RGB", (32, 32)), "PNG")
    copy = jpeg(picture("rocket.jpg"))
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
