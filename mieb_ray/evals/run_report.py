"""Eval result pages, each one self-contained HTML file (page.py's style).

render      a suite's own page (clustering, linear probe, retrieval): one table of its tasks
write       the run's page, OUT/report.html, and summary.json beside it: the run as mteb's leaderboard reads it
            (evals/summary.py): one table per task type with each task's main score beside its contamination-clean
            score (with `--exclude`) and what the audit left out, the type's means, and per MIEB benchmark the run
            covers its Mean(TaskType) and Mean(Task) and the tasks it lacks; a task links to its suite's own page
            where it has one (the zero-shot gallery, BioVITA's queries)
"""

from __future__ import annotations

import html
import json

from mieb_ray import formats, storage
from mieb_ray.evals import summary as summaries
from mieb_ray.evals.protocol import fast_line
from mieb_ray.page import CSS, num

COLUMNS = ("task", "main score (mteb)", "clean", "clean - mteb", "eval images left out")


def _fmt(v) -> str:
    v = num(v)
    return "—" if v is None else f"{v:.4f}"


def _delta(main, clean) -> str:
    main, clean = num(main), num(clean)
    return "—" if main is None or clean is None else f"{clean - main:+.4f}"


def _row(task: str, main, clean, left, link: str | None = None) -> str:
    name = f"<a href=\"{html.escape(link)}\">{html.escape(task)}</a>" if link else html.escape(task)
    return (f"<tr><td>{name}</td><td>{_fmt(main)}</td><td>{_fmt(clean)}</td><td>{_delta(main, clean)}</td>"
            f"<td>{'—' if left is None else f'{left:,}'}</td></tr>")


def _table(head: tuple[str, ...], rows: list[str], foot: str = "") -> str:
    return ("<div class=panel><table><thead><tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in head)
            + "</tr></thead><tbody>" + "".join(rows) + f"</tbody>{foot}</table></div>")


def _header(model: dict, made: dict) -> list[str]:
    return [f"<!doctype html><meta charset=utf-8><title>MIEB eval run</title><style>{CSS}</style>",
            "<h1>MIEB eval run</h1>",
            f"<div class=meta><span>model <b>{html.escape(str(model.get('name') or 'unknown'))}</b></span>"
            f"<span>revision <b>{html.escape(str(model.get('revision') or '—'))}</b></span>"
            f"<span>embeddings <b>{html.escape(str(made.get('mode') or 'unknown'))}</b></span></div>",
            fast_line(made)]


def render(sections: list[tuple[str, str | None, dict[str, dict]]], model: dict, made: dict | None = None) -> str:
    """sections: (a suite's title, the link to its own page or None, {task: TaskResult}); made: which computation
    made the embeddings (protocol.made_by), said beside the model, and in a line of its own where --fast made some."""
    parts = _header(model, made or {})
    for title, link, results in sections:
        rows = []
        for name, result in results.items():
            clean = summaries.clean_of(result)
            rows.append(_row(name, next(iter(result["scores"].values()))[0].get("main_score"),
                             None if clean is None else clean.get("main_score"),
                             (clean or {}).get("left_out", {}).get("eval", {}).get("any")))
        see = f" <a href=\"{html.escape(link)}\">its page</a>" if link else ""
        parts.append(f"<h2>{html.escape(title)}{see}</h2>" + _table(COLUMNS, rows))
    return "\n".join(parts) + "\n"


def _missing(missing: list[str]) -> str:
    if not missing:
        return "none"
    return f"<details><summary>{len(missing)}</summary>{html.escape(', '.join(missing))}</details>"


def _benchmarks(found: dict[str, dict]) -> str:
    """The benchmarks the run covers: their means as mteb computes them, and the tasks the run lacks."""
    rows = []
    for name, b in found.items():
        clean = b["clean_scores"] or {}
        rows.append(f"<tr><td>{html.escape(name)}</td><td>{len(b['run'])} of {b['tasks']}</td>"
                    + "".join(f"<td>{_fmt(s.get(key))}</td>" for s in (b["scores"], clean)
                              for key in (summaries.MEAN_TYPE, summaries.MEAN_TASK))
                    + f"<td style=\"text-align:left\">{_missing(b['missing'])}</td></tr>")
    head = ("benchmark", "tasks run", "Mean (TaskType)", "Mean (Task)", "clean Mean (TaskType)", "clean Mean (Task)",
            "missing")
    return ("<h2>Benchmarks</h2><p>Means as mteb's <code>Benchmark.get_score</code> computes them (its leaderboard "
            "ranks MIEB by Mean (TaskType)). Of a benchmark run in part, the means are over the tasks run, as mteb's "
            "summary table of these results alone has them; beside other models' full results the leaderboard "
            "leaves them blank. The clean means count a task without a clean score at its main score.</p>"
            + _table(head, rows))


def render_run(summary: dict, model: dict, made: dict, links: dict[str, str]) -> str:
    """The run's page from its summary (summary.summarize); links: {task: its suite's own page}."""
    parts = _header(model, made)
    if summary["benchmarks"]:
        parts.append(_benchmarks(summary["benchmarks"]))
    tasks = summary["tasks"]
    for kind, of in summary["types"].items():
        rows = [_row(n, tasks[n]["main_score"], tasks[n]["clean_score"], tasks[n]["left_out"], links.get(n))
                for n in of["tasks"]]
        foot = (f"<tfoot><tr><th>mean of {len(of['tasks'])}</th><th>{_fmt(of['main_score'])}</th>"
                f"<th>{_fmt(of['clean_score'])}</th><th>{_delta(of['main_score'], of['clean_score'])}</th>"
                "<th></th></tr></tfoot>")
        errors = "".join(f"<p class=meta>{html.escape(tasks[n]['clean_error'])}</p>" for n in of["tasks"]
                         if tasks[n]["clean_error"])
        parts.append(f"<h2>{html.escape(kind)}</h2>" + _table(COLUMNS, rows, foot) + errors)
    return "\n".join(parts) + "\n"


def write(out: str, results: dict[str, dict], model: dict, made: dict, links: dict[str, str]) -> list[str]:
    """The run's summary.json and report.html in OUT; their names. model: the embed manifest's; made: which
    computation made the embeddings (protocol.merged); links: {task: its suite's own page, relative to OUT}."""
    summary = summaries.summarize(results)
    doc = {"model": {"name": model.get("name"), "revision": model.get("revision")}, "embeddings": made, **summary}
    storage.write_bytes(storage.join(out, formats.SUMMARY), (json.dumps(doc, indent=2) + "\n").encode())
    storage.write_bytes(storage.join(out, formats.REPORT), render_run(summary, model, made, links).encode())
    return [formats.SUMMARY, formats.REPORT]
