"""The eval-biovita HTML report (mieb_ray/page.py's style): `render(results, gallery, images)` returns the page: a
header (model, task score, time), the taxon top-k accuracy per subset as an SVG grouped bar chart and a table, each
beside its chance level when the results give it (`chance_top_<k>`: what random embeddings score, about k/100),
and a gallery of query cards with each query's top-5 taxa and their best photos. No JavaScript and no external
URL; every text is escaped.
"""

from __future__ import annotations

from html import escape

from mieb_ray.page import CHANCE_LINE, PALETTE, duration, num, pct, scalar, text, thumbnail
from mieb_ray.page import CSS as BASE_CSS

KS = (1, 5, 10)
CSS = BASE_CSS + ".chance{color:#666;font-size:12px}\n"


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
    fields += [(k, v) for k, v in model.items() if k not in ("name", "revision", "dim") and scalar(v)]
    fields.append(("evaluation time", duration(results.get("evaluation_time"))))
    meta = "".join(f"<span>{escape(k)}: <b>{escape(text(v))}</b></span>" for k, v in fields)
    chances = [num(s.get("chance_top_1")) for s in (results.get("subsets") or {}).values()]
    chance = sum(chances) / len(chances) if chances and None not in chances else None
    return (f"<header><h1>{escape(title)}</h1><div class=\"meta\">{meta}</div>"
            f"<div class=\"score\">task score (mean top-1 over subsets): "
            f"<b>{escape(pct(results.get('task_score')))}</b>{_chance(chance)}</div></header>")


def _chance(v) -> str:
    """A chance level beside an accuracy; nothing when unknown."""
    return "" if num(v) is None else f" <span class=\"chance\">chance {pct(v)}</span>"


def _chart(subsets: dict) -> str:
    """An SVG grouped bar chart: one group per k, one bar per subset with a dashed mark at its chance level, y
    from 0 to 100 %."""
    names = list(subsets)
    w, h, left, right, top, bottom = 620, 320, 52, 12, 44, 34
    ph, pw = h - top - bottom, w - left - right
    group_w = pw / len(KS)
    bar_w = min(56.0, group_w * 0.8 / max(1, len(names)))
    out = [f"<svg width=\"{w}\" height=\"{h}\" viewBox=\"0 0 {w} {h}\" "
           f"role=\"img\" aria-labelledby=\"chart-title\" font-family=\"DejaVu Sans,sans-serif\" font-size=\"12\">",
           "<title id=\"chart-title\">Taxon top-1, top-5 and top-10 accuracy per subset</title>"]
    for level in range(0, 101, 20):  # gridlines and y labels
        y = top + ph * (1 - level / 100)
        out.append(f"<line x1=\"{left}\" x2=\"{w - right}\" y1=\"{y:.1f}\" y2=\"{y:.1f}\" "
                   f"stroke=\"{'#888' if level == 0 else '#e2e2e2'}\"/>"
                   f"<text x=\"{left - 6}\" y=\"{y + 4:.1f}\" text-anchor=\"end\" fill=\"#555\">{level}%</text>")
    out.append(f"<text transform=\"translate(13 {top + ph / 2:.0f}) rotate(-90)\" text-anchor=\"middle\" "
               f"fill=\"#555\">accuracy</text>")
    for g, k in enumerate(KS):
        x0 = left + g * group_w + (group_w - bar_w * len(names)) / 2
        for i, name in enumerate(names):
            v = num(subsets[name].get(f"taxon_top_{k}_accuracy"))
            x = x0 + i * bar_w
            if v is None:
                out.append(f"<text x=\"{x + bar_w / 2:.1f}\" y=\"{top + ph - 4}\" text-anchor=\"middle\" "
                           f"fill=\"#777\">n/a</text>")
                continue
            bh = ph * min(max(v, 0.0), 1.0)
            out.append(f"<rect class=\"bar\" x=\"{x + 2:.1f}\" y=\"{top + ph - bh:.1f}\" width=\"{bar_w - 4:.1f}\" "
                       f"height=\"{bh:.1f}\" fill=\"{PALETTE[i % len(PALETTE)]}\">"
                       f"<title>{escape(name)} top-{k}: {pct(v)}</title></rect>"
                       f"<text x=\"{x + bar_w / 2:.1f}\" y=\"{top + ph - bh - 4:.1f}\" text-anchor=\"middle\" "
                       f"fill=\"#1b1b1b\">{pct(v)}</text>")
            chance = num(subsets[name].get(f"chance_top_{k}"))
            if chance is not None:
                y = top + ph * (1 - min(max(chance, 0.0), 1.0))
                out.append(f"<line class=\"chance\" x1=\"{x + 2:.1f}\" x2=\"{x + bar_w - 2:.1f}\" y1=\"{y:.1f}\" "
                           f"y2=\"{y:.1f}\" {CHANCE_LINE}><title>{escape(name)} top-{k} chance: {pct(chance)}"
                           "</title></line>")
        out.append(f"<text x=\"{left + (g + 0.5) * group_w:.1f}\" y=\"{h - 12}\" text-anchor=\"middle\" "
                   f"font-weight=\"bold\">top-{k}</text>")
    lx = left
    for i, name in enumerate(names):  # legend, above the plot
        out.append(f"<rect x=\"{lx}\" y=\"12\" width=\"12\" height=\"12\" fill=\"{PALETTE[i % len(PALETTE)]}\"/>"
                   f"<text x=\"{lx + 17}\" y=\"22\">{escape(name)}</text>")
        lx += 30 + 8 * len(name)
    if any(num(s.get(f"chance_top_{k}")) is not None for s in subsets.values() for k in KS):
        out.append(f"<line x1=\"{lx}\" x2=\"{lx + 12}\" y1=\"18\" y2=\"18\" {CHANCE_LINE}/>"
                   f"<text x=\"{lx + 17}\" y=\"22\">chance</text>")
    out.append("</svg>")
    return "".join(out)


