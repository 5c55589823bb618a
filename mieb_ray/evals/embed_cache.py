"""The eval's embeddings, made once: each image and text the chosen tasks need is encoded once per model identity,
across suites, tasks and runs, keyed by its content (evals/mteb_keys.py: an image by sha256 of its stored bytes,
never decoded; a text by itself).

OUT/embeddings/cache/<model>[-fast]/{images,texts}-<digest>/   embed outputs of the model's raw vectors (what
                                                               mteb's CLIP wrapper gives); one counts once complete
add    item tables (`key` and `image` or `text`; the mteb suite's) -> the items no complete output holds, each once,
       embedded by the embed job's pools into a new output
keyed  a hand-built suite's table, its rows keyed its own way (<slug>/<split>/<index>, a corpus id): a task per file
       keys its rows by content (`row`, `key`: no image is decoded, the driver reads none), for `add`
view_of  then a task per file writes the rows' vectors, gathered from the cache, as an embed output of their own
       keyed as the suite reads them (L2-normalised unless the suite scores raw vectors)
Lookup the cache's keys, read once into one index (per run for the views: Indexes; for the mteb suite's scores)
       that every task narrows to its own keys (Lookup.only), then reads the embeddings of the shards holding them
An eval plans every suite's inputs first and adds them all at once (evals/protocol.py): one embed job per modality
for the whole run, so the model loads once per encoder; an image that the zero-shot, probe and clustering suites
and an mteb task all read costs one forward pass, and a second run encodes nothing.
"""

from __future__ import annotations

import copy
import hashlib
import json
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from mieb_ray import storage
from mieb_ray.errors import UserError
from mieb_ray.evals.mteb_keys import image_key
from mieb_ray.io import embeddings, parquet, reader
from mieb_ray.runtime import identity, placement, tasks
from mieb_ray.runtime.cluster import RunContext
from mieb_ray.runtime.pools import PoolRequest
from mieb_ray.topk.groupmax import normalize

IMAGES, TEXTS = "images", "texts"
MODALITY = {IMAGES: "image", TEXTS: "text"}
KEYED = pa.schema([("row", pa.string()), ("key", pa.string())])  # a suite's row -> its item's content key
BATCH_ROWS, BATCH_BYTES = 2048, 256 << 20  # the keying task's reads


