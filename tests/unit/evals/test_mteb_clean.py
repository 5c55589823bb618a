"""`eval --exclude` on the tasks mteb scores (mieb_ray/evals/mteb_clean.py): each task's clean scores equal
`mteb.evaluate` with mteb's CLIP wrapper on a mirror written without the rows that hold a flagged image (and, for
retrieval, without the judgements of the documents and queries that left), one task of each type and layout: a
classification with train and test splits, STS pairs, clustering, self-retrieval (v1 layout), fused image+text
queries, a ViDoRe BEIR repo with integer ids, Compositionality (pictures keyed by their pixels) and a
VisionCentricQA task whose queries rank only their own candidates, and an aggregate (VisualSTS17Eng: its sub-task
cleaned)."""

from __future__ import annotations

import glob
import hashlib
import io
import os
import shutil

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
import yaml
from PIL import Image
from support.contamination import audit_output
from support.hub_tasks import compositionality, retrieval, sts, tasks_misc
from support.mteb_tasks import assert_same_scores, mteb_result, noise_decided, ours

pytestmark = pytest.mark.timeout(600)

WRITERS = {**tasks_misc.TASKS, **sts.TASKS, **compositionality.TASKS, **retrieval.TASKS}
TASKS = ["FGVCAircraft", "STS12VisualSTS", "ImageNetDog15Clustering", "CUB200I2IRetrieval", "CIRRIT2IRetrieval",
         "VidoreArxivQARetrieval", "Winoground", "CVBenchCount", "VisualSTS17Eng"]
PIXELS = {"Winoground"}  # its pictures are made in memory by mteb's task: keyed by their decoded pixels
QRELS = ("query-id", "corpus-id")


def _image_columns(table: pa.Table) -> list[str]:
    """The columns holding images: an HF Image struct {bytes, path}, or a list of them."""
    def is_image(t) -> bool:
        return pa.types.is_struct(t) and {f.name for f in t} >= {"bytes", "path"}
    return [f.name for f in table.schema
            if is_image(f.type) or (pa.types.is_list(f.type) and is_image(f.type.value_type))]


def _keys(value, pixels: bool) -> list[str]:
    """What mieb-ray names a stored image (independently of its code): sha256 of its bytes, or mteb's content
    hash of the decoded picture for a task that makes its pictures in memory."""
    if isinstance(value, list):
        return [k for v in value for k in _keys(v, pixels)]
    if value is None or value["bytes"] is None:
        return []
    if pixels:
        from mteb._content_hashes import hash_image

        return ["pixels:" + hash_image(Image.open(io.BytesIO(value["bytes"])))]
    return ["sha256:" + hashlib.sha256(value["bytes"]).hexdigest()]


def _row_keys(table: pa.Table, pixels: bool) -> list[list[str]]:
    columns = _image_columns(table)
    return [[k for c in columns for k in _keys(row[c], pixels)] for row in table.select(columns).to_pylist()] \
        if columns else [[] for _ in range(table.num_rows)]


def _flag(repo: str, pixels: bool, every: int = 3) -> set[str]:
    """Every `every`th image key of the repo's files, in sorted order: some queries, documents, train and test rows."""
    keys = sorted({k for path in glob.glob(os.path.join(repo, "**/*.parquet"), recursive=True)
                   for row in _row_keys(pq.read_table(path), pixels) for k in row})
    return set(keys[::every])


def _without(repo: str, target: str, flagged: set[str], pixels: bool) -> int:
    """A copy of the repo without the rows that hold a flagged image, and without the qrels rows of a query or
    document that left (qrels files: those with query-id and corpus-id); the rows removed."""
    shutil.copytree(repo, target)
    removed, gone = 0, {"query": set(), "corpus": set()}
    files = sorted(glob.glob(os.path.join(target, "**/*.parquet"), recursive=True))
    for path in files:
        table = pq.read_table(path)
        if set(QRELS) <= set(table.column_names):
            continue
        drop = [any(k in flagged for k in row) for row in _row_keys(table, pixels)]
        for column in ("id", "query-id", "corpus-id", "_id"):
            if column in table.column_names:
                side = "query" if "quer" in os.path.relpath(path, target) else "corpus"
                gone[side].update(str(v) for v, d in zip(table[column].to_pylist(), drop) if d)
                break
        removed += sum(drop)
        pq.write_table(table.filter(pa.array([not d for d in drop])), path)
    for path in files:
        table = pq.read_table(path)
        if set(QRELS) <= set(table.column_names):
            leaving = [str(q) in gone["query"] or str(c) in gone["corpus"]
                       for q, c in zip(table["query-id"].to_pylist(), table["corpus-id"].to_pylist())]
            pq.write_table(table.filter(pc.invert(pa.array(leaving))), path)
    card = os.path.join(target, "README.md")
    if os.path.exists(card):  # its split sizes are the full repo's: a card without them, as many hub repos have
        _, front, rest = open(card, encoding="utf-8").read().split("---\n", 2)
        meta = {k: v for k, v in yaml.safe_load(front).items() if k != "dataset_info"}
        with open(card, "w", encoding="utf-8") as f:
            f.write(f"---\n{yaml.safe_dump(meta)}---\n{rest}")
    return removed


@pytest.fixture(scope="module")
def mirror(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("mirror"))
    for name in TASKS:
        WRITERS[name](root)
    return root


