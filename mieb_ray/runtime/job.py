"""A job's flow, the same for build, embed and audit: plan -> units -> commit -> manifest.

The job supplies its units (name -> what the unit reads), its stages (runtime/units.py) and its manifest;
`Job` does the rest:

    reusable() with `reuse`: a complete output of the same identity, to return as it is; one of another identity
              is to be replaced (runtime/identity.py: the one reuse rule)
    start()   the output checked: writable, outside the folders the run reads, and held by this run
              (runtime/lease.py: one run at a time); a complete one refused without --overwrite, an unfinished one
              removed with --overwrite
    earlier() once the plan gives the settings: an unfinished output continued with --resume (the units whose
              progress record an earlier run committed with these settings), refused without it, and refused
              with it when the settings or units differ, saying how: hours of work are never replaced by mistake
    run()     the remaining units on Ray or in this process (runtime/placement.py), a progress line every 5 s,
              each unit's result once, and an error if one never came back; on Ray, what the cluster did
              meanwhile (runtime/watch.py)
    finish()  the error-rate check, files of this job's kind that this run did not make removed (an interrupted
              run's other shard sizes), the manifest written last with the job's identity, then the progress
              records dropped
A job is a context manager: however the run ends, its hold on the output ends with it.
"""

from __future__ import annotations

import contextlib
import re
import time

from mieb_ray import storage
from mieb_ray.errors import UserError
from mieb_ray.runtime import identity, output, units, watch
from mieb_ray.runtime.cluster import RunContext, ray_up
from mieb_ray.runtime.lease import Lease
from mieb_ray.runtime.output import Progress

TICK_SECONDS = 5.0