@dataclass(frozen=True)
class Cache:
    """One model's cache in one eval output: `folder`, and how its items are embedded."""

    root: str  # OUT/embeddings/cache
    name: str  # the model's identity digest, -fast for eval --fast's
    model: str
    revision: str | None
    exact: bool  # as mteb's wrappers compute (embed --exact); False: eval --fast's, in a folder of its own
    dim: int

    @classmethod
    def of(cls, out: str, model: str, revision: str | None, exact: bool = True) -> Cache:
        from mieb_ray.encode.model import describe

        info, made_by = describe(model, revision)
        name = identity.digest(made_by)[:16] + ("" if exact else "-fast")
        return cls(storage.join(out, "embeddings", "cache"), name, model, revision, exact, info.dim)

    @property
    def folder(self) -> str:
        return storage.join(self.root, self.name)

    def outputs(self, kind: str) -> list[str]:
        """The complete outputs of `kind` (a manifest: committed last)."""
        names = sorted({u[len(self.folder) + 1:].split("/")[0] for u in storage.list_files(self.folder)}) \
            if storage.exists(self.folder) else []
        return [storage.join(self.folder, n) for n in names
                if n.startswith(f"{kind}-") and storage.read_manifest(storage.join(self.folder, n)) is not None]

    def add(self, tables: list[tuple[str, str]], kind: str, log, pool: PoolRequest = PoolRequest(),
            executor: str = "auto", ctx: RunContext | None = None) -> list[str]:
        """Embed the items of `tables` ((data file, file of its rows' `key`s), row for row; one file may be both)
        that no output holds, each once, into a new output; the complete outputs of `kind` after."""
        from mieb_ray.pipelines.embed import embed_table

        outputs, where = self.outputs(kind), placement.choose(executor, None, ctx=ctx)
        held = [_digests(k) for k in _shard_keys([uri for root in outputs for uri in embeddings.shard_uris(root)])]
        cached = np.unique(np.concatenate([np.zeros(0, DIGEST), *held]))  # the cache's keys, then earlier tables'
        picks = {}
        for data, keys in tables:  # keys only: the driver reads no image
            column = parquet.read_table(keys, ["key"])["key"].to_pylist()
            present = [i for i, key in enumerate(column) if key is not None]
            digests = _digests([column[i] for i in present])
            first = np.sort(np.unique(digests, return_index=True)[1])  # an item's first row in this table
            new = first[_find(cached, digests[first]) < 0]
            if len(new):
                picks[(data, keys)] = [present[i] for i in new.tolist()]
                cached = np.union1d(cached, digests[new])
        if not picks:
            log(f"[eval] every {MODALITY[kind]} is in the cache ({storage.display(self.folder)})")
            return outputs
        digest = identity.digest([[*t, r] for t, r in picks.items()])[:16]
        todo = storage.join(self.root, "_todo", f"{kind}-{digest}")
        with tasks.using(where.mode, where.ctx):
            tasks.get([select.remote(data, storage.join(todo, f"{n:05d}.parquet"), rows, keys, MODALITY[kind])
                       for n, ((data, keys), rows) in enumerate(picks.items())])
        embed_table(todo, "key", storage.join(self.folder, f"{kind}-{digest}"), self.model, self.revision,
                    MODALITY[kind], log, pool, executor, raw=True, exact=self.exact, ctx=where.ctx)
        storage.delete_tree(todo)  # its items are in the cache now
        return self.outputs(kind)

    def keyed(self, table: str, key: str, target: str, kind: str, ctx: RunContext | None = None,
              executor: str = "auto") -> list[tuple[str, str]]:
        """A task per file of `table` keys its rows by content into `target`/_keyed (no image decoded, the driver
        reads none): (data file, file of its rows' `row` and `key`) for `add` and `view_of`."""
        where = placement.choose(executor, None, ctx=ctx)
        fmt, files = reader.input_files(table)
        if fmt != "parquet":
            raise UserError(f"{storage.display(table)}: the eval's embeddings are made from Parquet tables")
        if storage.exists(target):  # an earlier view, or an embed output of an older version: made anew
            storage.delete_tree(target)
        keyed = storage.join(target, "_keyed")
        with tasks.using(where.mode, where.ctx):
            tasks.get([content_keys.remote(f.uri, key, MODALITY[kind], storage.join(keyed, f"{n:05d}.parquet"))
                       for n, f in enumerate(files)])
        return [(f.uri, storage.join(keyed, f"{n:05d}.parquet")) for n, f in enumerate(files)]

    def view_of(self, table: str, key: str, target: str, pairs: list[tuple[str, str]], index: Lookup,
                normalized: bool, ctx: RunContext | None = None, executor: str = "auto") -> str:
        """`table`'s rows (keyed into `pairs`) as an embed output at `target` keyed by its `key` column, every
        vector from the cache's outputs `index` reads (L2-normalised or raw). Returns target."""
        outputs = index.roots
        if not outputs:
            raise UserError(f"{storage.display(table)}: no row has an image or text to embed")
        where = placement.choose(executor, None, ctx=ctx)
        with tasks.using(where.mode, where.ctx):
            held = tasks.put(index)  # each task takes its own keys from it
            shards = tasks.get([view.remote(k, held, target, f"{n:05d}.arrow", normalized)
                                for n, (_, k) in enumerate(pairs)])
        storage.delete_tree(storage.join(target, "_keyed"))
        first = storage.read_manifest(outputs[0])
        storage.write_manifest(target, {
            **first, "config": {**first["config"], "input": storage.display(table), "key_column": key,
                                "raw": not normalized},
            "counts": {"total": sum(s["rows"] for s in shards), "errors": sum(s["errors"] for s in shards)},
            "shards": [{k: s[k] for k in ("path", "rows", "bytes", "sha256")} for s in shards],
            "error_files": [s["error_file"] for s in shards if s["error_file"]],
            "cache": [storage.display(o) for o in outputs]})
        return target


class Indexes(dict):
    """The cache's outputs of each kind ({kind: roots}) -> one Lookup of them, read when first asked for: the
    views of every suite of a run share it."""

    def __init__(self, outputs: dict[str, list[str]]):
        super().__init__()
        self.outputs = outputs

    def __missing__(self, kind: str) -> Lookup:
        self[kind] = Lookup(self.outputs[kind])
        return self[kind]


