"""The eval-zeroshot HTML report: one self-contained file (inline CSS and SVG, images as data: URIs).

`render(summary, gallery, images)` returns the page: a header (model, mean accuracy under both prompt sets and
chance), per-task accuracy with mteb's prompts and with the fixed prompts beside chance (1 / classes: what a
model guessing at random scores) as an SVG bar chart and a table, and a gallery of images misclassified under
mteb's prompts, grouped by task (how many shown of how many misclassified), with the prompts shown escaped so
their defects (stray newlines...) are visible. No JavaScript and no external URL; every text is escaped.
"""

from __future__ import annotations

import math
from html import escape

from mieb_ray.page import CHANCE_LINE, PALETTE, duration, thumbnail
from mieb_ray.page import CSS as BASE_CSS

DASH = "\u2013"  # a missing or non-finite value
SETS = (("mteb", "mteb prompts", PALETTE[1]), ("fixed", "fixed prompts", PALETTE[0]))
VISIBLE = {"\n": "\\n", "\r": "\\r", "\t": "\\t", "\\": "\\\\"}

CSS = BASE_CSS + """
td.up{color:#00734f;font-weight:bold}
td.down{color:#b03a00;font-weight:bold}
.note{max-width:900px;color:#333}
.cards{grid-template-columns:repeat(auto-fill,minmax(400px,1fr))}
.card{display:grid;grid-template-columns:160px 1fr;gap:12px}
.card .ph,.card img{width:160px;height:160px;object-fit:cover;border-radius:4px;background:#e4e4e4}
.card img{display:block}
.card .tick{display:inline}
.key{color:#666;font-size:12px;overflow-wrap:anywhere}
.card ol{margin:4px 0;padding-left:20px}
.card li.true{color:#00563f;font-weight:bold}
.prompt{font-family:"DejaVu Sans Mono",monospace;font-size:12px;color:#444;overflow-wrap:anywhere}
.esc{background:#fbe3d3;color:#8a3300;border-radius:2px;padding:0 1px}
.cross{color:#8a3300;font-weight:bold}
"""

NOTE = (
    "<p class=\"note\">The <b>mteb prompts</b> column is what MIEB reports: each "
    "class is turned into a caption by mteb's own prompts, defects included. The <b>fixed prompts</b> column "
    "scores the same images against the same classes named correctly: no stray newlines, a/an agreement, "
    "corrected spelling and casing, words instead of snake_case or CamelCase identifiers. The "
    "<b>difference</b> (fixed minus mteb, in percentage points) is what the prompt defects cost this model.</p>"
)


def render(summary: dict, gallery: list[dict], images: dict[str, bytes]) -> str:
    title = summary.get("title") or "MIEB zero-shot classification"
    tasks = summary.get("tasks") or []
    return "".join([
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">",
        f"<title>{escape(title)}</title><style>{CSS}</style></head><body>",
        _header(summary, title, tasks),
        "<h2>Accuracy per task</h2>", NOTE,
        f"<div class=\"summary\"><div class=\"panel\">{_chart(tasks)}</div>",
        f"<div class=\"panel\">{_table(tasks)}</div></div>",
        "<h2>Misclassified images under mteb's prompts</h2>",
        _gallery(gallery, images, tasks),
        "</body></html>\n",
    ])


def _chance(task: dict) -> float | None:
    """The accuracy of a random guess among the task's classes."""
    classes = _num(task.get("classes"))
    return 1 / classes if classes and classes >= 1 else None


def _header(summary: dict, title: str, tasks: list[dict]) -> str:
    model = summary.get("model") or {}
    fields = [("model", model.get("name")), ("revision", model.get("revision")), ("tasks", len(tasks)),
              ("evaluation time", _secs(summary.get("evaluation_time")))]
    meta = "".join(f"<span>{escape(k)}: <b>{escape(str(v))}</b></span>" for k, v in fields if v not in (None, ""))
    mean = summary.get("mean") or {}
    scores = "".join(f"<div class=\"score\">{label}: <b>{_pct(mean.get(s))}</b></div> " for s, label, _ in SETS)
    chances = [c for c in map(_chance, tasks) if c is not None]
    chance = sum(chances) / len(chances) if chances else None
    return (f"<header><h1>{escape(title)}</h1><div class=\"meta\">{meta}</div>"
            f"<p>mean accuracy over the tasks</p>{scores}"
            f"<div class=\"score\">difference: <b>{_pp(mean.get('difference'))}</b></div> "
            f"<div class=\"score\">chance: <b>{_pct(chance)}</b></div></header>")


