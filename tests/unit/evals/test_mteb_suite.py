"""The tasks scored through mteb's own code (mieb_ray/evals/mteb_suite.py): each input embedded once per model across
tasks and runs (a content-keyed cache), precomputed raw embeddings accepted and normalised ones refused, bad input in
one line, benchmark names expanded. Each task type's equality with mteb is in test_mteb_<type>.py."""

from __future__ import annotations

import hashlib
import io
import os
import re
import shutil
import subprocess
import sys
import types

import datasets
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image
from support.mteb_tasks import assert_same_scores, mteb_result, ours

from mieb_ray.demo_data.models import make_tiny_clip
from mieb_ray.errors import UserError
from mieb_ray.evals import benchmarks, registry
from mieb_ray.io import embeddings

FEATURES = datasets.Features({"sentence1": datasets.Image(), "sentence2": datasets.Image(),
                              "score": datasets.Value("float32")})


def _png(rgb) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (40, 24), rgb).save(out, "PNG")
    return out.getvalue()


def _sts(root, repo: str, pairs: list[tuple[bytes, bytes]], scores: list[float]) -> None:
    """A rendered-STS repo as the hub holds it: data/test-00000-of-00001.parquet, sentence1/2 images, score."""
    rows = {"sentence1": [{"bytes": a, "path": None} for a, _ in pairs],
            "sentence2": [{"bytes": b, "path": None} for _, b in pairs], "score": scores}
    datasets.Dataset.from_dict(rows, features=FEATURES).to_parquet(
        os.path.join(root, repo, "data", "test-00000-of-00001.parquet"))


@pytest.fixture(scope="module")
def two_tasks(tmp_path_factory):
    """STS13VisualSTS and STS15VisualSTS sharing images: 8 distinct images in 12 slots."""
    root = tmp_path_factory.mktemp("mirror")
    images = [_png((37 * i % 256, 91 * i % 256, 53 * i % 256)) for i in range(1, 9)]
    _sts(root, "mteb/rendered-sts13", [(images[0], images[1]), (images[2], images[3]), (images[4], images[5])],
         [0.5, 2.0, 4.5])
    _sts(root, "mteb/rendered-sts15", [(images[1], images[0]), (images[3], images[6]), (images[7], images[5])],
         [1.0, 3.5, 5.0])
    model = make_tiny_clip(str(tmp_path_factory.mktemp("model")))
    return str(root), model, {hashlib.sha256(b).hexdigest() for b in images}


def _cache(out) -> dict[str, int]:
    """Each cache output under OUT/embeddings/cache/<model>/: its rows."""
    folder = _model_dir(out)
    return {name: len(embeddings.read_all(os.path.join(folder, name))[0]) for name in sorted(os.listdir(folder))}


def test_each_image_is_embedded_once_across_tasks_and_runs(two_tasks, tmp_path):
    root, model, distinct = two_tasks
    names = ["STS13VisualSTS", "STS15VisualSTS"]
    first = ours(names, root, model, str(tmp_path))
    for name in names:
        assert_same_scores(first[name], mteb_result(name, root, model))
    cache = _cache(tmp_path)
    assert list(cache.values()) == [len(distinct)]  # one image output, each distinct image once
    keys = embeddings.read_all(os.path.join(_model_dir(tmp_path), list(cache)[0]))[0]
    assert {k.removeprefix("sha256:") for k in keys} == distinct

    lines = []
    again = ours(names, root, model, str(tmp_path), overwrite=True, log=lines.append)
    assert _cache(tmp_path) == cache  # the second run embedded nothing
    assert "[eval] every image is in the cache" in "\n".join(lines)
    assert {n: again[n]["scores"] for n in names} == {n: first[n]["scores"] for n in names}


