"""The audit's HTML page: one self-contained file (inline CSS, images as data: URIs, no JavaScript).

A header (detectors, threshold, totals), a table per eval task (eval images affected per detector and their
share of the split), a table per train dataset (rows flagged), then the pairs side by side, grouped by
detector and sorted by score, so a person can judge where the near-duplicate threshold should be. A detector
that did not run (near without embeddings: the summary's threshold is None) shows "—", not a count of 0.
"""

from __future__ import annotations

from html import escape

from mieb_ray import formats
from mieb_ray.page import CSS as BASE_CSS
from mieb_ray.page import thumbnail

__all__ = ["render", "thumbnail"]

CSS = BASE_CSS + """
.pairs{display:grid;grid-template-columns:repeat(auto-fill,minmax(360px,1fr));gap:12px}
.pair .imgs{display:grid;grid-template-columns:1fr 1fr;gap:8px}
.note{color:#555;max-width:70em}
"""
WHAT = {"exact": "the same bytes (sha256)",
        "pixels": "the same decoded pixels after EXIF orientation (a re-encode that lost nothing, a new container)",
        "pdq": "the same picture by its PDQ perceptual hash (a re-encode, resize, small crop, mirror, colour edit): "
               "256 bits within the distance shown, score = 1 - distance / 256",
        "near": "nearest train images by embedding cosine at or above the threshold"}
NOT_RUN = "\u2014"
WHY_NOT = {"near": "not run: it needs --model, or --train-embeddings and --against-embeddings"}


def ran(summary: dict) -> tuple[str, ...]:
    """The detectors this audit ran: the hashes always, near when it had embeddings (a threshold)."""
    return formats.DETECTORS if summary.get("threshold") is not None else formats.HASH_DETECTORS


def render(summary: dict, pairs: list[dict]) -> str:
    totals = summary["totals"]
    threshold = summary.get("threshold")
    done = ran(summary)
    body = ["<h1>mieb-ray audit: train rows that duplicate an eval image</h1>",
            '<div class="meta">'
            f"<span>train rows flagged <b>{totals['train_rows_flagged']:,}</b></span>"
            f"<span>eval images affected <b>{totals['eval_images_affected']:,}</b></span>"
            + "".join(f"<span>{m} pairs <b>{totals['pairs'].get(m, 0):,}</b></span>" if m in done else
                      f"<span>{m} pairs <b>{NOT_RUN}</b></span>" for m in formats.DETECTORS)
            + f"<span>pdq threshold <b>distance ≤ {summary.get('pdq_threshold')}</b></span>"
            + f"<span>near threshold <b>{'not run' if threshold is None else f'cosine ≥ {threshold}'}</b></span>"
            "</div>",
            '<p class="note">Exact and pixel matches are proof of a duplicate. A pdq or near match is a threshold, '
            "not a proof: look at the pairs below, lowest scores last, and choose the threshold where they stop being "
            "copies.</p>",
            _tasks(summary["eval_tasks"], done), _datasets(summary["train_datasets"], done), _groups(summary)]
    for method in formats.DETECTORS:
        if method not in done:
            body.append(f"<h2>{method}: {escape(WHAT[method])} ({NOT_RUN})</h2><p>{escape(WHY_NOT[method])}</p>")
            continue
        mine = [p for p in pairs if p["method"] == method]
        body.append(f"<h2>{method}: {escape(WHAT[method])} ({totals['pairs'].get(method, 0):,} pairs"
                    f"{f', the first {len(mine)} shown' if len(mine) < totals['pairs'].get(method, 0) else ''})</h2>")
        body.append('<div class="pairs">' + "".join(_pair(p) for p in mine) + "</div>" if mine else
                    "<p>none</p>")
    return ("<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>mieb-ray audit</title>"
            f"<style>{CSS}</style></head><body>{''.join(body)}</body></html>\n")


def _tasks(tasks: dict, done: tuple[str, ...]) -> str:
    head = "".join(f"<th>{m}</th>" for m in (*formats.DETECTORS, "any"))
    rows = "".join(f"<tr><td>{escape(t)}</td><td>{e['eval_rows']:,}</td>"
                   + "".join(f"<td>{e[m]['eval_images']:,} ({e[m]['percent']:.2f}%)</td>" if m in (*done, "any")
                             else f"<td>{NOT_RUN}</td>" for m in (*formats.DETECTORS, "any"))
                   + "</tr>" for t, e in tasks.items())
    return (f'<h2>Eval images affected, per task</h2><div class="panel"><table><thead><tr><th>eval task</th>'
            f"<th>eval rows</th>{head}</tr></thead><tbody>{rows}</tbody></table></div>")


def _groups(summary: dict) -> str:
    """The groups too large to list as pairs: one eval picture and its copies, thousands on both sides."""
    groups = summary.get("groups") or []
    if not groups:
        return ""
    rows = "".join(f"<tr><td>{escape(g['method'])}</td><td>{g['train_rows']:,}</td><td>{g['eval_images']:,}</td>"
                   f"<td>{g['pairs']:,}</td><td>{escape(', '.join(g['train_sample']))}</td>"
                   f"<td>{escape(', '.join(g['eval_sample']))}</td></tr>" for g in groups[:100])
    return ("<h2>Groups: copies too many to list as pairs</h2><p class=\"note\">Each is one eval picture (a blank "
            "frame, a placeholder) with its copies on both sides: its rows are listed once each in "
            "contamination.parquet under one group id, and every one is flagged.</p><div class=\"panel\"><table>"
            "<thead><tr><th>detector</th><th>train rows</th><th>eval images</th><th>pairs</th><th>train sample"
            f"</th><th>eval sample</th></tr></thead><tbody>{rows}</tbody></table></div>")


def _datasets(datasets: dict, done: tuple[str, ...]) -> str:
    head = "".join(f"<th>{m}</th>" for m in (*formats.DETECTORS, "any"))
    rows = "".join(f"<tr><td>{escape(d or '(no dataset)')}</td><td>{e['train_rows']:,}</td>"
                   + "".join(f"<td>{e[m]:,}</td>" if m in (*done, "any") else f"<td>{NOT_RUN}</td>"
                             for m in (*formats.DETECTORS, "any")) + "</tr>" for d, e in datasets.items())
    return (f'<h2>Train rows flagged, per dataset</h2><div class="panel"><table><thead><tr><th>train dataset</th>'
            f"<th>train rows</th>{head}</tr></thead><tbody>{rows}</tbody></table></div>")


def _figure(uri: str | None, caption: str) -> str:
    image = f'<img src="{uri}" alt="">' if uri else '<div class="ph">no preview</div>'
    return f"<figure>{image}<figcaption>{escape(caption)}</figcaption></figure>"


def _pair(p: dict) -> str:
    return (f'<div class="card pair"><div class="head"><span>{escape(p["eval_task"] or "?")}</span>'
            f'<span class="sc">{p["method"]} {p["score"]:.4f}</span></div><div class="imgs">'
            f"{_figure(p.get('train_image'), 'train ' + p['train_key'])}"
            f"{_figure(p.get('against_image'), 'eval ' + p['eval_key'])}</div></div>")
