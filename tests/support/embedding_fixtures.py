"""Embeddings the tests and benchmarks write themselves, in our format (the embed job's layout, manifest last).

BioVITA (make_biovita_embeddings): image embeddings keyed by corpus id and text embeddings keyed by the query
text, for a mirror make_biovita_mirror wrote (its plan is read back from the mirror's sidecar). Species lie near
their genus, photos near their species, texts near their taxon; the plan's exact ties (the same photo under
several ids, a photo equal to a text) are identical vectors.

Zero-shot (make_zeroshot_embeddings): a fixture mirror's eval splits keyed `<slug>/<split>/<index>` and the
prompts keyed by their text. Each class has a random centre; an image is its class centre plus noise, a prompt
its class centre plus less noise, so accuracy is far from chance and mteb's and the fixed prompts disagree on
some images. A prompt's vector depends on its text only: ImageNet's two "missile" prompts are one vector, and an
image of a class whose mteb prompt another class shares is that very vector, so both classes tie exactly at the
top. With `zero`, the first image of each cosine-scored task is the zero vector: every class scores 0.

By default every vector lies on the 1/256 lattice with a squared norm of exactly 1 (on_grid): every cosine is then
exact in float32 whatever the summation order, and float16 storage is lossless, so ties are ties on any CPU, in
mteb's scoring as in ours (support/numerics.py).
"""

from __future__ import annotations

import functools
import hashlib
import json
from pathlib import Path

import numpy as np

from mieb_ray import __version__, formats, storage
from mieb_ray.demo_data.biovita import SIDECAR, SINGLE_GENERA, Plan, make_plan
from mieb_ray.demo_data.mirror import hub_names, label_of
from mieb_ray.evals.biovita_data import REPO
from mieb_ray.evals.zeroshot_tasks import COSINE, ZeroShotTask
from mieb_ray.io import embeddings
from support.numerics import on_grid

TEXT_NOISE = 0.6  # how far a name's text vector lies from its taxon
MODEL = {"name": "fixture/biovita-random", "revision": None, "architecture": "random", "image_config": None,
         "max_text_length": 77}


def _unit(x: np.ndarray) -> np.ndarray:
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def _vectors(plan: Plan, dim: int, seed: int, grid: int | None, spread: float):
    """Image vectors by corpus index, text vectors by text. Species lie near their genus, photos near their
    species with noise `spread` (so accuracies are neither 0 nor 1), texts near their taxon."""
    rng = np.random.default_rng([seed, 1])
    genera = sorted(set(plan.genus_of.values()))
    species = sorted(plan.genus_of)
    noise = lambda n: rng.standard_normal((n, dim)) / np.sqrt(dim)  # noqa: E731  (rows of norm ~1)
    g = dict(zip(genera, _unit(noise(len(genera)))))
    p = dict(zip(species, _unit(np.stack([g[plan.genus_of[s]] for s in species]) + 0.9 * noise(len(species)))))
    texts = {s: v for s, v in zip(species, _unit(np.stack([p[s] for s in species]) + TEXT_NOISE * noise(len(species))))}
    texts |= dict(zip(genera, _unit(np.stack([g[x] for x in genera]) + TEXT_NOISE * noise(len(genera)))))
    images = _unit(np.stack([p[s] for s, _ in plan.photos]) + spread * noise(len(plan.photos)))
    if grid:
        names = list(texts)
        texts = dict(zip(names, on_grid(np.stack([texts[n] for n in names]), grid, rng)))
        images = on_grid(images, grid, rng)
    images = images.astype(np.float32)
    ties = plan.ties
    for i in ties["species_photos"]:
        images[int(i)] = texts[ties["species_taxa"][0]]
    for i in ties["genus_photos"]:
        images[int(i)] = texts[ties["genus"]]
    for src, dup in ties["duplicates"]:
        images[int(dup)] = images[int(src)]
    query_texts = {t for q in plan.queries.values() for t, _, _ in q}
    return images, {t: texts[t].astype(np.float32) for t in sorted(query_texts)}


def write_embeddings(out: str, keys: list[str], matrix: np.ndarray, modality: str, dtype: str, shards: int,
           config: dict, normalized: bool = True) -> dict:
    """Shards + _manifest.json, laid out as the embed job writes them (manifest last); `normalized`: what the
    shards say of their vectors (False: raw, as `embed --raw` writes them)."""
    storage.check_output(out)
    dim = matrix.shape[1]
    meta = {"model": MODEL | {"dim": dim}, "modality": modality, "dtype": dtype, "normalized": normalized,
            "preprocessing": None, "package": f"mieb-ray {__version__}"}
    schema = formats.embedding_schema(dim, dtype, None, meta)
    entries = []
    bounds = np.linspace(0, len(keys), shards + 1).astype(int)
    for k in range(shards):
        lo, hi = bounds[k], bounds[k + 1]
        name = f"part-{k:05d}.arrow"
        dest = storage.join(out, name)
        local = storage.staging_path(dest)
        embeddings.write_ipc(local, embeddings.shard_table(schema, keys[lo:hi], matrix[lo:hi], {}))
        stats = storage.file_stats(local)
        storage.commit(local, dest)
        entries.append({"path": name, "rows": int(hi - lo), **stats})
    manifest = {
        **formats.EMBEDDINGS.stamp(), "package": "mieb-ray", "version": __version__,
        "config": {"input": "fixture", "modality": modality, "dtype": dtype, **config},
        "model": MODEL | {"dim": dim}, "dim": dim, "preprocessing": None,
        "counts": {"total": len(keys), "errors": 0}, "shards": entries, "error_files": [],
    }
    storage.write_manifest(out, manifest)
    return manifest