def test_the_caches_keys_are_read_once_for_all_the_tasks_scores(two_tasks, tmp_path, monkeypatch):
    """Each shard's keys are read twice in a run, whatever the tasks: once to see what the cache lacks, once into
    the index every task takes its own keys from (a task reading them itself: 130 tasks times hundreds of
    shards at MIEB's size)."""
    root, model, _ = two_tasks
    names = ["STS13VisualSTS", "STS15VisualSTS"]
    ours(names, root, model, str(tmp_path))
    read, real = [], embeddings.shard_keys
    monkeypatch.setattr(embeddings, "shard_keys", lambda uri: read.append(uri) or real(uri))
    again = ours(names, root, model, str(tmp_path), overwrite=True)
    shards = [os.path.join(_model_dir(tmp_path), d, f) for d in os.listdir(_model_dir(tmp_path))
              for f in os.listdir(os.path.join(_model_dir(tmp_path), d)) if f.endswith(".arrow")]
    assert shards and sorted(read) == sorted(shards * 2)
    for name in names:
        assert_same_scores(again[name], mteb_result(name, root, model))


def test_reading_and_scoring_the_tasks_say_how_many_are_done(two_tasks, tmp_path, monkeypatch):
    from mieb_ray.evals import mteb_suite

    root, model, _ = two_tasks
    monkeypatch.setattr(mteb_suite, "TICK_SECONDS", 0)  # a line whenever a task ends (else every 5 s), but the last
    lines = []
    ours(["STS13VisualSTS", "STS15VisualSTS"], root, model, str(tmp_path), log=lines.append)
    said = [line.rsplit(",", 1)[0] for line in lines if "/2 tasks" in line]
    assert said == ["[eval] mteb: 1/2 tasks read by mteb's loaders", "[eval] mteb: 1/2 tasks scored"], lines


def _model_dir(out) -> str:
    """OUT/embeddings/cache/<model>: the cache of the one model used."""
    folder = os.path.join(out, "embeddings", "cache")
    (model,) = [d for d in os.listdir(folder) if not d.startswith("_")]
    return os.path.join(folder, model)


def test_precomputed_raw_embeddings_score_the_same(two_tasks, tmp_path):
    from mieb_ray.evals import job

    root, model, _ = two_tasks
    made = ours(["STS13VisualSTS"], root, model, str(tmp_path / "made"))
    folder = _model_dir(tmp_path / "made")
    (images,) = [os.path.join(folder, d) for d in os.listdir(folder)]
    given = job.evaluate(registry.select("STS13VisualSTS"), registry.Options(root), str(tmp_path / "given"),
                         log=lambda *a: None, images=images, executor="local")
    assert given["STS13VisualSTS"]["scores"] == made["STS13VisualSTS"]["scores"]


def test_tasks_mteb_gives_only_images_need_no_text_embeddings(two_tasks, tmp_path):
    """A task whose encoder mteb hands only images (the rendered-text VisualSTS tasks, and their aggregates, which
    MIEB(Img) leaves out) is scored from --image-embeddings alone; beside a task with texts, that task is named."""
    from support.hub_tasks import sts

    from mieb_ray.evals import job

    _, model, _ = two_tasks
    root, names = str(tmp_path / "mirror"), ["STS13VisualSTS", "VisualSTS17Eng"]
    for name in names:
        sts.TASKS[name](root)
    made = ours(names, root, model, str(tmp_path / "made"))
    folder = _model_dir(tmp_path / "made")
    (images,) = [os.path.join(folder, d) for d in os.listdir(folder)]
    given = job.evaluate(registry.select(",".join(names)), registry.Options(root), str(tmp_path / "given"),
                         log=lambda *a: None, images=images, executor="local")
    assert {n: given[n]["scores"] for n in names} == {n: made[n]["scores"] for n in names}
    with pytest.raises(UserError, match=r"^CIRRIT2IRetrieval needs --text-embeddings too$"):
        job.evaluate(registry.select("VisualSTS17Eng,CIRRIT2IRetrieval"), registry.Options(root),
                     str(tmp_path / "mixed"), log=lambda *a: None, images=images, executor="local")


