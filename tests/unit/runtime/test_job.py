"""A job's output rules (mieb_ray/runtime/job.py): a complete output refused, an unfinished one resumed or
overwritten, other settings or units refused naming what differs, the error rate enforced, stale files removed, the
manifest last; a unit that never comes back is an error, one that comes twice counts once."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time

import numpy as np
import pytest

from mieb_ray import storage
from mieb_ray.errors import UserError
from mieb_ray.runtime import lease, units
from mieb_ray.runtime.job import Job
from mieb_ray.runtime.lease import holder

pytestmark = pytest.mark.timeout(300)


def test_a_job_refuses_to_replace_work_by_mistake(tmp_path):
    out = tmp_path / "out"
    ours = re.compile(r"^\d+\.txt$")
    with Job("test", str(out), "a complete test", ours) as job:  # a run that stopped midway
        job.start()
        job.earlier({}, {"v": 1})
        job.progress.record("u0", {"lo": 0}, {"rows": 1})
        (out / "0.txt").write_text("x")
    with Job("test", str(out), "a complete test", ours) as plain:
        plain.start()
        with pytest.raises(UserError, match=r"out holds an unfinished run of test \(2 files\); pass --resume to "
                                            r"continue it or --overwrite to start again$"):
            plain.earlier({"u0": {"lo": 0}}, {"v": 1})
        with pytest.raises(UserError, match=r"out holds an unfinished run of test \(2 files\), started with other "
                                            r"settings \(v 1 -> 2\); pass --resume"):
            plain.earlier({"u0": {"lo": 0}}, {"v": 2})
    with Job("test", str(out), "a complete test", ours, resume=True) as resumed:
        resumed.start()
        assert resumed.earlier({"u0": {"lo": 0}, "u1": {"lo": 1}}, {"v": 1}) == {"u0": {"rows": 1}}
        assert resumed.earlier({"u0": {"lo": 5}}, {"v": 1}) == {}  # its input changed: made again
        with pytest.raises(UserError, match=r"started with other settings: v 1 -> 2; pass --resume with its "
                                            r"settings"):
            resumed.earlier({"u0": {"lo": 0}}, {"v": 2})
        with pytest.raises(UserError, match=r"started with other settings: 1 of its units are not in this run's "
                                            r"plan \(e\.g\. u0\); pass"):  # other --datasets: never orphaned
            resumed.earlier({"u9": {"lo": 0}}, {"v": 1})
    assert (out / "0.txt").exists() and (out / storage.PROGRESS / "u0.json").exists()  # refusals change nothing
    with Job("test", str(out), "a complete test", ours, overwrite=True) as again:
        again.start()  # the unfinished run's files are gone
        assert not (out / "0.txt").exists() and not (out / storage.PROGRESS).exists()
        again.earlier({}, {"v": 1})
        (out / "1.txt").write_text("x")
        (out / "7.txt").write_text("stale")
        with pytest.raises(UserError, match=r"^3 of 10 rows could not be made \(x: 3\), more than --max-error-rate "
                                            r"0.1; see .*out/_errors$"):
            again.check_errors(3, 7, 0.1, "made", "x: 3")
        again.check_errors(1, 9, 0.1, "made")
        assert again.finish({"format": "test"}, {"1.txt"}) == {"format": "test"}
    assert sorted(p.name for p in out.iterdir()) == ["1.txt", storage.MANIFEST]  # the stale file removed
    with pytest.raises(UserError, match="already holds a complete test"), \
            Job("test", str(out), "a complete test", ours) as done:
        done.start()


def test_an_output_another_run_is_writing_is_left_alone(tmp_path):
    """One run at a time per output (runtime/lease.py): a second run is refused with --resume and --overwrite too,
    touching nothing, until the first ends however it ends; a run whose process is gone holds nothing."""
    out, ours = tmp_path / "out", re.compile(r"^\d+\.txt$")
    with Job("embed", str(out), "embeddings", ours) as first:
        first.start()
        first.earlier({}, {"v": 1})
        (out / "0.txt").write_text("x")
        for flags in ({}, {"resume": True}, {"overwrite": True}):
            with pytest.raises(UserError, match=rf"^{re.escape(str(out))} is being written by another run of "
                                                rf"mieb-ray embed \(pid {os.getpid()} on this machine, since "
                                                r"20\d\d-\d\d-\d\d \d\d:\d\d:\d\d UTC\): wait for it to end, or stop "
                                                r"it \(ray job stop, or kill its process\); --resume and --overwrite "
                                                r"leave an output alone while another run writes it$"), \
                    Job("embed", str(out), "embeddings", ours, **flags) as second:
                second.start()
        assert (out / "0.txt").read_text() == "x"
        left = (out / storage.LEASE).read_text()
    (out / storage.LEASE).write_text(left)  # as if S3 had been down when the run ended: its lease left behind
    # the run ended (an error here): the output is free, an unfinished run now as a stopped run leaves it
    with pytest.raises(UserError, match="pass --resume"), Job("embed", str(out), "embeddings", ours) as third:
        third.start()
        third.earlier({}, {"v": 1})
    # a driver SIGKILLed: its process gone, its next run goes on at once
    held = "from mieb_ray.runtime import lease; import os, sys; lease.take(sys.argv[1], 'embed'); os._exit(0)"
    subprocess.run([sys.executable, "-c", held, str(out)], check=True, timeout=120)
    assert json.loads((out / storage.LEASE).read_text())["job"] == "embed"  # left behind
    with Job("embed", str(out), "embeddings", ours, overwrite=True) as fourth:
        fourth.start()
        fourth.earlier({}, {"v": 1})
        fourth.finish({"format": "test"}, set())
    assert sorted(p.name for p in out.iterdir()) == [storage.MANIFEST]


def test_a_run_that_lost_its_hold_writes_no_manifest(tmp_path):
    """A driver on another machine that went unheard for lease.STALE_SECONDS was taken for dead, and another
    run took the output over: the first, coming back, must not write its manifest over the other's files."""
    out = tmp_path / "out"
    with Job("embed", str(out), "embeddings", re.compile("^$")) as job:
        job.start()
        job.earlier({}, {"v": 1})
        (out / storage.LEASE).write_text(json.dumps({"job": "embed", "run": "other", "host": "gpu-7", "pid": 12,
                                                     "started_at": 1.0, "since": time.time(), "seen": time.time()}))
        with pytest.raises(UserError, match=r"out was taken over by another run of mieb-ray embed \(pid 12 on host "
                                            r"gpu-7, last heard from 0 s ago, since .*\) while this run's hold on it "
                                            r"lapsed: this run's manifest was not written$"):
            job.finish({"format": "test"}, set())
    assert not (out / storage.MANIFEST).exists()
    assert json.loads((out / storage.LEASE).read_text())["run"] == "other"  # its lease is not this run's to drop


