"""Embedding shards: Arrow IPC files of `key`, `embedding` (fixed_size_list<float16|float32>[dim]) and
carried columns, one record batch each, so a memory-mapped shard is a numpy matrix without a copy.

The schema metadata `mieb_ray` (JSON) names the model, revision, dim, dtype, normalisation and
preprocessing. Errors go to a table of `key`, `error` beside the shards.

Readers hold any shard to that contract only (key + embedding, see normalise()), whoever wrote it: the manifest
lists the shards when it can; when there is none, or it lists none usable, the IPC files of the folder are
read (not `_errors/` or other `_` paths) and the driver warns (check_inputs()).
"""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from mieb_ray import storage
from mieb_ray.errors import UserError
from mieb_ray.formats import EMBEDDING_ERROR_SCHEMA, SHARD_SUFFIXES, other_command


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


def commit_shard(out: str, name: str, schema_: pa.Schema, rows: dict, key: str, carry: tuple[str, ...],
                 errors: np.ndarray | None = None) -> dict:
    """Commit one unit's shard `OUT/<name>` (its good rows) and, when some rows failed, `OUT/_errors/<name>`
    (key, error) first. `rows`: numpy columns `key`, `embedding` and the carried ones ({} for an empty input
    file); `errors`: per row, why it failed ("" when good; None: none failed). Returns the manifest entry: path,
    rows, bytes, sha256, errors, error_file."""
    dim = schema_.field("embedding").type.list_size
    if not rows:  # an empty input file: an empty shard
        empty = np.zeros(0, dtype=object)
        rows = {key: empty, "embedding": np.zeros((0, dim)), **{c: empty for c in carry}}
    bad = np.zeros(len(rows[key]), dtype=bool) if errors is None else errors != ""
    result = {"path": name, "rows": int((~bad).sum()), "errors": int(bad.sum()), "error_file": None}
    if bad.any():
        result["error_file"] = f"_errors/{name}"
        table = pa.table({"key": [None if k is None else str(k) for k in rows[key][bad]],
                          "error": [str(e) for e in errors[bad]]},
                         schema=EMBEDDING_ERROR_SCHEMA)
        storage.commit_file(storage.join(out, result["error_file"]), lambda local: write_ipc(local, table))
    table = shard_table(schema_, [str(k) for k in rows[key][~bad]], rows["embedding"][~bad],
                        {c: list(rows[c][~bad]) for c in carry})
    return {**result, **storage.commit_file(storage.join(out, name), lambda local: write_ipc(local, table))}


def open_shard(path: str) -> pa.Table:
    """A shard read by its contract (see normalise): a local shard memory-mapped, an s3:// one read into memory.
    An Arrow IPC file, or an IPC stream as some tools write; anything else is a one-line error naming it."""
    where = storage.display(path)
    try:
        if storage.is_s3(path):
            with storage.open_input(path) as f:
                source = pa.py_buffer(f.read())
        else:
            source = pa.memory_map(path)
        try:
            table = pa.ipc.open_file(source).read_all()
        except pa.ArrowInvalid:
            table = pa.ipc.open_stream(source).read_all()
    except FileNotFoundError:
        raise storage.StorageError(f"no such embedding shard: {where}") from None
    except (pa.ArrowInvalid, OSError) as exc:
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise storage.StorageError(f"{where} is not an Arrow IPC file of embeddings ({reason})") from None
    return normalise(table, where)


def shard_keys(path: str) -> list[str]:
    """A shard's keys, reading none of its embeddings: of an s3:// shard only the key column's bytes are fetched
    (Arrow's field projection), so a reader that wants a few keys of a large cache opens the rest for nothing."""
    key = _footer_read(path, "key")
    if key is not None and (pa.types.is_string(key.type) or pa.types.is_large_string(key.type)) \
            and not key.null_count:
        return key.to_pylist()
    return open_shard(path)["key"].to_pylist()


def shard_schema(path: str) -> pa.Schema:
    """A shard's schema (its metadata names the model), from the file's footer: no column is read."""
    schema = _footer_read(path)
    return schema if schema is not None else open_shard(path).schema


def _footer_read(path: str, column: str | None = None):
    """An IPC file's schema, or its one `column`; None where it cannot be read so (an IPC stream, a breach of
    the contract): the caller reads the shard whole with open_shard, whose one-line error a bad one gets."""
    try:
        with (storage.open_input(path) if storage.is_s3(path) else pa.memory_map(path)) as source:
            schema = pa.ipc.open_file(source).schema
            if column is None:
                return schema
            if schema.names.count(column) != 1:
                return None
            only = pa.ipc.IpcReadOptions(included_fields=[schema.names.index(column)])
            return pa.ipc.open_file(source, options=only).read_all()[column]
    except (pa.ArrowInvalid, OSError, storage.StorageError):
        return None


