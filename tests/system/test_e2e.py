"""Users' path end to end: a real Ray cluster of three nodes (a head and two workers, support/raycluster.py), a real
S3 server (SeaweedFS), and the jobs through `ray job submit --working-dir .`: build -> embed, their work spread over
both worker nodes, then the outputs on S3; eval: MIEB(lite) by name, its 51 tasks, with BioVITA (which embeds
texts too), the mirror and the outputs on S3; audit against MIEB, everything on S3; and an eval from the hub (a
server in its image) whose nodes each download a task once.

Credentials reach the jobs the way they do on AWS, from the nodes' environment, never through the job's
runtime env, so they appear in no job metadata and no log (checked).
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.paths import ROOT

REPO = ROOT
BIN = Path(sys.executable).parent
pytestmark = pytest.mark.timeout(900)


def submit(address: str, *args: str, check: bool = True, env_vars: dict | None = None) -> subprocess.CompletedProcess:
    """`ray job submit` as a user types it: the checkout as working dir, `env_vars` in its runtime env, the job's
    own flags after `--`. Sets `.status`, the job's final status as the cluster reports it."""
    from ray.job_submission import JobSubmissionClient

    endpoint = os.environ["AWS_ENDPOINT_URL"]
    cmd = [str(BIN / "ray"), "job", "submit", "--address", address, "--working-dir", str(REPO),
           "--runtime-env-json", json.dumps({"env_vars": {"AWS_ENDPOINT_URL": endpoint, **(env_vars or {})}}), "--",
           "python", *args]
    env = {**os.environ, "RAY_AUTH_MODE": "disabled"}
    # under the test's own 900 s: MIEB(lite) through a job took 136 s alone on a fast day, 259 s alone and past 600 s
    # in the full suite on a slow one (2026-12-06)
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=840, cwd=REPO)
    found = re.search(r"raysubmit_\w+", done.stdout + done.stderr)
    assert found, done.stdout[-3000:] + done.stderr[-3000:]
    job_id = found.group()
    info = JobSubmissionClient(address).get_job_info(job_id)
    done.status, done.ray_job_id = str(info.status.value), info.job_id
    if check:
        assert done.returncode == 0 and done.status == "SUCCEEDED", done.stdout[-3000:] + done.stderr[-3000:]
    return done


def upload(client, bucket: str, local: str, prefix: str) -> None:
    for path in glob.glob(f"{local}/**/*", recursive=True):
        if os.path.isfile(path):
            client.upload_file(path, bucket, f"{prefix}/{os.path.relpath(path, local)}")


def read_json(client, bucket: str, key: str) -> dict:
    return json.loads(client.get_object(Bucket=bucket, Key=key)["Body"].read())


