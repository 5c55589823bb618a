"""A fake Hugging Face hub for the tests: a hub-layout mirror on local disk served under `hf://` paths, with
faults injected deterministically.

It is plugged in where the real hub client is: `MIEB_RAY_HUB_FS=support.fakehub:from_env` (tests/ on PYTHONPATH) makes
hubfs.HubFileSystem wrap it instead of `huggingface_hub.HfFileSystem`, in the driver and (the variable
reaching them) in Ray's workers. `from_env` reads its settings from the JSON file that
`MIEB_RAY_HUB_FAKE` names; while that file does not exist it returns the real hub client, so the
variable can be set for a whole test session.

Paths are the hub client's: `datasets/<org>/<repo>@<revision>/<path in repo>` -> `<root>/<org>/<repo>/<path>`
(the layout of mieb_ray/demo_data/mirror.py and of `huggingface-cli download --local-dir ROOT/<org>/<repo>`). A
revision other than the one the catalog pins is a 404, as on the hub.

Settings (all optional but root):
  root         the mirror
  every, faults  every `every`-th request of a process fails (byte ranges and the other requests counted
               apart; never two in a row for one path, so that a retry succeeds), with the next kind of
               `faults` in turn: "429" (Retry-After: `retry_after`), "503", "timeout", "reset" (connection
               reset), "truncate" (a byte range comes back half long)
  offset       shifts which requests fail
  fail         substrings of paths whose every request is a 503 (an outage that outlasts the retries)
  flaky        {substring: n}: the first n requests of a process for such paths are a 503 (an outage that
               outlasts the local retries but not Ray's), except in the process `calm_pid` (the driver)
  throttle     {substring: n}: the same, with a 429 (Retry-After: `retry_after`), logged as "throttle"
  deny         repos ("org/name") that answer 401 to everyone
  error        every request fails with OSError(error), as a transport that fails in its own words
  token        the only HF_TOKEN accepted: any other, or none, is a 401
  delay        seconds each request takes (to see concurrency)
  limit, slots  at most `limit` requests at once across every process (each holds an flock on one of the
               `limit` files in the folder `slots`); one more is refused with a 429 (Retry-After: `retry_after`),
               logged as "busy", as the hub refuses a client that asks too much at once. Each request that got
               through is logged as "slot <i>" (i: the lowest free slot it took; the largest + 1 is the most
               requests seen at once)
  log          a file each process appends its injected faults to: "<pid> <kind> <path>"
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import threading
import time

import fsspec
from fsspec.spec import AbstractBufferedFile

ENV_CONFIG = "MIEB_RAY_HUB_FAKE"
FACTORY = "support.fakehub:from_env"
ENV_HTTP = "MIEB_RAY_HUB_FAKE_HTTP"  # the url of an HttpHub, for HTTP_FACTORY
HTTP_FACTORY = "support.fakehub:http_client"
ENDPOINT = "https://huggingface.co"


def from_env() -> fsspec.AbstractFileSystem:
    path = os.environ.get(ENV_CONFIG)
    if not path or not os.path.exists(path):
        from huggingface_hub import HfFileSystem

        return HfFileSystem()
    return FakeHub.from_config(path)


def http_client() -> fsspec.AbstractFileSystem:
    """huggingface_hub's own HfFileSystem, as on the real hub, talking to the HttpHub whose url MIEB_RAY_HUB_FAKE_HTTP
    names (MIEB_RAY_HUB_FS=support.fakehub:http_client)."""
    from huggingface_hub import HfFileSystem

    return HfFileSystem(endpoint=os.environ[ENV_HTTP])


def as_the_hub(monkeypatch, url: str) -> None:
    """huggingface_hub and `datasets` in this process read the server at `url` (an HttpHub) as the hub, online,
    as HF_ENDPOINT makes them at import: its host is the hub's (hubfs.bounded_client gates it)."""
    import datasets.config
    import huggingface_hub.constants as hub_constants

    for module, name, value in [
            (hub_constants, "HF_HUB_OFFLINE", False), (datasets.config, "HF_HUB_OFFLINE", False),
            (hub_constants, "ENDPOINT", url), (datasets.config, "HF_ENDPOINT", url),
            (hub_constants, "HUGGINGFACE_CO_URL_TEMPLATE", url + "/{repo_id}/resolve/{revision}/{filename}"),
            (datasets.config, "HUB_DATASETS_URL", url + "/datasets/{repo_id}/resolve/{revision}/{path}")]:
        monkeypatch.setattr(module, name, value)