def test_normalised_embeddings_are_refused_in_one_line(two_tasks, tmp_path):
    from mieb_ray.evals import job
    from mieb_ray.pipelines.embed import embed_table

    root, model, _ = two_tasks
    table = tmp_path / "items.parquet"
    pq.write_table(pa.table({"key": ["a"], "image": [_png((1, 2, 3))]}), table)
    normalised = embed_table(str(table), "key", str(tmp_path / "emb"), model, None, "image", log=lambda *a: None,
                             executor="local")
    with pytest.raises(UserError, match=r"holds L2-normalised embeddings; .* embed with --raw"):
        job.evaluate(registry.select("STS13VisualSTS"), registry.Options(root), str(tmp_path / "out"),
                     log=lambda *a: None, images=normalised, executor="local")


def test_a_mirror_without_a_tasks_data_is_one_line_before_any_work(two_tasks, mirror, tmp_path, monkeypatch):
    """With a model and from precomputed embeddings, before any other suite works (a zero-shot task chosen too),
    naming the folder as given; a folder there that holds no data file: mteb's own load, in one line."""
    from mieb_ray.evals import job

    root, model, _ = two_tasks
    ours(["STS13VisualSTS"], root, model, str(tmp_path / "made"))
    (images,) = [os.path.join(_model_dir(tmp_path / "made"), d) for d in os.listdir(_model_dir(tmp_path / "made"))]
    shutil.copytree(mirror[0], tmp_path / "mirror")  # the 23 sources, no mteb task
    monkeypatch.chdir(tmp_path)  # a relative --sources, as typed
    line = ("the mirror holds no data of STS13VisualSTS (mirror/mteb/rendered-sts13): a mirror holds each task's "
            "hub repo at <mirror>/<its hub path>, in the hub's layout (docs/evals.md)")
    with pytest.raises(UserError) as exc:
        ours(["CIFAR10ZeroShot", "STS13VisualSTS"], "mirror", model, str(tmp_path / "out"))
    assert str(exc.value) == line and not (tmp_path / "out").exists()  # the zero-shot suite built nothing
    with pytest.raises(UserError) as exc:
        job.evaluate(registry.select("STS13VisualSTS"), registry.Options("mirror"), str(tmp_path / "given"),
                     log=lambda *a: None, images=images, executor="local")
    assert str(exc.value) == line and not (tmp_path / "given").exists()
    (tmp_path / "mirror" / "mteb" / "rendered-sts13").mkdir(parents=True)
    with pytest.raises(UserError) as exc:
        ours(["STS13VisualSTS"], "mirror", model, str(tmp_path / "out"))
    assert str(exc.value).startswith("STS13VisualSTS: mteb cannot load its data from mirror/mteb/rendered-sts13: "
                                     "EmptyDatasetError: ")


def test_a_mirror_on_s3_is_copied_once_per_machine_and_scores_as_mteb_does(two_tasks, s3, tmp_path, monkeypatch):
    """mteb's loaders read local folders: a task's folder on S3 is copied to the machine that loads it, once for
    the collect and score passes of every task holding it and for later runs, again once its files change."""
    from mieb_ray import storage

    root, model, _ = two_tasks
    storage.reset_clients()  # made for this server's environment
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    client, prefix = s3.client(), "mteb-mirror"
    files = {os.path.relpath(os.path.join(d, f), root): os.path.join(d, f) for d, _, fs in os.walk(root) for f in fs}
    for rel, path in files.items():
        client.upload_file(path, s3.bucket, f"{prefix}/{rel}")
    mirror, opened, real_open = f"s3://{s3.bucket}/{prefix}", [], storage.open_input
    monkeypatch.setattr(storage, "open_input",
                        lambda uri: (uri.startswith(mirror) and opened.append(uri), real_open(uri))[1])
    names = ["STS13VisualSTS", "STS15VisualSTS"]
    got = ours(names, mirror, model, str(tmp_path / "out"))
    for name in names:
        assert_same_scores(got[name], mteb_result(name, root, model))
    assert sorted(opened) == sorted(f"{mirror}/{rel}" for rel in files)  # each file once
    copies = tmp_path / "xdg" / "mieb-ray" / "mirrors"
    assert len(os.listdir(copies)) == 3  # a folder per task, and the locks
    ours(names, mirror, model, str(tmp_path / "again"))
    assert len(opened) == len(files)  # a later run: the copies as they were
    rel = next(r for r in files if "rendered-sts13" in r)
    pq.write_table(pq.read_table(files[rel]), tmp_path / "again.parquet", compression="gzip")  # the same rows
    client.upload_file(str(tmp_path / "again.parquet"), s3.bucket, f"{prefix}/{rel}")  # written again: a new version
    ours(["STS13VisualSTS"], mirror, model, str(tmp_path / "changed"))
    assert opened[len(files):] == [f"{mirror}/{rel}"] and len(os.listdir(copies)) == 4