def test_three_jobs_through_ray_job_submit(cluster, s3, tiny_clip, tmp_path):
    from support.mirror import kept_rows

    from mieb_ray.demo_data.mirror import make_mirror

    address = cluster.dashboard_url
    client, bucket = s3.client(), s3.bucket
    written = make_mirror(tmp_path / "mirror", rows=6)
    upload(client, bucket, str(tmp_path / "mirror"), "e2e/mirror")
    upload(client, bucket, tiny_clip, "e2e/models/tiny-clip")
    s3uri = f"s3://{bucket}/e2e"

    build = submit(address, "jobs/build_train.py", "--sources", f"{s3uri}/mirror", "--out", f"{s3uri}/train",
                   "--rows-per-shard", "4")
    assert "[build] done:" in build.stdout
    assert "[build] shard builders: 4 actors x 1 CPU (4 CPUs up now)" in build.stdout
    manifest = read_json(client, bucket, "e2e/train/_manifest.json")
    assert manifest["counts"]["datasets"] == kept_rows(written)

    model = f"{s3uri}/models/tiny-clip"
    # a cluster with no GPU and no autoscaler: encoding on CPUs must be asked for, and without it the job
    # fails at once, in one line, rather than encode on CPUs unasked or wait for GPUs that cannot come
    t0 = time.time()
    refused = submit(address, "jobs/embed.py", "--input", f"{s3uri}/train", "--out", f"{s3uri}/emb-refused",
                     "--model", model, check=False)
    # a failing job is FAILED for `ray job submit`, with the one-line reason in its log
    assert refused.returncode != 0 and refused.status == "FAILED" and time.time() - t0 < 90
    assert "mieb-ray: error: the Ray cluster has no GPU (3 nodes) and Ray reports no autoscaler that could add " \
           "one; pass --gpus-per-worker 0" in refused.stdout + refused.stderr
    cpus = ("--gpus-per-worker", "0", "--cpus-per-worker", "0.5")
    images = submit(address, "jobs/embed.py", "--input", f"{s3uri}/train", "--out", f"{s3uri}/emb-images",
                    "--model", model, "--carry-columns", "dataset_name,label", *cpus)
    assert ("[embed] encoders on CPUs: 1 actor x 0.5 CPU (one per 4 CPUs, at least one; 4 CPUs up now): "
            "--gpus-per-worker 0") in images.stdout
    emb = read_json(client, bucket, "e2e/emb-images/_manifest.json")
    assert emb["counts"] == {"total": manifest["counts"]["total"], "errors": 0}
    assert len(emb["shards"]) == len(manifest["shards"])  # a shard per input file

    # the work ran on both worker nodes (the head takes none)
    workers = {cluster.node_id(n) for n in ("node_a", "node_b")}
    assert cluster.actor_nodes("ShardBuilder", build) == workers
    assert cluster.actor_nodes("EncodeStage", images) <= workers and cluster.actor_nodes("EncodeStage", images)
    assert_no_secret(cluster, s3, [build, refused, images],
                     ["e2e/train/_manifest.json", "e2e/emb-images/_manifest.json"])


def test_a_hub_model_is_downloaded_by_the_nodes_that_encode_not_by_the_driver(cluster, mirror, tiny_clip, tmp_path):
    """`embed --model <hub name>` through `ray job submit`: the driver, on the head, reads the model's config,
    tokenizer and processor files; its weights are downloaded once on each node that runs encoders, into that
    node's own Hugging Face cache (the head downloaded them too: 1.7 GB for clip-vit-large-patch14)."""
    from support import fakehub

    from mieb_ray.pipelines.build import BuildConfig, build

    train = str(tmp_path / "train")
    build(BuildConfig(mirror[0], train, datasets=["gtsrb", "stl10"], executor="local"), log=lambda line: None)
    repos = tmp_path / "hub"
    (repos / "someone").mkdir(parents=True)
    shutil.copytree(tiny_clip, repos / "someone" / "tiny-clip")
    server = fakehub.HttpHub(str(repos))
    try:
        done = submit(cluster.dashboard_url, "jobs/embed.py", "--input", train, "--out", str(tmp_path / "out"),
                      "--model", "someone/tiny-clip", "--workers", "2", "--gpus-per-worker", "0",
                      "--cpus-per-worker", "0.5", env_vars={"HF_ENDPOINT": server.url, "HF_HUB_OFFLINE": "0"})
    finally:
        server.stop()
    # Each node that loads the model reads its config.json once, from its own cache after: the driver's head, and
    # each worker node where an encoder started (Ray's state API does not name the node of an actor the job
    # ended while it was still loading, so the nodes are counted here). The weights: the worker nodes' alone (an
    # actor the job ends between its config and its weights downloads one and not the other).
    got = server.downloads()
    assert 1 <= got.count("model.safetensors") <= got.count("config.json") - 1 <= 2, got
    assert cluster.actor_nodes("EncodeStage", done) - {None} <= {cluster.node_id(n) for n in ("node_a", "node_b")}
    manifest = json.loads((tmp_path / "out" / "_manifest.json").read_text())
    assert manifest["model"]["revision"] == fakehub.commit("someone/tiny-clip")
    assert manifest["counts"]["errors"] == 0 and manifest["counts"]["total"] > 0


