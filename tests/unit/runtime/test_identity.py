"""One reuse rule (runtime/identity.py): an output a command makes for its own needs (`eval --model`'s embeddings,
its eval splits) is reused only when everything that decides its content is the same, never by its name or path:
another model revision, a local model folder overwritten with other weights, an input rebuilt at the same path,
a mirror whose files changed, each makes it be redone; the same request reuses it. The log line says which."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from mieb_ray.demo_data.mirror import make_mirror
from mieb_ray.demo_data.models import make_tiny_clip
from mieb_ray.io import embeddings
from mieb_ray.pipelines.build import BuildConfig, build, build_eval_splits
from mieb_ray.pipelines.embed import embed_table


class Log(list):
    def __call__(self, line: str) -> None:
        self.append(line)

    def said(self, job: str) -> str:
        """The job's reuse decision: its one `reusing` or `redoing` line ('' for a first run)."""
        return next((line for line in self if line.startswith((f"[{job}] reusing ", f"[{job}] redoing "))), "")


@pytest.fixture(scope="module")
def table(tmp_path_factory):
    """A mieb-train of two datasets, and its mirror."""
    root = tmp_path_factory.mktemp("reuse")
    mirror, out = str(root / "mirror"), str(root / "train")
    make_mirror(mirror, rows=4, datasets=["cifar10", "dtd"], files=1)
    build(BuildConfig(mirror, out, datasets=("cifar10",), executor="local"), log=lambda _: None)
    return mirror, out


def vectors(out: str) -> dict:
    return {k: v.tobytes() for k, v in zip(*embeddings.read_all(out))}


def run(source: str, target: str, model: str, revision: str | None = None) -> Log:
    log = Log()
    embed_table(source, "key", target, model, revision, "image", log, executor="local")
    return log


def test_the_same_request_reuses_and_other_weights_redo(table, tmp_path):
    _, train = table
    model, target = make_tiny_clip(str(tmp_path / "model")), str(tmp_path / "emb")
    assert run(train, target, model).said("embed") == ""
    first = vectors(target)
    again = run(train, target, model)
    assert again.said("embed").startswith(f"[embed] reusing {target}: made from the same ")
    assert not any(" units, " in line for line in again)  # nothing encoded
    assert vectors(target) == first

    shutil.rmtree(model)
    make_tiny_clip(model, seed=1)  # the same folder, other weights
    log = run(train, target, model)
    assert log.said("embed").startswith(f"[embed] redoing {target}: made from other inputs or settings: "
                                        "model.content ")  # the two hashes' heads
    assert vectors(target).keys() == first.keys() and vectors(target) != first


def test_another_revision_of_a_hub_model_redoes(table, tmp_path):
    """Two commits of `someone/tiny-clip` in the hub cache (offline): each revision its own embeddings."""
    _, train = table
    hub = os.path.join(os.environ["HF_HOME"], "hub", "models--someone--tiny-clip")
    shas = ["1" * 40, "2" * 40]
    for seed, sha in enumerate(shas):
        make_tiny_clip(os.path.join(hub, "snapshots", sha), seed=seed)
    target = str(tmp_path / "emb")
    run(train, target, "someone/tiny-clip", shas[0])
    first = vectors(target)
    log = run(train, target, "someone/tiny-clip", shas[1])
    assert log.said("embed") == (f"[embed] redoing {target}: made from other inputs or settings: model.revision "
                                 f'"{shas[0][:16]}..." -> "{shas[1][:16]}..."')
    assert vectors(target) != first
    assert run(train, target, "someone/tiny-clip", shas[1]).said("embed").startswith("[embed] reusing ")
    manifest = json.loads(open(os.path.join(target, "_manifest.json")).read())
    assert manifest["identity"]["model"] == {"name": "someone/tiny-clip", "revision": shas[1]}


def test_an_input_rebuilt_at_the_same_path_redoes(table, tmp_path):
    mirror, _ = table
    train, target, model = str(tmp_path / "train"), str(tmp_path / "emb"), make_tiny_clip(str(tmp_path / "m"))
    build(BuildConfig(mirror, train, datasets=("cifar10",), executor="local"), log=lambda _: None)
    run(train, target, model)
    build(BuildConfig(mirror, train, datasets=("dtd",), executor="local", overwrite=True), log=lambda _: None)
    log = run(train, target, model)
    assert log.said("embed").startswith(f"[embed] redoing {target}: made from other inputs or settings: "
                                        'input "sha256:')  # the build's shards, by their checksums
    assert {k.split("/")[0] for k in vectors(target)} == {"dtd"}


def test_eval_splits_are_rebuilt_when_the_mirror_changes(tmp_path):
    mirror, out = str(tmp_path / "mirror"), str(tmp_path / "out")
    make_mirror(mirror, rows=2, datasets=["dtd"], eval_rows=3)
    log = Log()
    target = build_eval_splits(mirror, out, log, ["dtd"])
    assert log.said("build") == ""
    log = Log()
    assert build_eval_splits(mirror, out, log, ["dtd"]) == target
    assert log.said("build").startswith(f"[build] reusing {target}: made from the same ")
    make_mirror(mirror, rows=2, datasets=["dtd"], eval_rows=5)  # the same path, other files
    log = Log()
    build_eval_splits(mirror, out, log, ["dtd"])
    assert log.said("build").startswith(f"[build] redoing {target}: made from other inputs or settings: "
                                        "inputs.dtd ")
    manifest = json.loads(open(os.path.join(target, "_manifest.json")).read())
    assert manifest["counts"]["total"] == 5