def test_benchmark_names_are_mtebs():
    import mteb

    for name, tasks in benchmarks.BENCHMARKS.items():
        assert tasks == tuple(t.metadata.name for t in mteb.get_benchmark(name).tasks), name


def test_a_benchmark_name_selects_its_tasks_in_every_suite():
    chosen = [t for _, names in registry.select("MIEB(lite),STS13VisualSTS") for t in names]
    assert sorted(chosen) == sorted(benchmarks.LITE)  # STS13VisualSTS is in MIEB(lite): once
    assert sum(len(names) for _, names in registry.select("MIEB(Multilingual)")) == 130
    for name, tasks in benchmarks.BENCHMARKS.items():  # each whole: MIEB(Img)'s two multilingual VisualSTS tasks too
        assert sorted(t for _, names in registry.select(name) for t in names) == sorted(tasks), name


def test_on_ray_the_tasks_load_and_score_in_workers(two_tasks, tmp_path, ray_local):
    root, model, _ = two_tasks
    got = ours(["STS13VisualSTS"], root, model, str(tmp_path), executor="ray")
    assert_same_scores(got["STS13VisualSTS"], mteb_result("STS13VisualSTS", root, model))


def test_the_comparison_with_mteb_sees_every_difference():
    """support.mteb_tasks.assert_same_scores, which every test_mteb_*.py relies on, fails on any difference."""
    ref = {"task_name": "T", "dataset_revision": "r", "evaluation_time": 1.0,
           "scores": {"test": [{"hf_subset": "default", "accuracy": 0.5, "ap": float("nan"), "x": None,
                                "per": [{"f1": 0.25}], "languages": ["eng-Latn"]}]}}
    same = {**ref, "evaluation_time": 9.0,
            "scores": {"test": [{**ref["scores"]["test"][0], "accuracy": 0.5 + 9e-7, "per": [{"f1": 0.25}]}]}}
    assert_same_scores(same, ref)
    for bad in ({"accuracy": 0.5 + 2e-6}, {"ap": 0.0}, {"x": 0}, {"per": [{"f1": 0.25}, {"f1": 0.25}]},
                {"per": [{"f1": 0.26}]}, {"languages": ["fra-Latn"]}, {"extra": 1.0}):
        other = {**ref, "scores": {"test": [{**ref["scores"]["test"][0], **bad}]}}
        with pytest.raises(AssertionError):
            assert_same_scores(other, ref)
    for scores in ({"valid": ref["scores"]["test"]}, {"test": ref["scores"]["test"] * 2},
                   {"test": [{**ref["scores"]["test"][0], "hf_subset": "en"}]}):
        with pytest.raises(AssertionError):
            assert_same_scores({**ref, "scores": scores}, ref)
    with pytest.raises(AssertionError):
        assert_same_scores({**ref, "dataset_revision": "other"}, ref)
    assert_same_scores(other, ref, skip=lambda key: key == "extra")  # a metric said to be float noise: not compared
    near = {**ref, "scores": {"test": [{**ref["scores"]["test"][0], "accuracy": 0.5 + 9e-6}]}}
    assert_same_scores(near, ref, tolerance=lambda key: 1e-5 if key == "accuracy" else 1e-6)  # said to be noisier
    for key in ("ap", "per"):
        with pytest.raises(AssertionError):  # the wider tolerance is that metric's alone
            assert_same_scores(near, ref, tolerance=lambda k, key=key: 1e-5 if k == key else 1e-6)


