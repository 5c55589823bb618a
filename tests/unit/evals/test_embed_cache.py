"""The content-keyed cache as an mteb task's score pass reads it: the vectors of the task's keys, from the shards
holding them, and no other shard's embeddings (at MIEB's size the cache is every task's: millions of items)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from support.embedding_fixtures import write_embeddings

from mieb_ray import storage
from mieb_ray.evals import embed_cache
from mieb_ray.io import embeddings

DIM = 8


@pytest.fixture(params=["local", "s3"])
def cache(request, tmp_path):
    """An embed output of 30 keys in 3 shards whose last shard's embeddings are broken (a null row: opening it
    whole is a one-line error) while its keys read fine; (root, keys, vectors)."""
    if request.param == "s3":
        s3 = request.getfixturevalue("s3")
        storage.reset_clients()
        root = f"s3://{s3.bucket}/embed-cache-test/{tmp_path.name}"
    else:
        root = str(tmp_path / "cache")
    keys = [f"sha256:{i:02d}" for i in range(30)]
    vectors = np.random.default_rng(0).standard_normal((30, DIM)).astype(np.float32)
    write_embeddings(root, keys, vectors, "image", "float32", 3, {}, normalized=False)
    last = embeddings.open_shard(storage.join(root, "part-00002.arrow"))
    broken = pa.array([None, *([[0.0] * DIM] * (last.num_rows - 1))], last.schema.field("embedding").type)
    table = last.set_column(1, "embedding", broken)
    storage.commit_file(storage.join(root, "part-00002.arrow"), lambda local: embeddings.write_ipc(local, table))
    return root, keys, vectors


def test_only_the_wanted_keys_and_only_from_the_shards_holding_them(cache):
    root, keys, vectors = cache
    found, dim = embed_cache.vectors(embed_cache.Lookup([root]), {keys[3], keys[15]})
    assert dim == DIM and sorted(found) == [keys[3], keys[15]]
    assert np.array_equal(found[keys[3]], vectors[3]) and np.array_equal(found[keys[15]], vectors[15])
    # the broken shard is opened only when a wanted key is in it: then it is the one-line error it should be
    with pytest.raises(storage.StorageError, match="part-00002.arrow: null embeddings"):
        embed_cache.vectors(embed_cache.Lookup([root]), {keys[3], keys[25]})
    with pytest.raises(storage.StorageError, match="null embeddings"):
        embed_cache.vectors(embed_cache.Lookup([root]))


def test_a_lookup_of_every_key_reads_a_shards_embeddings_when_one_of_its_keys_is_taken(cache):
    root, keys, vectors = cache
    lookup = embed_cache.Lookup([root])  # the eval was given the cache: the task's keys are known as mteb asks
    assert all(k in lookup for k in keys) and "sha256:30" not in lookup and lookup.dim == DIM
    assert np.array_equal(lookup.take([keys[15], keys[3], keys[15]]), vectors[[15, 3, 15]])
    with pytest.raises(storage.StorageError, match="null embeddings"):
        lookup.take([keys[25]])


def test_a_shards_keys_and_schema_without_its_embeddings(cache):
    root, keys, _ = cache
    uris = embeddings.shard_uris(root)
    assert [k for uri in uris for k in embeddings.shard_keys(uri)] == keys
    assert embeddings.shard_schema(uris[2]).metadata == embeddings.open_shard(uris[0]).schema.metadata
    assert embeddings.model_metadata(embeddings.shard_schema(uris[2]))["normalized"] is False


def test_text_keys_and_a_key_in_two_outputs_the_later_ones_copy(tmp_path):
    # the mteb suite's texts are keyed by themselves: long, any characters; a key two outputs hold is served from
    # the later one (a re-embedded item), as every cache reader takes it
    texts = ["a photo of a cat", "ein Foto von einem Hund " * 40, "猫の写真", ""]
    first = np.arange(4 * DIM, dtype=np.float32).reshape(4, DIM)
    second = -first[:2]
    write_embeddings(str(tmp_path / "a"), texts, first, "text", "float32", 2, {}, normalized=False)
    write_embeddings(str(tmp_path / "b"), texts[:2], second, "text", "float32", 1, {}, normalized=False)
    lookup = embed_cache.Lookup([str(tmp_path / "a"), str(tmp_path / "b")])
    assert len(lookup) == 4 and lookup.missing(["猫の写真", "a dog", "", "a photo"]) == ["a dog", "a photo"]
    assert np.array_equal(lookup.take(texts), np.concatenate([second, first[2:]]))
    # a task's own keys: read so, or narrowed from the job's one index of the cache (nothing read again)
    for only in (embed_cache.Lookup([str(tmp_path / "a"), str(tmp_path / "b")], keys={texts[1], texts[3]}),
                 embed_cache.Lookup([str(tmp_path / "a"), str(tmp_path / "b")]).only({texts[1], texts[3], "a dog"})):
        assert len(only) == 2 and only.missing(texts) == [texts[0], texts[2]]
        assert np.array_equal(only.take([texts[3], texts[1]]), np.stack([first[3], second[1]]))
        with pytest.raises(KeyError):
            only.take([texts[0]])
    found, dim = embed_cache.vectors(embed_cache.Lookup([str(tmp_path / "a"), str(tmp_path / "b")]))
    assert dim == DIM and list(found) == texts and np.array_equal(found[texts[1]], second[1])


def test_a_lookup_of_no_outputs_or_no_wanted_keys_holds_nothing(cache):
    root, keys, _ = cache
    for lookup in (embed_cache.Lookup([]), embed_cache.Lookup([root], keys=set())):
        assert len(lookup) == 0 and lookup.missing(keys[:2]) == keys[:2] and lookup.take([]).shape[0] == 0


def test_the_views_of_every_suite_in_a_run_read_the_caches_keys_once(tiny_clip, tmp_path, monkeypatch):
    """A zero-shot and a linear-probe task: three image views (the zero-shot eval split, the probe's drawn train rows
    and its eval split) and the prompts' view. A fresh run's cache shards are the ones it embeds; each one's keys
    are read once, into the run's index of the cache that every view takes its rows from."""
    from mieb_ray.demo_data.mirror import make_mirror
    from mieb_ray.evals import registry
    from mieb_ray.evals.job import evaluate

    mirror = str(tmp_path / "mirror")
    make_mirror(mirror, rows={"cifar10": 200}, datasets=["cifar10"], eval_rows=12)
    read, real = [], embeddings.shard_keys
    monkeypatch.setattr(embeddings, "shard_keys", lambda uri: read.append(uri) or real(uri))
    out = tmp_path / "out"
    evaluate(registry.select("CIFAR10ZeroShot,CIFAR10"), registry.Options(mirror), str(out), model=tiny_clip,
             executor="local", log=lambda *a: None)
    shards = [str(p) for p in (out / "embeddings" / "cache").glob("*/*/*.arrow")]
    assert len([s for s in shards if "/images-" in s]) and len([s for s in shards if "/texts-" in s])
    assert sorted(read) == sorted(shards)
    assert len(list(out.glob("**/embeddings/images-1/_manifest.json"))) == 1  # the probe's two image views
