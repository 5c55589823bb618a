"""The eval-zeroshot HTML report: a self-contained page from a summary, a gallery and image bytes."""

from __future__ import annotations

import io
import math
import re
from html.parser import HTMLParser

from PIL import Image

from mieb_ray.evals.zeroshot_report import render


def _png() -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (64, 48), (200, 30, 30)).save(buf, "PNG")
    return buf.getvalue()


def _metrics(acc: float) -> dict:
    return {"accuracy": acc, "f1": acc - 0.01, "f1_weighted": acc, "precision": acc, "recall": acc, "ap": None}


SUMMARY = {
    "title": "MIEB zero-shot classification",
    "model": {"name": "openai/clip-vit-base-patch32", "revision": "3d74acf9"},
    "evaluation_time": 123.4,
    "tasks": [
        {"task": "CIFAR100ZeroShot", "split": "test", "images": 10000, "classes": 100,
         "mteb": _metrics(0.6123), "fixed": _metrics(0.6333), "difference": 0.021, "misclassified": 3877},
        {"task": "GTSRBZeroShot", "split": "test", "images": 12630, "classes": 43,
         "mteb": _metrics(0.3259), "fixed": _metrics(0.3011), "difference": -0.0248},
        {"task": "Country211ZeroShot", "split": "test", "images": 21100, "classes": 211,
         "mteb": _metrics(0.1712), "fixed": {**_metrics(0.17), "accuracy": float("nan")}, "difference": None},
    ],
    "mean": {"mteb": 0.3698, "fixed": 0.4672, "difference": 0.0974},
}

GALLERY = [
    {"task": "CIFAR100ZeroShot", "key": "cifar100/test/17", "true": "crab",
     "top": [{"class": "lobster", "prompt": "a photo of a lobster.", "score": 0.41},
             {"class": "crab", "prompt": "a photo of a crab.", "score": 0.39},
             {"class": "spider", "prompt": "a photo of a spider.", "score": 0.2}],
     "fixed_pred": "crab", "fixed_correct": True},
    {"task": "GTSRBZeroShot", "key": "gtsrb/test/3", "true": "<b>stop</b>",
     "top": [{"class": "yield", "prompt": "a zoomed in photo of a \"yield\n\" traffic sign.", "score": 0.3}],
     "fixed_pred": "yield", "fixed_correct": False},
    {"task": "CIFAR100ZeroShot", "key": "cifar100/test/99", "true": "apple",
     "top": [{"class": "pear", "prompt": "a photo of a pear.", "score": float("inf")}],
     "fixed_pred": "pear", "fixed_correct": False},
]

IMAGES = {"cifar100/test/17": _png(), "gtsrb/test/3": b"not an image at all"}  # cifar100/test/99 is missing


def _parse(page: str) -> None:
    class Strict(HTMLParser):
        def error(self, message):  # pragma: no cover - Python < 3.10 only
            raise AssertionError(message)

    p = Strict()
    p.feed(page)
    p.close()


def test_report_renders_a_self_contained_page():
    page = render(SUMMARY, GALLERY, IMAGES)
    _parse(page)
    assert page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>")
    for t in SUMMARY["tasks"]:
        assert t["task"] in page
    assert "openai/clip-vit-base-patch32" in page and "3d74acf9" in page and "2 min 03 s" in page
    assert "61.23%" in page and "63.33%" in page  # both accuracy values
    assert "+2.10 pp" in page and "-2.48 pp" in page and "+9.74 pp" in page  # signed differences
    assert re.search(r'<td class="up">\+2\.10 pp</td>', page) and re.search(r'<td class="down">-2\.48 pp</td>', page)
    assert "\u2013" in page  # the NaN accuracy, the None difference, the infinite score
    assert "<svg" in page and "</svg>" in page
    assert page.count("data:image/") == 1  # the one decodable image
    assert "image unreadable" in page and "image missing" in page
    assert '<span class="esc">\\n</span>' in page  # the newline in a prompt shown as an escape
    assert "<script" not in page.lower()
    assert not re.search(r"https?://", re.sub(r'xmlns(:\w+)?="[^"]*"', "", page))
    assert "<b>stop</b>" not in page and "&lt;b&gt;stop&lt;/b&gt;" in page
    assert page.index("cifar100/test/99") < page.index("gtsrb/test/3")  # grouped by task


def test_chance_stands_beside_each_accuracy():
    """1 / classes in each task's row, between its classes and its accuracies, and as a dashed mark on its bars;
    their mean beside the mean accuracies: a model at chance reads as one."""
    page = render(SUMMARY, GALLERY, IMAGES)
    for t in SUMMARY["tasks"]:
        row = re.search(rf"<tr><td>{t['task']}</td>(.*?)</tr>", page).group(1)
        cells = re.findall(r"<td[^>]*>([^<]*)</td>", row)
        assert cells[2:4] == [str(t["classes"]), f"{100 / t['classes']:.2f}%"], cells
        assert f"<title>{t['task']}, chance: {100 / t['classes']:.2f}%</title>" in page
    mean = sum(1 / t["classes"] for t in SUMMARY["tasks"]) / len(SUMMARY["tasks"])
    assert f'<div class="score">chance: <b>{100 * mean:.2f}%</b></div>' in page
    assert "<th>chance (1 / classes)</th><th>accuracy (mteb prompts)</th>" in page


def test_the_gallery_says_how_many_of_the_misclassified_it_shows():
    page = render(SUMMARY, GALLERY, IMAGES)
    shown = sum(g["task"] == "CIFAR100ZeroShot" for g in GALLERY)
    assert f"<h3>CIFAR100ZeroShot ({shown} of 3,877 shown)</h3>" in page
    assert "<h3>GTSRBZeroShot (1 shown)</h3>" in page  # a summary without the count: what it can say
    assert "<h2>Misclassified images under mteb's prompts</h2>" in page


def test_report_renders_empty_and_bare_inputs():
    for summary in ({"tasks": [], "mean": {}}, {"model": None, "tasks": [], "evaluation_time": math.inf},
                    {"tasks": [{"task": "X", "mteb": {}, "fixed": None}]}):
        page = render(summary, [], {})
        _parse(page)
        assert "MIEB zero-shot classification" in page and "<svg" in page and "No misclassified images" in page
        assert "n/a" not in page and "nan%" not in page and "inf" not in page