@functools.lru_cache(maxsize=None)
def _biovita_vectors_once(params: str, dim: int, seed: int, grid: int | None, spread: float):
    params = json.loads(params)
    return _vectors(make_plan(params["species_queries"], params["genus_queries"], params["seed"],
                              params.get("single_genera", SINGLE_GENERA)), dim, seed, grid, spread)


def _biovita_vectors(*args):
    """_vectors of a mirror's plan, made once per session for the same arguments (the lattice takes seconds)."""
    images, texts = _biovita_vectors_once(*args)
    return images.copy(), {t: v.copy() for t, v in texts.items()}


def make_biovita_embeddings(mirror: dict | str, image_out: str, text_out: str, dim: int = 32, seed: int = 0,
                            dtype: str = "float32", grid: int | None = 256, spread: float = 2.4,
                            image_shards: int = 2) -> None:
    """Write the fixture's image embeddings (key = corpus id, one set for both subsets) and text embeddings
    (key = query text: one row per distinct text) in our format, to local paths or s3:// URIs.

    mirror: what make_biovita_mirror returned, or its root (the plan is read back from the sidecar).
    grid: put every vector on the 1/grid lattice with an exactly-unit norm (exact cosines), None for plain floats.
    """
    if isinstance(mirror, dict):
        params = mirror["params"]
    else:
        params = json.loads(Path(mirror, REPO, SIDECAR).read_text())
    images, texts = _biovita_vectors(json.dumps(params, sort_keys=True), dim, seed, grid, spread)
    config = {"fixture": params, "seed": seed, "grid": grid, "spread": spread}
    write_embeddings(image_out, [str(i) for i in range(len(images))], images, "image", dtype, image_shards, config)
    write_embeddings(text_out, list(texts), np.stack(list(texts.values())), "text", dtype, 1, config)


# ---------------------------------------------------------------------------------------------- zero-shot


def _rng(*parts) -> np.random.Generator:
    return np.random.default_rng(int.from_bytes(hashlib.sha256("|".join(map(str, parts)).encode()).digest()[:8], "big"))


@functools.lru_cache(maxsize=None)
def _lattice(v: bytes, seed: int, name: str) -> np.ndarray:
    """A vector moved onto the 1/256 lattice, once per session (the tests ask for the same ones again and again)."""
    v = np.frombuffer(v)
    return on_grid((v / np.linalg.norm(v))[None], 256, _rng(seed, name, "grid"))[0]


def zeroshot_vectors(tasks: list[ZeroShotTask], rows: dict[str, int], dim: int = 16, noise: float = 0.5,
                     seed: int = 0, zero: bool = True) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """({image key: vector}, {prompt: vector}) for the first rows[slug] rows of each task's eval split."""
    images, texts = {}, {}

    def lattice(v: np.ndarray, name: str) -> np.ndarray:
        return _lattice(v.astype(np.float64).tobytes(), seed, name).copy()

    for task in tasks:
        names = hub_names(task.slug)
        sets = (task.mteb_prompts(names), task.fixed_prompts(names))
        centres = _rng(seed, task.slug, "centres").standard_normal((len(sets[0]), dim)).astype(np.float32)
        for prompts in sets:
            for label, text in enumerate(prompts):
                if text not in texts:
                    texts[text] = lattice(centres[label] + 0.5 * _rng(seed, text).standard_normal(dim), text)
        for i in range(rows[task.slug]):
            key = f"{task.key_prefix()}{i}"
            label = label_of(task.source, i)
            images[key] = lattice(centres[label] + noise * _rng(seed, key).standard_normal(dim), key)
            if sets[0].count(sets[0][label]) > 1:
                images[key] = texts[sets[0][label]].copy()
            if zero and i == 0 and task.scorer == COSINE:
                images[key] = np.zeros(dim, np.float32)
    return images, texts


def make_zeroshot_embeddings(tasks: list[ZeroShotTask], rows: dict[str, int], image_out: str, text_out: str,
                             dim: int = 16, seed: int = 0, image_shards: int = 3, zero: bool = True) -> None:
    """Write the image and prompt embeddings (see zeroshot_vectors) as embed outputs."""
    images, texts = zeroshot_vectors(tasks, rows, dim, seed=seed, zero=zero)
    config = {"fixture": "zeroshot", "seed": seed}
    write_embeddings(image_out, list(images), np.stack(list(images.values())), "image", "float32", image_shards,
                     config)
    write_embeddings(text_out, list(texts), np.stack(list(texts.values())), "text", "float32", 1, config)
