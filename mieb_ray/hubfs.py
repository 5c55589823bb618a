"""Hub access that survives the hub: the user's token, a bound on concurrent requests, retries with backoff.

`HubFileSystem` is an fsspec filesystem around the hub's own (`huggingface_hub.HfFileSystem`, or the one
a factory named by `MIEB_RAY_HUB_FS=package.module:factory` returns: the tests' fake hub). storage.py
reads `hf://` through it. Every request to the inner filesystem (an info, a listing, one byte range):

- holds one of `MIEB_RAY_HUB_CONCURRENCY` (default 8) slots of the job's gate (hubgate.py): at most that many
  requests at once in the whole job, every process on every node together; a 429 pauses every process of the
  job for the wait the hub asked;
- is retried, up to `MIEB_RAY_HUB_RETRIES` tries (default 6), on 408/429/5xx, timeouts, connection
  resets and truncated reads (fewer bytes than asked before the end of the file), waiting what the hub
  asks (`Retry-After`, the `RateLimit` header) or an exponential backoff from `MIEB_RAY_HUB_RETRY_WAIT`
  seconds (default 1), doubling up to 30 s, with jitter so that workers do not retry in step;
- when the tries run out, raises `storage.TransientStorageError`: a one-line error, which Ray may retry.

(huggingface_hub retries a byte range itself, 5 times on 429/5xx/timeouts; its listings and infos it does not
retry, and it takes a short body for the whole range: those are what this layer adds. Its own retries of a 429
happen inside one of our requests; its warning of each is the only word of them, so `_ClientRetries` reads those
warnings and pauses the job's gate for the wait the client takes, as a 429 of ours does.)

Reads of the hub by other libraries' code (mteb's loaders through `datasets`: `bounded_client()`) are
huggingface_hub's own requests, retried by it alone; inside `bounded_client`, each such request of the process to
the hub or its CDNs, whichever thread makes it (datasets downloads 16 files at once), holds a slot of the same gate
until its body is read, and a 429 pauses the gate. While a request of `call`'s is under way in the process, the
client's requests pass: `call` holds a slot for them, and the client may spread them over threads of its own
(HfFileSystem lists a tree in a pool), which a second slot would deadlock at a bound of 1.

A connection that cannot be made (no network, unknown host) is tried 3 times within about 3 s and then
raised as it is, unless the hub has answered this process before (then it is an outage, waited out like
the rest): nothing can succeed, so the user hears it in seconds.
Anything else (404, 401, a malformed file) is not retried and keeps its own error.

The token is the standard `HF_TOKEN` (or the one `hf auth login` saved), which the hub client sends with
every request; `worker_runtime_env()` gives it to the job's Ray workers without writing it in a log.
"""

from __future__ import annotations

import functools
import importlib
import json
import logging
import os
import random
import re
import threading
import time
import urllib.parse
from contextlib import contextmanager

import fsspec
from fsspec.spec import AbstractBufferedFile

from mieb_ray import hubgate
from mieb_ray.errors import TransientStorageError, UserError, described

ENV_FS = "MIEB_RAY_HUB_FS"
ENV_CONCURRENCY = "MIEB_RAY_HUB_CONCURRENCY"
ENV_RETRIES = "MIEB_RAY_HUB_RETRIES"
ENV_RETRY_WAIT = "MIEB_RAY_HUB_RETRY_WAIT"
DEFAULT_CONCURRENCY = 8
DEFAULT_TRIES = 6
MAX_WAIT = 30.0
MAX_RETRY_AFTER = 300.0  # the hub's rate-limit windows are 5 minutes
RETRY_STATUS = frozenset({408, 429, 500, 502, 503, 504})
UNREACHED_TRIES = 3  # a connection error before the hub ever answered this process: a few seconds, then said
# what the job's workers need to read the hub as the driver does
WORKER_ENV = ("HF_TOKEN", "HF_ENDPOINT", "HF_HUB_DISABLE_PROGRESS_BARS")
WORKER_ENV_PREFIX = "MIEB_RAY_HUB_"


