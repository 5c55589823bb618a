"""Embeddings another tool wrote: whatever the manifest holds (nothing, `{}`, odd types, no usable shard list)
and whatever the shards' schema (extra columns, float16/float64, list or large_list, an empty shard, an IPC
stream), eval-biovita, eval-zeroshot and the audit's near stage give the clean result; a shard that breaks the
contract (no key, no embedding, ragged, nulls) is one `mieb-ray: error:` line, never a traceback. And image and
text (or train and eval) embeddings of different models are refused, unless --allow-mixed-models.

Every vector is float16-exact, so a shard stored in float16, float32 or float64 scores identically."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from support.embedding_fixtures import make_biovita_embeddings, write_embeddings, zeroshot_vectors

from mieb_ray.audit.job import near_pairs
from mieb_ray.cli import main
from mieb_ray.demo_data.biovita import make_biovita_mirror
from mieb_ray.demo_data.mirror import make_mirror
from mieb_ray.errors import UserError, find_user_error
from mieb_ray.evals.zeroshot_tasks import select_tasks
from mieb_ray.io import embeddings

pytestmark = pytest.mark.timeout(300)

MODEL = "fixture/biovita-random"  # the model the fixtures' manifests name
ZS_TASK, ZS_ROWS = "RenderedSST2", 12

# ---------------------------------------------------------------------------------------------- manifests
# each: (shard names, the clean manifest) -> the text of _manifest.json, or None for no manifest


def _entries(names, manifest):
    return [{"path": n, "rows": 0} for n in names]


MANIFESTS = {
    "ours": lambda names, m: json.dumps({**m, "shards": _entries(names, m)}),
    "none": lambda names, m: None,
    "empty-object": lambda names, m: "{}",
    "model-str": lambda names, m: json.dumps({"model": MODEL, "shards": _entries(names, m)}),
    "model-number": lambda names, m: json.dumps({"model": 7, "shards": _entries(names, m)}),
    "model-list": lambda names, m: json.dumps({"model": [MODEL], "shards": _entries(names, m)}),
    "model-null": lambda names, m: json.dumps({"model": None, "shards": _entries(names, m)}),
    "shards-str": lambda names, m: json.dumps({"model": m["model"], "shards": names[0]}),
    "shards-bare-paths": lambda names, m: json.dumps({"model": m["model"], "shards": list(names)}),
    "entry-without-path": lambda names, m: json.dumps({"shards": [{"rows": 1}] + _entries(names, m)[1:]}),
    "entry-without-rows": lambda names, m: json.dumps({"shards": [{"path": n} for n in names]}),
    "unknown-fields": lambda names, m: json.dumps({"format": "other-tool", "dim": "big", "extra": {"a": [1]},
                                                   "model": {"name": MODEL, "weights": [1, 2]},
                                                   "shards": [{"path": n, "file": 3} for n in names]}),
    "not-json": lambda names, m: "{not json",
    "a-list": lambda names, m: "[1, 2]",
}

# ---------------------------------------------------------------------------------------------- shard schemas
# each: a clean shard table -> the foreign one; (name, table) pairs, so a case may add a shard


def _embedding(table, column):
    return table.set_column(table.schema.get_field_index("embedding"), "embedding", column)


def _as(value_type):
    def cast(table):
        return _embedding(table, table["embedding"].cast(pa.list_(value_type, table["embedding"].type.list_size)))
    return cast


def _lists(kind):
    return lambda table: _embedding(table, table["embedding"].cast(kind(pa.float32())))


def _large(table):
    table = _lists(pa.large_list)(table)
    return table.set_column(0, "key", table["key"].cast(pa.large_string()))


def _extra(table):
    n = table.num_rows
    return table.append_column("score", pa.array(np.arange(n, dtype=np.float64))).append_column(
        "meta", pa.array([{"source": "x"}] * n)).append_column("image", pa.array([b"\x00"] * n, pa.binary()))


def _ragged(table):
    rows = table["embedding"].to_pylist()
    rows[0] = rows[0][:-1]
    return _embedding(table, pa.chunked_array([pa.array(rows, pa.list_(pa.float32()))]))


def _null_embedding(table):
    rows = table["embedding"].to_pylist()
    rows[0] = None
    return _embedding(table, pa.chunked_array([pa.array(rows, table.schema.field("embedding").type)]))


def _null_key(table):
    return table.set_column(0, "key", pa.array([None] + table["key"].to_pylist()[1:], pa.string()))


def _rename(old, new):
    return lambda table: table.rename_columns([new if c == old else c for c in table.column_names])


SCHEMAS = {  # name -> (transform, the error it must give or None)
    "clean": (lambda t: t, None),
    "extra-columns": (_extra, None),
    "float16": (_as(pa.float16()), None),
    "float64": (_as(pa.float64()), None),
    "list-float": (_lists(pa.list_), None),
    "large-list-large-string": (_large, None),
    "empty-shard": ("empty", None),
    "ipc-stream": ("stream", None),
    "missing-key": (_rename("key", "id"), "has no `key` column"),
    "missing-embedding": (_rename("embedding", "vector"), "has no `embedding` column"),
    "ragged": (_ragged, "ragged embeddings"),
    "null-embedding": (_null_embedding, "null embeddings"),
    "null-key": (_null_key, "null keys"),
}


LISTED = {"none", "empty-object", "shards-str", "entry-without-path", "not-json", "a-list"}  # no usable list


def write_ipc(path, table, stream=False):
    with pa.OSFile(str(path), "wb") as sink:
        writer = pa.ipc.new_stream(sink, table.schema) if stream else pa.ipc.new_file(sink, table.schema)
        with writer:
            writer.write_table(table, max_chunksize=max(1, table.num_rows // 2))  # two batches: not one map


def foreign(clean: str, dst: str, manifest: str, schema: str) -> str:
    """A copy of the clean output `clean` at `dst`, its shards and manifest rewritten as another tool might."""
    os.makedirs(dst)
    transform, _ = SCHEMAS[schema]
    names = []
    for n, uri in enumerate(embeddings.shard_uris(clean)):
        table = pa.ipc.open_file(pa.memory_map(uri)).read_all()  # as written, not normalised
        name = f"part-{n}.arrow"
        if callable(transform):
            table = transform(table) if n == 0 else table
        write_ipc(Path(dst, name), table, stream=transform == "stream")
        names.append(name)
    if transform == "empty":  # a list-typed empty shard: its type gives no dim
        empty = pa.table({"key": pa.array([], pa.string()), "embedding": pa.array([], pa.list_(pa.float32()))})
        write_ipc(Path(dst, "part-empty.arrow"), empty)
        names.insert(1, "part-empty.arrow")
    os.makedirs(Path(dst, "_errors"))
    write_ipc(Path(dst, "_errors", "part-0.arrow"), pa.table({"key": ["x"], "error": ["undecodable"]}))
    text = MANIFESTS[manifest](names, json.loads(Path(clean, "_manifest.json").read_text()))
    if text is not None:
        Path(dst, "_manifest.json").write_text(text)
    return dst


def cases(seed: int) -> list[tuple[str, str]]:
    """Every schema and every manifest at least once, paired: (manifest, schema)."""
    manifests, schemas = list(MANIFESTS), list(SCHEMAS)
    n = max(len(manifests), len(schemas))
    return [(manifests[(i + seed) % len(manifests)], schemas[i % len(schemas)]) for i in range(n)]


def one_line_error(capsys, code: int, expected: str) -> None:
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    errors = [line for line in lines if line.startswith("mieb-ray: error:")]
    assert code == 1 and len(errors) == 1 and expected in errors[0], captured.err
    assert "Traceback" not in captured.err, captured.err


# ---------------------------------------------------------------------------------------------- the reader alone


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    root = tmp_path_factory.mktemp("small")
    keys = [f"k{i}" for i in range(7)]
    vectors = np.float16(np.random.default_rng(0).standard_normal((7, 4))).astype(np.float32)
    write_embeddings(str(root / "clean"), keys, vectors, "image", "float32", 2, {})
    return str(root / "clean"), keys, vectors


@pytest.mark.parametrize("schema", list(SCHEMAS))
@pytest.mark.parametrize("manifest", list(MANIFESTS))
def test_read_all_by_the_contract(small, tmp_path, manifest, schema):
    clean, keys, vectors = small
    out = foreign(clean, str(tmp_path / "x"), manifest, schema)
    error = SCHEMAS[schema][1]
    if error:
        with pytest.raises(UserError, match=error) as got:
            embeddings.read_all(out)
        assert "\n" not in str(got.value)
        return
    got_keys, got_vectors = embeddings.read_all(out)
    assert got_keys == keys and got_vectors.dtype == np.float32 and np.array_equal(got_vectors, vectors)
    notes = embeddings.check_inputs({"image": out})
    assert any("reading its" in n and "IPC files" in n for n in notes) == (manifest in LISTED)
    assert all("\n" not in n for n in notes)


def test_other_contract_breaches_are_one_line(small, tmp_path):
    clean, _, _ = small
    bad = {
        "int-key": pa.table({"key": [1, 2], "embedding": pa.array([[1.0], [2.0]], pa.list_(pa.float32(), 1))}),
        "int-values": pa.table({"key": ["a"], "embedding": pa.array([[1, 2]], pa.list_(pa.int8(), 2))}),
        "a-string-embedding": pa.table({"key": ["a"], "embedding": ["0.1,0.2"]}),
        "null-value": pa.table({"key": ["a"], "embedding": pa.array([[1.0, None]], pa.list_(pa.float32()))}),
        "other-dim": pa.table({"key": ["a"], "embedding": pa.array([[1.0] * 5], pa.list_(pa.float32(), 5))}),
        "no-values": pa.table({"key": ["a"], "embedding": pa.array([[]], pa.list_(pa.float32()))}),
        "two-keys": pa.Table.from_arrays([pa.array(["a"]), pa.array(["b"]), pa.array([[1.0] * 4])],
                                         ["key", "key", "embedding"]),
    }
    want = {"int-key": "`key` is int64, not strings", "int-values": "not a list of floats",
            "a-string-embedding": "not a list of floats", "null-value": "null values",
            "other-dim": "mixes embedding dimensions [4, 5]", "no-values": "embeddings of no values",
            "two-keys": "has more than one `key` column"}
    for name, table in bad.items():
        out = foreign(clean, str(tmp_path / name), "none", "clean")
        write_ipc(Path(out, "zz.arrow"), table)
        with pytest.raises(UserError, match=re.escape(want[name])):
            embeddings.read_all(out)
    Path(tmp_path / "garbage").mkdir()
    Path(tmp_path / "garbage" / "0.arrow").write_bytes(b"PAR1 not arrow")
    with pytest.raises(UserError, match=r"0\.arrow is not an Arrow IPC file of embeddings"):
        embeddings.read_all(str(tmp_path / "garbage"))
    with pytest.raises(UserError, match="has no _manifest.json and no embedding shards"):
        embeddings.read_all(str(tmp_path / "nowhere"))
    unfinished = tmp_path / "unfinished"
    (unfinished / "_progress").mkdir(parents=True)
    (unfinished / "_progress" / "a.json").write_text("{}")
    write_ipc(unfinished / "a.arrow", pa.ipc.open_file(embeddings.shard_uris(clean)[0]).read_all())
    with pytest.raises(UserError, match="unfinished embed output .* --resume"):
        embeddings.read_all(str(unfinished))


def test_mixed_models_are_refused_unless_allowed(tmp_path):
    def output(name, model):
        write_embeddings(str(tmp_path / name), ["a"], np.ones((1, 2), np.float32), "image", "float32", 1, {})
        manifest = json.loads((tmp_path / name / "_manifest.json").read_text())
        (tmp_path / name / "_manifest.json").write_text(json.dumps({**manifest, "model": model}))
        return str(tmp_path / name)

    a, b = output("a", {"name": "org/clip", "revision": "r1"}), output("b", {"name": "org/siglip"})
    c, d = output("c", {"name": "org/clip", "revision": "r2"}), output("d", "org/clip")
    unnamed = output("e", None)
    with pytest.raises(UserError, match=r"image embeddings \(org/clip at revision r1\) and text embeddings "
                                        r"\(org/siglip\) come from different models; pass --allow-mixed-models"):
        embeddings.check_inputs({"image": a, "text": b})
    with pytest.raises(UserError, match="revision r1.*revision r2"):
        embeddings.check_inputs({"image": a, "text": c})
    assert embeddings.check_inputs({"image": a, "text": d}) == []  # a revision named on one side only
    notes = embeddings.check_inputs({"image": a, "text": b}, allow_mixed_models=True)
    assert len(notes) == 1 and "come from different models (--allow-mixed-models)" in notes[0]
    notes = embeddings.check_inputs({"image": a, "text": unnamed})
    assert len(notes) == 1 and "text embeddings at" in notes[0] and "name no model: cannot check" in notes[0]
    # several image roots scored as one output: each root's model is checked, and the first names the run's model
    assert embeddings.check_inputs({"image": f"{a},{d}", "text": d}) == []
    with pytest.raises(UserError, match=rf"image embeddings at {a} \(org/clip at revision r1\) and image embeddings "
                                        rf"at {b} \(org/siglip\) come from different models"):
        embeddings.check_inputs({"image": f"{a},{b}", "text": a})
    assert embeddings.model_of(f"{b},{a}") == {"name": "org/siglip"}


# ---------------------------------------------------------------------------------------------- the consumers


@pytest.fixture(scope="module")
def bio(tmp_path_factory):
    """A small BioVITA mirror, its embeddings, and the clean eval's results."""
    root = tmp_path_factory.mktemp("bio")
    data = str(root / "data")
    make_biovita_mirror(data, species_queries=3, genus_queries=6)
    images, texts = str(root / "img"), str(root / "txt")
    make_biovita_embeddings(data, images, texts, image_shards=3)  # grid vectors: float16-exact
    return data, images, texts, _bio_result(str(root / "clean"), data, images, texts)


