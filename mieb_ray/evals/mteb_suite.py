"""Every MIEB task the hand-built suites do not score, scored by mteb's own loaders and evaluators from embeddings
the embed job's pools make: equal to `mteb.evaluate` by construction, wherever our vectors equal mteb's wrapper's.

collect  a task each (Ray, or this process): mteb loads the task with its own code (from the hub, or from a mirror:
         root/<its hub path>) and runs it with a Recorder, which keys every input mteb would encode by its content
         (an image: sha256 of its stored bytes, never decoded; a text: itself) and writes the task's item tables
         (OUT/embeddings/mteb/_items/<task>/); the evaluator runs on zero vectors (a retrieval split is read, not
         searched, nor its nAUCs computed) and its result is dropped
embed    the items no earlier run or suite embedded with this model, each once however many tasks hold it, embedded
         by the embed job into the eval's content-keyed cache (embed_cache.py) as the model's raw vectors: mteb's
         CLIP wrapper returns those, and adds an image's and a text's for an input of both
score    a task each, on Ray on the node that collected it (its data in that node's caches, not downloaded again):
         mteb runs the task again with a Server, which answers each input from the cache by its key (an
         input of both: the sum of its parts; the task takes its inputs' places from the job's one index of the
         cache's keys and reads the embeddings of the shards holding them, not the whole cache: embed_cache.Lookup),
         and searches a retrieval corpus of ENGINE_DOCS or more on the top-k engine -> the TaskResult mteb writes;
         with --exclude, mteb runs it once more on the task cleaned of the rows that hold a flagged image
         (mteb_clean.py)
A second run with the same model embeds nothing; the driver reads no image. The audit reads every image of these
tasks through the same collect pass (eval_images).
"""

from __future__ import annotations

import copy
import io
import json
import os
import shutil
import tempfile
import time
import warnings
from contextlib import contextmanager, nullcontext
from pathlib import Path
from unittest import mock

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from mieb_ray import formats, hubfs, storage
from mieb_ray.errors import TransientStorageError, UserError, described
from mieb_ray.evals import embed_cache, mteb_clean, protocol
from mieb_ray.evals.mteb_keys import image_key, pixels_key, stored_bytes
from mieb_ray.evals.retrieval import top_docs
from mieb_ray.evals.summary import mteb_task
from mieb_ray.io import contamination, embeddings, parquet
from mieb_ray.io.contamination import Flags
from mieb_ray.runtime import placement, tasks
from mieb_ray.runtime.cluster import RunContext
from mieb_ray.runtime.job import TICK_SECONDS

HF = "hf"
IMAGES, TEXTS = embed_cache.IMAGES, embed_cache.TEXTS
ITEM_SCHEMA = {IMAGES: pa.schema([("key", pa.string()), ("image", pa.binary())]),
               TEXTS: pa.schema([("key", pa.string()), ("text", pa.string())])}
BATCH = 512  # rows of a dataset read at a time
RECORDED_DIM = 8  # the recorder's zero vectors when no model says their dim: any serves
ENGINE_DOCS = 50_000  # a retrieval corpus of this many docs (one chunk of mteb's search) or more: the top-k engine


# ---------------------------------------------------------------------------------------------- mteb's side


def load_task(name: str, sources: str):
    """mteb's task, reading its data from the hub (`hf`) or from the mirror root/<its hub path> (a local folder is
    resolved as the hub resolves the repo: datasets' own rules; the revision is the mirror's; a folder on S3 is
    copied to the machine that loads it first); a load that fails, in one line."""
    import mteb

    task = _own(mteb.get_task(name))
    if sources != HF:
        _redirect(task, sources)
    for loading in _holding_data(task):
        loading.load_data = _one_line(name, loading, sources, loading.load_data)
    return task


def _holding_data(task) -> list:
    """The tasks whose load_data reads the data: an aggregate's sub-tasks, else the task itself."""
    return getattr(task.metadata, "tasks", None) or [task]


def _own(task):
    """The task with sub-tasks of its own: an aggregate's come from its class's metadata, shared by every instance
    in the process, so data one run loaded (or cleaned) onto them would be another's."""
    subs = getattr(task.metadata, "tasks", None)
    if subs:
        fresh = []
        for sub in subs:
            sub = copy.copy(sub)
            sub.dataset, sub.data_loaded = None, False
            fresh.append(_own(sub))
        task.metadata = task.metadata.model_copy(update={"tasks": fresh})
    return task