def assert_no_secret(cluster, s3, done: list, keys: list[str]) -> None:
    """The secret key is in no job's output, no job's metadata or log, no node's log and no output object."""
    from ray.job_submission import JobSubmissionClient

    client, jobs = s3.client(), JobSubmissionClient(cluster.dashboard_url)
    seen = [d.stdout + d.stderr for d in done]
    for job in jobs.list_jobs():  # drivers that joined without `ray job submit` (the tests' probes) have no logs
        seen += [json.dumps(job.dict(), default=str)] + ([jobs.get_job_logs(job.submission_id)]
                                                          if job.submission_id else [])
    seen += [open(p, errors="replace").read() for p in glob.glob(f"{cluster.tmp}/*/session_latest/logs/*.out")]
    seen += [client.get_object(Bucket=s3.bucket, Key=key)["Body"].read().decode() for key in keys]
    assert not [text for text in seen if s3.secret_key in text]


def test_mieb_lite_through_ray_job_submit(cluster, s3, tiny_clip, tmp_path):
    """MIEB(lite), its 51 tasks, by name through `ray job submit` on the cluster, with BioVITA beside them, the
    mirror and the outputs on S3: the 23 sources' eval splits and the other tasks' inputs (read by mteb's loaders
    from the mirror's folders in their hub layouts, copied to the nodes that load them) embedded on the worker
    nodes, each unique input once, and every task's TaskResult written as mteb reads it back."""
    import mteb
    import pyarrow.parquet as pq
    from support.hub_tasks import compositionality, retrieval, sts, tasks_misc

    from mieb_ray.demo_data.biovita import make_biovita_mirror
    from mieb_ray.demo_data.mirror import make_mirror
    from mieb_ray.evals import benchmarks, biovita_data, registry
    from mieb_ray.io import embeddings, parquet

    mirror, out = tmp_path / "mirror", tmp_path / "out"  # made here, read by the job from S3
    make_mirror(mirror, rows=8, eval_rows=4)
    make_biovita_mirror(mirror)
    writers = {**tasks_misc.TASKS, **sts.TASKS, **compositionality.TASKS, **retrieval.TASKS}
    for write in dict.fromkeys(writers[t] for t in benchmarks.LITE if t in writers):
        write(str(mirror))
    client, bucket = s3.client(), s3.bucket
    upload(client, bucket, str(mirror), "lite-mirror")
    done = submit(cluster.dashboard_url, "jobs/eval.py", "--tasks", "MIEB(lite),BioVITAT2IReranking", "--sources",
                  f"s3://{bucket}/lite-mirror", "--model", tiny_clip, "--out", f"s3://{bucket}/lite",
                  "--gpus-per-worker", "0", "--cpus-per-worker", "0.5")
    assert f"[eval] {len(benchmarks.LITE) + 1} tasks in " in done.stdout
    assert "[eval] on Ray (a cluster was asked for (RAY_ADDRESS)" in done.stdout  # a job stays on its cluster
    workers = {cluster.node_id(n) for n in ("node_a", "node_b")}
    assert cluster.actor_nodes("EncodeStage", done) <= workers and cluster.actor_nodes("EncodeStage", done)
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix="lite/"):
        for key in (obj["Key"] for obj in page.get("Contents", []) if not obj["Key"].endswith("/")):  # no folders
            (out / key[len("lite/"):]).parent.mkdir(parents=True, exist_ok=True)
            client.download_file(bucket, key, str(out / key[len("lite/"):]))
    for suite, names in registry.select("MIEB(lite),BioVITAT2IReranking"):
        for name in names:
            result = mteb.TaskResult.from_disk(out / suite.name / f"{name}.json")
            assert result.task_name == name and result.scores, name
    biovita = json.loads((out / "biovita" / "BioVITAT2IReranking.json").read_text())
    assert [e["hf_subset"] for e in biovita["scores"]["test"]] == ["unseen_species", "unseen_genus"]
    assert (out / "biovita" / "report.html").stat().st_size > 10_000
    # each input of every suite embedded once: the cache's rows are the distinct items, by content, that mteb's
    # loaders gave (the item tables) and that the hand-built suites read (their tables' image bytes, their texts)
    for kind in ("images", "texts"):
        keys = {k for path in out.glob(f"mteb/embeddings/mteb/_items/*/{kind}.parquet")
                for k in pq.read_table(path)["key"].to_pylist()}
        if kind == "images":
            tables = [p for p in out.glob("*/*/**/*.parquet") if {"eval-data", "probe-train"} & set(p.parts)]
            tables += biovita_data.corpus_files(str(mirror), biovita_data.SUBSETS[0])  # one corpus for both subsets
            keys |= {f"sha256:{hashlib.sha256(b).hexdigest()}" for path in tables
                     for b in parquet.image_bytes(pq.read_table(path)["image"]).to_pylist()}
        else:
            keys |= {k for path in out.glob("*/embeddings/texts") for k in embeddings.read_all(str(path))[0]}
        folders = list(out.glob(f"embeddings/cache/*/{kind}-*"))
        cached = [k for folder in folders for k in embeddings.read_all(str(folder))[0]]
        assert sorted(cached) == sorted(keys) and keys, kind
        for folder in folders:  # BioVITA's taxon texts among them: the text path of the embed job
            made = json.loads((folder / "_manifest.json").read_text())
            assert made["config"]["modality"] == kind[:-1] and made["counts"]["errors"] == 0, folder
    assert not mirror_copies(cluster, "head") and mirror_copies(cluster, "node_a") | mirror_copies(cluster, "node_b")
    assert_no_secret(cluster, s3, [done], ["lite/biovita/BioVITAT2IReranking.json"])