def _table(subsets: dict) -> str:
    rows = "".join(
        f"<tr><td><span class=\"swatch\" style=\"background:{PALETTE[i % len(PALETTE)]}\"></span>{escape(name)}</td>"
        f"<td>{escape(text(s.get('queries')))}</td>"
        + "".join(f"<td>{pct(s.get(f'taxon_top_{k}_accuracy'))}{_chance(s.get(f'chance_top_{k}'))}</td>"
                  for k in KS) + "</tr>"
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
    return (f"<article class=\"card\"><div class=\"head\"><span>{escape(text(q.get('subset')))} &middot; "
            f"query {escape(text(q.get('query_id')))}</span>{badge}</div>"
            f"<p class=\"query\">&ldquo;{escape(text(q.get('text')))}&rdquo;</p>"
            f"<p class=\"truth\">correct taxon: <b class=\"name\">{escape(text(correct))}</b></p>"
            f"<div class=\"top\">{figs}</div></article>")


def _figure(n: int, t: dict, is_correct: bool, images: dict[str, bytes], thumbs: dict[str, str | None]) -> str:
    name, best = text(t.get("taxon")), t.get("best_id")
    if best is not None and best not in thumbs and best in images:
        thumbs[best] = thumbnail(images[best])
    uri = thumbs.get(best) if best is not None else None
    if uri:
        pic = f"<img src=\"{uri}\" alt=\"{escape(name)}\" title=\"{escape(str(best))}\">"
    else:  # no photo for this taxon, or one that is missing or does not decode
        why = "no image" if best is None else ("image unreadable" if best in thumbs else "image missing")
        pic = f"<div class=\"ph\" role=\"img\" aria-label=\"{why}\">{why}</div>"
    score = num(t.get("score"))
    tick = "<span class=\"tick\">&#10003; correct</span>" if is_correct else ""
    cls = " class=\"correct\"" if is_correct else ""
    return (f"<figure{cls}>{pic}<figcaption>"
            f"<span class=\"rank\">#{n}</span> <span class=\"name\">{escape(name)}</span><br>"
            f"<span class=\"sc\">{'no score' if score is None else f'cos {score:.3f}'}</span>{tick}"
            f"</figcaption></figure>")