def _redirect(task, root: str) -> None:
    subs = getattr(task.metadata, "tasks", None)  # an aggregate (VisualSTS17Eng): its sub-tasks hold the data
    if subs:
        for sub in subs:
            _redirect(sub, root)
        return
    hub = (type(task).metadata.dataset or {}).get("path")  # the class's: a sub-task may have been redirected already
    if hub:
        task.metadata = type(task).metadata.model_copy(deep=True)
        task.metadata.dataset["path"] = storage.join(root, hub)


def inputs(loader, payload: bool = True):
    """Batches of (image keys, image bytes, texts) of what mteb gives an encoder, None where a row has none. An HF
    dataset's images are keyed and read as stored (its Image feature undecoded: the driver of a score pass never
    decodes one); a picture a task made in memory (a PIL image) by mteb's own content hash, its bytes a PNG of it
    (only with `payload`)."""
    import datasets

    dataset = loader.dataset
    if not isinstance(dataset, datasets.Dataset):  # a task's own torch dataset of pictures (Compositionality)
        for batch in loader:
            n = len(next(iter(batch.values())))
            images = batch.get("image", [None] * n)
            keys = [None if im is None else pixels_key(im) for im in images]
            data = [None if im is None or not payload else _png(im) for im in images]
            yield keys, data, [None if t is None else str(t) for t in batch.get("text", [None] * n)]
        return
    has_image, has_text = "image" in dataset.column_names, "text" in dataset.column_names
    stored = has_image and isinstance(dataset.features["image"], datasets.Image)
    if stored:
        dataset = dataset.cast_column("image", datasets.Image(decode=False))
    for batch in dataset.iter(batch_size=BATCH):
        n = len(next(iter(batch.values())))
        data = [_bytes(v, stored) for v in batch["image"]] if has_image else [None] * n
        keys = [None if d is None else image_key(d) for d in data]
        texts = [None if t is None else str(t) for t in batch["text"]] if has_text else [None] * n
        yield keys, data if payload else [None] * n, texts


def _png(image) -> bytes:
    out = io.BytesIO()
    image.save(out, format="PNG")
    return out.getvalue()


def _bytes(value, stored: bool) -> bytes | None:
    if value is None:
        return None
    return stored_bytes(value) if stored else _png(value)


def _encoder_base(dim: int):
    from mteb.models.abs_encoder import AbsEncoder
    from mteb.models.model_meta import ModelMeta, ScoringFunction

    class Base(AbsEncoder):
        def __init__(self):
            self.model = None
            self.mteb_model_meta = ModelMeta.create_empty({
                "name": "mieb-ray/served", "revision": "0", "similarity_fn_name": ScoringFunction.COSINE,
                "modalities": ["image", "text"], "embed_dim": dim, "framework": ["PyTorch"]})

    return Base


def _encode_all(model, data, prompt_type, where: dict, encode_kwargs: dict, num_proc) -> np.ndarray:
    """`model`'s vectors of a retrieval split's queries or corpus, through the dataloader mteb's search makes."""
    from mteb._create_dataloaders import create_dataloader

    loader = create_dataloader(data, task_metadata=where["task_metadata"], prompt_type=prompt_type,
                               num_proc=num_proc, **encode_kwargs)
    return model.encode(loader, **where, prompt_type=prompt_type, **encode_kwargs)


def recorder(dim: int, sink: ItemSink):
    """An mteb encoder that records what it is asked to encode and answers with zero vectors: the evaluator's work on
    them is thrown away, and on zeros its fits are cheapest (a logistic regression of 5,000 random rows took 10x
    the time of the rest of the run). It answers mteb's search interface too, so that a retrieval split costs a
    read of its queries and corpus (what mteb's search encodes, a reranking included), not a search of the corpus
    and pytrec_eval's scoring of 1,000 documents a query."""
    class Recorder(_encoder_base(dim)):
        corpus = None

        def encode(self, inputs_, *, task_metadata, hf_split, hf_subset, prompt_type=None, **kwargs):
            n = 0
            for keys, data, texts in inputs(inputs_):
                sink.add(keys, data, texts)
                n += len(keys)
            return np.zeros((n, dim), np.float32)

        def index(self, corpus, **kwargs) -> None:
            self.corpus = corpus

        def search(self, queries, *, task_metadata, hf_split, hf_subset, top_k, encode_kwargs, top_ranked=None,
                   num_proc=None, **kwargs) -> dict[str, dict[str, float]]:
            from mteb.types import PromptType

            where = {"task_metadata": task_metadata, "hf_split": hf_split, "hf_subset": hf_subset}
            _encode_all(self, queries, PromptType.query, where, encode_kwargs, num_proc)
            _encode_all(self, self.corpus, PromptType.document, where, encode_kwargs, num_proc)
            first = {self.corpus["id"][0]: 0.0} if len(self.corpus) else {}  # a result mteb scores, then dropped
            self.corpus = None
            return {qid: dict(first) for qid in queries["id"]}

    return Recorder()


