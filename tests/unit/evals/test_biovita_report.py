"""The eval-biovita HTML report: structure (parsed with html.parser), escaping, size, and a headless Chromium
screenshot when Chromium is installed (`.ci/chromium` installs it)."""

from __future__ import annotations

import base64
import io
import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest
from PIL import Image
from support.paths import PICTURES

from mieb_ray.evals.biovita_report import render
from mieb_ray.page import PALETTE, THUMB_PX

NASTY = "O'Brien's \"<script>alert(1)</script>\" warbler"
VOID = {"meta", "img", "br", "hr", "input", "link", "rect", "line", "path"}  # no end tag, or self-closed in SVG


class Page(HTMLParser):
    """Every start tag with its attributes, all text, and whether every element is closed in order."""

    def __init__(self, text):
        super().__init__(convert_charrefs=True)
        self.tags, self.data, self.stack, self.errors = [], [], [], []
        self.feed(text)
        self.close()

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))
        if tag not in VOID:
            self.stack.append(tag)

    def handle_startendtag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))

    def handle_endtag(self, tag):
        if tag in VOID:
            return
        if not self.stack or self.stack.pop() != tag:
            self.errors.append(tag)

    def handle_data(self, data):
        self.data.append(data)

    def having(self, tag, cls=None):
        return [a for t, a in self.tags if t == tag and (cls is None or cls in (a.get("class") or "").split())]


CHANCE = {"chance_top_1": 0.01, "chance_top_5": 0.05, "chance_top_10": 0.1}  # 100 candidates with photos


def results():
    return {"task_score": 0.3605,
            "subsets": {"unseen_species": {"taxon_top_1_accuracy": 0.412, "taxon_top_5_accuracy": 0.687,
                                           "taxon_top_10_accuracy": 0.791, "queries": 1200, **CHANCE},
                        "unseen_genus": {"taxon_top_1_accuracy": 0.309, "taxon_top_5_accuracy": 0.574,
                                         "taxon_top_10_accuracy": 0.702, "queries": 800,
                                         "chance_top_1": 0.0125, "chance_top_5": 0.0625, "chance_top_10": 0.125}},
            "model": {"name": "openai/clip-vit-base-patch32", "revision": "3d74acf9", "dim": 512},
            "evaluation_time": 754.2}


def photos():
    jpgs = {p.stem: p.read_bytes() for p in sorted(PICTURES.glob("*.jpg"))}
    return jpgs | {"horse": (PICTURES / "horse.png").read_bytes()}  # a grayscale PNG too


def gallery(ids):
    """6 queries over the fixture photos: hits, misses (rank 3, rank 17), a taxon with no image, a missing id,
    a corrupt image and a taxon name with quotes and a <script>."""
    names = ["Passer domesticus", "Turdus merula", NASTY, "Parus major", "Erithacus rubecula", "Pica pica"]
    out = []
    for q in range(6):
        top = [{"taxon": names[(q + j) % 6], "score": round(0.31 - 0.02 * j, 4), "best_id": ids[(q * 5 + j) % len(ids)]}
               for j in range(5)]
        out.append({"subset": ("unseen_species", "unseen_genus")[q % 2], "query_id": f"q{q}",
                    "text": f"a photo of a bird, query {q}", "correct_taxon": top[0]["taxon"],
                    "rank_of_correct": 1, "top": top})
    out[1]["correct_taxon"], out[1]["rank_of_correct"] = out[1]["top"][2]["taxon"], 3
    out[2]["correct_taxon"], out[2]["rank_of_correct"] = "Cyanistes caeruleus", 17
    out[3]["top"][1].update(score=None, best_id=None)  # a taxon with no photo
    out[4]["top"][2]["best_id"] = "missing-id"
    out[4]["top"][3]["best_id"] = "corrupt"
    t = out[5]["top"]  # the nasty name (at rank 4) moves to rank 1, a hit
    t[0]["taxon"], t[3]["taxon"] = t[3]["taxon"], t[0]["taxon"]
    out[5]["correct_taxon"] = NASTY
    return out


@pytest.fixture(scope="module")
def page():
    images = photos()
    ids = list(images)
    images["corrupt"] = b"\xff\xd8\xff\xe0 not really a jpeg"
    g = gallery(ids)
    return render(results(), g, images), g


def test_structure(page):
    text, g = page
    p = Page(text)
    assert not p.errors and p.stack == [], (p.errors, p.stack)
    assert text.startswith("<!DOCTYPE html>")
    # the chart: one bar per (k, subset), and the same numbers in a table
    assert len(p.having("svg")) == 1
    assert len(p.having("rect", "bar")) == 3 * 2
    assert {a["fill"] for a in p.having("rect", "bar")} == set(PALETTE[:2])
    data = " ".join(p.data)
    for v in ("41.2%", "68.7%", "79.1%", "30.9%", "57.4%", "70.2%", "36.0%", "12 min 34 s",
              "openai/clip-vit-base-patch32", "3d74acf9", "512"):
        assert v in data, v
    assert len(p.having("table")) == 1
    # one card per query, five figures each; the correct taxon highlighted where it is in the top 5
    assert len(p.having("article", "card")) == len(g)
    assert len(p.having("figure")) == 5 * len(g)
    in_top = sum(any(t["taxon"] == q["correct_taxon"] for t in q["top"]) for q in g)
    assert len(p.having("figure", "correct")) == in_top == len(g) - 1
    assert data.count("\u2713 correct") == in_top and "&" not in data and "<" not in data.replace(NASTY, "")
    assert data.count("found at rank 1") == 4 and "rank 3" in data and "rank 17" in data
    # placeholders for no photo, a missing id and an undecodable image
    assert [a["aria-label"] for a in p.having("div", "ph")] == ["no image", "image missing", "image unreadable"]
    assert "no score" in data and "cos 0.310" in data


