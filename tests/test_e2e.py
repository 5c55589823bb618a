"""Users' path end to end: a real local Ray cluster (`ray start --head`), a real S3 server (SeaweedFS), and the
three jobs through `ray job submit --working-dir .`, build -> embed (images and texts) -> eval; then the
outputs on S3. The cluster is stopped whatever happens.

Credentials reach the jobs the way they do on AWS, from the nodes' environment, never through the job's
runtime env, so they appear in no job metadata and no log (checked).
"""

from __future__ import annotations

import glob
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest

from s3server import free_port

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
pytestmark = pytest.mark.timeout(900)


@pytest.fixture(scope="module")
def cluster(s3):
    """`ray start --head` in its own session and temp dir: its own processes only are stopped at the end."""
    tmp = tempfile.mkdtemp(prefix="mieb-e2e-", dir="/tmp")  # short: Ray's socket paths have a length limit
    dashboard = free_port()
    env = {**os.environ, **s3.env, "RAY_AUTH_MODE": "disabled", "PATH": f"{BIN}:{os.environ['PATH']}"}
    env.pop("RAY_ADDRESS", None)
    head = subprocess.Popen(
        [str(BIN / "ray"), "start", "--head", "--block", f"--port={free_port()}", "--num-cpus=4",
         f"--temp-dir={tmp}/r", "--include-dashboard=true", "--dashboard-host=127.0.0.1",
         f"--dashboard-port={dashboard}", "--disable-usage-stats",
         # ports of their own: the test session's Ray may hold the defaults on this machine
         *(f"--{name}={free_port()}" for name in ("dashboard-agent-listen-port", "dashboard-agent-grpc-port",
                                                   "metrics-export-port", "runtime-env-agent-port",
                                                   "ray-client-server-port", "node-manager-port",
                                                   "object-manager-port"))],
        env=env, stdout=open(f"{tmp}/head.log", "wb"), stderr=subprocess.STDOUT, start_new_session=True)
    address = f"http://127.0.0.1:{dashboard}"
    try:
        from ray.job_submission import JobSubmissionClient

        deadline = time.time() + 180
        while True:  # ready when it takes a job: the dashboard answers before its job agent does
            try:
                client = JobSubmissionClient(address)
                probe = client.submit_job(entrypoint="python -c pass")
                while client.get_job_status(probe).value not in ("SUCCEEDED", "FAILED", "STOPPED"):
                    time.sleep(0.5)
                break
            except Exception:
                if head.poll() is not None or time.time() > deadline:
                    raise RuntimeError(f"the Ray head did not come up: {open(f'{tmp}/head.log').read()[-2000:]}")
                time.sleep(1)
        yield address, tmp
    finally:
        os.killpg(head.pid, signal.SIGTERM)
        try:
            head.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(head.pid, signal.SIGKILL)
        for proc in psutil.process_iter(["cmdline"]):  # anything of this cluster that outlived its session
            if tmp in " ".join(proc.info["cmdline"] or []):
                proc.kill()
        shutil.rmtree(tmp, ignore_errors=True)


def submit(address: str, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    """`ray job submit` as a user types it: the checkout as working dir, the job's own flags after `--`.
    Sets `.status`, the job's final status as the cluster reports it."""
    from ray.job_submission import JobSubmissionClient

    endpoint = os.environ["AWS_ENDPOINT_URL"]
    cmd = [str(BIN / "ray"), "job", "submit", "--address", address, "--working-dir", str(REPO),
           "--runtime-env-json", json.dumps({"env_vars": {"AWS_ENDPOINT_URL": endpoint}}), "--", "python", *args]
    env = {**os.environ, "RAY_AUTH_MODE": "disabled"}
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, cwd=REPO)
    found = re.search(r"raysubmit_\w+", done.stdout + done.stderr)
    assert found, done.stdout[-3000:] + done.stderr[-3000:]
    job_id = found.group()
    done.status = str(JobSubmissionClient(address).get_job_status(job_id).value)
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
    from mieb_ray.fixtures.biovita import make_biovita_mirror
    from mieb_ray.fixtures.mirror import expected_rows, make_mirror

    address, tmp = cluster
    client, bucket = s3.client(), s3.bucket
    written = make_mirror(tmp_path / "mirror", rows=6)
    make_biovita_mirror(tmp_path / "biovita")
    upload(client, bucket, str(tmp_path / "mirror"), "e2e/mirror")
    upload(client, bucket, str(tmp_path / "biovita"), "e2e/biovita")
    upload(client, bucket, tiny_clip, "e2e/models/tiny-clip")
    s3uri = f"s3://{bucket}/e2e"

    build = submit(address, "jobs/build_train.py", "--sources", f"{s3uri}/mirror", "--out", f"{s3uri}/train",
                   "--rows-per-shard", "4")
    assert "[build] done:" in build.stdout
    manifest = read_json(client, bucket, "e2e/train/_manifest.json")
    assert manifest["counts"]["datasets"] == expected_rows(written)

    model = f"{s3uri}/models/tiny-clip"
    submit(address, "jobs/embed.py", "--input", f"{s3uri}/train", "--out", f"{s3uri}/emb-images", "--model", model,
           "--carry-columns", "dataset_name,label")
    submit(address, "jobs/embed.py", "--input", f"{s3uri}/train", "--out", f"{s3uri}/emb-texts", "--model", model,
           "--modality", "text")
    for name in ("emb-images", "emb-texts"):
        emb = read_json(client, bucket, f"e2e/{name}/_manifest.json")
        assert emb["counts"] == {"total": manifest["counts"]["total"], "errors": 0}
        assert len(emb["shards"]) == len(manifest["shards"])

    evaluation = submit(address, "jobs/eval_biovita.py", "--data", f"{s3uri}/biovita", "--model", model,
                        "--out", f"{s3uri}/eval")
    assert "[eval] task score" in evaluation.stdout
    results = read_json(client, bucket, "e2e/eval/BioVITAT2IReranking.json")
    assert [e["hf_subset"] for e in results["scores"]["test"]] == ["unseen_species", "unseen_genus"]
    assert client.head_object(Bucket=bucket, Key="e2e/eval/report.html")["ContentLength"] > 10_000

    # a failing job is FAILED for `ray job submit`, with the one-line reason in its log
    failed = submit(address, "jobs/build_train.py", "--sources", f"{s3uri}/mirror", "--out", f"{s3uri}/x",
                    "--datasets", "cifar11", check=False)
    assert failed.returncode != 0 and failed.status == "FAILED"
    assert "mieb-ray: error: unknown dataset 'cifar11'" in failed.stdout + failed.stderr

    # the secret key is in no log, no job's metadata and no output
    from ray.job_submission import JobSubmissionClient

    jobs = JobSubmissionClient(address)
    seen = [build.stdout + build.stderr, evaluation.stdout, failed.stdout + failed.stderr]
    for job in jobs.list_jobs():
        seen += [json.dumps(job.dict(), default=str), jobs.get_job_logs(job.submission_id)]
    seen += [open(p, errors="replace").read() for p in glob.glob(f"{tmp}/r/session_latest/logs/*.out")]
    for key in ("e2e/train/_manifest.json", "e2e/emb-images/_manifest.json", "e2e/eval/BioVITAT2IReranking.json"):
        seen.append(client.get_object(Bucket=bucket, Key=key)["Body"].read().decode())
    assert not [text for text in seen if s3.secret_key in text]