def server(vectors: embed_cache.Lookup | embed_cache.Given, dim: int, task: str):
    """An mteb encoder that answers each input with its vector (an image and a text: their sum, as mteb's CLIP
    wrapper adds them), read from the cache as mteb asks (embed_cache.Lookup), and mteb's search interface: a
    retrieval corpus of ENGINE_DOCS or more is searched on the top-k engine (evals/retrieval.top_docs: mteb's own
    search, its query blocks over the cluster), a smaller one, or a reranking of given candidates, by mteb's own
    SearchEncoderWrapper."""
    class Server(_encoder_base(dim)):
        corpus = None

        def encode(self, inputs_, *, task_metadata, hf_split, hf_subset, prompt_type=None, **kwargs):
            rows = [[k for k in (text, image) if k is not None]  # per input, the keys of its parts
                    for keys, _, texts in inputs(inputs_, payload=False) for image, text in zip(keys, texts)]
            if not all(rows):
                raise UserError(f"{task}: an input has no embedding ('nothing')")
            if not rows:
                return np.zeros((0, dim), np.float32)
            try:
                first = vectors.take([r[0] for r in rows])
                both = [i for i, r in enumerate(rows) if len(r) == 2]
                if both:
                    first[both] += vectors.take([rows[i][1] for i in both])
            except KeyError as missing:
                raise UserError(f"{task}: an input has no embedding ({missing.args[0][:80]!r})") from None
            return first.astype(np.float32, copy=False)

        def index(self, corpus, **kwargs) -> None:
            self.corpus = corpus

        def search(self, queries, *, task_metadata, hf_split, hf_subset, top_k, encode_kwargs, top_ranked=None,
                   num_proc=None, **kwargs) -> dict[str, dict[str, float]]:
            from mteb.models.search_wrappers import SearchEncoderWrapper
            from mteb.types import PromptType

            where = {"task_metadata": task_metadata, "hf_split": hf_split, "hf_subset": hf_subset}
            if top_ranked is not None or len(self.corpus) < ENGINE_DOCS:
                mteb_search = SearchEncoderWrapper(self)
                mteb_search.index(self.corpus, **where, encode_kwargs=encode_kwargs, num_proc=num_proc)
                return mteb_search.search(queries, **where, top_k=top_k, encode_kwargs=encode_kwargs,
                                          top_ranked=top_ranked, num_proc=num_proc, **kwargs)
            ids = list(self.corpus["id"])
            scores, rows = top_docs(_encode_all(self, queries, PromptType.query, where, encode_kwargs, num_proc),
                                    _encode_all(self, self.corpus, PromptType.document, where, encode_kwargs, num_proc),
                                    ids, top_k)
            self.corpus = None
            return {qid: {ids[j]: float(v) for v, j in zip(scores[i], rows[i])} for i, qid in enumerate(queries["id"])}

    return Server()


