"""The eval job on a suite a test made itself (its own settings: BioVITA's gallery, a zero-shot suite over chosen
tasks), as `mieb-ray eval` runs the suites it makes: the same lifecycle, outputs and manifest."""

from __future__ import annotations

from mieb_ray import formats
from mieb_ray.evals import registry
from mieb_ray.evals.job import evaluate


def run_suite(scorer, out: str, images: str, texts: str | None, log=print, **settings) -> dict[str, dict]:
    """{task: TaskResult} of `scorer` scored into `out` by the eval job; settings: evaluate()'s (executor,
    allow_mixed_models, overwrite, resume, ...)."""
    suite = next(s for s in registry.SUITES if formats.suite_kind(s.name) == scorer.kind)
    return evaluate([(suite, scorer.task_names())], registry.Options(scorer.sources), out, images=images,
                    texts=texts if scorer.needs_texts else None, log=log, scorers=[scorer], **settings)
