"""The eval-biovita HTML report: one self-contained file (inline CSS and SVG, images as data: URIs).

`render(results, gallery, images)` returns the page: a header (model, task score, time), the taxon top-k
accuracy per subset as an SVG grouped bar chart and a table, and a gallery of query cards with each query's
top-5 taxa and their best photos. No JavaScript and no external URL; every text is escaped.
"""

from __future__ import annotations

import base64
import io
from html import escape

from PIL import Image, ImageOps

KS = (1, 5, 10)
THUMB_PX = 160  # longest side of a gallery thumbnail
THUMB_QUALITY = 80
# Okabe-Ito, safe for colour-blind readers: one colour per subset in the chart
PALETTE = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00")

CSS = """
*{box-sizing:border-box}
body{margin:0;padding:24px 32px;font:14px/1.45 "DejaVu Sans",system-ui,sans-serif;color:#1b1b1b;background:#f6f6f4}
h1{margin:0 0 6px;font-size:24px}
h2{margin:28px 0 10px;font-size:18px}
.meta{display:flex;flex-wrap:wrap;gap:6px 22px;color:#444}
.meta b{color:#1b1b1b}
.score{display:inline-block;margin-top:10px;padding:6px 12px;border-radius:6px;background:#fff;border:1px solid #ccc}
.score b{font-size:20px}
.summary{display:flex;flex-wrap:wrap;gap:24px;align-items:flex-start}
.panel{background:#fff;border:1px solid #ddd;border-radius:8px;padding:12px}
table{border-collapse:collapse}
th,td{padding:5px 12px;text-align:right;border-bottom:1px solid #e3e3e3}
th:first-child,td:first-child{text-align:left}
thead th{border-bottom:2px solid #999}
.swatch{display:inline-block;width:11px;height:11px;margin-right:6px;border-radius:2px;vertical-align:-1px}
.cards{display:grid;grid-template-columns:repeat(auto-fill,minmax(580px,1fr));gap:14px}
.card{background:#fff;border:1px solid #ddd;border-radius:8px;padding:12px 14px}
.head{display:flex;justify-content:space-between;gap:8px;color:#555;font-size:12px}
.badge{padding:1px 8px;border-radius:10px;font-weight:bold;white-space:nowrap}
.hit{background:#d7efe6;color:#00563f}
.miss{background:#fbe3d3;color:#8a3300}
.query{margin:6px 0;font-size:15px}
.truth{margin:0 0 8px;color:#444}
.top{display:grid;grid-template-columns:repeat(5,1fr);gap:8px}
figure{margin:0;padding:4px;border:2px solid transparent;border-radius:6px;min-width:0}
figure.correct{border-color:#009E73;background:#eef8f4}
.ph,figure img{display:block;width:100%;aspect-ratio:1;object-fit:cover;border-radius:4px;background:#e4e4e4}
.ph{display:flex;align-items:center;justify-content:center;color:#777;font-size:12px;text-align:center}
figcaption{font-size:12px;line-height:1.3;margin-top:4px;overflow-wrap:break-word}
.rank{color:#777}
.name{font-style:italic}
.sc{color:#555;font-variant-numeric:tabular-nums}
.tick{display:block;color:#00563f;font-weight:bold}
"""


def render(results: dict, gallery: list[dict], images: dict[str, bytes],
           title: str = "BioVITA text-to-image") -> str:
    thumbs: dict[str, str | None] = {}  # corpus id -> data URI (None: undecodable), each photo encoded once
    subsets = results.get("subsets") or {}
    parts = [
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">",
        f"<title>{escape(title)}</title><style>{CSS}</style></head><body>",
        _header(results, title),
        "<h2>Taxon top-k accuracy</h2><div class=\"summary\">",
        f"<div class=\"panel\">{_chart(subsets)}</div><div class=\"panel\">{_table(subsets)}</div></div>",
        f"<h2>Example queries ({len(gallery)})</h2><div class=\"cards\">",
        *(_card(q, images, thumbs) for q in gallery),
        "</div></body></html>\n",
    ]
    return "".join(parts)