def _bio_argv(out, data, images, texts, *flags):
    return ["eval-biovita", "--data", data, "--image-embeddings", images, "--text-embeddings", texts,
            "--out", out, "--query-block", "4", *flags]


def _bio_result(out, data, images, texts, *flags):
    assert main(_bio_argv(out, data, images, texts, *flags)) == 0
    result = json.loads(Path(out, "BioVITAT2IReranking.json").read_text())
    return [{k: v for k, v in s.items()} for s in result["scores"]["test"]], \
        pq.read_table(Path(out, "ranks.parquet")).to_pylist()


@pytest.mark.parametrize("manifest,schema", cases(0))
def test_eval_biovita(ray_local, bio, tmp_path, capsys, manifest, schema):
    data, images, texts, clean = bio
    images = foreign(images, str(tmp_path / "img"), manifest, schema)
    texts = foreign(texts, str(tmp_path / "txt"), manifest, schema)
    capsys.readouterr()
    error = SCHEMAS[schema][1]
    if error:
        one_line_error(capsys, main(_bio_argv(str(tmp_path / "out"), data, images, texts)), error)
    else:
        assert _bio_result(str(tmp_path / "out"), data, images, texts) == clean
        captured = capsys.readouterr()
        assert "Traceback" not in captured.err
        warned = [line for line in captured.out.splitlines() if "IPC files by the shard contract" in line]
        assert len(warned) == (2 if manifest in LISTED else 0), captured.out  # one line per output