def serve_models(monkeypatch, root: str, models: dict[str, str]) -> HttpHub:
    """An HttpHub serving each {repo: folder} as a model repo, as this process's hub, with an empty model cache:
    what a machine that never loaded them sees. The caller stops it."""
    import huggingface_hub.constants as hub_constants

    for repo, folder in models.items():
        shutil.copytree(folder, os.path.join(root, "repos", repo))
    hub = HttpHub(os.path.join(root, "repos"))
    as_the_hub(monkeypatch, hub.url)
    monkeypatch.setattr(hub_constants, "HF_HUB_CACHE", os.path.join(root, "cache"))
    return hub


def write_config(path: str, **settings) -> str:
    """Write the settings `from_env` reads; returns `path`."""
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump(settings, f)
    os.replace(tmp, path)
    return path


def _read_config(path: str) -> tuple[int, dict]:
    """(the file's mtime, taken before reading it, so that a rewrite meanwhile is seen next time; its settings)"""
    stamp = os.stat(path).st_mtime_ns
    with open(path) as f:
        return stamp, json.load(f)


def _pinned() -> dict[str, str]:
    from mieb_ray.sources import SOURCES

    return {s.repo: s.revision for s in SOURCES}


def http_error(status: int, url: str, text: str = "", headers: dict | None = None):
    """The exception the hub client raises for an HTTP `status` answer."""
    import httpx2
    from huggingface_hub.utils import hf_raise_for_status

    response = httpx2.Response(status, headers=headers or {}, text=text, request=httpx2.Request("GET", url))
    try:
        hf_raise_for_status(response)
    except Exception as exc:
        return exc
    raise AssertionError(f"no error for HTTP {status}")