def test_a_lease_is_kept_fresh_while_its_run_lasts_and_never_written_over_another(tmp_path, monkeypatch):
    monkeypatch.setattr(lease, "BEAT_SECONDS", 0.05)
    held = lease.take(str(tmp_path), "audit")
    uri = tmp_path / storage.LEASE
    first = json.loads(uri.read_text())["seen"]
    time.sleep(0.5)
    assert json.loads(uri.read_text())["seen"] > first  # rewritten: another machine sees it alive
    landed = {**json.loads(uri.read_text()), "seen": 5.0}
    uri.write_text(json.dumps(landed))  # a beat of its own that landed though the store said it failed
    time.sleep(0.5)
    assert json.loads(uri.read_text())["seen"] > 5.0  # still its own: it goes on beating
    other = {"job": "audit", "run": "other", "host": "gpu-7", "pid": 12, "started_at": 1.0, "since": time.time(),
             "seen": time.time()}
    uri.write_text(json.dumps(other))  # taken over (this run went unheard on another machine for a minute)
    time.sleep(0.5)
    held.release()
    assert json.loads(uri.read_text()) == other  # neither rewritten nor dropped by the run that lost it


_TAKE_AT_ONCE = """
import os, sys, time
from mieb_ray.errors import UserError
from mieb_ray.runtime import lease
print("ready", flush=True)
at = float(sys.stdin.readline())
while time.time() < at:  # all at the same instant
    pass
try:
    lease.take(sys.argv[1], "embed")
    print("took", flush=True)
except UserError:
    print("refused", flush=True)
time.sleep(3)  # alive while the others try
os._exit(0)
"""