@pytest.mark.parametrize("name", ["CIRRIT2IRetrieval", "ROxfordHardI2IRetrieval", "BLINKIT2IMultiChoice"])
def test_the_collect_pass_records_what_mtebs_own_search_encodes(name, tmp_path, monkeypatch):
    """The collect pass answers mteb's search interface itself and searches nothing (a retrieval split costs a read
    of its queries and corpus, not a search and pytrec_eval's scoring of 1,000 documents a query), yet records
    every input mteb's own SearchEncoderWrapper hands an encoder, and nothing more: fused image+text queries, a
    split of ROxford's, a reranking of each query's given candidates."""
    import numpy as np
    from mteb.models.search_wrappers import SearchEncoderWrapper
    from support.hub_tasks import retrieval, tasks_misc

    from mieb_ray.evals import mteb_suite

    root = str(tmp_path)
    {**retrieval.TASKS, **tasks_misc.TASKS}[name](root)

    class Items:
        def __init__(self):
            self.images, self.texts = set(), set()

        def add(self, keys, data, texts):
            self.images |= {k for k in keys if k is not None}
            self.texts |= {t for t in texts if t is not None}

    class Plain(mteb_suite._encoder_base(8)):  # an encoder alone: mteb searches with its SearchEncoderWrapper
        def encode(self, inputs_, **kwargs):
            batches = list(mteb_suite.inputs(inputs_, payload=False))
            for keys, _, texts in batches:
                handed.add(keys, None, texts)
            n = sum(len(keys) for keys, _, _ in batches)
            return np.random.default_rng(n).standard_normal((n, 8)).astype(np.float32)

    handed, recorded = Items(), Items()
    mteb_suite._quiet_evaluate(Plain(), mteb_suite.load_task(name, root))
    monkeypatch.setattr(SearchEncoderWrapper, "search", lambda *a, **k: pytest.fail("the recorder searched"))
    mteb_suite._quiet_evaluate(mteb_suite.recorder(8, recorded), mteb_suite.load_task(name, root))
    assert handed.images  # every one of these tasks has images, on one side or both
    assert (recorded.images, recorded.texts) == (handed.images, handed.texts)


def test_a_tasks_load_resolves_its_repo_once_and_reads_what_mteb_reads(tmp_path, monkeypatch):
    """`datasets` resolves a repo on each load_dataset call (its card parsed, its files listed; requests on the hub),
    and XM3600T2IRetrieval's load makes one per language (36). Ours resolves the repo once, and the task then holds
    what mteb's own load of the same folder holds."""
    import mteb
    from datasets import load
    from support.hub_tasks import retrieval

    from mieb_ray.evals import mteb_suite

    name = "XM3600T2IRetrieval"
    retrieval.TASKS[name](str(tmp_path))
    theirs = mteb.get_task(name)
    theirs.metadata = theirs.metadata.model_copy(deep=True)
    theirs.metadata.dataset["path"] = str(tmp_path / retrieval.PATHS[name])
    theirs.load_data()

    real, resolved = load.dataset_module_factory, []
    monkeypatch.setattr(load, "dataset_module_factory", lambda *a, **k: resolved.append(a) or real(*a, **k))
    ours = mteb_suite.load_task(name, str(tmp_path))
    ours.load_data()
    assert resolved == [(theirs.metadata.dataset["path"],)]

    def held(task) -> list:
        """The task's data, each dataset as its Arrow table (images as stored)."""
        def plain(value):
            if isinstance(value, datasets.Dataset):
                return value.with_format("arrow")[:]
            if isinstance(value, dict):
                return {k: plain(v) for k, v in value.items()}
            return [plain(v) for v in value] if isinstance(value, list) else value
        return [plain(getattr(task, part)) for part in ("corpus", "queries", "relevant_docs")]

    assert held(ours) == held(theirs)


