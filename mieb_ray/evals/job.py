"""The eval job, `mieb-ray eval`: the chosen suites scored into OUT on the one job lifecycle (runtime/job.py) that
build, embed and the audit share.

start     the output checked: a complete one refused without --overwrite, an unfinished one without --resume or
          --overwrite (the same rule and words as every job)
embed     with --model, first: every suite's inputs from the run's cache (evals/embed_cache.py: each item encoded
          once per model across suites and runs, in one embed job per modality; eval splits reused only when of
          the same identity: runtime/identity.py)
units     one per suite, run in turn by the driver: score it on the top-k engine (its tasks on Ray or in this
          process, evals/protocol.py); write its `<Task>.json` files and its own files (and, of several suites,
          its folder's manifest); then its progress record
manifest  last: a single suite's kind, or `mieb-eval` listing the suite folders beside OUT/report.html; files of
          this kind an earlier run left (a task no longer chosen) are removed first

--resume skips the suites an earlier, unfinished run scored from the same inputs and settings; --overwrite
replaces a complete output (its cache and eval splits stay, and are reused when they fit).
"""

from __future__ import annotations

import dataclasses
import json
import re
import time
from dataclasses import dataclass

from mieb_ray import __version__, flags, formats, storage
from mieb_ray.encode.model import pinned
from mieb_ray.errors import UserError
from mieb_ray.evals import embed_cache, protocol, registry, results_repo, run_report
from mieb_ray.evals.mteb_suite import has_texts
from mieb_ray.io import embeddings
from mieb_ray.runtime import identity
from mieb_ray.runtime.cluster import RunContext
from mieb_ray.runtime.job import Job
from mieb_ray.runtime.pools import PoolRequest, cpus_option, gpus_option, workers_option

# what an eval writes itself; its embeddings and eval splits are outputs of their own, never removed here
_FILES = "|".join(re.escape(f) for f in (*formats.EVAL_FILES, storage.MANIFEST))
OURS = re.compile(rf"^(?:(?:{'|'.join(s.name for s in registry.SUITES)})/)?(?:[\w.-]+\.json|{_FILES})$")


@dataclass(frozen=True)
class EvalConfig:
    """How an eval runs: what it scores from, where it writes, and its job's settings (--tasks, --sources,
    --exclude and the suites' own settings make the suites: registry.select and registry.Options)."""

    out: str = flags.option(flag="--out", parse=flags.output, required=True,
                            help="output folder: <Task>.json per task (mteb's TaskResult layout), report.html, "
                                 "per-query ranks or predictions")
    images: str | None = flags.option(
        None, flag="--image-embeddings", parse=flags.existing_list,
        help="embed output(s), comma-separated, of the images: keyed by BioVITA's corpus id, <slug>/<split>/<index> "
             "for the eval splits (what build --split eval writes) and, for the linear probe, <slug>/<index> for its "
             "train rows (mieb-train's keys)")
    texts: str | None = flags.option(
        None, flag="--text-embeddings", parse=flags.existing_list,
        help="embed output(s), comma-separated, of the query texts, prompts and captions, keyed by the text itself")
    model: str | None = flags.option(None, flag="--model", parse=flags.model,
                                     help="instead of the two embedding flags: embed what the tasks need with this "
                                          "model first (reused only when made from the same model commit or files, "
                                          "input and settings)")
    revision: str | None = flags.option(
        None, flag="--revision", help="hub commit of --model (default: the pinned one for the openai CLIPs, else the "
                                      "hub's main as the run starts, for the whole run)")
    results_dir: str | None = flags.option(
        None, flag="--results-dir", parse=flags.output,
        help="also write the TaskResults as mteb's results repository lays them out: "
             "DIR/<org>__<model>/<revision>/<Task>.json and model_meta.json (docs/evals.md)")
    trained_on_mieb_train: bool = flags.option(
        False, flag="--trained-on-mieb-train", action="store_true",
        help="the model was trained on mieb-train: model_meta.json's training_datasets names the MIEB tasks drawn "
             "from its sources, so a leaderboard does not count them as zero-shot")
    fast: bool = flags.option(False, flag="--fast", action="store_true",
                              help="with --model: embed as the embed job does by default (bf16 on a GPU, --decode "
                                   "auto), faster but not mteb's computation; each TaskResult, the manifest and the "
                                   "report say so (default: as mteb's model wrappers compute, embed --exact)")
    resume: bool = flags.option(False, flag="--resume", action="store_true",
                                help="continue an unfinished run: skip the suites it scored from the same inputs and "
                                     "settings (an unfinished output needs --resume or --overwrite)")
    overwrite: bool = flags.option(False, flag="--overwrite", action="store_true",
                                   help="replace complete results already at --out (their embeddings stay, reused "
                                        "when they fit)")
    allow_mixed_models: bool = flags.option(False, flag="--allow-mixed-models", action="store_true",
                                            help=flags.MIXED_MODELS_HELP)
    executor: str = flags.executor_option()
    workers: int | None = workers_option("with --model: ")
    gpus_per_worker: float | None = gpus_option("with --model: ")
    cpus_per_worker: float | None = cpus_option("with --model: ")

    @property
    def pool(self) -> PoolRequest:
        return PoolRequest(self.workers, self.gpus_per_worker, self.cpus_per_worker)