def mirror_copies(cluster, node: str) -> set[str]:
    """The copies of an S3 mirror's folders a node made for mteb's loaders (its own cache, as on its own machine)."""
    folder = os.path.join(cluster.tmp, f"hf-{node}", "xdg", "mieb-ray", "mirrors")
    return set(os.listdir(folder)) - {".locks"} if os.path.isdir(folder) else set()


def test_an_audit_against_mieb_through_ray_job_submit(cluster, s3, tmp_path):
    """`audit --against mieb` through `ray job submit`, with the mirror, the train table and the outputs on S3: the
    train rows that copy a test image of a task mteb scores (read by mteb's loaders on the worker nodes, from the
    mirror's folders copied there) found as a comparison of the bytes finds them. (For the suite's time, no
    BioVITA corpus and no near detector here, which embeds each table with the model: test_audit_job.py.)"""
    import io

    import pyarrow.parquet as pq
    from support.hub_tasks import sts, tasks_misc

    from mieb_ray.demo_data.mirror import make_mirror
    from mieb_ray.pipelines.build import BuildConfig, build

    mirror, client, root = tmp_path / "mirror", s3.client(), f"s3://{s3.bucket}/audit-e2e"
    sts.write_sts13(str(mirror))
    tasks_misc.write_fgvc_aircraft(str(mirror))
    test_images = {}  # each task's test images, read from its repo's files, independently of mteb
    for task, repo in {"STS13VisualSTS": "mteb/rendered-sts13", "FGVCAircraft": "mteb/FGVCAircraft"}.items():
        for path in (mirror / repo).rglob("test-*.parquet"):
            table = pq.read_table(path)
            for column in {"image", "sentence1", "sentence2"} & set(table.column_names):
                for value in table[column].to_pylist():
                    test_images.setdefault(value["bytes"], set()).add(task)
    copies = [next(b for b, holders in test_images.items() if holders == {task})
              for task in ("STS13VisualSTS", "FGVCAircraft")]
    make_mirror(str(mirror), rows=len(copies), datasets=["dtd"], eval_rows=1,
                image_bytes=lambda source, i: copies[i])  # dtd's train row i copies an mteb task's test image
    upload(client, s3.bucket, str(mirror), "audit-e2e/mirror")
    build(BuildConfig(str(mirror), f"{root}/train", datasets=["dtd"], executor="local"), log=lambda _: None)

    done = submit(cluster.dashboard_url, "jobs/audit.py", "--train", f"{root}/train", "--against", "mieb",
                  "--sources", f"{root}/mirror", "--out", f"{root}/audit")
    assert "[audit] done:" in done.stdout
    body = client.get_object(Bucket=s3.bucket, Key="audit-e2e/audit/contamination.parquet")["Body"].read()
    pairs = pq.read_table(io.BytesIO(body)).to_pylist()
    want = {(f"dtd/{i}", "sha256:" + hashlib.sha256(b).hexdigest(), task) for i, b in enumerate(copies)
            for task in test_images[b]}
    assert {(p["train_key"], p["eval_key"], p["eval_task"]) for p in pairs
            if p["method"] == "exact" and p["eval_task"] != "DTDZeroShot/DTD"} == want
    assert not mirror_copies(cluster, "head") and mirror_copies(cluster, "node_a") | mirror_copies(cluster, "node_b")
    assert_no_secret(cluster, s3, [done], ["audit-e2e/audit/_manifest.json"])


