"""Where an encoder runs is its pool's decision, never a guess in the actor (issue: a GPU actor that silently
encodes on its CPU, a CPU actor that loads onto a GPU it was not given).

With Ray on this machine: a local Ray that declares one GPU (Ray then gives an actor asking for it
CUDA_VISIBLE_DEVICES=0, though this torch has no CUDA: a driver too old for the build, or a container without the
GPU runtime, look the same), and a setup hook that makes torch claim CUDA in every worker (a GPU node where an
actor given no GPU still sees one)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from support.pictures import encode, picture

from mieb_ray.encode.model import Encoder, cuda_problem, load_info
from mieb_ray.errors import UserError

RUN = """
import json, sys, ray
from mieb_ray.errors import UserError
from mieb_ray.pipelines.embed import EmbedConfig, embed
table, out, model, gpus, hook, temp = sys.argv[1:7]
ray.init(num_cpus=2, num_gpus=1, include_dashboard=False, logging_level="ERROR", _temp_dir=temp,
         runtime_env={"worker_process_setup_hook": hook} if hook else None)
try:
    manifest = embed(EmbedConfig(table, out, model, gpus_per_worker=float(gpus), cpus_per_worker=0.5,
                                 executor="ray"), log=lambda line: None)
    print(json.dumps({"counts": manifest["counts"]}))
except UserError as exc:
    print(json.dumps({"error": str(exc)}))
"""


def start(folder, tiny_clip, gpus: float, hook: str = ""):
    """The embed job in a fresh process with its own local Ray (random ports: two run side by side)."""
    table = folder / "t.parquet"
    photo = encode(picture("coffee.jpg").resize((80, 60)), "JPEG")
    pq.write_table(pa.table({"key": ["a", "b"], "image": [photo, photo]}), table)
    temp = tempfile.mkdtemp(prefix="ray")  # short: Ray's socket paths have a length limit
    return subprocess.Popen([sys.executable, "-c", RUN, str(table), str(folder / "out"), tiny_clip, str(gpus), hook,
                             temp], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True), folder, temp


def result(proc) -> dict:
    stdout, stderr = proc.communicate(timeout=240)
    lines = [line for line in stdout.splitlines() if line.startswith("{")]
    assert proc.returncode == 0 and lines, stdout[-3000:] + stderr[-3000:]
    return json.loads(lines[-1])


@pytest.fixture(scope="module")
def runs(tiny_clip, tmp_path_factory):
    """Both actors' runs at once (each waits mostly on its own Ray's start): {name: (process, its folder, Ray's
    temp dir)}."""
    if torch.cuda.is_available():
        pytest.skip("torch sees CUDA here")
    both = {"given a gpu": start(tmp_path_factory.mktemp("gpu"), tiny_clip, gpus=1),
            "given none": start(tmp_path_factory.mktemp("none"), tiny_clip, gpus=0, hook="support.fake_cuda.pretend")}
    yield both
    for proc, _, temp in both.values():
        proc.kill()  # a no-op once it has ended
        proc.wait()
        shutil.rmtree(temp, ignore_errors=True)


def test_an_encoder_asked_for_cuda_without_it_is_one_line(tiny_clip):
    if torch.cuda.is_available():
        pytest.skip("torch sees CUDA here")
    with pytest.raises(UserError) as exc:
        Encoder(tiny_clip, load_info(tiny_clip, tiny_clip, None), device="cuda")
    line = str(exc.value)
    assert line == cuda_problem("cuda") and "\n" not in line
    assert line.startswith(f"this encoder was asked for cuda, but torch {torch.__version__} (")
    assert "sees no CUDA device (NVIDIA driver: " in line and line.endswith("or pass --gpus-per-worker 0 to encode "
                                                                          "on CPUs")


@pytest.mark.timeout(300)
def test_an_actor_given_a_gpu_that_torch_cannot_see_stops_in_one_line(runs):
    proc, folder, _ = runs["given a gpu"]
    got = result(proc)
    build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU-only build"
    assert got["error"].startswith(f"this encoder was given GPU 0, but torch {torch.__version__} ({build}) sees no "
                                   "CUDA device (NVIDIA driver: "), got
    assert not os.path.exists(folder / "out" / "_manifest.json")


@pytest.mark.timeout(300)
def test_an_actor_given_no_gpu_encodes_on_its_cpu_even_where_torch_sees_cuda(runs):
    """Before, the encoder took cuda whenever torch.cuda.is_available(): here that load fails (no CUDA build)."""
    got = result(runs["given none"][0])
    assert got == {"counts": {"total": 2, "errors": 0}}