@pytest.fixture
def hub_server(tmp_path, monkeypatch):
    """`serve(root, **settings)`: a server in the hub's image over `root` (support/fakehub.HttpHub) that
    huggingface_hub and `datasets` in this process read as the hub, into this test's caches; stopped after. The
    hub client's own waits between its retries are skipped."""
    import datasets.config
    import huggingface_hub.constants as hub_constants
    import huggingface_hub.utils._http as hub_http
    from support import fakehub

    servers = []

    def serve(root: str, **settings):
        server = fakehub.HttpHub(root, **settings)
        servers.append(server)
        fakehub.as_the_hub(monkeypatch, server.url)
        for module, name, value in [
                (hub_constants, "HF_HUB_CACHE", str(tmp_path / "hub-cache")),  # this test's downloads apart
                (datasets.config, "HF_DATASETS_CACHE", tmp_path / "datasets-cache"),
                (hub_http, "time", types.SimpleNamespace(sleep=lambda seconds: None))]:
            monkeypatch.setattr(module, name, value)
        return server

    yield serve
    for server in servers:
        server.stop()


def test_a_tasks_load_from_the_hub_asks_for_each_file_once(tmp_path, hub_server):
    """On the hub each resolution is requests: the card, the loading script and .huggingface.yaml asked for again
    for each language made XM3600T2IRetrieval's load 185 requests for its 37 files. Through a server in the hub's
    image (support/fakehub.HttpHub), the load asks for each file once."""
    from support.hub_tasks import retrieval

    from mieb_ray.evals import mteb_suite

    retrieval.TASKS["XM3600T2IRetrieval"](str(tmp_path / "hub"))
    server = hub_server(str(tmp_path / "hub"))
    task = mteb_suite.load_task("XM3600T2IRetrieval", "hf")
    task.load_data()
    asked = [(method, path) for method, path, _, _ in server.requests if "/api/agent-harnesses" not in path]
    assert len(task.corpus) == 36 and len(asked) == len(set(asked)), sorted(asked)
    repo = tmp_path / "hub" / retrieval.PATHS["XM3600T2IRetrieval"]
    files = {str(p.relative_to(repo)) for p in repo.rglob("*") if p.is_file()}
    assert {path.split("/", 6)[6] for method, path, _, _ in server.requests
            if method == "GET" and "/resolve/" in path} == files


def test_a_tasks_load_from_the_hub_holds_the_jobs_bound(tmp_path, hub_server, monkeypatch):
    """Within a task's load every request to the hub holds a slot of the job's gate (hubfs.bounded_client; its
    threads: test_hubfs.py): with the bound at 1, the server in the hub's image never has two requests at once, the
    gate counts every request the server saw (none, without the gate), and every 429 it sent paused the gate once."""
    from support.hub_tasks import retrieval

    from mieb_ray import hubfs, hubgate
    from mieb_ray.evals import mteb_suite

    retrieval.TASKS["XM3600T2IRetrieval"](str(tmp_path / "hub"))
    server = hub_server(str(tmp_path / "hub"), every=25, faults=("429",), delay=0.01)  # each 429: the job waits 1 s
    monkeypatch.setenv(hubfs.ENV_CONCURRENCY, "1")
    hubgate.reset(1)
    try:
        before = hubfs.requests_so_far()
        mteb_suite.load_task("XM3600T2IRetrieval", "hf").load_data()
        after = hubfs.requests_so_far()
    finally:
        monkeypatch.delenv(hubfs.ENV_CONCURRENCY)
        hubgate.reset(hubfs.bound())
    assert server.peak == 1
    assert after["requests"] - before["requests"] == len(server.requests)
    assert after["throttled"] - before["throttled"] == sum(fault == "429" for *_, fault in server.requests) > 0