def test_chance_stands_beside_each_accuracy(page):
    """Each subset's top-k accuracy with its chance level in the table and as a dashed mark on its bar; the mean
    top-1 chance beside the task score. Without chance levels, nothing is made up."""
    text, _ = page
    rows = dict(re.findall(r"</span>(\w+)</td>(.*?)</tr>", text))
    for name, s in results()["subsets"].items():
        cells = re.findall(r"<td>([^<]*)(?:<span class=\"chance\">([^<]*)</span>)?</td>", rows[name])
        want = [(f"{100 * s[f'taxon_top_{k}_accuracy']:.1f}% ", f"chance {100 * s[f'chance_top_{k}']:.1f}%")
                for k in (1, 5, 10)]
        assert cells[1:] == want, cells
    assert len(Page(text).having("line", "chance")) == 3 * 2
    assert 'task score (mean top-1 over subsets): <b>36.0%</b> <span class="chance">chance 1.1%</span>' in text
    bare = render({"subsets": {"unseen_species": {"taxon_top_1_accuracy": 0.5}}}, [], {})
    assert "chance" not in bare.replace(".chance{", "")


def test_images_are_small_inline_thumbnails(page):
    text, g = page
    imgs = Page(text).having("img")
    assert len(imgs) == 5 * len(g) - 3
    for a in imgs:
        assert a["src"].startswith("data:image/jpeg;base64,")
        with Image.open(io.BytesIO(base64.b64decode(a["src"].split(",", 1)[1]))) as im:
            assert max(im.size) <= THUMB_PX and im.format == "JPEG"
    assert "http://" not in text and "https://" not in text and "url(" not in text


def test_text_is_escaped(page):
    text, _ = page
    p = Page(text)
    assert not p.having("script")
    assert "<script>" not in text and "&lt;script&gt;alert(1)&lt;/script&gt;" in text
    assert NASTY in " ".join(p.data)  # reads back exactly, quotes included
    assert any(a.get("alt") == NASTY for a in p.having("img"))


def test_missing_fields_and_empty_gallery():
    text = render({}, [], {})
    p = Page(text)
    assert not p.errors and len(p.having("svg")) == 1 and not p.having("article")
    text = render({"subsets": {"unseen_species": {"taxon_top_1_accuracy": 0.5}}, "model": {"name": "m"}},
                  [{"top": [{"taxon": "x", "score": 0.1, "best_id": "a"}]}], {"a": b""})
    assert len(Page(text).having("rect", "bar")) == 1 and "n/a" in text


def test_forty_queries_stay_under_two_megabytes():
    # 200 distinct photo crops, as if every top-5 taxon of every query had its own best photo
    srcs = [Image.open(p).convert("RGB") for p in sorted(PICTURES.glob("*.jpg"))]
    images = {}
    for i in range(200):
        im = srcs[i % len(srcs)]
        s = int(min(im.size) * (0.6 + 0.4 * ((i // len(srcs)) % 4) / 3))
        x, y = (i * 37) % (im.width - s + 1), (i * 53) % (im.height - s + 1)
        buf = io.BytesIO()
        im.crop((x, y, x + s, y + s)).resize((500, 500)).save(buf, "JPEG", quality=90)
        images[f"p{i}"] = buf.getvalue()
    g = [{"subset": "unseen_species", "query_id": f"q{q}", "text": "a photo of " + "a bird " * 20,
          "correct_taxon": f"taxon {q * 5}", "rank_of_correct": 1,
          "top": [{"taxon": f"taxon {q * 5 + j}", "score": 0.3, "best_id": f"p{q * 5 + j}"} for j in range(5)]}
         for q in range(40)]
    size = len(render(results(), g, images).encode())
    assert size < 2_000_000, size


def _chromium():
    return shutil.which("chromium") or (Path("/usr/bin/chromium").exists() and "/usr/bin/chromium")


def test_screenshot(page, tmp_path):
    exe = _chromium()
    if not exe:
        pytest.skip("chromium not installed")
    html, png = tmp_path / "report.html", tmp_path / "report.png"
    html.write_text(page[0], encoding="utf-8")
    cmd = [exe, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
           "--disable-background-networking", "--disable-component-update", "--disable-sync",
           f"--user-data-dir={tmp_path / 'profile'}", "--hide-scrollbars", "--window-size=1280,2000",
           f"--screenshot={png}", html.as_uri()]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert png.exists(), proc.stderr[-2000:]
    with Image.open(png) as im:
        assert im.size == (1280, 2000)
        colours = {c for _, c in im.convert("RGB").getcolors(maxcolors=1 << 24)}
    assert len(colours) > 1000  # text, chart and photos, not a blank page
    for hex_ in PALETTE[:2]:  # both bar colours are on screen
        assert tuple(int(hex_[i:i + 2], 16) for i in (1, 3, 5)) in colours, hex_