class ItemSink:
    """A task's inputs, each key once, into local Parquet files in `folder` (images streamed: a corpus may not fit
    memory), staged for `dest`'s: a disk that refuses a write is one line naming them (storage.writing)."""

    def __init__(self, folder: str, dest: str):
        self.paths = {kind: os.path.join(folder, f"{kind}.parquet") for kind in ITEM_SCHEMA}
        self.dests = {kind: storage.join(dest, f"{kind}.parquet") for kind in ITEM_SCHEMA}
        self.writers = {}
        for kind, path in self.paths.items():
            with storage.writing(self.dests[kind], path):
                self.writers[kind] = pq.ParquetWriter(path, ITEM_SCHEMA[kind])
        self.seen: set[str] = set()

    def add(self, keys: list, data: list, texts: list) -> None:
        for kind, pairs in ((IMAGES, zip(keys, data)), (TEXTS, zip(texts, texts))):
            rows = {}
            for key, value in pairs:
                if key is not None and key not in self.seen:
                    self.seen.add(key)
                    rows[key] = value
            if rows:
                with storage.writing(self.dests[kind], self.paths[kind]):
                    self.writers[kind].write_table(pa.table([list(rows), list(rows.values())],
                                                            schema=ITEM_SCHEMA[kind]))

    def close(self) -> None:
        for kind, w in self.writers.items():
            with storage.writing(self.dests[kind], self.paths[kind]):
                w.close()


@contextmanager
def _without_abstention():
    """mteb's retrieval scores without their nAUCs, for the collect pass, which drops them: on any split, however
    small, the abstention curves take about 100 sklearn AUCs: about half of a small retrieval task's evaluate.
    One task runs at a time in a process (a Ray worker, or this one), so the patch holds for that task alone."""
    from mteb._evaluators import retrieval_metrics

    with mock.patch.object(retrieval_metrics, "evaluate_abstention", lambda results, metric_scores: {}):
        yield


def _quiet_evaluate(model, task) -> dict:
    """mteb.evaluate on one task, no result cache, no progress bars: the TaskResult JSON it writes."""
    import mteb

    result = mteb.evaluate(model, task, cache=None, show_progress_bar=False, co2_tracker=False)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp, "result.json")
        result.task_results[0].to_disk(path)
        with open(path) as f:
            return json.load(f)


# ---------------------------------------------------------------------------------------------- the tasks


def items_root(out: str, task: str) -> str:
    return storage.join(out, "embeddings", "mteb", "_items", task)


def _one_line(name: str, task, sources: str, load):
    """mteb's own load of a task's data, wherever it runs (here, or in mteb.evaluate, timed there as mteb times
    it); what it cannot read, in one line rather than its trace. The hub failing for longer than its client's
    own retries (a 429 or 5xx, a timeout) is a TransientStorageError: the task runs again (runtime/tasks.py), as a
    build's reads do; the rest (a missing repo or file, a bad token) fails the task at once."""
    path = (task.metadata.dataset or {}).get("path", "")  # a mirror's: redirected there already
    where = "the hub" if sources == HF else storage.display(path)

    def load_data(*args, **kwargs):
        if storage.is_s3(path):  # mteb's loaders read local folders: this node's copy, made once per version
            task.metadata.dataset["path"] = storage.local_copy(path, storage.files_under(path),
                                                               storage.cache_dir("mirrors"))
        try:
            with _resolved_once(), hubfs.bounded_client() if sources == HF else nullcontext():
                return load(*args, **kwargs)
        except Exception as exc:
            if sources == HF and (cause := hubfs.transient_cause(exc)) is not None:
                raise TransientStorageError(f"{name}: the hub kept failing while mteb loaded its data: "
                                            f"{described(cause)}") from exc
            raise UserError(f"{name}: mteb cannot load its data from {where}: {described(exc)}") from exc

    return load_data


@contextmanager
def _resolved_once():
    """`datasets` resolves a dataset on every load_dataset call (its card parsed, its files listed and hashed; on the
    hub, requests), and a task's load calls it for each config and split: XM3600T2IRetrieval's 36 languages, each
    split of a retrieval task. Within one load the repo does not change, so the first resolution of the same
    arguments serves the rest, each caller its own copy (load_dataset_builder pops from it): XM3600's load through a
    server in the hub's image, 80 requests rather than 185; MIEB's 56 retrieval tasks on the test mirrors, 33 s
    rather than 43. One load runs at a time in a process, as in _without_abstention."""
    from datasets import load

    real, resolved = load.dataset_module_factory, {}

    def resolve(*args, **kwargs):
        key = repr((args, sorted(kwargs.items())))
        if key not in resolved:
            resolved[key] = real(*args, **kwargs)
        return copy.deepcopy(resolved[key])

    with mock.patch.object(load, "dataset_module_factory", resolve):
        yield


