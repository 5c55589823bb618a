"""mteb 2.26.24's own BioVITAT2IReranking pipeline on precomputed embeddings: the reference the tests compare to.

The task's dataset is replaced by in-memory RetrievalSplitData built from our Subsets, and the model by an
encoder that looks the embeddings up (queries by text, corpus photos by id). Everything else is mteb's:
the rerank search (cosine, the top-1,000 cap), the document metrics, the taxon scores, main_score and the
task score (reference/biovita-scoring.md §7(d)).
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import warnings
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from mieb_ray.evals.biovita_data import SPLIT, TASK
from support.biovita import Subset

TAXON_KEYS = ("taxon_top_1_accuracy", "taxon_top_5_accuracy", "taxon_top_10_accuracy", "main_score")


@contextmanager
def quiet_env(tmp: str):
    """mteb's caches in `tmp`; its beta warning and progress bars silenced."""
    keys = ("MTEB_CACHE", "HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")
    old = {k: os.environ.get(k) for k in keys}
    os.environ.update({"MTEB_CACHE": os.path.join(tmp, "mteb"), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"})
    mteb_log = logging.getLogger("mteb")
    level = mteb_log.level
    mteb_log.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*is currently in beta.*")
            yield
    finally:
        mteb_log.setLevel(level)
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _precomputed(dim: int, modalities: tuple[str, ...] = ("text", "image")):
    """The base of the stand-in encoders: an mteb encoder of `dim`-d cosine embeddings; encode() is each one's."""
    from mteb.models.abs_encoder import AbsEncoder
    from mteb.models.model_meta import ModelMeta, ScoringFunction

    class Precomputed(AbsEncoder):
        def __init__(self):
            self.model = None
            self.mteb_model_meta = ModelMeta.create_empty({
                "name": "mieb-ray/precomputed", "revision": "0", "similarity_fn_name": ScoringFunction.COSINE,
                "modalities": list(modalities), "embed_dim": dim, "framework": ["PyTorch"]})

    return Precomputed


def _encoder(text_emb: dict[str, np.ndarray], image_emb: dict[str, np.ndarray]):
    class FakeEncoder(_precomputed(len(next(iter(image_emb.values()))))):
        """Returns the precomputed embeddings: a query batch carries `text`, a corpus batch `id` (+ image=None)."""

        def encode(self, inputs, *, task_metadata, hf_split, hf_subset, prompt_type=None, **kwargs):
            rows = []
            for batch in inputs:
                if "text" in batch:
                    rows += [text_emb[t] for t in batch["text"]]
                else:
                    rows += [image_emb[i] for i in batch["id"]]
            return np.stack(rows).astype(np.float32)

    return FakeEncoder()


def _split_data(subset: Subset):
    from datasets import Dataset, Features, List, Value
    from mteb.abstasks.retrieval_dataset_loaders import RetrievalSplitData

    string = Value("string")
    corpus = Dataset.from_dict(
        {"id": subset.corpus_ids, "image": [None] * len(subset.corpus_ids), "taxon": subset.corpus_taxa},
        features=Features({"id": string, "image": Value("null"), "taxon": string}))
    queries = Dataset.from_dict(
        {"id": subset.query_ids, "text": subset.query_texts, "correct_taxon": subset.correct_taxa,
         "candidate_taxa": subset.candidate_taxa},
        features=Features({"id": string, "text": string, "correct_taxon": string, "candidate_taxa": List(string)}))
    return RetrievalSplitData(corpus=corpus, queries=queries,
                              relevant_docs={q: dict(d) for q, d in subset.qrels.items()},
                              top_ranked=dict(zip(subset.query_ids, subset.top_ranked)))


def mteb_scores(subsets: dict[str, Subset], text_emb: dict[str, np.ndarray], image_emb: dict[str, np.ndarray],
                return_results: bool = False) -> dict:
    """{subset: {taxon_top_{1,5,10}_accuracy, main_score}, "task_score": TaskResult.get_score(),
    "task_result": the TaskResult JSON exactly as mteb's TaskResult.to_disk writes it}.

    return_results: also return the raw per-query rerank results ({subset: {qid: {doc: score}}}) as
    "results", from mteb's predictions file.
    """
    import mteb

    with tempfile.TemporaryDirectory() as tmp, quiet_env(tmp):
        task = mteb.get_task(TASK)
        task.dataset = {name: {SPLIT: _split_data(s)} for name, s in subsets.items()}
        task.hf_subsets = list(subsets)  # evaluate only the subsets given
        task.data_loaded = True
        predictions = os.path.join(tmp, "predictions") if return_results else None
        model_result = mteb.evaluate(_encoder(text_emb, image_emb), task, cache=None, show_progress_bar=False,
                                     prediction_folder=predictions)
        task_result = model_result.task_results[0]
        out = {name: {k: task_result.scores[SPLIT][i][k] for k in TAXON_KEYS}
               for i, name in enumerate(s["hf_subset"] for s in task_result.scores[SPLIT])}
        out["task_score"] = float(task_result.get_score())
        path = Path(tmp, f"{TASK}.json")
        task_result.to_disk(path)  # the JSON mteb writes: scores rounded to 6 decimals, date as a timestamp
        out["task_result"] = json.loads(path.read_text())
        if return_results:
            with open(os.path.join(predictions, f"{TASK}_predictions.json")) as f:
                saved = json.load(f)
            out["results"] = {name: saved[name][SPLIT] for name in subsets}
    return out


def _zeroshot_encoder(text_emb: dict[str, np.ndarray], images: np.ndarray):
    """Prompts by their text; the images of the split in order, one encode() call per pass over the split."""
    class FakeEncoder(_precomputed(images.shape[1])):

        def encode(self, inputs, *, task_metadata, hf_split, hf_subset, prompt_type=None, **kwargs):
            rows, seen = [], 0
            for batch in inputs:
                if "text" in batch:
                    rows += [text_emb[t] for t in batch["text"]]
                else:
                    n = len(next(iter(batch.values())))
                    rows += list(images[seen:seen + n])
                    seen += n
            return np.stack(rows).astype(np.float32)

    return FakeEncoder()


def load_like_mteb(repo: str, cache_dir: str):
    """Every split of a fixture repo as mteb loads a task's dataset: `datasets.load_dataset(path, revision=...)`,
    the hub's path replaced by the mirror's folder (its card, split patterns and file order are datasets' own)."""
    import datasets

    return datasets.load_dataset(repo, cache_dir=cache_dir)


def mteb_zeroshot(task_name: str, repo: str, split: str, text_emb: dict[str, np.ndarray],
                  images: np.ndarray, cache_dir: str | None = None) -> dict:
    """The TaskResult JSON mteb 2.26.24 writes for a zero-shot task whose eval split is read from a fixture repo
    in the hub layout (parquet or WebDataset), `images` = the split's image embeddings in row order.
    cache_dir: the `datasets` cache to load through (default: a fresh one per call)."""

    import mteb

    with tempfile.TemporaryDirectory() as tmp, quiet_env(tmp):
        data = load_like_mteb(repo, cache_dir or os.path.join(tmp, "hf"))
        task = mteb.get_task(task_name)
        task.dataset = data
        task.data_loaded = True
        task.dataset_transform()
        result = mteb.evaluate(_zeroshot_encoder(text_emb, images), task, cache=None, show_progress_bar=False)
        path = Path(tmp, f"{task_name}.json")
        result.task_results[0].to_disk(path)
        return json.loads(path.read_text())


def rank_bounds(subsets: dict[str, Subset], results: dict, atol: float) -> dict[tuple[str, str], tuple[int, int]]:
    """{(subset, query id): (best, worst) rank of the correct taxon} that scores within `atol` of mteb's own
    (`mteb_scores(..., return_results=True)["results"]`) allow: a candidate taxon whose best photo scores within
    `atol` of the correct taxon's may rank on either side of it. On random floats the last bit of a cosine
    depends on the BLAS kernel and the product's shape, so a tie between identical photos breaks either way,
    in mteb as in ours; on exact (lattice) vectors the two bounds are mteb's one rank."""
    out = {}
    for name, s in subsets.items():
        taxon = dict(zip(s.corpus_ids, s.corpus_taxa))
        for qid, cand, correct in zip(s.query_ids, s.candidate_taxa, s.correct_taxa):
            best: dict[str, float] = {}
            for doc, score in results[name][qid].items():
                best[taxon[doc]] = max(best.get(taxon[doc], -np.inf), score)
            m = np.array([best.get(t, -np.inf) for t in cand])
            c = cand.index(correct)
            others = np.arange(len(cand)) != c
            if m[c] == -np.inf:  # no photo of it scored: after every scored one, then in candidate order
                rank = 1 + int((m > -np.inf).sum()) + int((m[:c] == -np.inf).sum())
                out[name, qid] = (rank, rank)
            else:
                out[name, qid] = (1 + int((m > m[c] + atol).sum()), 1 + int((others & (m >= m[c] - atol)).sum()))
    return out


def _identity_png(split: int, index: int) -> bytes:
    """A 2x1 PNG whose pixels spell (split, index): how the probe's stand-in encoder knows the row it is given."""
    import io

    from PIL import Image

    pixels = np.array([[[split, (index >> 16) & 255, (index >> 8) & 255], [index & 255, 0, 0]]], np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels, "RGB").save(out, "PNG")
    return out.getvalue()


def _probe_encoder(vectors: dict[tuple[int, int], np.ndarray]):
    """Each image's vector by the (split, index) its pixels spell (0: train, 1: eval)."""
    class FakeEncoder(_precomputed(len(next(iter(vectors.values()))), ("image",))):

        def encode(self, inputs, *, task_metadata, hf_split, hf_subset, prompt_type=None, **kwargs):
            rows = []
            for batch in inputs:
                for image in batch["image"]:
                    p = np.array(image.convert("RGB"))[0].astype(int)
                    rows.append(vectors[int(p[0, 0]), (p[0, 1] << 16) | (p[0, 2] << 8) | p[1, 0]])
            return np.stack(rows).astype(np.float32)

    return FakeEncoder()


def mteb_probe(task_name: str, repo: str, eval_split: str, train: dict[int, np.ndarray],
               evaluated: dict[int, np.ndarray], drop: dict[str, set[int]] | None = None) -> dict:
    """The TaskResult JSON mteb 2.26.24 writes for a linear-probe task whose train and eval splits are read from a
    fixture repo in the hub layout (their labels as `datasets` loads them), each image replaced by one that spells
    its split and row: the stand-in encoder gives it the vector `train[row]` or `evaluated[row]`. drop: rows left
    out of a split ({"train" | "eval": row indices}) before mteb sees it (the task's own transform runs after)."""
    return _mteb_on_rows(task_name, repo, {0: "train", 1: eval_split}, train, evaluated, drop)


def mteb_clustering(task_name: str, repo: str, eval_split: str, evaluated: dict[int, np.ndarray],
                    drop: dict[str, set[int]] | None = None) -> dict:
    """As mteb_probe, for a clustering task: its eval split only."""
    return _mteb_on_rows(task_name, repo, {1: eval_split}, {}, evaluated, drop)


def _mteb_on_rows(task_name: str, repo: str, splits: dict[int, str], train: dict[int, np.ndarray],
                  evaluated: dict[int, np.ndarray], drop: dict[str, set[int]] | None = None) -> dict:

    import datasets
    import mteb

    with tempfile.TemporaryDirectory() as tmp, quiet_env(tmp):
        task = mteb.get_task(task_name)
        loaded, every = {}, load_like_mteb(repo, os.path.join(tmp, "hf"))
        for code, split in splits.items():
            data = every[split]
            column = task.input_column_name
            pngs = [{"bytes": _identity_png(code, i), "path": None} for i in range(len(data))]
            data = data.remove_columns([column]).add_column(column, pngs).cast_column(column, datasets.Image())
            gone = (drop or {}).get("train" if code == 0 else "eval", set())
            loaded[split] = data.select([i for i in range(len(data)) if i not in gone]) if gone else data
        task.dataset = datasets.DatasetDict(loaded)
        task.data_loaded = True
        task.dataset_transform()
        vectors = {(0, i): v for i, v in train.items()} | {(1, i): v for i, v in evaluated.items()}
        result = mteb.evaluate(_probe_encoder(vectors), task, cache=None, show_progress_bar=False)
        path = Path(tmp, f"{task_name}.json")
        result.task_results[0].to_disk(path)
        return json.loads(path.read_text())


def mteb_retrieval(task_name: str, repo: str, images: np.ndarray, text_emb: dict[str, np.ndarray]) -> dict:
    """The TaskResult JSON mteb 2.26.24 writes for a SciMMIR retrieval task whose data are read from a fixture
    repo in the hub layout by the task's own `_load_data`; `images` = the test split's image embeddings in row
    order, `text_emb` the captions' by text as mteb passes them (stripped as documents, as they are as queries)."""
    import mteb
    from mteb.tasks.retrieval.eng.sci_mmir_i2t_retrieval import _load_data
    from mteb.types import PromptType

    class Encoder(_precomputed(images.shape[1])):  # queries and corpus each encoded in one call, in row order

        def encode(self, inputs, *, task_metadata, hf_split, hf_subset, prompt_type=None, **kwargs):
            query_side = "image" if task_metadata.category == "i2t" else "text"
            side = query_side if prompt_type == PromptType.query else ({"image", "text"} - {query_side}).pop()
            rows = []
            for batch in inputs:
                if side == "text":
                    rows += [text_emb[t] for t in batch["text"]]
                else:
                    rows += list(images[len(rows):len(rows) + len(batch["image"])])
            return np.stack(rows).astype(np.float32)

    with tempfile.TemporaryDirectory() as tmp, quiet_env(tmp):
        task = mteb.get_task(task_name)
        task.corpus, task.queries, task.relevant_docs = _load_data(repo, task.metadata.eval_splits)
        task.data_loaded = True
        result = mteb.evaluate(Encoder(), task, cache=None, show_progress_bar=False)
        path = Path(tmp, f"{task_name}.json")
        result.task_results[0].to_disk(path)
        return json.loads(path.read_text())