def _header(results: dict, title: str) -> str:
    model = results.get("model") or {}
    fields = [("model", model.get("name")), ("revision", model.get("revision")), ("dim", model.get("dim"))]
    fields += [(k, v) for k, v in model.items() if k not in ("name", "revision", "dim") and _scalar(v)]
    fields.append(("evaluation time", _duration(results.get("evaluation_time"))))
    meta = "".join(f"<span>{escape(k)}: <b>{escape(_text(v))}</b></span>" for k, v in fields)
    return (f"<header><h1>{escape(title)}</h1><div class=\"meta\">{meta}</div>"
            f"<div class=\"score\">task score (mean top-1 over subsets): "
            f"<b>{escape(_pct(results.get('task_score')))}</b></div></header>")


def _chart(subsets: dict) -> str:
    """An SVG grouped bar chart: one group per k, one bar per subset, y from 0 to 100 %."""
    names = list(subsets)
    w, h, left, right, top, bottom = 620, 320, 52, 12, 44, 34
    ph, pw = h - top - bottom, w - left - right
    group_w = pw / len(KS)
    bar_w = min(56.0, group_w * 0.8 / max(1, len(names)))
    out = [f"<svg width=\"{w}\" height=\"{h}\" viewBox=\"0 0 {w} {h}\" "
           f"role=\"img\" aria-labelledby=\"chart-title\" font-family=\"DejaVu Sans,sans-serif\" font-size=\"12\">",
           "<title id=\"chart-title\">Taxon top-1, top-5 and top-10 accuracy per subset</title>"]
    for pct in range(0, 101, 20):  # gridlines and y labels
        y = top + ph * (1 - pct / 100)
        out.append(f"<line x1=\"{left}\" x2=\"{w - right}\" y1=\"{y:.1f}\" y2=\"{y:.1f}\" "
                   f"stroke=\"{'#888' if pct == 0 else '#e2e2e2'}\"/>"
                   f"<text x=\"{left - 6}\" y=\"{y + 4:.1f}\" text-anchor=\"end\" fill=\"#555\">{pct}%</text>")
    out.append(f"<text transform=\"translate(13 {top + ph / 2:.0f}) rotate(-90)\" text-anchor=\"middle\" "
               f"fill=\"#555\">accuracy</text>")
    for g, k in enumerate(KS):
        x0 = left + g * group_w + (group_w - bar_w * len(names)) / 2
        for i, name in enumerate(names):
            v = _num(subsets[name].get(f"taxon_top_{k}_accuracy"))
            x = x0 + i * bar_w
            if v is None:
                out.append(f"<text x=\"{x + bar_w / 2:.1f}\" y=\"{top + ph - 4}\" text-anchor=\"middle\" "
                           f"fill=\"#777\">n/a</text>")
                continue
            bh = ph * min(max(v, 0.0), 1.0)
            out.append(f"<rect class=\"bar\" x=\"{x + 2:.1f}\" y=\"{top + ph - bh:.1f}\" width=\"{bar_w - 4:.1f}\" "
                       f"height=\"{bh:.1f}\" fill=\"{PALETTE[i % len(PALETTE)]}\">"
                       f"<title>{escape(name)} top-{k}: {_pct(v)}</title></rect>"
                       f"<text x=\"{x + bar_w / 2:.1f}\" y=\"{top + ph - bh - 4:.1f}\" text-anchor=\"middle\" "
                       f"fill=\"#1b1b1b\">{_pct(v)}</text>")
        out.append(f"<text x=\"{left + (g + 0.5) * group_w:.1f}\" y=\"{h - 12}\" text-anchor=\"middle\" "
                   f"font-weight=\"bold\">top-{k}</text>")
    lx = left
    for i, name in enumerate(names):  # legend, above the plot
        out.append(f"<rect x=\"{lx}\" y=\"12\" width=\"12\" height=\"12\" fill=\"{PALETTE[i % len(PALETTE)]}\"/>"
                   f"<text x=\"{lx + 17}\" y=\"22\">{escape(name)}</text>")
        lx += 30 + 8 * len(name)
    out.append("</svg>")
    return "".join(out)


def _table(subsets: dict) -> str:
    rows = "".join(
        f"<tr><td><span class=\"swatch\" style=\"background:{PALETTE[i % len(PALETTE)]}\"></span>{escape(name)}</td>"
        f"<td>{escape(_text(s.get('queries')))}</td>"
        + "".join(f"<td>{_pct(s.get(f'taxon_top_{k}_accuracy'))}</td>" for k in KS) + "</tr>"
        for i, (name, s) in enumerate(subsets.items()))
    heads = "".join(f"<th>top-{k}</th>" for k in KS)
    return (f"<table><caption>taxon top-k accuracy per subset</caption>"
            f"<thead><tr><th>subset</th><th>queries</th>{heads}</tr></thead><tbody>{rows}</tbody></table>")