@tasks.remote(num_cpus=1)
def collect_task(name: str, sources: str, folder: str, dim: int) -> tuple[dict[str, int], str | None]:
    """Load a task with mteb's code, record its inputs into `folder` (items_root); the count of each kind, and the
    node that loaded it (its data is in that node's caches now: the hub's files, datasets' Arrow tables)."""
    task = load_task(name, sources)
    for loading in _holding_data(task):
        loading.load_data()
    with tempfile.TemporaryDirectory() as tmp:
        sink = ItemSink(tmp, folder)
        try:
            # the scores of zero vectors are dropped, and so are their warnings
            with warnings.catch_warnings(), _without_abstention():
                warnings.simplefilter("ignore")
                _quiet_evaluate(recorder(dim, sink), task)
        finally:
            sink.close()
        counts = {}
        for kind, path in sink.paths.items():
            counts[kind] = pq.read_metadata(path).num_rows
            storage.commit_file(storage.join(folder, f"{kind}.parquet"),
                                lambda local, path=path: shutil.copyfile(path, local))
    return counts, tasks.node()


@tasks.remote(num_cpus=1)
def score_task(name: str, sources: str, items: str | None, cache: embed_cache.Lookup,
               exclude: str | None = None) -> dict:
    """Load a task with mteb's code, answer its inputs from the cache (`cache`: the job's index of it; of the keys
    its item tables list, when collected): its TaskResult JSON; with `exclude` (an audit), its clean scores too
    (mteb_clean.py)."""
    keys = None
    if items is not None:
        keys = set()
        for kind in ITEM_SCHEMA:
            keys.update(parquet.read_table(storage.join(items, f"{kind}.parquet"), ["key"])["key"].to_pylist())
    vectors = cache.only(keys)
    result = _quiet_evaluate(server(vectors, vectors.dim, name), load_task(name, sources))
    if exclude:
        result["mieb_ray"] = {**result.get("mieb_ray", {}), "clean": _clean(name, sources, exclude, result,
                                                                            server(vectors, vectors.dim, name))}
    return result


def _clean(name: str, sources: str, exclude: str, result: dict, model) -> dict:
    """The task scored by mteb without the rows holding an image the audit flagged (its scores when it holds
    none), mteb's main score of them (the mean over its splits and subsets), and the images left out."""
    from mteb import TaskResult

    flags = Flags.load(exclude)
    task = load_task(name, sources)
    for loading in _holding_data(task):
        loading.load_data()
    where = {"audit": storage.display(exclude)}
    try:
        clean = mteb_clean.cleaned(task, mteb_clean.flagged_in(flags, name))
    except Exception as exc:  # a task whose rows mteb's cleaning cannot filter: said, not fatal
        return {**where, "error": f"mteb cannot clean {name}: {described(exc)}"}
    about = {"left_out": {"eval": Flags.left_out(flags.eval, sorted(clean.found))}, **where}
    audited = contamination.audited_tasks(exclude)
    if clean.images and audited is not None and name not in audited:  # no clean score where nobody looked
        return {**about, "error": f"the audit at {storage.display(exclude)} read none of {name}'s images (an audit "
                                  "against other tables, or from before it covered this task): audit --against "
                                  "mieb again"}
    try:
        scores = _quiet_evaluate(model, clean.task) if clean.found else result
    except Exception as exc:  # what is left may be too little to score (an STS subset of one pair): said, not fatal
        return {**about, "error": f"mteb cannot score {name} without the flagged rows: {described(exc)}"}
    return {"main_score": TaskResult.from_dict(scores).get_score(), "scores": scores["scores"], **about}


def has_texts(name: str) -> bool:
    """Whether mteb gives the task's encoder texts (its metadata's modalities): the rendered-text VisualSTS tasks and
    their aggregates do not, though MIEB(Img) leaves the aggregates out."""
    return "text" in mteb_task(name).metadata.modalities


def missing_data(names: list[str], sources: str) -> dict[str, str]:
    """{task: the folder of its hub path (or of a sub-task's) that a mirror lacks}; none on the hub."""
    if sources == HF:
        return {}
    lacking = {}
    for name in names:
        for task in _holding_data(load_task(name, sources)):
            path = task.metadata.dataset["path"]
            if not (storage.exists(path) if storage.is_s3(path) else os.path.isdir(path)):
                lacking[name] = storage.display(path)
                break
    return lacking


