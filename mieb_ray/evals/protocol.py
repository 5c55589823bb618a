"""What an eval task is, and the one runner every eval job uses.

An eval implements `EvalSuite`: the tasks it scores together from one set of embeddings (BioVITA's subsets,
the zero-shot tasks chosen), what to embed with which keys, how to score blocks on the top-k engine (refs
only: workers read the embeddings), how to gather and merge the blocks into mteb's TaskResult per task, and
what else to write. `plan()` keys what a suite needs by content, `embed_all()` embeds every suite's at once (once
per item and model: evals/embed_cache.py), `score()` scores it the same way for all: placement, submit, collect,
`OUT/<task>.json` per task and the suite's own files. The eval job (evals/job.py) makes that an output: its
lifecycle, the manifest last.
"""

from __future__ import annotations

import hashlib
import html
import json
import time
from dataclasses import dataclass
from typing import Any, Callable, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from mieb_ray import formats, storage
from mieb_ray.errors import UserError
from mieb_ray.evals import embed_cache
from mieb_ray.io import embeddings
from mieb_ray.runtime import placement, tasks
from mieb_ray.runtime.cluster import RunContext
from mieb_ray.runtime.pools import PoolRequest
from mieb_ray.topk import engine

MTEB_VERSION = "2.26.24"  # the scorers we equal


@dataclass(frozen=True)
class EmbedInputs:
    """What to embed: a table of images keyed by `image_key`, a table of texts keyed by the text itself."""

    images: str  # one table, or several separated by commas (each embedded into its own output)
    image_key: str
    texts: str | None  # None: the suite needs no texts
    # the model's own vectors, not L2-normalised: what mteb's CLIP wrapper gives a scorer that is not a cosine
    # (the linear probe's logistic regression, k-means); cosine scorers are the same either way
    raw: bool = False


class EvalSuite(Protocol):
    kind: formats.Kind  # what its manifest says it is
    title: str  # its section of a run's page
    needs_texts: bool  # False: scored from image embeddings alone (texts is None)

    def task_names(self) -> list[str]: ...

    def embed_inputs(self, out: str, log, ctx: RunContext | None = None) -> EmbedInputs: ...

    def submit(self, images: str, texts: str, log) -> Any: ...

    def collect(self, pending: Any, log) -> dict[str, dict]: ...

    def write(self, out: str, results: dict[str, dict], pending: Any, log) -> tuple[list[str], dict]:
        """The suite's own files (relative paths) and what its manifest adds."""


def task_result(task: str, revision: str, split: str, entries: list[dict], seconds: float, phases: list[dict]) -> dict:
    """mteb's TaskResult layout, as `TaskResult.to_disk` writes it (floats rounded to 6 decimals)."""
    def rounded(v):  # nested too: the linear probe's scores_per_experiment
        if isinstance(v, dict):
            return {k: rounded(x) for k, x in v.items()}
        if isinstance(v, list):
            return [rounded(x) for x in v]
        return round(v, 6) if isinstance(v, float) else v

    return {"dataset_revision": revision, "task_name": task, "mteb_version": MTEB_VERSION,
            "scores": {split: [{**{k: rounded(v) for k, v in e.items()}, "mteb_version": MTEB_VERSION}
                               for e in entries]},
            "evaluation_time": round(seconds, 6), "kg_co2_emissions": None, "date": time.time(),
            "evaluation_phases": phases}


def unscorable(task: str, why: str, about: dict) -> dict:
    """A task's clean block where what the audit left cannot be scored (say, every eval image flagged): an error
    line in the place of its clean scores, beside what was left out; the run goes on (evals/summary.py counts the
    task at its main score)."""
    return {**about, "error": f"cannot score {task} without the flagged rows: {why}"}