def _card(q: dict, images: dict[str, bytes], thumbs: dict[str, str | None]) -> str:
    correct = q.get("correct_taxon")
    rank = q.get("rank_of_correct")
    if rank == 1:
        badge = "<span class=\"badge hit\">&#10003; found at rank 1</span>"
    elif rank is None:
        badge = "<span class=\"badge miss\">correct taxon not ranked</span>"
    else:
        badge = f"<span class=\"badge miss\">correct taxon at rank {escape(str(rank))}</span>"
    figs = "".join(_figure(n, t, t.get("taxon") == correct, images, thumbs)
                   for n, t in enumerate((q.get("top") or [])[:5], 1))
    return (f"<article class=\"card\"><div class=\"head\"><span>{escape(_text(q.get('subset')))} &middot; "
            f"query {escape(_text(q.get('query_id')))}</span>{badge}</div>"
            f"<p class=\"query\">&ldquo;{escape(_text(q.get('text')))}&rdquo;</p>"
            f"<p class=\"truth\">correct taxon: <b class=\"name\">{escape(_text(correct))}</b></p>"
            f"<div class=\"top\">{figs}</div></article>")


def _figure(n: int, t: dict, is_correct: bool, images: dict[str, bytes], thumbs: dict[str, str | None]) -> str:
    name, best = _text(t.get("taxon")), t.get("best_id")
    if best is not None and best not in thumbs and best in images:
        thumbs[best] = thumbnail(images[best])
    uri = thumbs.get(best) if best is not None else None
    if uri:
        pic = f"<img src=\"{uri}\" alt=\"{escape(name)}\" title=\"{escape(str(best))}\">"
    else:  # no photo for this taxon, or one that is missing or does not decode
        why = "no image" if best is None else ("image unreadable" if best in thumbs else "image missing")
        pic = f"<div class=\"ph\" role=\"img\" aria-label=\"{why}\">{why}</div>"
    score = _num(t.get("score"))
    tick = "<span class=\"tick\">&#10003; correct</span>" if is_correct else ""
    cls = " class=\"correct\"" if is_correct else ""
    return (f"<figure{cls}>{pic}<figcaption>"
            f"<span class=\"rank\">#{n}</span> <span class=\"name\">{escape(name)}</span><br>"
            f"<span class=\"sc\">{'no score' if score is None else f'cos {score:.3f}'}</span>{tick}"
            f"</figcaption></figure>")


def thumbnail(data: bytes) -> str | None:
    """A JPEG data: URI of the picture shrunk to THUMB_PX; None when it does not decode."""
    try:
        with Image.open(io.BytesIO(data)) as im:
            im.draft("RGB", (THUMB_PX * 2, THUMB_PX * 2))  # JPEG: decode at a reduced scale, much faster
            im = ImageOps.exif_transpose(im)
            if im.mode in ("RGBA", "LA", "P", "PA"):  # transparency onto white
                im = im.convert("RGBA")
                flat = Image.new("RGB", im.size, "white")
                flat.paste(im, mask=im.getchannel("A"))
                im = flat
            im = im.convert("RGB")
            im.thumbnail((THUMB_PX, THUMB_PX), Image.Resampling.LANCZOS)
            buf = io.BytesIO()
            im.save(buf, "JPEG", quality=THUMB_QUALITY, optimize=True)
    except Exception:  # noqa: BLE001 - any undecodable input (truncated, not an image, bomb) is a placeholder
        return None
    return "data:image/jpeg;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def _num(v) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and v == v else None


def _pct(v) -> str:
    v = _num(v)
    return "n/a" if v is None else f"{100 * v:.1f}%"


def _scalar(v) -> bool:
    return isinstance(v, (str, int, float, bool)) or v is None


def _text(v) -> str:
    return "n/a" if v is None else str(v)


def _duration(s) -> str:
    s = _num(s)
    if s is None:
        return "n/a"
    if s < 60:
        return f"{s:.1f} s"
    m, sec = divmod(round(s), 60)
    return f"{m} min {sec:02d} s" if m < 60 else f"{m // 60} h {m % 60:02d} min"
