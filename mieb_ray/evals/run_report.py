"""The page of a whole eval run, `OUT/report.html`: per task type a section with each task's main score beside its
contamination-clean score (with `--exclude`) and what the audit left out, and a link to the suite's own page where
it has one (the zero-shot gallery, BioVITA's queries). One self-contained HTML file (page.py's style)."""

from __future__ import annotations

import html

from mieb_ray.evals.protocol import fast_line
from mieb_ray.page import CSS, num


def _fmt(v) -> str:
    v = num(v)
    return "—" if v is None else f"{v:.4f}"


def render(sections: list[tuple[str, str | None, dict[str, dict]]], model: dict, made: dict | None = None) -> str:
    """sections: (a suite's title, the link to its own page or None, {task: TaskResult}); made: which computation
    made the embeddings (protocol.made_by), said beside the model, and in a line of its own where --fast made some."""
    made = made or {}
    parts = [f"<!doctype html><meta charset=utf-8><title>MIEB eval run</title><style>{CSS}</style>",
             "<h1>MIEB eval run</h1>",
             f"<div class=meta><span>model <b>{html.escape(str(model.get('name') or 'unknown'))}</b></span>"
             f"<span>revision <b>{html.escape(str(model.get('revision') or '—'))}</b></span>"
             f"<span>embeddings <b>{html.escape(str(made.get('mode') or 'unknown'))}</b></span></div>"]
    parts.append(fast_line(made))
    for title, link, results in sections:
        rows = []
        for name, result in results.items():
            entry = next(iter(result["scores"].values()))[0]
            clean = result.get("mieb_ray", {}).get("clean")
            left = (clean or {}).get("left_out", {}).get("eval", {}).get("any")
            delta = None if clean is None else num(clean.get("main_score")) - num(entry.get("main_score"))
            rows.append(f"<tr><td>{html.escape(name)}</td><td>{_fmt(entry.get('main_score'))}</td>"
                        f"<td>{_fmt(None if clean is None else clean.get('main_score'))}</td>"
                        f"<td>{'—' if delta is None else f'{delta:+.4f}'}</td>"
                        f"<td>{'—' if left is None else f'{left:,}'}</td></tr>")
        see = f" <a href=\"{html.escape(link)}\">its page</a>" if link else ""
        parts.append(f"<h2>{html.escape(title)}{see}</h2><div class=panel><table><thead><tr>"
                     "<th>task</th><th>main score (mteb)</th><th>clean</th><th>clean - mteb</th>"
                     "<th>eval images left out</th></tr></thead><tbody>" + "".join(rows) + "</tbody></table></div>")
    return "\n".join(parts) + "\n"
