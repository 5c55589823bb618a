"""What a user reads: a job prints its own lines and the errors, nothing else (Ray's log lines, Ray Data's plan,
progress bars of transformers and the hub, Ray core's E lines that are not errors); --verbose brings them back.
A model the hub cannot give is one line within seconds, not half a minute of retries."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from support.pictures import encode, picture

OWN = re.compile(r"^\[(build|embed|eval|audit|demo)\] ")


def env(**extra) -> dict:
    keep = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}  # a laptop: the job's own local Ray
    return {**keep, **extra}


@pytest.mark.timeout(600)
def test_a_ray_job_prints_only_its_own_lines_unless_verbose(tiny_clip, mirror, tmp_path):
    """An embed (the encoder's weight-loading bars, Ray Data's plan) says its own lines only; a build with --verbose
    (no encoder to start: the cheaper job) shows Ray Data's plan. Side by side, each on a local Ray of its own."""
    photo = encode(picture("coffee.jpg").resize((80, 60)), "JPEG")
    pq.write_table(pa.table({"key": ["a", "b", "c"], "image": [photo] * 3}), tmp_path / "t.parquet")
    commands = {False: ["embed", "--input", str(tmp_path / "t.parquet"), "--out", str(tmp_path / "emb"), "--model",
                        tiny_clip],
                True: ["build", "--sources", mirror[0], "--datasets", "cifar10", "--out", str(tmp_path / "train"),
                       "--verbose"]}
    runs = {verbose: subprocess.Popen([sys.executable, "-m", "mieb_ray", *args, "--executor", "ray"],
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env())
            for verbose, args in commands.items()}
    lines = {}
    for verbose, proc in runs.items():
        stdout, stderr = proc.communicate(timeout=300)
        assert proc.returncode == 0, stdout[-2000:] + stderr[-3000:]
        lines[verbose] = [line for line in (stdout + stderr).splitlines() if line.strip()]
    assert [line for line in lines[False] if not OWN.match(line)] == []
    others = [line for line in lines[True] if not OWN.match(line)]
    assert any("streaming_executor" in line for line in others), others  # Ray Data's plan, with --verbose