def test_an_outage_that_outlasts_the_hub_clients_retries_runs_the_task_again(tmp_path, hub_server, monkeypatch):
    """huggingface_hub tries a file 7 times, then says it cannot find the file "in the local cache". A task's
    load that fails so is run again, as a build's reads are (runtime/tasks.py: on Ray, by Ray), and collects what
    a load without the outage collects; an outage that outlasts those runs too is one line that says the hub kept
    failing; a repo the hub does not have fails at once."""
    from support.hub_tasks import retrieval

    from mieb_ray.errors import TransientStorageError
    from mieb_ray.evals import mteb_suite
    from mieb_ray.runtime import tasks

    name, corpus = "Flickr30kT2IRetrieval", "corpus-00000-of-00001.parquet"
    retrieval.TASKS[name](str(tmp_path / "hub"))

    loads, load_task = [], mteb_suite.load_task
    monkeypatch.setattr(mteb_suite, "load_task", lambda *args: loads.append(args[0]) or load_task(*args))

    def collect(out: str):
        loads.clear()
        with tasks.using("local"):
            return tasks.get(mteb_suite.collect_task.remote(name, "hf", str(tmp_path / out), 8))[0]

    hub_server(str(tmp_path / "hub"))
    clean = collect("clean")  # the task's files, now in this test's caches: each load below starts from none
    for cache in ("hub-cache", "datasets-cache"):
        shutil.rmtree(tmp_path / cache)
    server = hub_server(str(tmp_path / "hub"), outage={corpus: 7})
    assert collect("after-outage") == clean and clean["images"] and clean["texts"]
    assert sum(fault == "503" for *_, fault in server.requests) == 7 and loads == [name, name]
    for kind in ("images", "texts"):
        assert pq.read_table(tmp_path / "after-outage" / f"{kind}.parquet") == \
            pq.read_table(tmp_path / "clean" / f"{kind}.parquet")

    for cache in ("hub-cache", "datasets-cache"):
        shutil.rmtree(tmp_path / cache)
    server = hub_server(str(tmp_path / "hub"), outage={corpus: 10_000})
    with pytest.raises(TransientStorageError) as caught:
        collect("never")
    assert str(caught.value).startswith(f"{name}: the hub kept failing while mteb loaded its data: HfHubHTTPError: "
                                        "Server error '503 Service Unavailable' for url ")
    assert "\n" not in str(caught.value)
    assert loads == [name] * (1 + tasks.UNIT_RETRIES)  # the task, run again each time

    shutil.rmtree(tmp_path / "hub" / retrieval.PATHS[name])
    server = hub_server(str(tmp_path / "hub"))
    with pytest.raises(UserError) as caught:
        collect("missing")
    assert not isinstance(caught.value, TransientStorageError)
    assert str(caught.value).startswith(f"{name}: mteb cannot load its data from the hub: ")
    assert loads == [name]  # not run again


def test_a_temp_disk_that_refuses_the_recorded_inputs_is_one_line(tmp_path):
    """The pass that records a task's inputs writes them into the temp dir as mteb hands them over: a full temp
    disk was an OSError traceback through mteb's evaluate; now one line naming the file and where it was staged.
    Here the limit is the kernel's (RLIMIT_FSIZE, after a first run made the `datasets` cache: no other write)."""
    import numpy as np

    noise = np.random.default_rng(0).integers(0, 256, (6, 96, 96, 3), dtype=np.uint8)
    pictures = []
    for array in noise:  # about 28 KB each as PNG
        out = io.BytesIO()
        Image.fromarray(array).save(out, "PNG")
        pictures.append(out.getvalue())
    root = tmp_path / "mirror"
    _sts(root, "mteb/rendered-sts13", list(zip(pictures[:3], pictures[3:])), [0.5, 2.0, 4.5])
    model = make_tiny_clip(str(tmp_path / "model"))
    ours(["STS13VisualSTS"], str(root), model, str(tmp_path / "warm"))
    limited = ("import resource, signal, sys; from mieb_ray.cli import main; "
               "signal.signal(signal.SIGXFSZ, signal.SIG_IGN); "
               "resource.setrlimit(resource.RLIMIT_FSIZE, (20000, 20000)); sys.exit(main(sys.argv[1:]))")
    out, temp = tmp_path / "out", tmp_path / "temp"
    temp.mkdir()
    done = subprocess.run([sys.executable, "-c", limited, "eval", "--tasks", "STS13VisualSTS", "--sources", str(root),
                           "--model", model, "--out", str(out), "--executor", "local"], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "TMPDIR": str(temp)})
    assert done.returncode == 1 and re.fullmatch(
        rf"mieb-ray: error: cannot write {re.escape(str(out))}/\S+/images\.parquet \(staged in "
        rf"{re.escape(str(temp))}/\S+\): OSError: .*File too large", done.stderr.splitlines()[-1]), done.stderr[-3000:]