@pytest.fixture(scope="module")
def zs(tmp_path_factory):
    """A mirror of one zero-shot task, float16-exact image and prompt embeddings, the clean eval's results."""
    root = tmp_path_factory.mktemp("zs")
    task = select_tasks(ZS_TASK)[0]
    data = str(root / "data")
    make_mirror(data, rows=2, datasets=[task.slug], files=1, eval_rows=ZS_ROWS)
    vectors, prompts = zeroshot_vectors([task], {task.slug: ZS_ROWS}, dim=8)  # on the 1/256 lattice: float16-exact
    images, texts = str(root / "img"), str(root / "txt")
    write_embeddings(images, list(vectors), np.stack(list(vectors.values())), "image", "float32", 2, {})
    write_embeddings(texts, list(prompts), np.stack(list(prompts.values())), "text", "float32", 1, {})
    return data, images, texts, _zs_result(str(root / "clean"), data, images, texts)


def _zs_argv(out, data, images, texts, *flags):
    return ["eval-zeroshot", "--tasks", ZS_TASK, "--data", data, "--image-embeddings", images,
            "--text-embeddings", texts, "--out", out, *flags]


def _zs_result(out, data, images, texts, *flags):
    assert main(_zs_argv(out, data, images, texts, *flags)) == 0
    return json.loads(Path(out, f"{ZS_TASK}.json").read_text())["scores"], \
        pq.read_table(Path(out, "predictions.parquet")).to_pylist()