def normalise(table: pa.Table, where: str) -> pa.Table:
    """`key` as string and `embedding` as fixed_size_list<float16|float32>[dim], whatever another tool wrote:
    string, large_string, string_view or dictionary keys; list, large_list or fixed_size_list embeddings of
    float16, float32 or float64 (float64 becomes float32). Other columns are left as they are. A clean shard
    is returned as is (still memory-mapped). Missing columns, other key or value types, null keys, null or
    partly null embeddings and ragged rows are one-line errors naming the shard: guessing would score wrong.
    An empty shard whose list type fixes no dim gets dim 0 (dim() says None)."""
    names = table.schema.names
    for column in ("key", "embedding"):
        if names.count(column) != 1:
            has = "has no" if column not in names else "has more than one"
            raise storage.StorageError(f"{where} {has} `{column}` column (it has {', '.join(names) or 'none'}); "
                                       "embedding shards hold `key` (string) and `embedding` (list of floats)")
    key, embedding = table["key"], table["embedding"]
    if not (pa.types.is_string(key.type) or pa.types.is_large_string(key.type) or pa.types.is_string_view(key.type)
            or (pa.types.is_dictionary(key.type) and pa.types.is_string(key.type.value_type))):
        raise storage.StorageError(f"{where}: `key` is {key.type}, not strings")
    kind, value = embedding.type, getattr(embedding.type, "value_type", None)
    if not (pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind)) \
            or not pa.types.is_floating(value):
        raise storage.StorageError(f"{where}: `embedding` is {kind}, not a list of floats")
    if key.null_count:
        raise storage.StorageError(f"{where}: null keys ({key.null_count} rows)")
    if embedding.null_count:
        raise storage.StorageError(f"{where}: null embeddings ({embedding.null_count} rows)")
    if pc.list_flatten(embedding).null_count:
        raise storage.StorageError(f"{where}: embeddings holding null values")
    dim = kind.list_size if pa.types.is_fixed_size_list(kind) else None
    if dim is None:
        sizes = pc.min_max(pc.list_value_length(embedding)).as_py()
        if sizes["min"] != sizes["max"]:
            raise storage.StorageError(f"{where}: ragged embeddings, rows of {sizes['min']} to {sizes['max']} "
                                       "values; every row needs the same dim")
        dim = sizes["max"] or 0
    if dim == 0 and table.num_rows:
        raise storage.StorageError(f"{where}: embeddings of no values")
    want = pa.list_(pa.float32() if value == pa.float64() else value, dim)
    if key.type != pa.string():
        table = table.set_column(names.index("key"), "key", pc.cast(key, pa.string()))
    if kind != want:
        table = table.set_column(names.index("embedding"), "embedding", pc.cast(embedding, want))
    return table


def dim(table: pa.Table) -> int | None:
    """A normalised shard's embedding dim; None for an empty shard whose type fixed none."""
    return table.schema.field("embedding").type.list_size or None


def common_dim(tables: list[pa.Table], where: str) -> int | None:
    """The one dim of some shards (None when none has one); several is a one-line error."""
    dims = sorted({d for d in map(dim, tables) if d is not None})
    if len(dims) > 1:
        raise storage.StorageError(f"{where} mixes embedding dimensions {dims}")
    return dims[0] if dims else None


def matrix(table: pa.Table, dim_: int | None = None) -> np.ndarray:
    """The embedding column of a normalised shard as an (n, dim) numpy array; zero-copy for a one-batch
    memory-mapped shard. dim_: the columns of an empty shard whose type fixed none."""
    column = table["embedding"]
    dtype = column.type.value_type.to_pandas_dtype()
    if table.num_rows == 0:
        return np.zeros((0, dim(table) or dim_ or 0), dtype)
    chunk = column.chunks[0] if column.num_chunks == 1 else column.combine_chunks()
    return chunk.flatten().to_numpy(zero_copy_only=True).reshape(-1, column.type.list_size)


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


def model_of(uris: str) -> dict:
    """The model that made an embedding output (of several, `roots`: the first's), as `manifest_model` gives it."""
    return manifest_model(storage.read_manifest(roots(uris)[0]))


def manifest_modality(manifest: dict | None) -> str | None:
    """What an embed output's manifest says it holds, "image" or "text" (its config.modality); None when it
    says neither (another tool's manifest, or none)."""
    config = (manifest or {}).get("config")
    modality = config.get("modality") if isinstance(config, dict) else None
    return modality if modality in ("image", "text") else None


def _listed(manifest: dict | None) -> list[str] | None:
    """The shard paths a manifest lists: entries {"path": ...} (ours) or bare strings; None unless all are."""
    entries = (manifest or {}).get("shards")
    if not isinstance(entries, list):
        return None
    paths = [e.get("path") if isinstance(e, dict) else e for e in entries]
    return paths if all(isinstance(p, str) and p for p in paths) else None