class TruncatedRead(Exception):
    """A byte range came back shorter than asked, before the end of the file."""


def _env(name: str, default, kind=int):
    """A count (at least 1) or, with kind=float, seconds (at least 0) from the environment; one line if it is not."""
    try:
        value = kind(os.environ.get(name) or default)
    except ValueError:
        raise UserError(f"{name}={os.environ[name]!r} is not a{'n integer' if kind is int else ' number'}") from None
    return max(1, value) if kind is int else max(0.0, value)


def bound() -> int:
    """The most hub requests at once for the whole job: MIEB_RAY_HUB_CONCURRENCY."""
    return _env(ENV_CONCURRENCY, DEFAULT_CONCURRENCY)


_answered = threading.Event()  # the hub has answered this process at least once
_used = threading.Event()  # this process reads the hub (a hub filesystem, bounded_client): its job shares the gate
# bounded_client blocks open in this process, `call`s under way (each holding a slot), the client factory set
_bounded = {"loads": 0, "calls": 0, "installed": False}
_bounded_lock = threading.Lock()


def share_gate() -> None:
    """Ray is up in a job's driver: if the job reads the hub, its workers share one gate (hubgate.share)."""
    if _used.is_set():
        hubgate.share(bound())


def job_reads_hub() -> None:
    """This job's workers will read the hub (bounded_client): once Ray is up, they share one gate (share_gate)."""
    _used.set()


def requests_so_far() -> dict:
    """The hub requests of the job so far (hubgate.stats): for `summary` at the end."""
    return hubgate.stats(bound())


def summary(before: dict) -> str:
    """The job's hub requests since `before` (requests_so_far), for its closing line."""
    now = requests_so_far()
    scope = "the whole job" if now["scope"] == "job" else "this process"
    return (f"the hub: {now['requests'] - before['requests']:,} requests, at most {now['peak']} at once (bound "
            f"{now['slots']}, {scope}), {now['throttled'] - before['throttled']:,} refused with 429 and waited out")


def load_inner() -> fsspec.AbstractFileSystem:
    """The hub filesystem to wrap: the factory MIEB_RAY_HUB_FS names, else huggingface_hub's (token: HF_TOKEN)."""
    spec = os.environ.get(ENV_FS)
    if spec:
        module, _, name = spec.partition(":")
        return getattr(importlib.import_module(module), name or "factory")()
    from huggingface_hub import HfFileSystem

    return HfFileSystem()


def _http_errors() -> tuple[tuple[type, ...], tuple[type, ...]]:
    """(connection errors, other transient transport errors) of the hub client's HTTP library."""
    connect, other = [], [TimeoutError, ConnectionResetError, ConnectionAbortedError, BrokenPipeError]
    for name in ("httpx2", "httpx"):  # huggingface_hub 2 uses httpx2
        try:
            mod = importlib.import_module(name)
        except ImportError:
            continue
        connect += [mod.ConnectError, mod.ConnectTimeout]
        other += [mod.TimeoutException, mod.NetworkError, mod.RemoteProtocolError]
    return tuple(connect), tuple(other)


def _wait_asked(response) -> float | None:
    """Seconds the hub asked us to wait (RateLimit reset or Retry-After), if it did."""
    try:
        from huggingface_hub.utils import parse_ratelimit_headers

        info = parse_ratelimit_headers(response.headers)
        if info is not None and info.remaining == 0:
            return float(info.reset_in_seconds)
    except Exception:  # an older hub client, or a header it cannot parse
        pass
    value = next((v for k, v in response.headers.items() if k.lower() == "retry-after"), None)
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:
        return None  # an HTTP date: the backoff will do