def evaluate(selected: list[tuple[registry.Suite, list[str]]], options: registry.Options, out: str, log=print,
             scorers: list[protocol.EvalSuite] | None = None, ctx: RunContext | None = None,
             **settings) -> dict[str, dict]:
    """Score the chosen tasks from embed outputs (`images`, and `texts` only where a task needs them), or embed
    what they need with `model` first; {task name: its TaskResult}. settings: EvalConfig's. scorers: the suites
    already made (one per entry of `selected`; default: each Suite's `make`). ctx: the command's Ray (None:
    RunContext())."""
    t0, ctx = time.time(), ctx or RunContext()  # one for every suite: the Ray the first brought up is the next ones'
    config = EvalConfig(out, **settings)
    flags.check(config)
    model = None  # --model's identity
    if config.model:
        revision, model = pinned(config.model, config.revision)
        config = dataclasses.replace(config, revision=revision)
    scorers = scorers or [suite.make(names, options) for suite, names in selected]
    _check_inputs(config, selected, scorers)
    for scorer in scorers:
        protocol.check(scorer)
    log(f"[eval] {_tasks(sum(len(names) for _, names in selected))} ("
        f"{', '.join(f'{suite.name} {len(names)}' for suite, names in selected)}) -> {storage.display(out)}")
    several = len(selected) > 1
    job = Job("eval", out, "complete eval results", OURS, config.resume, config.overwrite, log)
    with job:  # its hold on the output ends with the run, however it ends
        job.start()
        if config.results_dir:  # written last: a folder that cannot be made fails now, not after the scoring
            storage.check_output(config.results_dir)
        planned = {suite.name: {"tasks": names} for suite, names in selected}
        done = job.earlier(planned, _settings(options, config, model))
        results, keep, scored_from, manifest, made = {}, set(), None, {}, []
        where = {suite.name: storage.join(out, suite.name) if several else out for suite, _ in selected}
        todo = [(s.name, scorer) for (s, _), scorer in zip(selected, scorers) if s.name not in done]
        inputs = _embedded(config, todo, where, log, ctx)
        for (suite, names), scorer in zip(selected, scorers):
            folder = f"{suite.name}/" if several else ""
            record = done.get(suite.name)
            if record is None:
                record = _scored(config, scorer, where[suite.name], several, log, inputs[suite.name], ctx)
                job.progress.record(suite.name, planned[suite.name], record)
            else:
                log(f"[eval] {suite.name}: scored by the run being resumed ({', '.join(names)})")
            results |= {n: json.loads(storage.read_text(storage.join(where[suite.name], formats.result_file(n))))
                        for n in names}
            keep |= {folder + f for f in record["files"]} | ({folder + storage.MANIFEST} if several else set())
            scored_from, manifest = scored_from or record["images"], record["manifest"]
            made.append(manifest.get("embeddings"))
        made_by = protocol.merged(made)
        if several or formats.REPORT not in keep:  # the run's page and summary.json, unless its one suite wrote its own
            links = {n: f"{suite.name}/{formats.REPORT}" for suite, names in selected for n in names
                     if f"{suite.name}/{formats.REPORT}" in keep}
            pages = run_report.write(out, results, embeddings.model_of(scored_from), made_by, links)
            keep |= set(pages)
            manifest = {**manifest, "files": [*manifest["files"], *pages]}
        if several:  # then its manifest, last
            manifest = {**formats.EVAL.stamp(), "version": __version__, "tasks": list(results),
                        "suites": {suite.name: suite.name for suite, _ in selected}, "files": pages,
                        "embeddings": made_by, "seconds": round(time.time() - t0, 3)}
        job.finish(manifest, keep)
        if config.results_dir:
            results_repo.write(config.results_dir, scored_from, results, config.trained_on_mieb_train, log)
        log(f"[eval] {_tasks(len(results))} in {time.time() - t0:.1f}s -> {storage.display(out)}")
        return results