def text_vectors(uri: str, texts: list[str], what: str) -> tuple[int, np.ndarray]:
    """The dim and the (n, d) float32 embeddings of `texts` from an embed output keyed by the text (in a task)."""
    tables = [embeddings.open_shard(u) for u in embeddings.shard_uris(uri)]
    dim = embeddings.common_dim(tables, storage.display(uri)) or 0
    where = {}
    for n, table in enumerate(tables):
        where.update({k: (n, r) for r, k in enumerate(table["key"].to_pylist())})
    duplicates = sum(t.num_rows for t in tables) - len(where)
    if duplicates:
        raise UserError(f"{storage.display(uri)} holds {duplicates} duplicate keys")
    missing = [k for k in dict.fromkeys(texts) if k not in where]
    if missing:
        shown = ", ".join(repr(k) for k in missing[:5])
        raise UserError(f"{len(missing)} {what} have no embedding in {storage.display(uri)} (e.g. {shown})")
    matrices = [embeddings.matrix(t, dim) for t in tables]
    rows = [matrices[where[k][0]][where[k][1]] for k in texts]
    return dim, np.stack(rows).astype(np.float32) if rows else np.zeros((0, dim), np.float32)


def text_table(out: str, name: str, texts: list[str]) -> str:
    """Texts to embed (prompts, captions) as a table keyed by the text itself:
    OUT/embeddings/_<name>/<name>-<digest>.parquet, named by its content so that a rerun with other texts embeds
    them anew."""
    digest = hashlib.sha256("\0".join(texts).encode()).hexdigest()[:12]
    uri = storage.join(out, "embeddings", f"_{name}", f"{name}-{digest}.parquet")
    if not storage.exists(uri):  # its name is its content: kept as it is, so its embeddings' input is the same
        storage.commit_file(uri, lambda local: pq.write_table(pa.table({"key": texts, "text": texts}), local))
    return uri


def check_sides(images: str, texts: str) -> None:
    """Refuse image and text embeddings whose manifests say they hold the other side: swapped flags would
    otherwise fail later as texts without an embedding, hiding the cause. Outputs that do not say pass."""
    said = {side: embeddings.manifest_modality(storage.read_manifest(uri)) for side, uri in
            (("image", images), ("text", texts))}
    flags = {"image": f"--image-embeddings {storage.display(images)}",
             "text": f"--text-embeddings {storage.display(texts)}"}
    if said == {"image": "text", "text": "image"}:
        raise UserError(f"{flags['image']} holds text embeddings and {flags['text']} holds image embeddings "
                        "(their manifests say so): swapped?")
    for side, other in (("image", "text"), ("text", "image")):
        if said[side] == other:
            raise UserError(f"{flags[side]} holds {other} embeddings (its manifest says so), not {side} embeddings")


def embedding_bytes(*uris: str | None) -> int:
    """The embedding shards' total size, from the listing (no shard opened)."""
    shards = [embeddings.shard_uris(root) for uri in uris if uri for root in embeddings.roots(uri)]  # each its store
    return sum(sum(storage.file_sizes(s)) for s in shards if s)


def placement_of(requested: str, images: str, texts: str | None,
                 ctx: RunContext | None = None) -> placement.Placement:
    """Where scoring runs (runtime/placement.py): under auto, in this process for at most one engine partition
    of embeddings when no cluster was asked for."""
    size = embedding_bytes(images, texts)
    needs_ray = f"more than {engine.PARTITION_BYTES >> 20} MiB" if size > engine.PARTITION_BYTES else None
    return placement.choose(requested, needs_ray, f"{size / 2 ** 20:.1f} MiB of embeddings", ctx)


@dataclass
class Plan:
    """A suite's inputs keyed by content, for the eval's cache to add with every other suite's at once (one embed
    job per modality for a whole run: the model loads once per encoder), and how to make the suite's embed outputs
    from the cache after."""

    tables: dict[str, list[tuple[str, str]]]  # {IMAGES/TEXTS: [(data file, file of its rows' content keys)]}
    inputs: Callable[[embed_cache.Indexes], tuple[str, str | None]]  # the cache's outputs -> (images, texts)


def check(suite: EvalSuite) -> None:
    """What the suite checks of its data before any suite works, after the flags and inputs are checked (the mteb
    suite: that a mirror holds its tasks' folders); a problem, in one line."""
    if hasattr(suite, "check_data"):
        suite.check_data()


