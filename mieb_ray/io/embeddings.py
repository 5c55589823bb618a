"""Embedding shards: Arrow IPC files of `key`, `embedding` (fixed_size_list<float16|float32>[dim]) and
carried columns, one record batch each, so a memory-mapped shard is a numpy matrix without a copy.

The schema metadata `mieb_ray` (JSON) names the model, revision, dim, dtype, normalisation and
preprocessing. Errors go to a table of `key`, `error` beside the shards.
"""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa

from mieb_ray import storage
from mieb_ray.commit import commit_file

ERROR_SCHEMA = pa.schema([("key", pa.string()), ("error", pa.string())])
DTYPES = {"float16": pa.float16(), "float32": pa.float32()}


def schema(dim: int, dtype: str, carry: pa.Schema | None, metadata: dict) -> pa.Schema:
    fields = [pa.field("key", pa.string()), pa.field("embedding", pa.list_(DTYPES[dtype], dim))]
    return pa.schema(fields + list(carry or []), metadata={"mieb_ray": json.dumps(metadata, sort_keys=True)})


def shard_table(schema_: pa.Schema, keys: list[str], embeddings: np.ndarray, carry: dict[str, list]) -> pa.Table:
    dim = schema_.field("embedding").type.list_size
    values = pa.array(embeddings.astype(schema_.field("embedding").type.value_type.to_pandas_dtype()).reshape(-1))
    columns = [pa.array(keys, pa.string()), pa.FixedSizeListArray.from_arrays(values, dim)]
    columns += [pa.array(carry[f.name], f.type) for f in list(schema_)[2:]]
    return pa.Table.from_arrays(columns, schema=schema_)


def write_ipc(local: str, table: pa.Table) -> None:
    """One record batch: a reader can map the whole embedding column to one numpy array."""
    with pa.OSFile(local, "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table, max_chunksize=max(table.num_rows, 1))


def commit_shard(out: str, name: str, schema_: pa.Schema, rows: dict, key: str, carry: tuple[str, ...]) -> dict:
    """Commit one unit's shard `OUT/<name>` (its good rows) and, when some rows failed, `OUT/_errors/<name>`
    (key, error) first. `rows`: numpy columns `key`, `embedding`, `__error` ("" when good) and the carried
    ones ({} for an empty input file). Returns the manifest entry: path, rows, bytes, sha256, errors, error_file."""
    if not rows:  # an empty input file: an empty shard
        empty = np.zeros(0, dtype=object)
        rows = {key: empty, "__error": empty, "embedding": np.zeros((0, schema_.field("embedding").type.list_size)),
                **{c: empty for c in carry}}
    bad = rows["__error"] != ""
    result = {"path": name, "rows": int((~bad).sum()), "errors": int(bad.sum()), "error_file": None}
    if bad.any():
        result["error_file"] = f"_errors/{name}"
        table = pa.table({"key": [str(k) for k in rows[key][bad]], "error": [str(e) for e in rows["__error"][bad]]},
                         schema=ERROR_SCHEMA)
        commit_file(storage.join(out, result["error_file"]), lambda local: write_ipc(local, table))
    table = shard_table(schema_, [str(k) for k in rows[key][~bad]], rows["embedding"][~bad],
                        {c: list(rows[c][~bad]) for c in carry})
    return {**result, **commit_file(storage.join(out, name), lambda local: write_ipc(local, table))}


def open_shard(path: str) -> pa.Table:
    """A local shard, memory-mapped; an s3:// shard, read into memory."""
    if storage.is_s3(path):
        with storage.open_input(path) as f:
            return pa.ipc.open_file(f).read_all()
    return pa.ipc.open_file(pa.memory_map(path)).read_all()


def matrix(table: pa.Table) -> np.ndarray:
    """The embedding column as an (n, dim) numpy array; zero-copy for a one-batch memory-mapped shard."""
    column = table["embedding"]
    dim = column.type.list_size
    chunk = column.chunks[0] if column.num_chunks == 1 else column.combine_chunks()
    return chunk.values.to_numpy(zero_copy_only=chunk.null_count == 0).reshape(-1, dim)


def model_metadata(table_or_schema) -> dict:
    schema_ = table_or_schema.schema if hasattr(table_or_schema, "schema") else table_or_schema
    return json.loads(schema_.metadata[b"mieb_ray"])


def manifest_model(manifest: dict | None) -> dict:
    """The model an embed output's manifest names, as a dict ({} when none): another tool's manifest may give
    a bare string, or nothing."""
    model = (manifest or {}).get("model")
    if isinstance(model, dict):
        return model
    return {"name": str(model)} if isinstance(model, (str, int, float)) and model != "" else {}


def shard_uris(root: str) -> list[str]:
    """The shards of a complete output, as its manifest lists them."""
    manifest = storage.read_manifest(root)
    if manifest is None:
        raise storage.StorageError(f"{storage.display(root)} has no {storage.MANIFEST}: not a complete output")
    return [storage.join(root, s["path"]) for s in manifest["shards"]]


def read_all(root: str) -> tuple[list[str], np.ndarray]:
    """Every key and embedding (float32) of a complete output, in shard order."""
    tables = [open_shard(u) for u in shard_uris(root)]
    dims = {t["embedding"].type.list_size for t in tables}
    if len(dims) > 1:
        raise storage.StorageError(f"{storage.display(root)} mixes embedding dimensions {sorted(dims)}")
    keys = [k for t in tables for k in t["key"].to_pylist()]
    vectors = [matrix(t).astype(np.float32) for t in tables]
    return keys, np.concatenate(vectors) if vectors else np.zeros((0, dims.pop() if dims else 0), np.float32)


def read_ray(root: str):
    """The embeddings of a complete output as a Ray Dataset (one block per shard)."""
    import ray

    uris = shard_uris(root)
    return ray.data.from_items([{"uri": u} for u in uris], override_num_blocks=len(uris)).map_batches(
        lambda batch: open_shard(str(batch["uri"][0])), batch_size=1, batch_format="numpy")
