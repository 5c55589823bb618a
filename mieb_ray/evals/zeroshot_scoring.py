"""Zero-shot scoring rules as pure functions (torch and sklearn for the arithmetic; no Ray).

ClassArgmax is the top-k engine's reducer for zero-shot classification: the class prompts of every task are
the corpus (one partition; a task's prompts are consecutive rows), a block of image embeddings is the query
block. For each image it computes mteb's score matrix row against its own task's prompts, once for mteb's
prompts and once for the fixed ones, and keeps the argmax (mteb's prediction), the top 3 and the score of
class 1 (what mteb's average precision ranks by in a binary task). Scores are computed with mteb's own
torch operations in mteb's orientation (images @ prompts.T), so they are the numbers mteb computes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mieb_ray.evals.metrics import classification
from mieb_ray.evals.zeroshot_tasks import SOFTMAX

TOP = 3  # predicted classes kept per image (the report's gallery)
CHUNK_ROWS = 4096  # images scored at once: bounds the (rows, classes) score matrix
# torch's CPU matmul takes another kernel (another summation order) for fewer than 16 rows; mteb scores a
# whole split at once, so a short block is padded with zero rows to score its rows as mteb does
MIN_ROWS = 16


def scores(images: np.ndarray, prompts: np.ndarray, scorer: str) -> np.ndarray:
    """mteb's (n, C) scores of L2-normalised images against L2-normalised prompts: softmax(100 x cosine)
    (`mteb.similarity_functions.similarity`) or the cosine (`cos_sim`)."""
    import torch

    n = len(images)
    a = torch.from_numpy(np.ascontiguousarray(images, np.float32))
    if n < MIN_ROWS:
        a = torch.cat([a, a.new_zeros((MIN_ROWS - n, a.shape[1]))])
    t = torch.from_numpy(np.ascontiguousarray(prompts, np.float32))
    if scorer == SOFTMAX:
        out = (torch.matmul(a, t.T) * 100).softmax(dim=-1)
    else:
        out = a @ t.transpose(0, 1)
    return out[:n].numpy()


def predictions(s: np.ndarray, top: int = TOP) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per row of (n, C) scores: the argmax (the first on ties, as torch's), the `top` best classes and their
    scores (best first; which of several tied classes make the cut is unspecified), and the score of class 1
    (NaN with one class)."""
    pred = s.argmax(1)
    k = min(top, s.shape[1])
    best_k = np.argpartition(-s, k - 1, axis=1)[:, :k] if k < s.shape[1] else np.tile(np.arange(k), (len(s), 1))
    values = np.take_along_axis(s, best_k, 1)
    order = np.lexsort((best_k, -values), axis=1)
    best_k, values = np.take_along_axis(best_k, order, 1), np.take_along_axis(values, order, 1)
    pos = s[:, 1] if s.shape[1] > 1 else np.full(len(s), np.nan, np.float32)
    return pred, best_k, values, pos.astype(np.float32)


@dataclass(frozen=True)
class TaskPrompts:
    """Where a task's prompts are in the prompt corpus: rows [mteb_lo, mteb_hi) and [fixed_lo, fixed_hi)."""

    mteb: tuple[int, int]
    fixed: tuple[int, int]
    scorer: str


PROMPT_SETS = ("mteb", "fixed")


@dataclass(frozen=True)
class ClassArgmax:
    """Reducer: per image of a block, its task's prediction under each prompt set.

    score() returns {"<set>_pred", "<set>_top" and "<set>_topv" (rows, TOP: classes and scores), "<set>_pos"
    for set in PROMPT_SETS}, rows in block order. data: the block's task index per row."""

    tasks: tuple[TaskPrompts, ...]

    def score(self, part, queries: np.ndarray, data: np.ndarray) -> dict[str, np.ndarray]:
        # one partition holding every prompt, each its own group, sorted by group = prompt row
        prompts = part.vectors
        q, out = len(queries), {}
        for name in PROMPT_SETS:
            out |= {f"{name}_pred": np.zeros(q, np.int32), f"{name}_pos": np.zeros(q, np.float32),
                    f"{name}_top": np.full((q, TOP), -1, np.int32),
                    f"{name}_topv": np.full((q, TOP), np.nan, np.float32)}
        for t in np.unique(data):
            rows = np.flatnonzero(data == t)
            task = self.tasks[t]
            for name in PROMPT_SETS:
                lo, hi = getattr(task, name)
                for a in range(0, len(rows), CHUNK_ROWS):
                    chunk = rows[a:a + CHUNK_ROWS]
                    pred, top, topv, pos = predictions(scores(queries[chunk], prompts[lo:hi], task.scorer))
                    out[f"{name}_pred"][chunk], out[f"{name}_pos"][chunk] = pred, pos
                    out[f"{name}_top"][chunk, :top.shape[1]] = top
                    out[f"{name}_topv"][chunk, :top.shape[1]] = topv
        return out

    @staticmethod
    def merge(parts: list) -> dict:
        raise ValueError("zero-shot prompts are laid out in one partition: nothing to merge")


def metrics(labels: np.ndarray, pred: np.ndarray, pos: np.ndarray) -> dict:
    """mteb 2.26.24's ZeroShotClassification metrics (`_calculate_scores`): ap from the score of class 1."""
    return classification([int(x) for x in labels], np.asarray(pred, np.int64), pos)