def start(suite: EvalSuite, out: str, cache: embed_cache.Cache, executor: str = "auto",
          ctx: RunContext | None = None) -> None:
    """Start what the suite's plan runs on its own (the mteb suite's task loads, on Ray), so that it runs while the
    other suites plan; `plan` then waits for it."""
    if hasattr(suite, "start_plan"):
        suite.start_plan(out, cache, executor, ctx=ctx)


def plan(suite: EvalSuite, out: str, cache: embed_cache.Cache, log=print, executor: str = "auto",
         ctx: RunContext | None = None) -> Plan:
    """What the suite needs embedded, keyed by content; its `inputs` are embed outputs OUT/embeddings/{images[-N],
    texts} keyed as it reads them, every vector from the eval's cache of this model (embed_cache.py: each item
    encoded once across suites and runs). ctx: the command's Ray."""
    if hasattr(suite, "embed_plan"):  # a suite that reads the cache by content itself (evals/mteb_suite.py)
        return suite.embed_plan(out, cache, log, executor, ctx=ctx)
    inputs = suite.embed_inputs(out, log, ctx)
    root = storage.join(out, "embeddings")
    views = [(table, inputs.image_key, storage.join(root, "images" + (f"-{n}" if n else "")), embed_cache.IMAGES,
              not inputs.raw) for n, table in enumerate(embeddings.roots(inputs.images))]
    if inputs.texts:
        views.append((inputs.texts, "key", storage.join(root, "texts"), embed_cache.TEXTS, True))
    keyed, tables = [], {embed_cache.IMAGES: [], embed_cache.TEXTS: []}
    for table, key, target, kind, _ in views:
        keyed.append(cache.keyed(table, key, target, kind, ctx, executor))
        tables[kind] += keyed[-1]

    def made(indexes: embed_cache.Indexes) -> tuple[str, str | None]:
        done = {embed_cache.IMAGES: [], embed_cache.TEXTS: []}
        for (table, key, target, kind, normalized), pairs in zip(views, keyed):
            done[kind].append(cache.view_of(table, key, target, pairs, indexes[kind], normalized, ctx, executor))
        return ",".join(done[embed_cache.IMAGES]), ",".join(done[embed_cache.TEXTS]) or None

    return Plan(tables, made)


def embed_all(plans: list[Plan], cache: embed_cache.Cache, log=print, executor: str = "auto",
              pool: PoolRequest = PoolRequest(), ctx: RunContext | None = None) -> dict[str, list[str]]:
    """Every plan's items the cache lacks, embedded at once (one embed job per modality); the cache's complete
    outputs of each modality."""
    outputs = {}
    for kind in (embed_cache.IMAGES, embed_cache.TEXTS):
        tables = [t for p in plans for t in p.tables[kind]]
        outputs[kind] = cache.add(tables, kind, log, pool, executor, ctx) if tables else cache.outputs(kind)
    return outputs


FAST_NOTE = ("These scores are not mteb's computation: the embeddings were made with eval --fast ({how}), not as "
             "mteb's model wrappers compute them; the measured differences are in bench/RESULTS.md (Eval: gpu_eval).")
MIXED = "mixed: "  # a value that differs between the outputs: "mixed: a, b"


def made_by(*uris: str | None) -> dict:
    """Which computation made the embeddings, from the embed outputs' manifests: mode "exact" (embed --exact, what
    mteb's wrappers compute: JPEGs decoded in full on the CPU, the model in float32), "fast" (the embed job's
    default: bf16 on a GPU, --decode auto), "unknown" (another tool's, no manifest); the precision its encoders ran
    in and where the images were decoded."""
    each = []
    for root in [r for uri in uris if uri for r in embeddings.roots(uri)]:
        manifest = storage.read_manifest(root) or {}
        config, made = manifest.get("config"), manifest.get("identity") or {}
        if not isinstance(config, dict) or "exact" not in config:
            each.append({"mode": "unknown"})
            continue
        ran = sorted(manifest.get("precision") or {})  # what its encoders ran in (an older embed: the setting)
        one = {"mode": "exact" if config["exact"] else "fast",
               "precision": ran[0] if len(ran) == 1 else MIXED + ", ".join(ran) if ran
               else "float32" if made.get("precision", "float32") == "float32"
               else "auto (bf16 on a GPU, float32 on a CPU)"}
        if config.get("modality") == "image":
            counts = manifest.get("counts") or {}
            on_device = counts.get("decoded_on_device")
            one["decode"] = "cpu" if config["exact"] else f"{config.get('decode')}" + (
                f" ({on_device:,} on the GPU, {counts.get('decoded_on_cpu', 0):,} on CPUs)" if on_device else "")
        each.append(one)
    return merged(each)