def classify(exc: BaseException) -> tuple[bool, float | None]:
    """(whether `exc` may pass if we try again, the wait the server asked for)."""
    if isinstance(exc, TruncatedRead):
        return True, None
    response = getattr(exc, "response", None)
    status = getattr(response, "status_code", None)
    if isinstance(status, int):  # HfHubHTTPError and the like: the server answered
        return status in RETRY_STATUS, _wait_asked(response) if status in RETRY_STATUS else None
    connect, other = _http_errors()
    if isinstance(exc, connect):
        return _answered.is_set(), None  # nothing reached yet: no network, a wrong endpoint or host
    return isinstance(exc, other), None


def transient_cause(exc: BaseException) -> BaseException | None:
    """The error in `exc`'s chain that may pass if tried again (classify), if any: another library's retries that
    ran out raise their own error from the hub's answer (huggingface_hub: a 503 to a file's HEAD becomes "cannot
    find the requested files in the local cache")."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if classify(exc)[0]:
            return exc
        exc = exc.__cause__ or exc.__context__
    return None


def _backoff(base: float, attempt: int) -> float:
    # jittered, so that a job's workers do not come back in step
    return min(MAX_WAIT, base * 2 ** (attempt - 1)) * random.uniform(0.5, 1.0)


def call(fn, what: str, on_retry=None):
    """`fn()` holding a slot, retried on transient errors with backoff; `on_retry()` before each retry."""
    tries = _env(ENV_RETRIES, DEFAULT_TRIES)
    base = _env(ENV_RETRY_WAIT, 1.0, float)
    t0 = time.monotonic()
    gate = hubgate.gate(bound())
    for attempt in range(1, tries + 1):
        try:
            lease = gate.enter()
            _count("calls", 1)
            try:
                result = fn()
            finally:
                _count("calls", -1)
                gate.leave(lease)
            _answered.set()
            return result
        except Exception as exc:
            transient, asked = classify(exc)
            # a connection error before any answer: a blip at this process's first request, or no network
            # at all, which is raised as it is after a few seconds
            unreached = not transient and attempt < min(UNREACHED_TRIES, tries) and isinstance(exc, _http_errors()[0])
            if not transient and not unreached:
                raise
            if attempt == tries:
                raise TransientStorageError(
                    f"the hub kept failing on {what} ({tries} tries in {time.monotonic() - t0:.0f}s): "
                    f"{described(exc)}") from exc
            wait = min(MAX_RETRY_AFTER, asked) if asked is not None else _backoff(base, attempt)
            if getattr(getattr(exc, "response", None), "status_code", None) == 429:
                gate.pause(wait)  # the whole job waits, not this request alone
            time.sleep(wait)  # no slot held
            if on_retry is not None:
                on_retry()


class _ClientRetries(logging.Handler):
    """huggingface_hub's warnings as it retries a request itself (utils/_http.py): "HTTP Error 429 thrown while
    requesting ...", then "Rate limited. Waiting 2.0s before retry ..." or "Retrying in 1s ..." (a last failure
    has no wait: it is raised to `call`, which counts it). Each 429 with a wait pauses the job's gate."""

    LOGGER = "huggingface_hub.utils._http"
    STATUS = re.compile(r"HTTP Error (\d+) ")
    WAIT = re.compile(r"(?:Rate limited\. Waiting|Retrying in) ([0-9.]+)s")

    def __init__(self):
        super().__init__(logging.WARNING)
        self.status = threading.local()  # per thread: the HTTP status its last warning named

    def emit(self, record: logging.LogRecord) -> None:
        text, last = record.getMessage(), getattr(self.status, "code", None)
        self.status.code = status.group(1) if (status := self.STATUS.match(text)) else None
        if last == "429" and (wait := self.WAIT.match(text)):
            hubgate.gate(bound()).pause(float(wait.group(1)))

    @classmethod
    def install(cls) -> None:
        logger = logging.getLogger(cls.LOGGER)
        if not any(isinstance(h, cls) for h in logger.handlers):
            logger.addHandler(cls())