def _chart(tasks: list[dict]) -> str:
    """An SVG horizontal bar chart: per task one bar per prompt set and a dashed mark at chance, x from 0 to
    100 %."""
    w, left, right, top, bar, gap = 720, 210, 60, 40, 13, 10
    pw = w - left - right
    h = top + len(tasks) * (2 * bar + gap) + 24
    out = [f"<svg width=\"{w}\" height=\"{h}\" viewBox=\"0 0 {w} {h}\" role=\"img\" aria-labelledby=\"chart-title\"",
           " font-family=\"DejaVu Sans,sans-serif\" font-size=\"12\">",
           "<title id=\"chart-title\">Accuracy per task with mteb's prompts and with the fixed prompts</title>"]
    for pct in range(0, 101, 20):  # gridlines and x labels
        x = left + pw * pct / 100
        out.append(f"<line x1=\"{x:.1f}\" x2=\"{x:.1f}\" y1=\"{top - 6}\" y2=\"{h - 20}\" "
                   f"stroke=\"{'#888' if pct == 0 else '#e2e2e2'}\"/>"
                   f"<text x=\"{x:.1f}\" y=\"{h - 6}\" text-anchor=\"middle\" fill=\"#555\">{pct}%</text>")
    for i, (_, label, colour) in enumerate(SETS):  # legend, above the plot
        lx = left + i * 140
        out.append(f"<rect x=\"{lx}\" y=\"10\" width=\"12\" height=\"12\" fill=\"{colour}\"/>"
                   f"<text x=\"{lx + 17}\" y=\"20\">{label}</text>")
    lx = left + len(SETS) * 140
    out.append(f"<line x1=\"{lx + 6}\" x2=\"{lx + 6}\" y1=\"8\" y2=\"24\" {CHANCE_LINE}/>"
               f"<text x=\"{lx + 17}\" y=\"20\">chance (1 / classes)</text>")
    for t_i, t in enumerate(tasks):
        y0 = top + t_i * (2 * bar + gap)
        name = escape(str(t.get("task")))
        out.append(f"<text x=\"{left - 8}\" y=\"{y0 + bar + 4}\" text-anchor=\"end\">{name}</text>")
        for i, (s, label, colour) in enumerate(SETS):
            v, y = _num((t.get(s) or {}).get("accuracy")), y0 + i * bar
            bw = 0.0 if v is None else pw * min(max(v, 0.0), 1.0)
            out.append(f"<rect x=\"{left}\" y=\"{y}\" width=\"{bw:.1f}\" height=\"{bar - 2}\" fill=\"{colour}\">"
                       f"<title>{name}, {label}: {_pct(v)}</title></rect>"
                       f"<text x=\"{left + bw + 4:.1f}\" y=\"{y + bar - 3}\" font-size=\"11\">{_pct(v)}</text>")
        chance = _chance(t)
        if chance is not None:
            x = left + pw * chance
            out.append(f"<line class=\"chance\" x1=\"{x:.1f}\" x2=\"{x:.1f}\" y1=\"{y0 - 2}\" "
                       f"y2=\"{y0 + 2 * bar}\" {CHANCE_LINE}><title>{name}, chance: {_pct(chance)}</title></line>")
    out.append("</svg>")
    return "".join(out)


