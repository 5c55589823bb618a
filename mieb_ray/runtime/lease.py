"""One run at a time per output: while a job writes OUT, its driver holds OUT/_lease.json (which run: job, host,
pid, since when) and rewrites it every BEAT_SECONDS. Another run given the same OUT (`ray job submit` interrupted
with Ctrl-C leaves its job running, and the user submits again, with --resume or --overwrite) is refused in one
line before it touches anything; without this, its --overwrite deleted the files the first run had committed
while that run went on committing and wrote a manifest over them.

A lease is free when its run ended (the driver drops it when the job ends, however it ends), when it was taken on
this machine by a process that is gone (a SIGKILLed driver: its next run goes on at once), or when it has not been
rewritten for STALE_SECONDS (a driver on another machine that died)."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import time
import uuid

import psutil

from mieb_ray import storage
from mieb_ray.errors import UserError

BEAT_SECONDS = 10.0
STALE_SECONDS = 60.0  # six beats missed: a driver on another machine is taken for dead
# the runs of this process that hold their output now: one of its runs that could not drop its lease (S3 down as
# it ended) holds nothing, though its process lives on (a notebook, a test)
_HOLDING: set[str] = set()


def _started(pid: int) -> float | None:
    """When process `pid` of this machine started (None: there is none), telling a reused pid from the holder."""
    try:
        return round(psutil.Process(pid).create_time(), 2)
    except psutil.Error:
        return None


def holder(lease: dict | None, now: float, host: str, started=_started, holding: set[str] = frozenset()) -> str | None:
    """The run that holds the output, in words, or None when no live run does. `lease`: the file's content (None:
    there is none); `host`: this machine's name; `started(pid)`: a process's start time on this machine;
    `holding`: the runs of this process that hold their output."""
    if not isinstance(lease, dict) or not isinstance(lease.get("seen"), (int, float)) \
            or not isinstance(lease.get("pid"), int):
        return None  # no lease, or not one of ours
    mine = lease.get("host") == host
    if mine and started(lease.get("pid")) != lease.get("started_at"):
        return None  # its process is gone (or the pid is another process's now)
    if mine and lease.get("pid") == os.getpid() and lease.get("run") not in holding:
        return None  # a run of this process that has ended
    if not mine and now - lease["seen"] > STALE_SECONDS:
        return None
    where = "this machine" if mine else f"host {lease.get('host')}, last heard from {now - lease['seen']:.0f} s ago"
    since = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(lease.get("since", lease["seen"])))
    return f"another run of mieb-ray {lease.get('job')} (pid {lease.get('pid')} on {where}, since {since})"


class Lease:
    """This run's hold on an output (take() makes one); release() ends it, and is safe to call twice. Its thread
    rewrites it every BEAT_SECONDS while the run lasts, and drops it when the run ends: a store that is down then
    (the job failed on it) delays the command's exit by RELEASE_SECONDS at most. Every write and the drop are
    conditional on the file being as this run last wrote it (storage.write_if): two runs starting together cannot
    both take it, and a run that lost it never writes over the run that took it."""

    RELEASE_SECONDS = 3.0  # a healthy store drops it in milliseconds

    def __init__(self, out: str, job: str):
        self.uri = storage.join(out, storage.LEASE)
        pid = os.getpid()
        self.record = {"job": job, "run": uuid.uuid4().hex, "host": socket.gethostname(), "pid": pid,
                       "started_at": _started(pid), "since": time.time()}
        self.version: str | None = None  # of the file as this run last wrote it
        self._stop = threading.Event()
        self._beat = threading.Thread(target=self._beating, name=f"lease {out}", daemon=True)

    def _write(self, over: str | None) -> str | None:
        """Write it over the file at version `over` (None: where there is none); None when that failed."""
        data = json.dumps({**self.record, "seen": time.time()}).encode()
        written = storage.write_if(self.uri, data, over)
        if written is None and over is not None:
            lease, now = _read(self.uri)
            if isinstance(lease, dict) and lease.get("run") == self.record["run"]:  # ours: a write whose reply
                written = storage.write_if(self.uri, data, now)  # was lost (the store failed after it landed)
        self.version = written or self.version
        return written

    def _beating(self) -> None:
        while not self._stop.wait(BEAT_SECONDS):
            try:
                if self._write(self.version) is None:  # taken over: never written over another run's
                    return
            except Exception:  # an outage: the run's own writes say so; the lease outlives it
                pass
        with contextlib.suppress(Exception):  # unreachable: it frees itself (a dead process, or stale)
            storage.delete_if(self.uri, self.version)

    def held_by_another(self) -> str | None:
        """Who holds the output now if not this run (another run took it over after this one's beats failed
        for STALE_SECONDS), else None."""
        return held_by_another(self.uri, self.record["run"], self.record["host"])

    def release(self) -> None:
        if self._stop.is_set():
            return
        _HOLDING.discard(self.record["run"])
        self._stop.set()  # the thread ends a beat in flight, then drops the lease
        self._beat.join(self.RELEASE_SECONDS)


def _read(uri: str) -> tuple[dict | None, str | None]:
    """The lease there (None: none; {}: not one) and its version; a store that cannot be reached is an error,
    never "none"."""
    data, version = storage.read_versioned(uri)
    if data is None:
        return None, None
    try:
        return json.loads(data), version
    except ValueError:
        return {}, version


def _other(lease: dict | None, run: str, host: str) -> str | None:
    """Who holds `lease` if not run `run`, in words; None when `run` holds it."""
    if isinstance(lease, dict) and lease.get("run") == run:
        return None
    return holder(lease, time.time(), host, holding=_HOLDING) or "a run that has ended since"


def held_by_another(uri: str, run: str, host: str | None = None) -> str | None:
    """Who holds the lease at `uri` if not run `run`, in words; None when `run` holds it."""
    return _other(_read(uri)[0], run, host or socket.gethostname())


def check_held(out: str, run: str | None, what: str) -> None:
    """Before a worker commits `what` into `out` for run `run` (None: a run that holds no lease): refuse if another
    run took the output over (this run went unheard for STALE_SECONDS), so the files it commits are never mixed
    with the other run's. No lease at all is no other run: a unit still committing after its driver was
    interrupted (and dropped the lease) is kept for --resume, as every committed unit is."""
    if run is None:
        return
    lease, _ = _read(storage.join(out, storage.LEASE))  # one read: this is every unit's commit
    if lease is not None and (other := _other(lease, run, socket.gethostname())):
        raise UserError(f"{storage.display(out)} was taken over by {other} while this run's hold on it lapsed: "
                        f"{what} was not committed")


def take(out: str, job: str) -> Lease:
    """Hold `out` for this run of `job`, or refuse in one line naming the run that holds it."""
    mine = Lease(out, job)
    for _ in range(3):  # a lease that changes between the read and the write is read again
        lease, version = _read(mine.uri)
        if other := holder(lease, time.time(), mine.record["host"], holding=_HOLDING):
            raise UserError(f"{storage.display(out)} is being written by {other}: wait for it to end, or stop it "
                            "(ray job stop, or kill its process); --resume and --overwrite leave an output alone "
                            "while another run writes it")
        _HOLDING.add(mine.record["run"])  # before it is written: this process's other runs see it held
        if mine._write(version) is not None:
            mine._beat.start()
            return mine
        _HOLDING.discard(mine.record["run"])
    raise UserError(f"{storage.display(out)}: other runs keep taking it as this one starts; try again")