def _is_shard(root: str, uri: str) -> bool:
    """An IPC file of the output itself: not under `_errors/`, `_progress/` or any other `_`/`.` path."""
    parts = uri[len(root.rstrip("/")) + 1:].split("/")
    return uri.endswith(SHARD_SUFFIXES) and not any(p.startswith(("_", ".")) for p in parts)


def roots(uris: str) -> list[str]:
    """The embedding outputs of a flag's value: one root, or several separated by commas."""
    return [u for u in uris.split(",") if u]


def shards(root: str) -> tuple[list[str], str | None]:
    """The shards of an embedding output (or of several: `roots`) and, when a manifest did not list them, why they
    were listed from the folder (a warning to print). An output of ours still running (progress records, no
    manifest) is an error: its shards are not all there yet."""
    if "," in root:
        found = [shards(r) for r in roots(root)]
        return [s for uris, _ in found for s in uris], "; ".join(n for _, n in found if n) or None
    manifest = storage.read_manifest(root)
    if theirs := other_command(manifest, "embed"):
        raise UserError(f"{storage.display(root)} holds the output of {theirs}, not embeddings (mieb-ray embed's)")
    paths = _listed(manifest)
    if paths is not None:
        return [p if "://" in p or p.startswith("/") else storage.join(root, p) for p in paths], None
    where = storage.display(root)
    files = storage.list_files(root)
    if manifest is None and any(_is_under(root, u, storage.PROGRESS) for u in files):
        raise storage.StorageError(f"{where} is an unfinished embed output (no {storage.MANIFEST} yet): run the "
                                   "embed job again with --resume to finish it")
    found = [u for u in files if _is_shard(root, u)]
    why = f"has no {storage.MANIFEST}" if manifest is None else f"has a {storage.MANIFEST} that lists no shards"
    if not found:
        raise storage.StorageError(f"{where} {why} and no embedding shards ({', '.join(SHARD_SUFFIXES)} files)")
    return found, f"{where} {why}: reading its {len(found)} IPC files by the shard contract (key, embedding)"


def _is_under(root: str, uri: str, folder: str) -> bool:
    return uri[len(root.rstrip("/")) + 1:].startswith(folder + "/")


def shard_uris(root: str) -> list[str]:
    """The shards of an embedding output: as its manifest lists them, else the IPC files in its folder."""
    return shards(root)[0]


def read_all(root: str) -> tuple[list[str], np.ndarray]:
    """Every key and embedding (float32) of an embedding output, in shard order."""
    tables = [open_shard(u) for u in shard_uris(root)]
    d = common_dim(tables, storage.display(root))
    keys = [k for t in tables for k in t["key"].to_pylist()]
    vectors = [matrix(t, d).astype(np.float32) for t in tables]
    return keys, np.concatenate(vectors) if vectors else np.zeros((0, d or 0), np.float32)


def _label(model: dict) -> str:
    revision = model.get("revision")
    return f"{model.get('name')}" + (f" at revision {revision}" if revision else "")


def _same_model(a: dict, b: dict) -> bool:
    """Same name, and same revision when both name one."""
    if str(a.get("name")) != str(b.get("name")):
        return False
    return not (a.get("revision") and b.get("revision")) or str(a["revision"]) == str(b["revision"])


def check_inputs(outputs: dict[str, str], allow_mixed_models: bool = False) -> list[str]:
    """Before scoring embedding outputs together ({what: root}, e.g. image and text): the warnings to print (a
    manifest that does not list the shards; a model that cannot be checked; mixed models when allowed). Outputs
    whose manifests name different models (name or revision) are refused: their cosines mean nothing."""
    notes, models = [], {}
    for what, uris in outputs.items():
        note = shards(uris)[1]
        if note:
            notes.append(f"{what} embeddings: {note}")
        several = len(roots(uris)) > 1
        for root in roots(uris):  # each root of several: they are scored as one output
            name = f"{what} embeddings" + (f" at {storage.display(root)}" if several else "")
            models[name] = manifest_model(storage.read_manifest(root))
            if not models[name].get("name"):
                notes.append(f"{what} embeddings at {storage.display(root)} name no model: cannot check that they "
                             "match the others'")
    named = [(w, m) for w, m in models.items() if m.get("name")]
    for what, model in named[1:]:
        first, ref = named[0]
        if _same_model(ref, model):
            continue
        mixed = f"{first} ({_label(ref)}) and {what} ({_label(model)}) come from different models"
        if not allow_mixed_models:
            raise UserError(f"{mixed}; pass --allow-mixed-models to score them together anyway")
        notes.append(f"{mixed} (--allow-mixed-models)")
    return notes


def read_ray(root: str):
    """The embeddings of a complete output as a Ray Dataset (one block per shard)."""
    import ray

    uris = shard_uris(root)
    return ray.data.from_items([{"uri": u} for u in uris], override_num_blocks=len(uris)).map_batches(
        lambda batch: open_shard(str(batch["uri"][0])), batch_size=1, batch_format="numpy")