def _values(value) -> list:
    return [] if value is None else value[len(MIXED):].split(", ") if str(value).startswith(MIXED) else [value]


def merged(made: list[dict | None]) -> dict:
    """Several made_by records (outputs, suites) as one: each value, or MIXED and the values where they differ."""
    out = {}
    for key in ("mode", "precision", "decode"):
        values = list(dict.fromkeys(v for m in made for v in _values((m or {}).get(key))))
        out[key] = None if not values else values[0] if len(values) == 1 else MIXED + ", ".join(values)
    return out


def fast_line(made: dict) -> str:
    """FAST_NOTE as a report page's line where --fast made some of the embeddings, else nothing."""
    if "fast" not in _values(made.get("mode")):
        return ""
    how = f"precision {made.get('precision') or '-'}, decode {made.get('decode') or '-'}"
    return f"<p class=meta><b>{html.escape(FAST_NOTE.format(how=how))}</b></p>"


def note_fast(out: str, page: str, made: dict) -> None:
    """Under --fast, fast_line at the top of a report page (after its heading), so that nobody takes it for mteb's."""
    line = fast_line(made)
    if not line:
        return
    uri = storage.join(out, page)
    text = storage.read_text(uri)
    at = text.find("</h1>")
    at = at + len("</h1>") if at >= 0 else 0
    storage.write_bytes(uri, (text[:at] + line + text[at:]).encode())


@dataclass(frozen=True)
class Scored:
    """A suite scored into a folder: its TaskResults, the files it wrote (relative), what its manifest adds."""

    results: dict[str, dict]
    files: list[str]
    extra: dict
    executor: str  # where it ran: ray or local
    seconds: float
    embeddings: dict  # made_by: which computation made the embeddings scored


def score(suite: EvalSuite, out: str, images: str, texts: str | None, log=print,
          allow_mixed_models: bool = False, executor_name: str = "auto", ctx: RunContext | None = None) -> Scored:
    """Score the suite from embedding outputs; write OUT/<task>.json per task and the suite's files (the eval job,
    evals/job.py, makes them an output, having refused image and text embeddings given the wrong way round:
    check_sides). Embeddings of different models are refused unless allow_mixed_models. executor_name: "ray",
    "local" (the same tasks inline in this process, Ray never started) or "auto" (placement_of). ctx: the
    command's Ray."""
    t0 = time.time()
    outputs = {f"image ({n})" if n else "image": root for n, root in enumerate(embeddings.roots(images))}
    outputs |= {f"text ({n})" if n else "text": root for n, root in enumerate(embeddings.roots(texts) if texts else [])}
    for note in embeddings.check_inputs(outputs, allow_mixed_models):
        log(f"[eval] warning: {note}")
    where = placement_of(executor_name, images, texts, ctx)
    log(f"[eval] {where.describe()}")
    made = made_by(images, texts)
    if made["mode"] != "exact":
        log(f"[eval] embeddings made {made['mode']} (precision {made['precision']}, decode {made['decode']}): "
            "not mteb's computation")
    with tasks.using(where.mode, where.ctx):
        pending = suite.submit(images, texts, log)
        results = suite.collect(pending, log)
        files, written = [], {}
        for name, result in results.items():  # which computation made its embeddings, beside mteb's keys
            written[name] = {**result, "mieb_ray": {**result.get("mieb_ray", {}), "embeddings": made}}
            files.append(formats.result_file(name))
            storage.write_bytes(storage.join(out, files[-1]), (json.dumps(written[name], indent=2) + "\n").encode())
        own, extra = suite.write(out, results, pending, log)
        if formats.REPORT in own:
            note_fast(out, formats.REPORT, made)
    return Scored(written, files + own, extra, where.mode, round(time.time() - t0, 3), made)