def _table(tasks: list[dict]) -> str:
    rows = []
    for t in tasks:
        d = _num(t.get("difference"))
        cls = "" if not d else (" class=\"up\"" if d > 0 else " class=\"down\"")
        cells = [_text(t.get(k)) for k in ("split", "images", "classes")]
        cells += [_pct(_chance(t))] + [_pct((t.get(s) or {}).get("accuracy")) for s, _, _ in SETS]
        tail = "".join(f"<td>{_pct((t.get(s) or {}).get('f1'))}</td>" for s, _, _ in SETS)
        rows.append(f"<tr><td>{escape(str(t.get('task')))}</td>" + "".join(f"<td>{c}</td>" for c in cells)
                    + f"<td{cls}>{_pp(d)}</td>{tail}</tr>")
    return ("<table><caption>accuracy and macro f1 per task</caption><thead><tr><th>task</th><th>split</th>"
            "<th>images</th><th>classes</th><th>chance (1 / classes)</th><th>accuracy (mteb prompts)</th>"
            "<th>accuracy (fixed prompts)</th>"
            "<th>difference</th><th>f1 (mteb prompts)</th><th>f1 (fixed prompts)</th></tr></thead>"
            f"<tbody>{''.join(rows)}</tbody></table>")


def _gallery(gallery: list[dict], images: dict[str, bytes], tasks: list[dict]) -> str:
    if not gallery:
        return "<p class=\"note\">No misclassified images to show.</p>"
    groups: dict[str, list[dict]] = {}
    for g in gallery:  # by task, in order of first appearance
        groups.setdefault(str(g.get("task")), []).append(g)
    misclassified = {str(t.get("task")): t.get("misclassified") for t in tasks}
    return "".join(f"<h3>{escape(task)} ({_shown(len(cards), misclassified.get(task))})</h3><div class=\"cards\">"
                   + "".join(_card(c, images) for c in cards) + "</div>" for task, cards in groups.items())


def _shown(shown: int, of) -> str:
    """"8 of 94 shown": the gallery holds the first few; a summary without the count says what it can."""
    return f"{shown} of {of:,} shown" if isinstance(of, int) and of >= shown else f"{shown} shown"


def _card(c: dict, images: dict[str, bytes]) -> str:
    key, true = str(c.get("key")), _text(c.get("true"))
    uri = thumbnail(images[key]) if key in images else None
    if uri:
        pic = f"<img src=\"{uri}\" alt=\"{escape(true)}\" title=\"{escape(key)}\">"
    else:
        why = "image unreadable" if key in images else "image missing"
        pic = f"<div class=\"ph\" role=\"img\" aria-label=\"{why}\">{why}</div>"
    items = []
    for t in (c.get("top") or [])[:3]:
        cls = " class=\"true\"" if str(t.get("class")) == true else ""
        score = _num(t.get("score"))
        items.append(f"<li{cls}>{escape(_text(t.get('class')))} <span class=\"sc\">"
                     f"{DASH if score is None else f'{score:.3f}'}</span><br>"
                     f"<span class=\"prompt\">&ldquo;{_visible(t.get('prompt'))}&rdquo;</span></li>")
    mark = ("<span class=\"tick\">&#10003; correct</span>" if c.get("fixed_correct")
            else "<span class=\"cross\">&#10007; wrong</span>")
    return (f"<article class=\"card\">{pic}<div><div class=\"key\">{escape(key)}</div>"
            f"<p class=\"truth\">true class: <b>{escape(true)}</b></p>"
            f"<div>top-3 with mteb's prompts:</div><ol>{''.join(items)}</ol>"
            f"<div>fixed prompts predict: <b>{escape(_text(c.get('fixed_pred')))}</b> {mark}</div></div></article>")


def _visible(s) -> str:
    """The prompt escaped for HTML, with newlines, tabs and other control characters shown as highlighted escapes."""
    out = []
    for ch in _text(s):
        esc = VISIBLE.get(ch) or (repr(ch)[1:-1] if not ch.isprintable() and ch != " " else None)
        out.append(f"<span class=\"esc\">{escape(esc)}</span>" if esc else escape(ch))
    return "".join(out)


def _num(v) -> float | None:
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    return float(v) if ok else None


def _secs(v) -> str:
    v = _num(v)
    return DASH if v is None else duration(v)


def _pct(v) -> str:
    v = _num(v)
    return DASH if v is None else f"{100 * v:.2f}%"


def _pp(v) -> str:
    v = _num(v)
    return DASH if v is None else f"{100 * v:+.2f} pp"


def _text(v) -> str:
    return DASH if v is None else str(v)