class Lookup:
    """key -> vector of embed outputs, read as asked: every shard's keys up front (only `keys` when given), a
    shard's embeddings only when a call wants one of its rows, and only those rows kept. A task's score pass
    holds its own vectors, not the cache's, which at MIEB's size is every task's (millions of items).

    The keys are held as sorted 16-byte digests beside their (shard, row): 24 bytes a key, where a dict of the
    keys themselves (sha256 hex digests, or whole texts) costs hundreds (a million keys: peak RSS 193 MiB against
    375); a take checks each digest's row holds its key."""

    def __init__(self, roots: list[str], keys: set[str] | None = None):
        self.roots = list(roots)
        self.uris = [uri for root in roots for uri in embeddings.shard_uris(root)]
        digests, places = [np.zeros(0, DIGEST)], [np.zeros((0, 2), np.int32)]
        for s, names in enumerate(_shard_keys(self.uris)):
            rows = [i for i, k in enumerate(names) if keys is None or k in keys]
            digests.append(_digests([names[i] for i in rows]))
            places.append(np.column_stack([np.full(len(rows), s, np.int32), np.asarray(rows, np.int32)]))
        digests, places = np.concatenate(digests), np.concatenate(places)
        order = np.argsort(digests, kind="stable")  # a key's copies in output order: a later output's wins
        digests, places = digests[order], places[order]
        last = np.ones(len(digests), bool)
        last[:-1] = digests[1:] != digests[:-1]
        self.digests, self.places = digests[last], places[last]
        first = embeddings.shard_schema(self.uris[0]) if self.uris else pa.schema([])
        kind = first.field("embedding").type if "embedding" in first.names else None
        self.dim = getattr(kind, "list_size", 0)  # another tool's list type says none: the first take does
        self.got: dict[str, np.ndarray] = {}

    def __len__(self) -> int:
        return len(self.digests)

    def only(self, keys: set[str] | None) -> Lookup:
        """This lookup of `keys` alone (those it holds; None: all), with nothing taken yet, reading nothing: a
        task's own vectors from the one index of the cache its job read (a Lookup per task would read every
        shard's keys again: at MIEB's size, 130 tasks times hundreds of shards)."""
        narrow = copy.copy(self)
        narrow.got = {}
        if keys is not None:
            at = self._at(list(keys))
            at = np.unique(at[at >= 0])  # sorted: the digests stay in order
            narrow.digests, narrow.places = self.digests[at], self.places[at]
        return narrow

    def _at(self, keys: list[str]) -> np.ndarray:
        """Each key's index into `places`, -1 where the outputs lack it."""
        return _find(self.digests, _digests(keys))

    def missing(self, keys: list[str]) -> list[str]:
        """The keys the outputs lack."""
        return [k for k, at in zip(keys, self._at(keys).tolist()) if at < 0]

    def __contains__(self, key: str) -> bool:
        return not self.missing([key])

    def take(self, keys: list[str]) -> np.ndarray:
        """The vectors of `keys` (each in the outputs: a KeyError where not), row for row, float32."""
        new = list(dict.fromkeys(k for k in keys if k not in self.got))
        at = self._at(new)
        if (at < 0).any():
            raise KeyError(new[int(np.flatnonzero(at < 0)[0])])
        by_shard: dict[int, dict[str, int]] = {}
        for k, (s, row) in zip(new, self.places[at].tolist()):
            by_shard.setdefault(s, {})[k] = row
        for s, rows in by_shard.items():
            table = embeddings.open_shard(self.uris[s])
            if table["key"].take(list(rows.values())).to_pylist() != list(rows):
                raise RuntimeError(f"{self.uris[s]}: two keys share a 16-byte digest")  # about 2^-100 at 10M
            self.dim = embeddings.dim(table) or self.dim
            block = np.asarray(embeddings.matrix(table, self.dim)[list(rows.values())], np.float32)  # a copy
            self.got.update(zip(rows, block))
        return np.stack([self.got[k] for k in keys]) if keys else np.zeros((0, self.dim), np.float32)


DIGEST = "S16"


def _digests(keys: list[str]) -> np.ndarray:
    """Each key's 16-byte blake2b digest, as one sortable array."""
    return np.frombuffer(b"".join(hashlib.blake2b(k.encode(), digest_size=16).digest() for k in keys), DIGEST)


def _find(digests: np.ndarray, wanted: np.ndarray) -> np.ndarray:
    """The index of each wanted digest in the sorted `digests`, -1 where it is not there."""
    if not len(digests):
        return np.full(len(wanted), -1)
    at = np.minimum(np.searchsorted(digests, wanted), len(digests) - 1)
    return np.where(digests[at] == wanted, at, -1)


def _shard_keys(uris: list[str]) -> list[list[str]]:
    """Each shard's keys, read side by side (an S3 read is mostly waiting)."""
    with ThreadPoolExecutor(16) as pool:
        return list(pool.map(embeddings.shard_keys, uris))


