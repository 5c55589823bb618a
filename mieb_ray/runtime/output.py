"""How a job's outputs become visible, the same for every job: files committed whole by the workers that make
them, a progress record per finished unit, and the manifest last.

A worker writes each file to a local staging file and commits it (storage.commit: rename on local disk, one
upload on S3) under a name that depends only on what it holds, so a retried or repeated unit rewrites the
same names. Once all of a unit's files are committed, the worker commits the unit's progress record
(`_progress/<name>.json`: the unit, the settings that made it, and its result: paths, rows, bytes, sha256,
errors). `--resume` reads those small records rather than the shards. The driver writes `_manifest.json` last,
then drops the records: an output without a manifest is unfinished, and every file in it is whole.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
from concurrent.futures import ThreadPoolExecutor

from mieb_ray import formats, storage
from mieb_ray.errors import UserError
from mieb_ray.runtime import identity, lease


@contextlib.contextmanager
def no_empty_folder_on_failure(out: str | None):
    """A run that fails leaves no folder behind that it made and wrote nothing into (a local `out`, or the
    first of its parents that did not exist). S3 has no folders, so nothing to do there."""
    if not out or storage.is_s3(out):
        yield
        return
    made = os.path.abspath(out)
    while not os.path.exists(os.path.dirname(made)):
        made = os.path.dirname(made)
    existed = os.path.exists(made)
    try:
        yield
    except BaseException:
        if not existed and os.path.isdir(made) and not any(files for _, _, files in os.walk(made)):
            shutil.rmtree(made, ignore_errors=True)
        raise


class Progress:
    """The progress records of one output: `_progress/<name>.json`, each {"unit", "settings", "result"}.

    A record counts on resume only if its unit (what was read) and settings equal this run's: a unit made
    from other files, with another model, format or shard size is made again."""

    def __init__(self, out: str, settings: dict, run: str | None = None):
        self.out, self.run = out, run  # run: the run that holds the output (runtime/lease.py), None: none
        self.settings = json.loads(json.dumps(settings))  # as a record will read back (tuples become lists)

    def path(self, name: str) -> str:
        return storage.join(self.out, storage.PROGRESS, f"{name}.json")

    def held(self, name: str) -> None:
        """Called by the worker before it commits unit `name`'s files: refused once another run took the output
        over (lease.check_held)."""
        lease.check_held(self.out, self.run, f"unit {name}")

    def record(self, name: str, unit, result: dict) -> None:
        """Called by the worker once every file of the unit is committed (after held()). `unit`: JSON-able, what
        was read."""
        record = {"unit": unit, "settings": self.settings, "result": result}
        storage.write_bytes(self.path(name), json.dumps(record).encode())

    def records(self) -> dict[str, dict]:
        """{unit name: record} of every progress record there."""
        root = storage.join(self.out, storage.PROGRESS).rstrip("/")
        found = [uri for uri in storage.list_files(root) if uri.endswith(".json")]
        with ThreadPoolExecutor(16) as pool:
            records = list(pool.map(lambda uri: json.loads(storage.read_text(uri)), found))
        return {uri[len(root) + 1:-len(".json")]: r for uri, r in zip(found, records)}

    def done(self, records: dict[str, dict], units: dict[str, object]) -> dict[str, dict]:
        """{name: result} of the wanted units ({name: unit}) among `records` an earlier run finished with these
        settings, from the same input (a unit whose input changed is made again)."""
        same = json.loads(json.dumps(units))
        return {name: r["result"] for name, r in records.items()
                if name in same and r.get("settings") == self.settings and r.get("unit") == same[name]}

    def differences(self, records: dict[str, dict], units: dict[str, object]) -> str:
        """How an earlier run's records differ from this run: its settings and the units this run does not plan
        (other datasets, another shard size); "" when they do not."""
        other = next((r.get("settings") or {} for r in records.values() if r.get("settings") != self.settings), None)
        said = [identity.differences(other, self.settings)] if other is not None else []
        unplanned = sorted(set(records) - set(units))
        if unplanned:
            said.append(f"{len(unplanned)} of its units are not in this run's plan (e.g. {unplanned[0]})")
        return "; ".join(said)

    def clear(self) -> None:
        storage.delete_tree(storage.join(self.out, storage.PROGRESS))


def check_apart(out: str, inputs: tuple[str, ...]) -> None:
    """An output inside a folder the run reads is refused: its files would be read as the input's rows, by this
    run's plan or the next run's (reader.input_files refuses an output it finds inside an input too)."""
    def norm(uri: str) -> str:
        return uri.rstrip("/") if storage.is_s3(uri) else os.path.realpath(uri)

    for given in inputs:
        if norm(out) == norm(given) or norm(out).startswith(norm(given) + "/"):
            raise UserError(f"--out {storage.display(out)} is inside the input {storage.display(given)}: its files "
                            "would be read as the input's rows; choose an --out outside it")


def prepare(out: str, overwrite: bool, what: str, job: str) -> lease.Lease:
    """Before any work: the output is writable (one line if not) and no other run is writing it (this run's lease
    on it is returned), a killed run's staging files are gone, and a complete output is refused, or with
    --overwrite made incomplete and its files removed; one that another command (`job` is this one's) wrote is
    refused even then: --overwrite replaces a build with a build, never embeddings or results with a build."""
    storage.check_output(out)
    held = lease.take(out, job)
    try:
        _replaceable(out, overwrite, what, job)
    except BaseException:
        held.release()
        raise
    return held


def _replaceable(out: str, overwrite: bool, what: str, job: str) -> None:
    storage.remove_staging(out)
    old = storage.read_manifest(out)
    if old is None:
        return
    if theirs := formats.other_command(old, job):
        raise UserError(f"{storage.display(out)} holds the output of {theirs}, not of mieb-ray {job}: choose another "
                        "--out (--overwrite never replaces another command's output)")
    if not overwrite:
        raise UserError(f"{storage.display(out)} already holds {what} ({storage.MANIFEST}); "
                        "pass --overwrite to replace it")
    storage.delete(storage.join(out, storage.MANIFEST))  # from here on the output reads as incomplete
    for path in [s["path"] for s in old.get("shards", [])] + old.get("error_files", []):
        storage.delete(storage.join(out, path))


def is_ours(pattern: re.Pattern, rel: str) -> bool:
    """Whether `rel` (a path in an output) is a file of the kind `pattern` says a job makes: never the lease, which
    is the run's, not the output's (an eval's results are any `*.json` at its root)."""
    return rel != storage.LEASE and pattern.match(rel) is not None


def remove_stale(out: str, keep: set[str], pattern: re.Pattern) -> None:
    """Delete the files matching `pattern` (relative paths) that this run did not make: an interrupted run's
    shards of other names (another shard size, another input)."""
    root = out.rstrip("/") + "/"
    for uri in storage.list_files(out):
        rel = uri[len(root):]
        if is_ours(pattern, rel) and rel not in keep:
            storage.delete(uri)


def finish(out: str, manifest: dict, progress: Progress) -> dict:
    """Staging files gone, the manifest last; then the progress records, which it now replaces. Returns the
    manifest as a reader will see it."""
    manifest = json.loads(json.dumps(manifest))
    # a worker killed mid-write left its staging file, and its unit's retry wrote under another name: every unit
    # has returned, so no staging file is anyone's now (bench/chaos.py found them)
    storage.remove_staging(out)
    storage.write_manifest(out, manifest)
    progress.clear()
    return manifest