@pytest.mark.timeout(300)
def test_an_eval_in_this_process_prints_only_its_own_lines(tiny_clip, tmp_path):
    """mteb's tasks run here (no cluster): CVBenchCount's dataset maps show `datasets` bars, and sklearn warns of a
    class never predicted in FGVCAircraftZeroShot's scores."""
    from support.hub_tasks import tasks_misc

    names = ["CVBenchCount", "FGVCAircraftZeroShot"]
    for write in dict.fromkeys(tasks_misc.TASKS[n] for n in names):
        write(str(tmp_path / "mirror"))
    done = subprocess.run([sys.executable, "-m", "mieb_ray", "eval", "--tasks", ",".join(names), "--sources",
                           str(tmp_path / "mirror"), "--model", tiny_clip, "--out", str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=240, env=env())
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert "[eval] 2 tasks in " in done.stdout
    assert [line for line in (done.stdout + done.stderr).splitlines() if line.strip() and not OWN.match(line)] == []


def test_a_hub_model_the_hub_cannot_give_is_one_line_within_seconds(tmp_path):
    """No network (here: nothing listens where the hub should be): the hub client would retry for half a minute."""
    pq.write_table(pa.table({"key": ["a"], "image": [b"x"]}), tmp_path / "t.parquet")
    quiet_hub = {k: v for k, v in env().items() if k != "HF_HUB_OFFLINE"}
    t0 = time.time()
    done = subprocess.run([sys.executable, "-m", "mieb_ray", "embed", "--input", str(tmp_path / "t.parquet"), "--out",
                           str(tmp_path / "o"), "--model", "openai/clip-vit-base-patch32"], capture_output=True,
                          text=True, timeout=120, env={**quiet_hub, "HF_ENDPOINT": "http://127.0.0.1:9",
                                                       "HF_HOME": str(tmp_path / "hf")})
    assert done.returncode == 1 and time.time() - t0 < 15
    assert done.stderr.splitlines() == ["mieb-ray: error: model openai/clip-vit-base-patch32 is not a local directory "
                                        "or cached here, and cannot reach the Hugging Face hub http://127.0.0.1:9: "
                                        "connection refused"]
    assert not os.path.exists(tmp_path / "o")


def test_mtebs_tasks_from_a_hub_it_cannot_reach_are_one_line_within_seconds(tiny_clip, tmp_path):
    """`eval` of a task mteb loads, with nothing listening where the hub should be: the hub client retried each
    file for half a minute, printing its retries, before mteb's error."""
    quiet_hub = {k: v for k, v in env().items() if k != "HF_HUB_OFFLINE"}
    t0 = time.time()
    done = subprocess.run([sys.executable, "-m", "mieb_ray", "eval", "--tasks", "STS13VisualSTS", "--model", tiny_clip,
                           "--out", str(tmp_path / "o")], capture_output=True, text=True, timeout=120,
                          env={**quiet_hub, "HF_ENDPOINT": "http://127.0.0.1:9", "HF_HOME": str(tmp_path / "hf")})
    assert done.returncode == 1 and time.time() - t0 < 20 and done.stdout == ""
    assert done.stderr.splitlines() == ["mieb-ray: error: mteb's tasks read the Hugging Face hub, and cannot reach the "
                                        "Hugging Face hub http://127.0.0.1:9: connection refused (with their data in "
                                        "this machine's cache, set HF_HUB_OFFLINE=1)"]
    assert not os.path.exists(tmp_path / "o")


def test_the_hub_clients_retry_notices_are_held_back(tmp_path):
    """huggingface_hub logs each retry of a request as a warning ("... thrown while requesting GET ...", "Retrying in
    1s [Retry 1/5]."); a job says how its hub requests went itself (hubfs.summary), and a request that fails for
    good reaches it as an error. Outside quiet(), as under --verbose, they show."""
    script = """
import datasets  # as the hub client's loggers are when a job runs: `datasets` gives them a stderr handler
from huggingface_hub.utils import http_backoff
from mieb_ray.runtime.quiet import quiet

def request():
    try:
        http_backoff("GET", "http://127.0.0.1:9/x", max_retries=1, base_wait_time=0.01, max_wait_time=0.01)
    except Exception:
        print("[eval] failed")

with quiet():
    request()
request()
"""
    online = {k: v for k, v in env().items() if k != "HF_HUB_OFFLINE"}  # offline, the client sends nothing
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, env=online)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "[eval] failed\n[eval] failed\n"
    assert done.stderr.count("Retrying in 0.01s [Retry 1/1].") == 1  # the second request's, outside quiet()


def test_raylet_notices_are_filtered_on_stdout_as_on_stderr(tmp_path):
    """Ray's driver prints a raylet's warnings with print_to_stdstream to sys.stdout (is_err False), its C++ log to
    the stderr descriptor: both are held back, the job's own lines on both pass, in order."""
    script = """
import sys
from ray._private.worker import print_to_stdstream
from mieb_ray.runtime.quiet import quiet
with quiet():
    print("[embed] before")
    print_to_stdstream({"lines": ["WARNING: 10 PYTHON worker processes have been started on node: x"],
                        "pid": "raylet", "is_err": False}, ignore_prefix=False)
    sys.stderr.write("[2026-12-02 21:16:56,714 E 6571 6571] core_worker.cc:2465: Actor restart will fail\\n")
    print("mieb-ray: an error of the job", file=sys.stderr)
    print("[embed] after")
print("[embed] outside")
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                          env={**env(), "RAY_COLOR_PREFIX": "1"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["[embed] before", "[embed] after", "[embed] outside"]
    assert done.stderr.splitlines() == ["mieb-ray: an error of the job"]