def vectors(index: Lookup, keys: set[str] | None = None) -> tuple[dict[str, np.ndarray], int]:
    """key -> vector of the outputs `index` reads (only `keys` when given), and their dim."""
    lookup = index.only(keys)
    names = list(keys) if keys is not None else [k for uri in lookup.uris for k in embeddings.shard_keys(uri)]
    lacking = set(lookup.missing(names))
    names = list(dict.fromkeys(k for k in names if k not in lacking))
    return dict(zip(names, lookup.take(names))), lookup.dim


class Given(dict):
    """Vectors a caller holds (key -> vector), served as a Lookup serves the cache's."""

    def take(self, keys: list[str]) -> np.ndarray:
        return np.stack([self[k] for k in keys])


def _errors(roots: list[str], keys: set[str]) -> dict[str, str]:
    """key -> why the embed job could not embed it, of `keys`, from the outputs' error files."""
    found = {}
    for root in roots:
        for name in (storage.read_manifest(root) or {}).get("error_files") or []:
            with storage.open_input(storage.join(root, name)) as f:
                table = pa.ipc.open_file(f).read_all()
            found.update((k, e) for k, e in zip(table["key"].to_pylist(), table["error"].to_pylist()) if k in keys)
    return found


@tasks.remote(num_cpus=1)
def content_keys(source: str, key: str, modality: str, target: str) -> int:
    """One Parquet file of a suite's table, each row's content key beside its own (`row`, `key`): an image's
    sha256 of its stored bytes (None where it has none: the view says so), a text itself. Its row count."""
    column = "image" if modality == "image" else "text"
    parts = []
    for _, table in parquet.read_range(source, [key, column], max_rows=BATCH_ROWS, max_bytes=BATCH_BYTES):
        rows = [str(r) for r in table[key].to_pylist()]
        if modality == "image":
            data = parquet.image_bytes(table[column]).to_pylist()
            items = [image_key(d) if d else None for d in data]
        else:
            items = table[column].to_pylist()
        parts.append(pa.table([pa.array(rows, pa.string()), pa.array(items, pa.string())], schema=KEYED))
    storage.commit_file(target, lambda local: pq.write_table(pa.concat_tables(parts) if parts
                                                             else KEYED.empty_table(), local))
    return sum(p.num_rows for p in parts)


@tasks.remote(num_cpus=1)
def select(data: str, target: str, rows: list[int], keys: str | None = None, column: str | None = None,
           labels: list[str] | None = None) -> None:
    """The chosen rows of a table into `target`: of `data` as it is, or (with `keys`, a file of its rows' content
    keys) its `column` beside those keys; each with its label (an `eval_task` column) when given."""
    if keys is None:
        table = parquet.read_table(data).take(rows)
    else:
        values = parquet.read_table(data, [column])[column].take(rows)
        if column == "image":
            values = parquet.image_bytes(values)
        table = pa.table({"key": parquet.read_table(keys, ["key"])["key"].take(rows), column: values})
    if labels is not None:
        table = table.append_column("eval_task", pa.array(labels, pa.string()))
    storage.commit_file(target, lambda local: pq.write_table(table, local))


@tasks.remote(num_cpus=1)
def view(keyed: str, index: Lookup, target: str, name: str, normalized: bool) -> dict:
    """The rows of a keyed table with their vectors from the cache's outputs `index` reads, as the shard `name` of
    `target` (a row whose item the cache could not embed: an error row with its reason); its manifest entry."""
    table = parquet.read_table(keyed)
    rows, items = table["row"].to_pylist(), table["key"].to_pylist()
    wanted = {k for k in items if k is not None}
    found, dim = vectors(index, wanted)
    why = _errors(index.roots, wanted - set(found))
    errors = np.array(["" if k in found else why.get(k, "no image bytes" if k is None else "not in the cache")
                       for k in items], dtype=object)
    matrix = np.stack([found.get(k, np.zeros(dim, np.float32)) for k in items]) if items \
        else np.zeros((0, dim), np.float32)
    if normalized:
        matrix = normalize(matrix)
    schema = embeddings.shard_schema(index.uris[0])  # the cache's: model, dim, dtype
    meta = {**embeddings.model_metadata(schema), "normalized": normalized}
    schema = pa.schema(list(schema)[:2], metadata={b"mieb_ray": json.dumps(meta).encode()})
    return embeddings.commit_shard(target, name, schema, {"key": np.array(rows, dtype=object), "embedding": matrix},
                                   "key", (), errors)