@contextmanager
def bounded_client():
    """huggingface_hub's requests in this process, from any thread, while the block runs: each holds a slot of the
    job's gate until its body is read, and a 429 pauses the gate (the module docstring)."""
    from huggingface_hub import set_client_factory
    from huggingface_hub.utils._http import default_client_factory

    _used.set()
    with _bounded_lock:
        if not _bounded["installed"]:
            set_client_factory(lambda: _gated(default_client_factory()))  # the client in use is closed
            _bounded["installed"] = True
    _count("loads", 1)
    try:
        yield
    finally:
        _count("loads", -1)


def _count(what: str, step: int) -> None:
    with _bounded_lock:
        _bounded[what] += step


def _gated(client):
    """huggingface_hub's default client with each of its transports (direct, or a proxy's) gated."""
    http = importlib.import_module(type(client).__module__.partition(".")[0])  # httpx2 (huggingface_hub 2) or httpx
    leaving = _leaving(http.SyncByteStream)
    client._transport = _GatedTransport(client._transport, leaving)
    client._mounts = {k: v if v is None else _GatedTransport(v, leaving) for k, v in client._mounts.items()}
    return client


class _GatedTransport:
    """A transport that holds a slot of the gate for each request while a bounded_client block is open."""

    def __init__(self, inner, leaving):
        self.inner, self.leaving = inner, leaving

    def handle_request(self, request):
        if not _bounded["loads"] or _bounded["calls"] or not _is_hub(request.url.host):
            return self.inner.handle_request(request)
        gate = hubgate.gate(bound())
        lease = gate.enter()
        try:
            response = self.inner.handle_request(request)
        except BaseException:
            gate.leave(lease)
            raise
        _answered.set()
        if response.status_code == 429:  # the client waits what the hub asked, or its own 1 s first backoff
            gate.pause(min(MAX_RETRY_AFTER, _wait_asked(response) or 1.0))
        response.stream = self.leaving(response.stream, lambda: gate.leave(lease))
        return response

    def close(self) -> None:
        self.inner.close()

    def __enter__(self):
        self.inner.__enter__()
        return self

    def __exit__(self, *exc):
        self.inner.__exit__(*exc)


def _is_hub(host: str) -> bool:
    """The hub's endpoint (HF_ENDPOINT) or its CDNs (a file's download is redirected there); not another host
    (datasets asks an S3 bucket of its own for legacy loading scripts)."""
    from huggingface_hub import constants

    host = host.lower()
    return host == urllib.parse.urlparse(constants.ENDPOINT).hostname or \
        any(host == d or host.endswith("." + d) for d in ("hf.co", "huggingface.co"))


@functools.lru_cache(maxsize=None)
def _leaving(base: type) -> type:
    """A response body of the client's HTTP library (`base`: its SyncByteStream, as the client checks) that gives
    its slot back once, when it is closed (read to its end, or dropped)."""

    class Leaving(base):
        def __init__(self, stream, leave):
            self.stream, self._leave = stream, leave

        def __iter__(self):
            yield from self.stream

        def close(self) -> None:
            try:
                self.stream.close()
            finally:
                leave, self._leave = self._leave, None
                if leave is not None:
                    leave()

    return Leaving


