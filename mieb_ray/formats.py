"""Every kind of output mieb-ray writes, in one place: its name (the manifest's `format`) and version, its files,
the schemas, keys and enums its readers rely on. Writers stamp their manifests and name their files from here,
readers check them from here; no job types a format's name, version or file name itself. What decides an
output's content, its identity, is written by the jobs under the manifest's `identity` (runtime/identity.py).
docs/formats.md describes each for users.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import pyarrow as pa


@dataclass(frozen=True)
class Kind:
    """A kind of output: what its manifest's `format` and `format_version` say."""

    name: str
    version: int

    def stamp(self) -> dict:
        """The manifest fields that say what the output is."""
        return {"format": self.name, "format_version": self.version}

    def holds(self, manifest: dict | None) -> bool:
        """Whether a manifest is of this kind (any version: a reader says what it cannot read)."""
        return isinstance(manifest, dict) and manifest.get("format") == self.name


# ---------------------------------------------------------------------------------------------- mieb-train

# 2: tars named <slug>/<slug>-000000.tar, with sizes.json; 3: a row's index is its index in
# `datasets.load_dataset(repo)[split]` (files sorted as strings: the hub's 10.tar before 2.tar)
MIEB_TRAIN = Kind("mieb-train", 3)
SIZES = "sizes.json"  # WebDataset builds: every shard's base name -> its rows, in each dataset folder
CARD = "README.md"  # the dataset card whose `configs` let `datasets` load one dataset by name

_STRING = {"dtype": "string", "_type": "Value"}
# What `datasets.Features(...).arrow_schema` writes (a test checks it): the `huggingface` metadata makes
# `datasets` decode `image` as an Image. Spelled out so that actors need not import `datasets` (0.6 s each).
HF_FEATURES = {"key": _STRING, "image": {"_type": "Image"}, "text": _STRING,
               "label": {"dtype": "int64", "_type": "Value"},
               "class_name": _STRING, "dataset_name": _STRING}
TRAIN_SCHEMA = pa.schema([("key", pa.string()),
                          ("image", pa.struct([("bytes", pa.binary()), ("path", pa.string())])),
                          ("text", pa.string()), ("label", pa.int64()), ("class_name", pa.string()),
                          ("dataset_name", pa.string())],
                         metadata={"huggingface": json.dumps({"info": {"features": HF_FEATURES}})})
TRAIN_ERROR_SCHEMA = pa.schema([("key", pa.string()), ("dataset_name", pa.string()), ("file", pa.string()),
                                ("error", pa.string())])


def key_prefix(slug: str, split: str = "train") -> str:
    """Train keys are `<slug>/<index>`; an eval split's `<slug>/<split>/<index>`, so the two never collide."""
    return f"{slug}/" if split == "train" else f"{slug}/{split}/"


def shard_path(slug: str, number: int, suffix: str) -> str:
    """Shard `number` of a dataset: `<slug>/000000.parquet` or `<slug>/<slug>-000000.tar`. Tar base names are
    unique across datasets because WebDataset trainers (open_clip) count samples by base name in one sizes.json,
    the one in the folder of the first shard, whatever mix of datasets follows."""
    return f"{slug}/{number:06d}.parquet" if suffix == "parquet" else f"{slug}/{slug}-{number:06d}.{suffix}"


def shard_sizes(shards: list[dict]) -> dict[str, int]:
    """sizes.json of a WebDataset build: {base name: rows} of all its shards (manifest entries)."""
    return dict(sorted((s["path"].rsplit("/", 1)[-1], s["rows"]) for s in shards))


# ---------------------------------------------------------------------------------------------- embeddings

EMBEDDINGS = Kind("mieb-embeddings", 2)
DTYPES = {"float16": pa.float16(), "float32": pa.float32()}
EMBEDDING_ERROR_SCHEMA = pa.schema([("key", pa.string()), ("error", pa.string())])
SHARD_SUFFIXES = (".arrow", ".ipc", ".feather", ".arrows")  # IPC files, when no manifest lists the shards


def embedding_schema(dim: int, dtype: str, carry: pa.Schema | None, metadata: dict) -> pa.Schema:
    """An embedding shard's schema: `key`, `embedding` (fixed_size_list<dtype>[dim]), the carried columns; the
    `mieb_ray` metadata (JSON) names the model, dim, dtype, normalisation and preprocessing."""
    fields = [pa.field("key", pa.string()), pa.field("embedding", pa.list_(DTYPES[dtype], dim))]
    return pa.schema(fields + list(carry or []), metadata={"mieb_ray": json.dumps(metadata, sort_keys=True)})


# ---------------------------------------------------------------------------------------------- audit

AUDIT = Kind("mieb-audit", 1)
PAIRS = "contamination.parquet"  # one row per (train row, eval image, detector) pair, or per member of a group
DUPLICATES = "duplicates.parquet"  # of a self audit: key, method, group, keep
AUDIT_ERRORS = "errors.parquet"
SUMMARY = "summary.json"
REPORT = "report.html"
DETECTORS = ("exact", "pixels", "pdq", "near")  # the report's order too
HASH_DETECTORS = DETECTORS[:-1]  # from the hash stage; near needs embeddings
BUILD_DETECTORS = HASH_DETECTORS  # build --exclude's default: the near (CLIP) threshold is a placeholder

# ---------------------------------------------------------------------------------------------- eval

EVAL = Kind("mieb-eval", 1)  # a run of several suites, each in its folder
PREDICTIONS = "predictions.parquet"  # zero-shot: each image's label and predictions
RANKS = "ranks.parquet"  # BioVITA: each query's rank of its correct taxon
EVAL_FILES = (SUMMARY, REPORT, PREDICTIONS, RANKS)  # besides the tasks' TaskResults


def suite_kind(suite: str) -> Kind:
    """One suite's output (its tasks' TaskResult JSONs and its own files): `mieb-<suite>-eval`."""
    return Kind(f"mieb-{suite.replace('_', '-')}-eval", 1)


def other_command(manifest: dict | None, job: str) -> str | None:
    """"mieb-ray embed (mieb-embeddings)" where an output's manifest says that another command than `job` (build,
    embed, audit, eval) wrote it; None for `job`'s own outputs and for what is not mieb-ray's."""
    name = (manifest or {}).get("format")
    if not isinstance(name, str):  # another tool's manifest, or none
        return None
    jobs = {MIEB_TRAIN.name: "build", EMBEDDINGS.name: "embed", AUDIT.name: "audit"}
    theirs = "eval" if name.startswith("mieb-") and name.endswith("-eval") else jobs.get(name)  # EVAL, suite_kind's
    return f"mieb-ray {theirs} ({name})" if theirs not in (None, job) else None


def result_file(task: str) -> str:
    """A task's TaskResult, as mteb's `TaskResult.to_disk` writes it."""
    return f"{task}.json"