@pytest.mark.parametrize("manifest,schema", cases(5))
def test_eval_zeroshot(ray_local, zs, tmp_path, capsys, manifest, schema):
    data, images, texts, clean = zs
    images = foreign(images, str(tmp_path / "img"), manifest, schema)
    texts = foreign(texts, str(tmp_path / "txt"), manifest, schema)
    capsys.readouterr()
    error = SCHEMAS[schema][1]
    if error:
        one_line_error(capsys, main(_zs_argv(str(tmp_path / "out"), data, images, texts)), error)
    else:
        assert _zs_result(str(tmp_path / "out"), data, images, texts) == clean
        assert "Traceback" not in capsys.readouterr().err


@pytest.fixture(scope="module")
def near(ray_local, tmp_path_factory):
    """Train and eval embeddings where some eval rows lie near train rows, and the clean near pairs."""
    root = tmp_path_factory.mktemp("near")
    rng = np.random.default_rng(3)
    train = rng.standard_normal((20, 8))
    evals = np.concatenate([train[:5] + 0.05 * rng.standard_normal((5, 8)), rng.standard_normal((5, 8))])
    exact = lambda v: v.astype(np.float16).astype(np.float32)  # noqa: E731
    write_embeddings(str(root / "train"), [f"t{i}" for i in range(20)], exact(train), "image", "float32", 3, {})
    write_embeddings(str(root / "eval"), [f"e{i}" for i in range(10)], exact(evals), "image", "float32", 2, {})
    pairs, _ = near_pairs(str(root / "train"), [str(root / "eval")], 0.9)
    assert pairs.num_rows >= 5
    return str(root / "train"), str(root / "eval"), pairs.to_pylist()