def eval_images(names: list[str], sources: str, folder: str, log, where: placement.Placement) -> str | None:
    """Every image the tasks give mteb's encoder, each once, for the audit: `folder`/images-NNNNN.parquet with
    key (as the collect pass keys it), image (its bytes) and eval_task (every task holding it, '/'-joined); the
    tasks' item tables under `folder`/_items. A complete one for the same tasks and sources is reused; None: the
    tasks hold no image."""
    made = {"tasks": list(names), "sources": storage.display(sources)}
    done = storage.read_manifest(folder) or {}
    if {k: done.get(k) for k in made} == made:
        log(f"[audit] the {len(names)} mteb tasks' eval images: reused {storage.display(folder)}")
        return folder if done.get("images") else None
    if storage.exists(folder):  # another run's, or an unfinished one: none of its files may be taken for ours
        storage.delete_tree(folder)
    t0 = time.time()
    items = {n: storage.join(folder, "_items", n) for n in names}
    if sources == HF:
        hubfs.job_reads_hub()  # every process's loads hold the job's one bound on hub requests
    with tasks.using(where.mode, where.ctx):
        tasks.get([collect_task.remote(n, sources, items[n], RECORDED_DIM) for n in names])
        holders: dict[str, list[str]] = {}  # key -> the tasks holding it (each task lists a key once)
        first: dict[str, list[tuple[int, str]]] = {}  # task -> (row, key) of the keys no earlier task holds
        for name in names:  # keys only: the driver reads no image
            source = storage.join(items[name], f"{IMAGES}.parquet")
            for i, key in enumerate(parquet.read_table(source, ["key"])["key"].to_pylist()):
                if key not in holders:
                    first.setdefault(name, []).append((i, key))
                holders.setdefault(key, []).append(name)
        tasks.get([embed_cache.select.remote(storage.join(items[n], f"{IMAGES}.parquet"),
                                      storage.join(folder, f"images-{i:05d}.parquet"), [r for r, _ in rows],
                                      labels=["/".join(holders[key]) for _, key in rows])
                   for i, (n, rows) in enumerate(first.items())])
    storage.write_manifest(folder, {**made, "images": len(holders)})
    log(f"[audit] the {len(names)} mteb tasks' eval images read by mteb's loaders in {time.time() - t0:.1f}s: "
        f"{len(holders):,} images")
    return folder if holders else None


def _each_task(names: list[str], refs: list, done: str, log) -> dict:
    """{name: its task's value}, in `names`' order, with a progress line every TICK_SECONDS while they run (MIEB's
    tasks on the hub: minutes to hours)."""
    got, t0, said = {}, time.time(), time.time()
    for i, value in tasks.each(refs):
        got[names[i]] = value
        if time.time() - said > TICK_SECONDS and len(got) < len(names):
            said = time.time()
            log(f"[eval] mteb: {len(got)}/{len(names)} tasks {done}, {said - t0:.0f}s")
    return {n: got[n] for n in names}


# ---------------------------------------------------------------------------------------------- the suite


