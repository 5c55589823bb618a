"""Where bytes live: local paths, `s3://` URIs and the Hugging Face hub (`hf://`), and the manifest.

S3 settings come from the standard AWS environment: `AWS_ENDPOINT_URL(_S3)`, `AWS_REGION` /
`AWS_DEFAULT_REGION`, and the SDK's own credential chain (keys, `AWS_PROFILE`, instance roles).
Reads go through pyarrow filesystems. Writes are atomic: a shard is written to a local temp file
and committed whole, by rename on local disk and by one boto3 upload on S3 (a multipart upload
is aborted on failure, so a half-written object is never visible).

An S3 endpoint that cannot be reached at all (an unknown host, a refused connection) is told in seconds:
the host is resolved once per process before the first S3 call, and check_output() (run by every job
before any work) also connects to it; the SDK's retries (10, backoff up to 20 s) are for outages.
The hub (`hf://`) is read through hubfs.HubFileSystem: token, bounded concurrency, retries.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import shutil
import socket
import tempfile
import time
import uuid
from urllib.parse import urlparse

import pyarrow.fs as pafs
from filelock import FileLock

# the store's errors, here too as storage.StorageError and storage.TransientStorageError
from mieb_ray.errors import StorageError, TransientStorageError, UserError, described, first_line, redact  # noqa: F401
from mieb_ray.hubfs import HubFileSystem

MANIFEST = "_manifest.json"  # an output's manifest, written last: without it, the output is unfinished
PROGRESS = "_progress"  # an unfinished output's records of the units it committed (runtime/output.py)
LEASE = "_lease.json"  # which run is writing the output now (runtime/lease.py)


PROBE_TIMEOUT = 3.0  # seconds to resolve and connect to an S3 endpoint before its first use


def is_s3(uri: str) -> bool:
    return uri.startswith("s3://")


def join(base: str, *parts: str) -> str:
    return "/".join([base.rstrip("/"), *(p.strip("/") for p in parts)])


def _endpoint() -> str | None:
    return os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")


def _s3_address() -> tuple[str, str, int]:
    """(endpoint as printed, host, port) of the S3 service this process talks to."""
    if endpoint := _endpoint():
        url = urlparse(endpoint if "://" in endpoint else f"https://{endpoint}")
        return endpoint, url.hostname or "", url.port or (80 if url.scheme == "http" else 443)
    region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"
    host = f"s3.{region}.amazonaws.com"
    return f"https://{host}", host, 443


def _resolve(host: str, port: int, what: str) -> None:
    for attempt in range(3):
        try:
            socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
            return
        except (socket.gaierror, UnicodeError) as exc:
            # a name that does not resolve now will not in the SDK's next 70 s either; only a resolver that
            # says "try again" (EAI_AGAIN) gets another second
            if getattr(exc, "errno", None) == socket.EAI_AGAIN and attempt < 2:
                time.sleep(0.5)
                continue
            raise StorageError(f"cannot reach {what}: unknown host {host!r} "
                               f"({exc.strerror if isinstance(exc, socket.gaierror) else exc})") from exc


def probe(endpoint: str, what: str, connect: bool = True) -> None:
    """One line within seconds when a service cannot be reached at all: its host does not resolve or (`connect`)
    no address takes a TCP connection within PROBE_TIMEOUT s. Not for outages mid-job: those the clients retry
    (for over a minute, on a machine that is simply offline)."""
    url = urlparse(endpoint if "://" in endpoint else f"https://{endpoint}")
    host, port = url.hostname or "", url.port or (80 if url.scheme == "http" else 443)
    _resolve(host, port, f"{what} {endpoint}")
    if not connect:
        return
    try:
        socket.create_connection((host, port), timeout=PROBE_TIMEOUT).close()  # tries each address in turn
    except OSError as exc:
        reason = "connection refused" if isinstance(exc, ConnectionRefusedError) else \
            f"no connection within {PROBE_TIMEOUT:g}s"
        raise StorageError(f"cannot reach {what} {endpoint}: {reason}") from None


def probe_s3(connect: bool = True) -> None:
    """probe() of the S3 endpoint this process talks to."""
    probe(_s3_address()[0], "S3 endpoint", connect)


def probe_hub() -> None:
    """probe() of the Hugging Face hub, unless HF_HUB_OFFLINE (its client retries an unreachable host for half a
    minute per file)."""
    from huggingface_hub import constants

    if not constants.HF_HUB_OFFLINE:
        probe(constants.ENDPOINT, "the Hugging Face hub")


@functools.lru_cache(maxsize=None)
def _s3() -> pafs.S3FileSystem:
    # A bare S3FileSystem() ignores AWS_ENDPOINT_URL, so pass it on; the SDK resolves region and keys.
    probe_s3(connect=False)  # an unknown host fails now, not after the SDK's retries
    kwargs = {}
    if endpoint := _endpoint():
        url = urlparse(endpoint)
        kwargs.update(endpoint_override=url.netloc, scheme=url.scheme or "https")
    if region := os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION"):
        kwargs["region"] = region
    elif endpoint:
        kwargs["region"] = "us-east-1"
    return pafs.S3FileSystem(retry_strategy=pafs.AwsStandardS3RetryStrategy(max_attempts=10),
                             connect_timeout=PROBE_TIMEOUT, **kwargs)


@functools.lru_cache(maxsize=None)
def _hf() -> pafs.FileSystem:
    return pafs.PyFileSystem(pafs.FSSpecHandler(HubFileSystem()))


def reset_clients() -> None:
    """Forget the S3 and hub clients this process made: the next request makes them again from the environment
    as it is then (AWS_* and MIEB_RAY_HUB_* are read when a client is made, once per process)."""
    for client in (_s3, _boto3_s3, _hf):
        client.cache_clear()


def filesystem(uri: str) -> tuple[pafs.FileSystem, str]:
    """The pyarrow filesystem for `uri` and the path inside it."""
    if is_s3(uri):
        return _s3(), uri[len("s3://"):].rstrip("/")
    if uri.startswith("hf://"):
        return _hf(), uri[len("hf://"):].rstrip("/")
    return pafs.LocalFileSystem(), os.path.abspath(uri)


def _remote_error(exc: BaseException) -> bool:
    """An error of the filesystem's own transport: OSError (pyarrow, S3), or the hub client's HTTP errors
    (httpx's ConnectError and timeouts are not OSErrors), which are one line for the user, not a traceback."""
    return isinstance(exc, OSError) or any(c.__module__.split(".")[0] in ("httpx", "httpx2", "huggingface_hub")
                                           for c in type(exc).__mro__)


def _describe(exc: BaseException) -> str:
    # pyarrow's S3 messages are long and multi-line; keep the first line, never any credential
    return redact(first_line(exc))


def listing(uri: str) -> dict[str, tuple[int, int | None]]:
    """{file URI: (size, modification time in ns or None)} of every file under `uri`, recursively, with the same
    scheme (of `uri` itself, when it is a file); {} when it does not exist."""
    fs, path = filesystem(uri)
    prefix = uri.rstrip("/")
    try:
        infos = fs.get_file_info([path])
        if infos[0].type != pafs.FileType.File:
            infos = fs.get_file_info(pafs.FileSelector(path, recursive=True, allow_not_found=True))
    except Exception as exc:
        if not _remote_error(exc):
            raise
        raise StorageError(f"cannot list {uri}: {_describe(exc)}") from exc
    files = {prefix + i.path[len(path):]: (i.size, i.mtime_ns) for i in sorted(infos, key=lambda i: i.path)
             if i.type == pafs.FileType.File}
    if not files and is_s3(uri):  # nothing there: a prefix yet to be written, or a mistyped bucket name
        _check_bucket(uri, sure=False)
    return files


def files_under(uri: str) -> dict[str, tuple[int, int | None]]:
    """listing() of a prefix, keyed by each file's path under it."""
    cut = len(uri.rstrip("/")) + 1
    return {file[cut:]: stamp for file, stamp in listing(uri).items()}


def list_files(uri: str) -> list[str]:
    """Every file under `uri`, recursively, as URIs with the same scheme; [] when it does not exist."""
    return list(listing(uri))


def exists(uri: str) -> bool:
    """Whether a file or folder is there (one line when its bucket is not: a mistyped name is said as such)."""
    fs, path = filesystem(uri)
    try:
        found = fs.get_file_info(path).type != pafs.FileType.NotFound
    except Exception as exc:
        if not _remote_error(exc):
            raise
        raise StorageError(f"cannot reach {uri}: {_describe(exc)}") from exc
    if not found and is_s3(uri):
        _check_bucket(uri, sure=False)
    return found


def open_input(uri: str):
    """A seekable binary file (pyarrow NativeFile) for reading `uri`."""
    fs, path = filesystem(uri)
    try:
        return fs.open_input_file(path)
    except FileNotFoundError as exc:
        raise StorageError(f"no such file: {uri}") from exc
    except Exception as exc:
        if not _remote_error(exc):
            raise
        raise StorageError(f"cannot open {uri}: {_describe(exc)}") from exc


def file_sizes(uris: list[str], what: str = "embedding shard") -> list[int]:
    """Sizes of files from the store's listing (never opened); a listed `what` that is not there is a one-line
    error (a manifest may list files another tool never wrote)."""
    if len({is_s3(u) for u in uris}) > 1:  # files on two stores: each asked of its own
        return [file_sizes([u], what)[0] for u in uris]
    fs, _ = filesystem(uris[0])
    infos = fs.get_file_info([filesystem(u)[1] for u in uris])
    for uri, info in zip(uris, infos):
        if info.type != pafs.FileType.File:
            raise StorageError(f"no such {what}: {display(uri)}")
    return [i.size for i in infos]


def read_text(uri: str) -> str:
    with open_input(uri) as f:
        return f.read().decode("utf-8")


def cache_dir(kind: str) -> str:
    """This machine's folder for local copies of remote files of one kind: $XDG_CACHE_HOME (~/.cache)/mieb-ray/kind."""
    return os.path.join(os.path.expanduser(os.environ.get("XDG_CACHE_HOME", "~/.cache")), "mieb-ray", kind)


# A machine's copies of S3 models and mirrors (a sweep over checkpoints makes one each) never leave their disk with
# less than CACHE_RESERVE of it free: the copies used least recently go first, never one used within
# CACHE_IN_USE_SECONDS (a job on this machine may be loading it).
CACHE_RESERVE = 0.1
CACHE_IN_USE_SECONDS = 3600.0


def local_copy(uri: str, files: dict[str, tuple], cache: str) -> str:
    """A folder of this machine holding `files` (of files_under(uri): path under the prefix, stamp) as they are there
    now: downloaded once per machine and version of those files (their sizes and times: files overwritten there
    are fetched again). The machine's other processes wait for a download under way rather than make their own,
    and see no folder or a complete one (renamed into place). Its use is noted (the folder's time), and room is
    made for a new one (make_room)."""
    uri = uri.rstrip("/")
    version = json.dumps([[f, *files[f]] for f in sorted(files)])
    final = os.path.join(cache, hashlib.sha1(f"{uri}\n{version}".encode()).hexdigest())
    if os.path.isdir(final):
        return _used(final)
    try:
        os.makedirs(os.path.join(cache, ".locks"), exist_ok=True)
        with FileLock(os.path.join(cache, ".locks", os.path.basename(final) + ".lock")):
            if os.path.isdir(final):
                return _used(final)
            make_room(cache, sum(stamp[0] for stamp in files.values()))
            tmp = tempfile.mkdtemp(prefix=".download-", dir=cache)
            try:
                for rel in files:
                    dest = os.path.join(tmp, rel)
                    os.makedirs(os.path.dirname(dest), exist_ok=True)
                    with open_input(f"{uri}/{rel}") as src, open(dest, "wb") as dst:
                        shutil.copyfileobj(src, dst, 16 << 20)
                os.rename(tmp, final)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
    except OSError as exc:  # this machine's side (a full disk, a cache it cannot write) or a read cut short
        raise StorageError(f"cannot copy {display(uri)} into {cache}: {described(exc)}") from exc
    return final


def _used(copy: str) -> str:
    with contextlib.suppress(OSError):  # a cache this process may only read
        os.utime(copy)
    return copy


def unused_copies(copies: list[tuple[str, float]], now: float) -> list[str]:
    """Of a cache's copies (folder, last used), those that may go, least recently used first."""
    return [path for path, used in sorted(copies, key=lambda c: c[1]) if now - used > CACHE_IN_USE_SECONDS]


def make_room(cache: str, incoming: int) -> None:
    """Remove the cache's unused copies, least recently used first, until `incoming` more bytes leave its disk
    CACHE_RESERVE free (or none is left to remove), and what killed processes left (a download cut short, a copy
    half removed). A copy goes by a rename first: no process sees it half gone."""
    now = time.time()
    for left in [e.path for e in os.scandir(cache) if e.name.startswith((".download-", ".removing-"))
                 and now - e.stat().st_mtime > CACHE_IN_USE_SECONDS]:
        shutil.rmtree(left, ignore_errors=True)
    usage = shutil.disk_usage(cache)
    short = CACHE_RESERVE * usage.total + incoming - usage.free
    copies = [(e.path, e.stat().st_mtime) for e in os.scandir(cache) if e.is_dir() and not e.name.startswith(".")]
    for path in unused_copies(copies, now):
        if short <= 0:
            return
        size = sum(os.path.getsize(os.path.join(d, f)) for d, _, names in os.walk(path) for f in names)
        trash = os.path.join(cache, f".removing-{uuid.uuid4().hex[:8]}")
        try:
            os.rename(path, trash)
        except OSError:  # another process took it first
            continue
        shutil.rmtree(trash, ignore_errors=True)
        short -= size


def check_output(uri: str) -> None:
    """Fail early, in one line, when the output cannot be written: a missing bucket, bad credentials."""
    if not is_s3(uri):
        try:
            os.makedirs(os.path.abspath(uri), exist_ok=True)
        except OSError as exc:  # a path under a file, a read-only or full disk
            raise StorageError(f"cannot make the output folder {display(uri)}: {exc.strerror}") from None
        if not os.access(uri, os.W_OK):
            raise StorageError(f"cannot write in the output folder {display(uri)}: permission denied")
        return
    probe_s3()
    _check_bucket(uri)


def _check_bucket(uri: str, sure: bool = True) -> None:
    """One line when the bucket of an s3:// URI does not exist or cannot be reached. sure=False: only when S3 says
    it does not exist (credentials may allow a prefix's objects and not the bucket's own request)."""
    bucket = uri[len("s3://"):].split("/", 1)[0]
    try:
        info = _s3().get_file_info(bucket)
    except OSError as exc:
        if not sure:
            return
        raise StorageError(f"cannot reach bucket '{bucket}': {_describe(exc)}") from exc
    if info.type == pafs.FileType.NotFound:
        endpoint = f" at {_endpoint()}" if _endpoint() else ""
        raise StorageError(f"bucket '{bucket}' does not exist{endpoint}")


def file_stats(path: str) -> dict:
    """Size and sha256 of a local file or an s3:// object (hashlib works outside the GIL)."""
    if is_s3(path):
        digest, size = hashlib.sha256(), 0
        with open_input(path) as f:
            while chunk := f.read(8 << 20):
                digest.update(chunk)
                size += len(chunk)
        return {"bytes": size, "sha256": digest.hexdigest()}
    with open(path, "rb") as f:
        return {"bytes": os.fstat(f.fileno()).st_size, "sha256": hashlib.file_digest(f, "sha256").hexdigest()}


def staging_path(dest: str) -> str:
    """A local path to write `dest` into before commit(): beside it on local disk (so the rename is
    atomic), in the temp dir for S3."""
    name = f".{os.path.basename(dest)}.{uuid.uuid4().hex[:8]}.tmp"
    if is_s3(dest):
        return os.path.join(tempfile.gettempdir(), name)
    directory = os.path.dirname(os.path.abspath(dest))
    os.makedirs(directory, exist_ok=True)
    return os.path.join(directory, name)


def remove_staging(root: str) -> None:
    """Delete the staging files a killed run left beside its local shards (never visible as shards). One may go
    meanwhile: an interrupted run's task that was still writing it (Ray's tasks outlive a driver's Ctrl-C while
    the driver's process lives) committed or dropped it."""
    if is_s3(root) or not os.path.isdir(root):
        return
    for path in [os.path.join(d, f) for d, _, files in os.walk(root) for f in files
                 if f.startswith(".") and f.endswith(".tmp")]:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


def _object(uri: str) -> tuple[str, str]:
    """An s3:// URI's bucket and key."""
    bucket, key = uri[len("s3://"):].split("/", 1)
    return bucket, key


def commit(local: str, dest: str) -> None:
    """Make the finished file `local` visible at `dest` all at once, and remove `local`."""
    try:
        if is_s3(dest):
            bucket, key = _object(dest)
            try:
                _boto3_s3().upload_file(local, bucket, key)
            except Exception as exc:  # boto3 raises several unrelated types; name the target, not the keys
                raise StorageError(f"cannot write {dest}: {described(exc)}") from exc
        else:
            os.replace(local, os.path.abspath(dest))
    finally:
        discard(local)


@contextlib.contextmanager
def writing(dest: str, local: str):
    """Around writes to `local`, the staging file of `dest`: this machine's disk refusing them (full, a file size
    limit) is one line naming where the file was to go."""
    try:
        yield
    except OSError as exc:
        staged = os.path.dirname(os.path.abspath(local))
        staged = f" (staged in {staged})" if is_s3(dest) or staged != os.path.dirname(os.path.abspath(dest)) else ""
        raise StorageError(f"cannot write {display(dest)}{staged}: {described(exc)}") from exc


def commit_file(dest: str, write) -> dict:
    """`write(local_path)` into a staging file, then commit it to `dest`: {"bytes", "sha256"}."""
    local = staging_path(dest)
    try:
        with writing(dest, local):
            write(local)
        stats = file_stats(local)
        commit(local, dest)
        return stats
    finally:
        discard(local)  # a failed write leaves nothing behind


@functools.lru_cache(maxsize=None)
def _boto3_s3():
    import boto3  # reads AWS_ENDPOINT_URL, region and credentials from the environment itself
    from botocore.config import Config

    probe_s3(connect=False)  # an unknown host fails now, not after the retries below
    # not boto3's default session, which keeps old credentials; retries as the pyarrow filesystem's (10,
    # standard backoff up to 20 s), so that an S3 hiccup of a few seconds does not fail the job
    return boto3.session.Session().client("s3", config=Config(retries={"mode": "standard", "max_attempts": 10}))


def discard(local: str) -> None:
    """Remove a staging file, if it is still there."""
    if os.path.exists(local):
        os.unlink(local)


def write_bytes(dest: str, data: bytes) -> None:
    local = staging_path(dest)
    try:
        with writing(dest, local), open(local, "wb") as f:  # closed inside: a full disk may say so as it flushes
            f.write(data)
    except BaseException:
        discard(local)
        raise
    commit(local, dest)


# ------------------------------------------------------------------ small files written by one writer at a time
# A file's version, for write_if and delete_if: on S3 its ETag, on local disk its content's digest (contents differ
# from one write to the next: a lease's is its run and a time).


def read_versioned(uri: str) -> tuple[bytes | None, str | None]:
    """A small file's bytes and version; (None, None) when there is none."""
    if not is_s3(uri):
        try:
            with open(uri, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            return None, None
        return data, hashlib.sha256(data).hexdigest()
    bucket, key = _object(uri)
    try:
        found = _boto3_s3().get_object(Bucket=bucket, Key=key)
        return found["Body"].read(), found["ETag"]
    except Exception as exc:  # boto3 raises several unrelated types; a missing object is a ClientError
        if getattr(exc, "response", {}).get("Error", {}).get("Code") in ("NoSuchKey", "404"):
            return None, None
        raise StorageError(f"cannot read {uri}: {described(exc)}") from exc


@contextlib.contextmanager
def _folder_locked(path: str):
    """This machine's processes one at a time in `path`'s folder (flock: released when the process dies)."""
    import fcntl

    fd = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY)
    try:
        with contextlib.suppress(OSError):  # a filesystem without locks (some network mounts): as before, unlocked
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # the lock with it


def write_if(uri: str, data: bytes, version: str | None) -> str | None:
    """Write `data` only if the file is still at `version` (None: only if there is none); its new version, or
    None when another writer changed it first. S3: a conditional PUT (If-Match, If-None-Match); a server without
    them writes unconditionally. Local disk: the check and the rename under a lock of the folder."""
    if not is_s3(uri):
        with _folder_locked(uri):
            if read_versioned(uri)[1] == version:
                write_bytes(uri, data)
                return hashlib.sha256(data).hexdigest()
    else:
        bucket, key = _object(uri)
        condition = {"IfNoneMatch": "*"} if version is None else {"IfMatch": version}
        done = _conditional(uri, "write", lambda **c: _boto3_s3().put_object(Bucket=bucket, Key=key, Body=data, **c),
                            condition)
        if done is not None:
            return done["ETag"]
    now, current = read_versioned(uri)  # a retried PUT that had landed fails its own condition: it landed
    return current if now == data else None


def _conditional(uri: str, verb: str, call, condition: dict):
    """call(**condition) on S3: its response, or None when the condition failed (412; 409: a concurrent write
    won; 404: If-Match of nothing). A server without such conditions (NotImplemented) gets the call without."""
    from botocore.exceptions import ClientError

    try:
        try:
            return call(**condition)
        except ClientError as exc:
            if exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") in (404, 409, 412):
                return None
            if exc.response.get("Error", {}).get("Code") not in ("NotImplemented", "InvalidArgument"):
                raise
        return call()
    except Exception as exc:
        raise StorageError(f"cannot {verb} {uri}: {described(exc)}") from exc


def delete_if(uri: str, version: str) -> bool:
    """Delete the file only if it is still at `version`; whether it was."""
    if not is_s3(uri):
        with _folder_locked(uri):
            if read_versioned(uri)[1] != version:
                return False
            delete(uri)
        return True
    bucket, key = _object(uri)
    return _conditional(uri, "delete", lambda **c: _boto3_s3().delete_object(Bucket=bucket, Key=key, **c),
                        {"IfMatch": version}) is not None


def delete(uri: str) -> None:
    fs, path = filesystem(uri)
    try:
        fs.delete_file(path)
    except FileNotFoundError:
        pass


def delete_tree(uri: str) -> None:
    """A folder and everything under it (on S3: every object under the prefix), if it exists."""
    fs, path = filesystem(uri)
    try:
        fs.delete_dir(path)
    except FileNotFoundError:
        pass


def write_manifest(root: str, manifest: dict) -> None:
    """The manifest is written last: an output without one is incomplete."""
    write_bytes(join(root, MANIFEST), (json.dumps(manifest, indent=1, sort_keys=True) + "\n").encode())


def read_manifest(root: str) -> dict | None:
    """An output's manifest; None when it has none, {} when it is not a JSON object (broken, or another tool's):
    callers then read what they need by its own contract."""
    uri = join(root, MANIFEST)
    if not exists(uri):
        return None
    try:
        manifest = json.loads(read_text(uri))
    except ValueError:  # not JSON, not UTF-8
        return {}
    return manifest if isinstance(manifest, dict) else {}


def display(uri: str) -> str:
    """`uri` as it may be printed or stored: no user:password@ part."""
    parsed = urlparse(uri)
    if parsed.password or parsed.username:
        return uri.replace(parsed.netloc, parsed.hostname or "", 1)
    return uri