def _tasks(n: int) -> str:
    return f"{n} task{'s' if n != 1 else ''}"


def _check_inputs(config: EvalConfig, selected, scorers) -> None:
    """A model, or the embeddings every chosen task needs, each of the side its flag says (its manifest): one line
    naming what is missing or swapped."""
    if bool(config.model) == bool(config.images or config.texts):
        raise UserError("give either --model, or --image-embeddings (and --text-embeddings where a task needs them)")
    if config.fast and not config.model:
        raise UserError("--fast is how --model embeds: precomputed embeddings say themselves how they were made")
    needing = any(scorer.needs_texts for scorer in scorers)
    if not config.model and not config.images:
        raise UserError("--image-embeddings is needed" + (f" (and --text-embeddings: {_text_task(selected)} needs "
                                                          "both)" if needing else ""))
    if not config.model and needing and not config.texts:
        raise UserError(f"{_text_task(selected)} needs --text-embeddings too")
    for root in embeddings.roots(config.images or "") + embeddings.roots(config.texts or ""):
        embeddings.shards(root)  # one line, before any work, for what is not embeddings (a build's table)
    if config.images and config.texts:
        for root in embeddings.roots(config.images):
            for text_root in embeddings.roots(config.texts):
                protocol.check_sides(root, text_root)


def _text_task(selected) -> str:
    """The first chosen task that mteb gives texts (a suite that needs texts may hold image-only tasks too)."""
    return next(n for _, names in selected for n in names if has_texts(n))


def _embedded(config: EvalConfig, todo: list[tuple[str, protocol.EvalSuite]], where: dict[str, str], log,
              ctx: RunContext) -> dict[str, tuple[str | None, str | None]]:
    """Each suite to score: (image embeddings, text embeddings) it scores from. With --model, from the run's cache
    (evals/embed_cache.py): every suite's inputs planned first, then embedded at once (one embed job per
    modality for the run: the model loads once per encoder, each item encoded once)."""
    if not config.model:
        return {name: (config.images, config.texts if scorer.needs_texts else None) for name, scorer in todo}
    cache = embed_cache.Cache.of(config.out, config.model, config.revision, exact=not config.fast)
    for name, scorer in todo:  # what a suite's plan runs on its own starts first, beside the other suites' plans
        protocol.start(scorer, where[name], cache, config.executor, ctx)
    plans = {name: protocol.plan(scorer, where[name], cache, log, config.executor, ctx) for name, scorer in todo}
    outputs = protocol.embed_all(list(plans.values()), cache, log, config.executor, config.pool, ctx) if plans else {}
    indexes = embed_cache.Indexes(outputs)  # one index of each kind's outputs, for every suite's views
    return {name: made.inputs(indexes) for name, made in plans.items()}


def _scored(config: EvalConfig, scorer: protocol.EvalSuite, where: str, several: bool, log,
            inputs: tuple[str | None, str | None], ctx: RunContext | None = None) -> dict:
    """One unit: the suite scored from `inputs` (image and text embeddings) into `where`; its progress record's
    result."""
    scored = protocol.score(scorer, where, *inputs, log=log, allow_mixed_models=config.allow_mixed_models,
                            executor_name=config.executor, ctx=ctx)
    manifest = {**scorer.kind.stamp(), "version": __version__, "files": scored.files,
                "image_embeddings": storage.display(inputs[0]),
                "text_embeddings": storage.display(inputs[1]) if inputs[1] else None, **scored.extra,
                "embeddings": scored.embeddings,
                "executor": scored.executor, "seconds": scored.seconds}
    if several:  # each suite's folder says what it holds, as a single suite's OUT does
        storage.write_manifest(where, manifest)
    return {"files": scored.files, "images": inputs[0], "manifest": manifest}


def _settings(options: registry.Options, config: EvalConfig, model: dict | None) -> dict:
    """What a suite scored by an earlier run must have been scored from to count on --resume: the same data and
    options, and the same embeddings (by their identity) or the same model (`model`: its identity, its commit or
    files)."""
    return {"version": __version__, "sources": storage.display(options.sources), "model": model,
            "images": [identity.of_input(r) for r in embeddings.roots(config.images)] if config.images else None,
            "texts": [identity.of_input(r) for r in embeddings.roots(config.texts)] if config.texts else None,
            "exclude": identity.of_input(options.exclude) if options.exclude else None,
            "settings": options.settings, "fast": config.fast}