def test_an_eval_from_the_hub_downloads_each_file_once_within_the_jobs_bound(cluster, tiny_clip, tmp_path):
    """With a model, mteb loads each task twice: to collect its inputs, then to score it (evals/mteb_suite.py). The
    cluster's nodes each have Hugging Face caches of their own, as machines do; the score runs where the collect
    did, so it finds the task's files there. Six tasks from a server in the hub's image (support/fakehub.HttpHub),
    their loads on both worker nodes at once: each file mteb reads of their repos downloaded once in the whole job
    (a score placed by Ray alone downloads its task again on the other node); with the job's bound at 1, the server
    never answers two requests at once (unbounded, mteb's loads went 4 at once), and the job counts them all; every
    task scored."""
    import mteb
    from support import fakehub
    from support.hub_tasks import retrieval

    names = ["CUB200I2IRetrieval", "Flickr30kT2IRetrieval", "MSCOCOT2IRetrieval", "OVENIT2TRetrieval",
             "TUBerlinT2IRetrieval", "VidoreTabfquadRetrieval"]  # six repos
    hub, out = tmp_path / "hub", tmp_path / "out"
    for name in names:
        retrieval.TASKS[name](str(hub))
    server = fakehub.HttpHub(str(hub), delay=0.02)
    try:
        done = submit(cluster.dashboard_url, "jobs/eval.py", "--tasks", ",".join(names), "--sources", "hf",
                      "--model", tiny_clip, "--out", str(out), "--gpus-per-worker", "0", "--cpus-per-worker", "0.5",
                      env_vars={"HF_ENDPOINT": server.url, "HF_HUB_OFFLINE": "0", "MIEB_RAY_HUB_CONCURRENCY": "1"})
    finally:
        server.stop()
    assert server.peak == 1
    assert (f"[eval] mteb: the hub: {len(server.requests):,} requests, at most 1 at once (bound 1, the whole job), "
            "0 refused with 429 and waited out") in done.stdout, done.stdout[-3000:]
    got = [path.split("/") for method, path, _, _ in server.requests if method == "GET" and "/resolve/" in path]
    downloads = ["/".join([*parts[2:4], *parts[6:]]) for parts in got]  # /datasets/<org>/<repo>/resolve/<rev>/<file>
    assert len(downloads) == len(set(downloads)), sorted(d for d in set(downloads) if downloads.count(d) > 1)
    files = {str(p.relative_to(hub)) for p in hub.rglob("*") if p.is_file()}
    assert set(downloads) <= files and {"/".join(d.split("/")[:2]) for d in downloads} == \
        {retrieval.PATHS[name] for name in names}
    assert f"[eval] mteb: {len(names)} tasks read by mteb's loaders in " in done.stdout
    for name in names:
        result = mteb.TaskResult.from_disk(out / f"{name}.json")
        assert result.task_name == name and result.scores, name