def test_clean_scores_are_mtebs_on_a_mirror_without_the_flagged_rows(mirror, tiny_clip, tmp_path, monkeypatch):
    import datasets

    from mieb_ray.evals.mteb_suite import load_task

    def repo(name: str) -> str:  # an aggregate's data: its one sub-task's repo
        task = load_task(name, "hf")
        task = (getattr(task.metadata, "tasks", None) or [task])[0]
        return os.path.join(mirror, task.metadata.dataset["path"])

    repos = {name: repo(name) for name in TASKS}
    # rendered-sts17 holds every language's pairs: every 8th leaves its en-en subset enough pairs to correlate
    flagged = {name: _flag(repos[name], name in PIXELS, 8 if name == "VisualSTS17Eng" else 3) for name in TASKS}
    holders = {}  # each flagged image's eval_task, as the audit writes it: the tasks holding it
    for name, keys in flagged.items():
        for key in keys:
            holders[key] = "/".join(sorted({*holders.get(key, "").split("/"), name} - {""}))
    audit = audit_output(tmp_path / "audit", [(f"train/{i}", key, "pdq") for i, key in enumerate(sorted(holders))],
                         tasks=holders)
    results = ours(TASKS, mirror, tiny_clip, str(tmp_path / "out"), exclude=audit)
    for name in TASKS:
        reduced = str(tmp_path / "reduced" / name)
        removed = _without(repos[name], os.path.join(reduced, os.path.relpath(repos[name], mirror)), flagged[name],
                           name in PIXELS)
        clean = results[name]["mieb_ray"]["clean"]
        assert removed and clean["left_out"]["eval"]["any"] == clean["left_out"]["eval"]["pdq"] > 0, name
        # a cache of its own: `datasets` would take the reduced repo, laid out as the full one, for the one it cached
        monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "cache" / name))
        theirs = mteb_result(name, reduced, tiny_clip)
        assert_same_scores({**results[name], "scores": clean["scores"]}, theirs,
                           skip=lambda key: noise_decided(name, key))
        assert clean["main_score"] == pytest.approx(sum(e["main_score"] for split in theirs["scores"].values()
                                                        for e in split) / sum(map(len, theirs["scores"].values())))
        assert clean["scores"] != results[name]["scores"], name  # the rows left, and the scores moved


def test_a_task_too_small_to_score_clean_says_so_beside_its_scores(mirror, tiny_clip, tmp_path):
    """Every pair of STS12VisualSTS's test split but one flagged: mteb cannot correlate one pair, so the clean
    score is an error line naming the task, and the task's own scores stand."""
    import mteb

    from mieb_ray.evals.mteb_suite import load_task

    repo = os.path.join(mirror, load_task("STS12VisualSTS", "hf").metadata.dataset["path"])
    test = pq.read_table(glob.glob(os.path.join(repo, "data/test-*.parquet"))[0])
    keys = [k for row in _row_keys(test, False)[1:] for k in row]
    audit = audit_output(tmp_path / "audit", [(f"train/{i}", k, "exact") for i, k in enumerate(keys)])
    result = ours(["STS12VisualSTS"], mirror, tiny_clip, str(tmp_path / "out"), exclude=audit)["STS12VisualSTS"]
    clean = result["mieb_ray"]["clean"]
    assert clean["error"].startswith("mteb cannot score STS12VisualSTS without the flagged rows: ValueError: ")
    assert "\n" not in clean["error"] and "scores" not in clean and clean["left_out"]["eval"]["exact"] == len(set(keys))
    assert mteb.TaskResult.from_dict(result).get_score() == result["scores"]["test"][0]["main_score"]


def test_an_audit_that_never_read_a_task_gives_it_no_clean_score(mirror, tiny_clip, tmp_path):
    """An audit whose summary names the tasks it read, STS12VisualSTS not among them (an audit against other tables,
    or from before it covered the mteb tasks): the task gets an error line, not a clean score equal to its own."""
    audit = audit_output(tmp_path / "audit", [("train/0", "sha256:" + "0" * 64, "exact")], audited=["CIFAR10"])
    clean = ours(["STS12VisualSTS"], mirror, tiny_clip, str(tmp_path / "out"), exclude=audit)["STS12VisualSTS"][
        "mieb_ray"]["clean"]
    assert clean["error"] == (f"the audit at {audit} read none of STS12VisualSTS's images (an audit against other "
                              "tables, or from before it covered this task): audit --against mieb again")
    assert "scores" not in clean and "main_score" not in clean


def test_a_task_is_decoded_for_pixel_keys_only_where_the_audit_found_them():
    """A `pixels:` key (a picture mteb's task makes in memory) is looked for only in the tasks the audit read it in:
    looking means decoding each of a task's images. Every `sha256:` key is looked for everywhere."""
    from mieb_ray.evals.mteb_clean import flagged_in
    from mieb_ray.io.contamination import Flags

    flags = Flags(eval={"sha256:a": frozenset({"exact"}), "pixels:b": frozenset({"pixels"}),
                        "pixels:c": frozenset({"pdq"})}, train={},
                  eval_tasks={"sha256:a": frozenset({"STS12VisualSTS"}), "pixels:b": frozenset({"Winoground"}),
                              "pixels:c": frozenset({"Winoground", "ImageCoDeT2IMultiChoice"})})
    assert flagged_in(flags, "Winoground") == {"sha256:a", "pixels:b", "pixels:c"}
    assert flagged_in(flags, "ImageCoDeT2IMultiChoice") == {"sha256:a", "pixels:c"}
    assert flagged_in(flags, "STS12VisualSTS") == flagged_in(flags, "CIRRIT2IRetrieval") == {"sha256:a"}