class FakeHub(fsspec.AbstractFileSystem):
    protocol = "hf"
    cachable = False

    def __init__(self, root: str, every: int = 0, faults=("429", "timeout", "truncate", "reset", "503"),
                 offset: int = 0, fail=(), flaky: dict | None = None, throttle: dict | None = None, deny=(),
                 token: str | None = None, calm_pid: int | None = None, delay: float = 0.0, retry_after: float = 0,
                 log: str | None = None, limit: int = 0, slots: str | None = None, error: str | None = None,
                 **kwargs):
        super().__init__(**kwargs)
        self.root, self.every, self.faults, self.offset = root, every, list(faults), offset
        self.fail, self.deny, self.token, self.delay, self.retry_after = list(fail), set(deny), token, delay, \
            retry_after
        self.log, self.limit, self.slots, self.error = log, limit, slots, error
        self.flaky = dict(flaky or {}) if os.getpid() != calm_pid else {}
        self.throttle = dict(throttle or {}) if os.getpid() != calm_pid else {}
        self.requests = 0
        self._faulted: set[str] = set()  # paths whose last request failed
        self._counts = {False: 0, True: 0}  # metadata requests, byte ranges: each their own turn of faults
        self.injected: list[str] = []  # the faults this process injected, in order
        self.inflight = self.max_inflight = 0
        self._lock = threading.Lock()
        self._pins = _pinned()

    @classmethod
    def from_config(cls, path: str) -> FakeHub:
        """The fake of the settings in `path`, which it reads again whenever they are rewritten: a Ray worker
        keeps its hub client for the session, and each test writes its own settings."""
        stamp, settings = _read_config(path)
        hub = cls(**settings)
        hub._config = (path, stamp)
        return hub

    def _reload(self) -> None:
        path, stamp = getattr(self, "_config", (None, None))
        try:
            if path is None or os.stat(path).st_mtime_ns == stamp:
                return
            stamp, settings = _read_config(path)
        except FileNotFoundError:  # unplugged after a test: this process keeps what it had
            return
        self.__init__(**settings)  # counters and faults start again, as in a fresh process
        self._config = (path, stamp)

    # ------------------------------------------------------------------------------------------ requests

    def _local(self, path: str) -> tuple[str, str]:
        """(repo, local path) of a hub path; FileNotFoundError where the hub would answer 404."""
        path = self._strip_protocol(path)
        parts = path.split("/")
        if len(parts) < 3 or parts[0] != "datasets":
            raise FileNotFoundError(path)
        name, _, revision = parts[2].partition("@")
        repo = f"{parts[1]}/{name}"
        if revision and repo in self._pins and revision != self._pins[repo]:
            raise FileNotFoundError(f"Revision '{revision}' does not exist for dataset '{repo}'")
        local = os.path.join(self.root, parts[1], name, *parts[3:])
        if not os.path.exists(os.path.join(self.root, parts[1], name)):
            raise FileNotFoundError(f"Repository not found: {repo}")
        return repo, local

    def _request(self, path: str, ranged: bool = False) -> str | None:
        """Count one request, raise the fault it gets; returns "truncate" when the range must come back short."""
        self._reload()
        if self.error:
            raise OSError(self.error)
        url = f"{ENDPOINT}/{self._strip_protocol(path)}"  # datasets/<org>/<repo>...
        repo = "/".join(self._strip_protocol(path).split("/")[1:3]).split("@")[0]
        if repo in self.deny or (self.token is not None and os.environ.get("HF_TOKEN") != self.token):
            given = os.environ.get("HF_TOKEN", "")
            # a careless server that echoes the credential: what we print must still not hold it
            raise http_error(401, url, f"Invalid credentials in Authorization header (Bearer {given})",
                              {"X-Error-Message": f"Invalid credentials: {given}"})
        if any(s in path for s in self.fail):
            raise http_error(503, url, "Service Unavailable")
        for kind, left in (("flaky", self.flaky), ("throttle", self.throttle)):
            with self._lock:
                hit = next((s for s, n in left.items() if s in path and n > 0), None)
                if hit is not None:
                    left[hit] -= 1
            if hit is not None:
                self._note(f"{kind} {path}")
                if kind == "throttle":
                    raise http_error(429, url, "Too Many Requests", {"Retry-After": f"{self.retry_after:g}"})
                raise http_error(503, url, "Service Unavailable")
        with self._lock:
            self.requests += 1
            n = self._counts[ranged] + self.offset
            self._counts[ranged] += 1
            # never twice in a row for one path: with threads sharing the count, a request's retries could
            # otherwise meet the fault's turn again and again
            if not self.every or n % self.every != self.every - 1 or path in self._faulted:
                self._faulted.discard(path)
                return None
            self._faulted.add(path)
        kinds = [k for k in self.faults if ranged or k != "truncate"] or ["timeout"]
        kind = kinds[(n // self.every) % len(kinds)]
        self.injected.append(kind)
        if self.log:
            with open(self.log, "a") as f:
                f.write(f"{os.getpid()} {kind} {path}\n")
        import httpx2

        request = httpx2.Request("GET", url)
        if kind == "429":
            raise http_error(429, url, "Too Many Requests", {"Retry-After": f"{self.retry_after:g}"})
        if kind == "503":
            raise http_error(503, url, "Service Unavailable")
        if kind == "timeout":
            raise httpx2.ReadTimeout("The read operation timed out", request=request)
        if kind == "reset":
            raise httpx2.ReadError("[Errno 104] Connection reset by peer", request=request)
        return kind

    def _note(self, line: str) -> None:
        if self.log:
            with open(self.log, "a") as f:
                f.write(f"{os.getpid()} {line}\n")

    def _slot(self, path: str):
        """One of the `limit` slot files, locked for this request; a 429 when every one is taken."""
        import fcntl

        os.makedirs(self.slots, exist_ok=True)
        for i in range(self.limit):
            f = open(os.path.join(self.slots, str(i)), "a")
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                f.close()
                continue
            self._note(f"slot {i} {path}")
            return f
        self._note(f"busy {path}")
        raise http_error(429, f"{ENDPOINT}/{path}", "Too Many Requests", {"Retry-After": f"{self.retry_after:g}"})

    def _timed(self, fn, path: str = ""):
        held = self._slot(path) if self.limit else None
        with self._lock:
            self.inflight += 1
            self.max_inflight = max(self.max_inflight, self.inflight)
        try:
            if self.delay:
                time.sleep(self.delay)
            return fn()
        finally:
            with self._lock:
                self.inflight -= 1
            if held is not None:
                held.close()  # the lock goes with the descriptor


    # ------------------------------------------------------------------------------------------ fsspec

    def info(self, path, **kwargs):
        path = self._strip_protocol(path)
        self._request(path)
        return self._timed(lambda: self._info(path), path)

    def _info(self, path: str) -> dict:
        _, local = self._local(path)
        if os.path.isdir(local):
            return {"name": path, "size": 0, "type": "directory"}
        if os.path.isfile(local):
            return {"name": path, "size": os.path.getsize(local), "type": "file"}
        raise FileNotFoundError(path)

    def ls(self, path, detail=True, **kwargs):
        path = self._strip_protocol(path)
        self._request(path)

        def listing():
            info = self._info(path)
            if info["type"] == "file":
                return [info] if detail else [path]
            _, local = self._local(path)
            out = [self._info(f"{path}/{name}") for name in sorted(os.listdir(local))]
            return out if detail else [i["name"] for i in out]

        return self._timed(listing, path)

    def find(self, path, maxdepth=None, withdirs=False, detail=False, **kwargs):
        # one listing request of the whole tree, as the hub client's find; fsspec's walk-based default would
        # swallow an injected error (an OSError) into an empty listing
        path = self._strip_protocol(path)
        self._request(path)

        def tree():
            top = self._info(path)
            if top["type"] == "file":
                return {path: top}
            _, local = self._local(path)
            out = {path: top} if withdirs else {}
            for folder, dirs, files in os.walk(local):
                rel = os.path.relpath(folder, local)
                depth = 0 if rel == "." else rel.count(os.sep) + 1
                if maxdepth is not None and depth >= maxdepth:
                    dirs[:] = []
                base = path if rel == "." else f"{path}/{rel.replace(os.sep, '/')}"
                for name in sorted(files) + (sorted(dirs) if withdirs else []):
                    out[f"{base}/{name}"] = self._info(f"{base}/{name}")
            return out

        found = self._timed(tree, path)
        return found if detail else sorted(found)

    def _open(self, path, mode="rb", block_size=None, autocommit=True, cache_options=None, **kwargs):
        if mode != "rb":
            raise NotImplementedError("the fake hub is read-only")
        path = self._strip_protocol(path)
        info = self.info(path)
        if info["type"] != "file":
            raise FileNotFoundError(path)
        return FakeHubFile(self, path, size=info["size"], block_size=block_size or "default",
                           cache_options=cache_options, **kwargs)


class FakeHubFile(AbstractBufferedFile):
    def _fetch_range(self, start: int, end: int) -> bytes:
        fs: FakeHub = self.fs
        fault = fs._request(self.path, ranged=True)
        _, local = fs._local(self.path)

        def read():
            with open(local, "rb") as f:
                f.seek(start)
                return f.read(end - start)

        data = fs._timed(read, self.path)
        return data[: len(data) // 2] if fault == "truncate" and len(data) > 1 else data


# ------------------------------------------------------------------------------------------ over HTTP


class HttpHub:
    """The same mirror behind a local HTTP server that speaks the part of the hub's API the real client uses
    to read a dataset (`/api/datasets/<repo>/revision|tree|paths-info/<rev>`, `/datasets/<repo>/resolve/<rev>/
    <path>` with byte ranges), so that `HfFileSystem(endpoint=hub.url)` is tested as it is, retries and all, and
    `datasets.load_dataset` (hf_hub_download: a HEAD of each file, the commit and ETag headers) with its endpoint;
    and a model (`/api/models/<repo>/...`, `/<repo>/resolve/...`: snapshot_download) from a folder in the same root.
    Its one branch, main, is the commit `commit(repo)`; any 40-hex revision is a commit.

    Every `every`-th request fails in turn with one of `faults`: "429" (Retry-After: 0), "503", "truncate"
    (a 206 holding half the range asked, its length consistent) and "drop" (the connection closes halfway
    through the body); an API call gets a 503 where a byte range would be cut. `outage` ({substring: n}): the
    first n requests whose path holds the substring are a 503, however they are retried. `token`: the only
    bearer token accepted (401 otherwise; for a repo in `gated`, the hub's answer to a gated repo). `delay`:
    seconds each request waits before its answer. `requests`: (method, path, authorization header, fault) of each
    request; `peak`: the most requests at once between their arrival and the start of their answer (a client
    still waits for each then).
    """

    def __init__(self, root: str, every: int = 0, faults=("429", "truncate", "503", "drop"),
                 token: str | None = None, outage: dict[str, int] | None = None, delay: float = 0.0):
        import urllib.parse
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        self.root, self.every, self.faults, self.token = root, every, list(faults), token
        self.outage, self.delay = dict(outage or {}), delay
        self.gated: set[str] = set()
        self.active = self.peak = 0
        self.requests: list[tuple[str, str, str | None, str | None]] = []
        self._lock = threading.Lock()
        self._count = 0
        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def send(self, code: int, body, headers: dict | None = None, cut: bool = False):
                body = json.dumps(body).encode() if isinstance(body, (list, dict)) else body
                self.send_response(code)
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if self.command != "HEAD":  # headers alone: a body would read as the next answer
                    self.wfile.write(body[: len(body) // 2] if cut else body)
                if cut:
                    self.close_connection = True

            def do_GET(self):
                with hub._lock:
                    hub.active += 1
                    hub.peak = max(hub.peak, hub.active)
                self.counted = True
                try:
                    time.sleep(hub.delay)
                    self.answer()
                finally:
                    self.answered()

            def send_response(self, *args, **kwargs):
                self.answered()  # before a byte of the answer leaves: the client is still waiting for it
                super().send_response(*args, **kwargs)

            def answered(self):
                if getattr(self, "counted", False):
                    self.counted = False
                    with hub._lock:
                        hub.active -= 1

            def answer(self):
                url = urllib.parse.urlparse(self.path)
                path = urllib.parse.unquote(url.path)
                length = int(self.headers.get("content-length") or 0)
                form = urllib.parse.parse_qs(self.rfile.read(length).decode()) if length else {}
                fault = hub._fault(path)
                with hub._lock:
                    hub.requests.append((self.command, path, self.headers.get("authorization"), fault))
                if hub.token is not None and self.headers.get("authorization") != f"Bearer {hub.token}":
                    repo = next((r for r in hub.gated if f"/{r}/" in path), None)
                    if repo:  # the hub's answer to a gated repo's files without a token that was granted them
                        return self.send(401, {"error": f"Access to model {repo} is restricted."},
                                         {"X-Error-Code": "GatedRepo"})
                    return self.send(401, {"error": "Invalid credentials in Authorization header"})
                api = re.match(r"^/api/(?:datasets|models)/([^/]+/[^/]+)/(revision|tree|paths-info)/([^/]+)/?(.*)$",
                               path)
                blob = None if api else re.match(r"^/(?:datasets/)?([^/]+/[^/]+)/resolve/([^/]+)/(.+)$", path)
                if fault == "429":
                    return self.send(429, {"error": "rate limited"}, {"Retry-After": "0"})
                if fault == "503" or (fault and api):
                    return self.send(503, {"error": "Service Unavailable"})
                if api:
                    return self.api(*api.groups(), form=form, query=urllib.parse.parse_qs(url.query))
                if blob:
                    return self.blob(blob.group(1), blob.group(2), blob.group(3), fault)
                self.send(404, {"error": "not found"})

            do_POST = do_HEAD = do_GET

            def api(self, repo, kind, revision, rest, form, query):
                folder = os.path.join(hub.root, repo)
                if not os.path.isdir(folder):
                    return self.send(404, {"error": "Repository not found"}, {"X-Error-Code": "RepoNotFound"})
                if kind == "revision":
                    if revision != "main" and not re.fullmatch(r"[0-9a-f]{40}", revision):
                        return self.send(404, {"error": f"Invalid rev id: {revision}"},
                                         {"X-Error-Code": "RevisionNotFound"})
                    sha = revision if revision != "main" else commit(repo)
                    return self.send(200, {"id": repo, "sha": sha, "private": False, "siblings": []})
                if kind == "paths-info":
                    return self.send(200, [_entry(folder, p) for p in form.get("paths", [])
                                           if os.path.exists(os.path.join(folder, p))])
                base = os.path.join(folder, rest)
                if query.get("recursive", ["false"])[0] == "true":
                    names = [os.path.join(d, n) for d, dirs, files in os.walk(base) for n in sorted(dirs + files)]
                else:
                    names = [os.path.join(base, n) for n in sorted(os.listdir(base))]
                self.send(200, [_entry(folder, os.path.relpath(n, folder)) for n in names])

            def blob(self, repo, revision, rel, fault):
                local = os.path.join(hub.root, repo, rel)
                if not os.path.isfile(local):
                    return self.send(404, {"error": "Entry not found"}, {"X-Error-Code": "EntryNotFound"})
                with open(local, "rb") as f:
                    data = f.read()
                lo, hi = 0, len(data) - 1
                if rng := self.headers.get("range"):
                    a, b = rng.split("=", 1)[1].split("-")
                    lo, hi = int(a), min(int(b) if b else hi, hi)
                part = data[lo:hi + 1]
                if fault == "truncate":
                    part = part[: len(part) // 2]
                    hi = lo + len(part) - 1
                # the hub's headers that hf_hub_download (datasets' reads) requires; its cache keeps a blob per ETag
                headers = {"Content-Range": f"bytes {lo}-{hi}/{len(data)}", "X-Repo-Commit": revision,
                           "ETag": f'"{hashlib.sha256(data).hexdigest()}"'}
                self.send(206 if rng else 200, part, headers, cut=fault == "drop")

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def _fault(self, path: str) -> str | None:
        with self._lock:
            for part, left in self.outage.items():
                if part in path and left > 0:
                    self.outage[part] = left - 1
                    return "503"
        if not self.every or path.startswith("/api/agent-harnesses"):  # the client's own registry fetch
            return None
        with self._lock:
            n, self._count = self._count, self._count + 1
        if n % self.every != self.every - 1:
            return None
        return self.faults[(n // self.every) % len(self.faults)]

    def downloads(self, since: int = 0) -> list[str]:
        """The files it sent in full (GET) from its `since`-th request on, sorted."""
        return sorted(path.rsplit("/resolve/", 1)[1].split("/", 1)[1]
                      for method, path, _, _ in self.requests[since:] if method == "GET" and "/resolve/" in path)

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def commit(repo: str) -> str:
    """The commit an HttpHub gives a repo's main."""
    return hashlib.sha1(repo.encode()).hexdigest()


def _entry(folder: str, rel: str) -> dict:
    local = os.path.join(folder, rel)
    if os.path.isdir(local):
        return {"type": "directory", "oid": "0" * 40, "size": 0, "path": rel}
    return {"type": "file", "oid": "1" * 40, "size": os.path.getsize(local), "path": rel}