class HubFileSystem(fsspec.AbstractFileSystem):
    """The inner hub filesystem, each request bounded and retried (see the module docstring)."""

    protocol = "hf"
    cachable = False

    def __init__(self, inner: fsspec.AbstractFileSystem | None = None, **kwargs):
        super().__init__(**kwargs)
        self.inner = inner if inner is not None else load_inner()
        _used.set()
        _ClientRetries.install()

    def _where(self, path: str) -> str:
        return "hf://" + self._strip_protocol(path)

    def info(self, path, **kwargs):
        return call(lambda: self.inner.info(path, **kwargs), self._where(path))

    def ls(self, path, detail=True, **kwargs):
        return call(lambda: self.inner.ls(path, detail=detail, **kwargs), self._where(path))

    def find(self, path, maxdepth=None, withdirs=False, detail=False, **kwargs):
        # the hub client lists a whole tree in a few paged calls: one request here, retried whole
        return call(lambda: self.inner.find(path, maxdepth=maxdepth, withdirs=withdirs, detail=detail, **kwargs),
                    self._where(path))

    # fsspec's defaults answer False on any error; only "not found" is False here, the rest is raised
    def exists(self, path, **kwargs):
        try:
            self.info(path)
            return True
        except FileNotFoundError:
            return False

    def isfile(self, path):
        try:
            return self.info(path)["type"] == "file"
        except FileNotFoundError:
            return False

    def isdir(self, path):
        try:
            return self.info(path)["type"] == "directory"
        except FileNotFoundError:
            return False

    def _open(self, path, mode="rb", block_size=None, autocommit=True, cache_options=None, **kwargs):
        if mode != "rb":
            raise NotImplementedError("the hub is read here, never written")
        return HubFile(self, path, block_size=block_size or "default", cache_options=cache_options)


class HubFile(AbstractBufferedFile):
    """A file of the hub read by byte ranges, each one request of the inner filesystem: bounded, retried, and
    checked against the file's size (a short range is a truncated read, retried on a fresh handle)."""

    def __init__(self, fs: HubFileSystem, path: str, **kwargs):
        super().__init__(fs, path, mode="rb", **kwargs)  # its size: one info() call, bounded and retried
        self._handle = None
        self._lock = threading.Lock()

    def _inner(self):
        if self._handle is None:
            # no cache of its own: the range asked is the range fetched, one GET
            self._handle = self.fs.inner.open(self.path, "rb", cache_type="none")
        return self._handle

    def _drop(self) -> None:
        handle, self._handle = self._handle, None
        if handle is not None:
            try:
                handle.close()
            except Exception:
                pass

    def _fetch_range(self, start: int, end: int) -> bytes:
        end = min(end, self.size)
        if end <= start:
            return b""

        def once() -> bytes:
            f = self._inner()
            f.seek(start)
            data = f.read(end - start)
            if len(data) != end - start:
                self._drop()
                raise TruncatedRead(f"{len(data)} of {end - start} bytes at offset {start}")
            return data

        with self._lock:
            if self._handle is None:  # opening is a request of its own (the hub client resolves the file)
                call(self._inner, self.fs._where(self.path))
            return call(once, self.fs._where(self.path), on_retry=self._drop)

    def close(self):
        self._drop()
        super().close()


def worker_runtime_env() -> dict | None:
    """A Ray runtime_env that gives the job's workers the hub settings of this process (HF_TOKEN, HF_ENDPOINT,
    MIEB_RAY_HUB_*), or None when there is nothing to give.

    Not as `env_vars`: Ray's runtime-env agent writes those, values and all, to runtime_env_agent.log on every
    node. A `worker_process_setup_hook` closure is stored pickled in Ray's GCS and only its name is logged.
    Values the job's own runtime_env (`ray job submit --runtime-env-json`) already sets are left to it, and a
    job that has its own setup hook keeps it (its workers then need the variables from the job or the nodes).
    """
    values = {k: v for k, v in os.environ.items() if v and (k in WORKER_ENV or k.startswith(WORKER_ENV_PREFIX))}
    job = {}
    if raw := os.environ.get("RAY_JOB_CONFIG_JSON_ENV_VAR"):
        try:
            job = (json.loads(raw).get("runtime_env") or {})
        except ValueError:
            job = {}
    if job.get("worker_process_setup_hook"):
        return None
    values = {k: v for k, v in values.items() if k not in (job.get("env_vars") or {})}
    return {"worker_process_setup_hook": _env_hook(values)} if values else None


def _env_hook(values: dict[str, str]):
    def mieb_ray_hub_env():  # a closure: pickled by value with `values`, run first in every worker
        os.environ.update(values)

    return mieb_ray_hub_env