@pytest.mark.parametrize("manifest,schema", cases(9))
def test_audit_near_stage(ray_local, near, tmp_path, manifest, schema):
    train, evals, clean = near
    train = foreign(train, str(tmp_path / "train"), manifest, schema)
    evals = foreign(evals, str(tmp_path / "eval"), manifest, schema)
    error = SCHEMAS[schema][1]
    if error:
        with pytest.raises(Exception) as got:
            near_pairs(train, [evals], 0.9)
        user = find_user_error(got.value)
        assert user is not None and error in str(user) and "\n" not in str(user), got.value
    else:
        assert near_pairs(train, [evals], 0.9)[0].to_pylist() == clean


def test_mixed_models_in_the_jobs(ray_local, bio, zs, tmp_path, capsys):
    """eval-biovita, eval-zeroshot and the audit refuse embeddings of two models in one line naming both, before
    any work; --allow-mixed-models scores them (the same result) with a warning."""
    data, images, texts, clean = bio
    other = foreign(texts, str(tmp_path / "txt"), "ours", "clean")
    manifest = json.loads(Path(other, "_manifest.json").read_text())
    Path(other, "_manifest.json").write_text(json.dumps({**manifest, "model": {"name": "org/other-model"}}))
    capsys.readouterr()
    code = main(["eval-biovita", "--data", data, "--image-embeddings", images, "--text-embeddings", other,
                 "--out", str(tmp_path / "bio")])
    one_line_error(capsys, code, f"image embeddings ({MODEL}) and text embeddings (org/other-model) come from "
                                 "different models; pass --allow-mixed-models")
    assert not os.path.exists(tmp_path / "bio" / "_manifest.json")
    assert _bio_result(str(tmp_path / "bio"), data, images, other, "--allow-mixed-models") == clean
    out = capsys.readouterr().out
    assert "[eval] warning: image embeddings" in out and "(--allow-mixed-models)" in out

    zs_data, zs_images, zs_texts, _ = zs
    code = main(["eval-zeroshot", "--tasks", ZS_TASK, "--data", zs_data, "--image-embeddings", zs_images,
                 "--text-embeddings", other, "--out", str(tmp_path / "zs")])
    one_line_error(capsys, code, "come from different models")

    (tmp_path / "no-train").mkdir()  # tables without files: the models are checked first
    (tmp_path / "no-eval").mkdir()
    argv = ["audit", "--train", str(tmp_path / "no-train"), "--against", str(tmp_path / "no-eval"),
            "--train-embeddings", images, "--against-embeddings", other, "--out", str(tmp_path / "audit")]
    one_line_error(capsys, main(argv), "train embeddings (fixture/biovita-random) and eval embeddings "
                                       "(org/other-model) come from different models")
    code = main(argv + ["--allow-mixed-models"])  # refused no more: on to the tables, which do not exist
    captured = capsys.readouterr()
    assert code == 1 and "[audit] warning: train embeddings" in captured.out and "no-train" in captured.err


def test_a_manifest_listing_a_missing_shard_is_one_line(ray_local, bio, zs, tmp_path, capsys):
    data, images, texts, _ = bio
    no_image, no_text = (foreign(u, str(tmp_path / n), "ours", "clean") for u, n in ((images, "i"), (texts, "t")))
    os.remove(Path(no_image, "part-1.arrow"))
    os.remove(Path(no_text, "part-0.arrow"))
    capsys.readouterr()
    for argv in (["--image-embeddings", no_image, "--text-embeddings", texts],
                 ["--image-embeddings", images, "--text-embeddings", no_text]):
        code = main(["eval-biovita", "--data", data, *argv, "--out", str(tmp_path / "o")])
        one_line_error(capsys, code, "no such embedding shard: ")
    zs_data, zs_images, zs_texts, _ = zs
    no_image = foreign(zs_images, str(tmp_path / "zi"), "shards-bare-paths", "clean")
    os.remove(Path(no_image, "part-0.arrow"))
    code = main(["eval-zeroshot", "--tasks", ZS_TASK, "--data", zs_data, "--image-embeddings", no_image,
                 "--text-embeddings", zs_texts, "--out", str(tmp_path / "z")])
    one_line_error(capsys, code, "no such embedding shard: ")