class Job:
    def __init__(self, name: str, out: str, what: str, ours: re.Pattern, resume: bool = False,
                 overwrite: bool = False, log=print, identity: dict | None = None, reuse: bool = False,
                 inputs: tuple[str, ...] = ()):
        """name: the log's prefix (build, embed, audit); what: the output, for messages ("a complete build");
        ours: the relative paths of the files this kind of job writes (shards, error and hash files); identity:
        what decides the output's content (runtime/identity.py); reuse: an output of that identity is kept, one
        of another replaced, an unfinished one of these settings resumed (what a job a command runs for its own
        needs does: `eval --model`'s embeddings and eval splits); inputs: the tables the run reads."""
        self.name, self.out, self.what, self.ours, self.inputs = name, out, what, ours, inputs
        self.resume, self.overwrite, self.log = resume or reuse, overwrite, log
        self.identity, self.reuse = identity, reuse
        self.progress: Progress | None = None  # once the plan gives the settings (earlier)
        self.lease: Lease | None = None  # from start() to the end of the run
        self.t0 = time.time()

    def __enter__(self) -> Job:
        return self

    def __exit__(self, *exc) -> None:
        if self.lease is not None:
            self.lease.release()

    def reusable(self) -> dict | None:
        """With `reuse`, first: the manifest of a complete output of this identity, which the job returns as it is
        (None: there is none, and a complete one of another identity will be replaced). Touches nothing."""
        if not self.reuse:
            return None
        manifest = storage.read_manifest(self.out)
        same, why = identity.decide(manifest, self.identity or {})
        if same:
            self.log(f"[{self.name}] reusing {storage.display(self.out)}: {why}")
            return manifest
        if manifest is not None:
            self.log(f"[{self.name}] redoing {storage.display(self.out)}: {why}")
            self.overwrite = True
        return None

    def start(self) -> None:
        """Before the plan: the output writable, a complete one refused (or removed, --overwrite), an unfinished
        one removed with --overwrite (else earlier() decides, once it knows this run's settings)."""
        output.check_apart(self.out, self.inputs)
        self.lease = output.prepare(self.out, self.overwrite, self.what, self.name)
        if self.overwrite:
            for uri in self._unfinished():
                storage.delete(uri)
            storage.delete_tree(storage.join(self.out, storage.PROGRESS))

    def earlier(self, planned: dict[str, object], settings: dict) -> dict[str, dict]:
        """{unit name: result} of the planned units ({name: what it reads}) an earlier, unfinished run finished
        with the same `settings` (what a progress record must match to be reused), when resuming. An unfinished
        output without --resume, or with --resume but other settings or other units, is refused in one line that
        says what differs: hours of work are never replaced or orphaned by mistake. From here on `progress` is
        the records the workers commit."""
        self.progress = Progress(self.out, settings, self.lease.record["run"] if self.lease else None)
        left = self._unfinished()
        if not left:
            return {}
        records = self.progress.records()
        differ = self.progress.differences(records, planned)
        where = f"{storage.display(self.out)} holds an unfinished run of {self.name} ({len(left)} " \
            f"file{'s' if len(left) != 1 else ''})"
        if self.reuse and differ:  # a stopped run for other inputs or settings: begin again
            self.log(f"[{self.name}] starting {storage.display(self.out)} again: its unfinished run had {differ}")
            for uri in left:
                storage.delete(uri)
            return {}
        old = {(r.get("settings") or {}).get("format_version") for r in records.values()} - {None}
        new = self.progress.settings.get("format_version")
        if new is not None and old and old != {new}:  # its rows mean other things: nothing of it can be kept
            raise UserError(f"{where} in format version {', '.join(map(str, sorted(old)))}; this mieb-ray writes "
                            f"version {new}: pass --overwrite to start again")
        if not self.resume:
            differ = f", started with other settings ({differ})" if differ else ""
            raise UserError(f"{where}{differ}; pass --resume to continue it or --overwrite to start again")
        if differ:
            raise UserError(f"{where} started with other settings: {differ}; pass --resume with its settings to "
                            "continue it, or --overwrite to start again with these")
        return self.progress.done(records, planned)

    def _unfinished(self) -> list[str]:
        root = self.out.rstrip("/") + "/"
        return [u for u in storage.list_files(self.out)
                if u.startswith(root + storage.PROGRESS + "/") or output.is_ours(self.ours, u[len(root):])]

    def run(self, todo: list[int], stages: list[units.Stage], mode: str, total: int | None = None,
            on_rows=None, ctx: RunContext | None = None) -> list[dict]:
        """The results of units `todo`, each once (a unit redone after a lost block comes back twice, the same),
        with a progress line every TICK_SECONDS and at the end. total: the planned units (default: len(todo)).
        ctx: the command's Ray (None: RunContext())."""
        total = total or len(todo)
        with self._watch(todo, stages, mode, ctx):
            results = self._results(todo, stages, mode, total, on_rows, ctx)
        missing = sorted(set(todo) - set(results))
        if missing:  # never a silent loss
            raise RuntimeError(f"{len(missing)} of {len(todo)} units did not come back (e.g. unit {missing[0]})")
        return [results[i] for i in todo]

    def _watch(self, todo: list[int], stages: list[units.Stage], mode: str, ctx: RunContext | None):
        """On Ray: the cluster's nodes added and removed, and the actors each pool started, in the job's log."""
        if mode != "ray" or not todo:
            return contextlib.nullcontext()
        ray_up(ctx)
        return watch.watching(self.name, self.log, {s.pool.what: (s.fn.__name__, s.pool.max_size)
                                                    for s in stages if s.pool is not None})

    def _results(self, todo, stages, mode, total, on_rows, ctx) -> dict[int, dict]:
        results, rows, t_run, t_log = {}, 0, time.time(), 0.0
        for number, result in units.run(todo, stages, mode, on_rows, ctx):
            if number in results:
                continue
            results[number] = result
            rows += result["rows"] + result.get("errors", 0)
            done = total - len(todo) + len(results)
            if time.time() - t_log > TICK_SECONDS or done == total:
                t_log, elapsed = time.time(), time.time() - t_run
                self.log(f"[{self.name}] {done}/{total} units, {rows:,} rows, {rows / max(elapsed, 1e-9):,.0f} rows/s")
        return results

    def check_errors(self, errors: int, rows: int, rate: float, verb: str, detail: str = "") -> None:
        """Fail when more than `rate` of the rows could not be made (the rows themselves are in _errors/)."""
        if errors > rate * (rows + errors):
            detail = f" ({detail})" if detail else ""
            raise UserError(f"{errors:,} of {rows + errors:,} rows could not be {verb}{detail}, more than "
                            f"--max-error-rate {rate}; see {storage.display(storage.join(self.out, '_errors'))}")

    def finish(self, manifest: dict, keep: set[str]) -> dict:
        """Remove the files of this job's kind that are not in `keep` (relative paths), write the manifest, drop
        the progress records; the manifest as a reader will see it. Refused if another run took the output over
        (this run's lease went unrenewed for lease.STALE_SECONDS)."""
        if other := self.lease.held_by_another():
            raise UserError(f"{storage.display(self.out)} was taken over by {other} while this run's hold on it "
                            "lapsed: this run's manifest was not written")
        output.remove_stale(self.out, keep, self.ours)
        written = output.finish(self.out, manifest | ({"identity": self.identity} if self.identity else {}),
                                self.progress)
        self.lease.release()
        return written