class MtebSuite:
    """The tasks scored through mteb's own code (module docstring): collect, embed what the cache lacks, score."""

    kind = formats.suite_kind("mteb")
    title = "MIEB through mteb's evaluators"

    def __init__(self, names: list[str], sources: str, exclude: str | None = None):
        self.names, self.sources, self.exclude = list(names), sources, exclude
        self.needs_texts = any(has_texts(n) for n in names)
        self.out: str | None = None  # where embed() wrote the tasks' item tables (None: embeddings were given)
        self.counts: dict[str, dict[str, int]] = {}
        self.nodes: dict[str, str | None] = {}  # the node that loaded each task in the collect pass
        self._collecting = None  # start_plan's (placement, start time, a collect_task ref per task)
        self._hub = None  # the hub's requests so far when the suite began (its data on the hub)
        if sources == HF:
            hubfs.job_reads_hub()  # every process's loads hold the job's one bound on hub requests
            self._hub = hubfs.requests_so_far()

    def task_names(self) -> list[str]:
        return list(self.names)

    def check_data(self) -> None:
        """A mirror without a task's folder, or a hub that cannot be reached, before any suite works (not after
        the others ran, nor after the hub client's half minute of retries per file)."""
        if self.sources == HF and self.names:
            try:
                storage.probe_hub()
            except storage.StorageError as exc:
                raise UserError(f"mteb's tasks read the Hugging Face hub, and {exc} (with their data in this "
                                "machine's cache, set HF_HUB_OFFLINE=1)") from None
        if lacking := missing_data(self.names, self.sources):
            listed = ", ".join(f"{name} ({path})" for name, path in list(lacking.items())[:3])
            more = f" and {len(lacking) - 3} more tasks" if len(lacking) > 3 else ""
            raise UserError(f"the mirror holds no data of {listed}{more}: a mirror holds each task's hub repo at "
                            "<mirror>/<its hub path>, in the hub's layout (docs/evals.md)")

    def start_plan(self, out: str, cache: embed_cache.Cache, executor: str = "auto",
                   ctx: RunContext | None = None) -> None:
        """Every task's collect submitted now: on Ray, mteb's loaders read while the other suites plan (their
        eval-split builds), and embed_plan waits for them; in this process, each runs when embed_plan fetches it."""
        where = placement.choose(executor, None, ctx=ctx)
        with tasks.using(where.mode, where.ctx):
            refs = [collect_task.remote(n, self.sources, items_root(out, n), cache.dim) for n in self.names]
        self._collecting = (where, time.time(), refs)

    def embed_plan(self, out: str, cache: embed_cache.Cache, log, executor: str = "auto",
                   ctx: RunContext | None = None) -> protocol.Plan:
        """Collect every task's inputs into item tables keyed by content (the cache adds them, embed_cache.py);
        its inputs: the cache's outputs, comma-separated (mteb's tasks read their vectors from it by content)."""
        if self._collecting is None:
            self.start_plan(out, cache, executor, ctx)
        (where, t0, refs), self._collecting, self.out = self._collecting, None, out
        with tasks.using(where.mode, where.ctx):
            collected = _each_task(self.names, refs, "read by mteb's loaders", log)
        self.counts = {n: counts for n, (counts, _) in collected.items()}
        self.nodes = {n: node for n, (_, node) in collected.items()}
        log(f"[eval] mteb: {len(self.names)} tasks read by mteb's loaders in {time.time() - t0:.1f}s, "
            + ", ".join(f"{sum(c[k] for c in self.counts.values()):,} {k}" for k in ITEM_SCHEMA))
        tables = {kind: [(t, t) for t in (storage.join(items_root(out, n), f"{kind}.parquet") for n in self.names)]
                  for kind in ITEM_SCHEMA}
        return protocol.Plan(tables, lambda indexes: (",".join(indexes.outputs[IMAGES]),
                                                    ",".join(indexes.outputs[TEXTS])))

    def embed_inputs(self, out: str, log, ctx: RunContext | None = None):
        raise NotImplementedError("the mteb suite embeds through its own cache (embed_plan)")

    def submit(self, images: str, texts: str, log):
        cache = [r for uri in (images, texts) if uri for r in embeddings.roots(uri)]
        for root in cache:  # mteb's CLIP wrapper scores raw vectors: normalised ones change every non-cosine metric
            shards = embeddings.shard_uris(root)
            meta = json.loads((embeddings.shard_schema(shards[0]).metadata or {}).get(b"mieb_ray", b"{}")) \
                if shards else {}
            if meta.get("normalized", True):
                raise UserError(f"{storage.display(root)} holds L2-normalised embeddings; mteb's tasks score the "
                                "model's raw vectors: embed with --raw, or eval with --model")
        items = {n: items_root(self.out, n) for n in self.names} if self.out else {}
        log(f"[eval] mteb: scoring {len(self.names)} tasks with mteb's evaluators")
        index = tasks.put(embed_cache.Lookup(cache))  # the cache's keys read once, each task takes its own from it
        # each task scored on the node that loaded it, while it lives: mteb loads the task again, from that node's
        # caches rather than from the hub again (a cluster's nodes do not share theirs)
        return {n: score_task.options(node=self.nodes.get(n)).remote(n, self.sources, items.get(n), index,
                                                                     self.exclude) for n in self.names}

    def collect(self, pending, log) -> dict[str, dict]:
        scored = _each_task(list(pending), list(pending.values()), "scored", log)
        if self._hub is not None:
            log(f"[eval] mteb: {hubfs.summary(self._hub)}")
        return scored

    def write(self, out: str, results: dict[str, dict], pending, log) -> tuple[list[str], dict]:
        return [], {"items": self.counts}