@pytest.mark.parametrize("where", ["local", "s3"])
def test_of_runs_starting_together_into_one_output_one_takes_it(where, tmp_path, request):
    """Six runs start at the same instant (a sweep that forgot to vary --out): exactly one holds the output, the
    others are refused; the lease is written only where it was as read (storage.write_if)."""
    env = dict(os.environ)
    if where == "s3":
        s3 = request.getfixturevalue("s3")
        out, env = f"s3://{s3.bucket}/race/{tmp_path.name}", {**env, **s3.env}
    else:
        out = str(tmp_path / "out")
        os.makedirs(out)
    runs = [subprocess.Popen([sys.executable, "-c", _TAKE_AT_ONCE, out], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True, env=env) for _ in range(6)]
    try:
        assert [r.stdout.readline() for r in runs] == ["ready\n"] * 6
        at = time.time() + 0.5
        for r in runs:
            r.stdin.write(f"{at}\n")
            r.stdin.flush()
        said = sorted(r.stdout.readline().strip() for r in runs)
    finally:
        for r in runs:
            r.kill()
            r.wait()
    assert said == ["refused"] * 5 + ["took"]


def test_who_holds_an_output():
    """lease.holder: a live process of this machine holds it; one of another machine until it goes unheard for
    STALE_SECONDS (its clock is not this one's to read: only how long since its last beat was written)."""
    here = {"job": "build", "host": "head", "pid": 40, "started_at": 7.5, "since": 0.0, "seen": 1000.0}
    alive, gone = (lambda pid: 7.5), (lambda pid: None)
    assert holder(here, 1000.0 + 3600, "head", alive) == \
        "another run of mieb-ray build (pid 40 on this machine, since 1970-01-01 00:00:00 UTC)"
    assert holder(here, 1000.0, "head", gone) is None
    assert holder(here, 1000.0, "head", lambda pid: 9.0) is None  # the pid is another process's now
    there = {**here, "host": "gpu-7"}
    assert holder(there, 1000.0 + lease.STALE_SECONDS, "head", gone) == \
        "another run of mieb-ray build (pid 40 on host gpu-7, last heard from 60 s ago, since 1970-01-01 00:00:00 UTC)"
    assert holder(there, 1000.5 + lease.STALE_SECONDS, "head", alive) is None
    assert holder(None, 0.0, "head", alive) is None and holder({}, 0.0, "head", alive) is None
    ours = {**here, "pid": os.getpid(), "run": "r1"}  # a run of this very process: held while it runs
    assert holder(ours, 1000.0, "head", alive, holding={"r1"}) and holder(ours, 1000.0, "head", alive) is None


def lossy(batch: dict) -> dict:
    """A last stage that loses unit 1 and hands unit 2 back twice."""
    units_out = [u for u in batch["unit"] if u != 1] + [u for u in batch["unit"] if u == 2]
    return {"unit": np.array(units_out, dtype=np.int64),
            "result": np.array([json.dumps({"rows": 1}) for _ in units_out], dtype=object)}


def test_a_unit_that_never_comes_back_is_an_error_and_one_that_comes_twice_counts_once(tmp_path):
    job = Job("test", str(tmp_path / "out"), "a complete test", re.compile("^$"), log=lambda _: None)
    assert job.run([0, 2], [units.Stage(lossy)], "local") == [{"rows": 1}, {"rows": 1}]
    with pytest.raises(RuntimeError, match=r"^1 of 3 units did not come back \(e\.g\. unit 1\)"):
        job.run([0, 1, 2], [units.Stage(lossy)], "local")
