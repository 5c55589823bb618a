"""mteb 2.26.24's metrics of the tasks that classify, cluster or retrieve: the same sklearn and scipy calls, the
same doubles. Pure: no Ray."""

from __future__ import annotations

import math
import warnings

import numpy as np


def classification(labels: list, pred, ap_scores) -> dict:
    """`_calculate_scores` of mteb's classification tasks (zero-shot and linear probe): accuracy, macro and weighted
    f1, precision and recall; for a binary task (two labels in `labels`) average precision of `ap_scores` (the
    zero-shot's score of class 1, the linear probe's predictions)."""
    from sklearn import metrics as m
    from sklearn.exceptions import UndefinedMetricWarning

    with warnings.catch_warnings():  # a class never predicted: sklearn warns, mteb's numbers stand
        warnings.simplefilter("ignore", UndefinedMetricWarning)
        out = {"accuracy": m.accuracy_score(labels, pred),
               "f1": m.f1_score(labels, pred, average="macro"),
               "f1_weighted": m.f1_score(labels, pred, average="weighted"),
               "precision": m.precision_score(labels, pred, average="macro"),
               "precision_weighted": m.precision_score(labels, pred, average="weighted"),
               "recall": m.recall_score(labels, pred, average="macro"),
               "recall_weighted": m.recall_score(labels, pred, average="weighted"),
               "ap": None, "ap_weighted": None}
        if len(np.unique(labels)) == 2:
            out["ap"] = m.average_precision_score(labels, ap_scores, average="macro")
            out["ap_weighted"] = m.average_precision_score(labels, ap_scores, average="weighted")
    return {k: (None if v is None else float(v)) for k, v in out.items()}


def clustering(labels: list, clusters) -> dict:
    """AbsTaskClusteringLegacy._compute_metrics: V-measure, NMI, ARI and cluster accuracy (clusters matched
    one-to-one to labels by linear_sum_assignment)."""
    from scipy.optimize import linear_sum_assignment
    from sklearn import metrics as m

    matrix = m.confusion_matrix(labels, clusters)
    rows, cols = linear_sum_assignment(matrix, maximize=True)
    return {"v_measure": float(m.cluster.v_measure_score(labels, clusters)),
            "nmi": float(m.cluster.normalized_mutual_info_score(labels, clusters)),
            "ari": float(m.cluster.adjusted_rand_score(labels, clusters)),
            "cluster_accuracy": float(matrix[rows, cols].sum() / len(labels))}


K_VALUES = (1, 3, 5, 10, 20, 100, 1000)  # AbsTaskRetrieval.k_values; the search keeps the top max(K_VALUES)
_ABSTENTION = np.linspace(0, 1, 11)[:-1]


def retrieval(ranks, confidence: dict[str, np.ndarray], k_values=K_VALUES) -> dict:
    """mteb's retrieval scores (`calculate_retrieval_scores` then `make_score_dict`) for queries that each have
    exactly one relevant document (relevance 1), from its rank (1-based, by score then doc id descending, as
    pytrec_eval and mteb break ties) among the documents the search returned (a rank over max(k_values): not
    returned). With one relevant document every trec_eval measure is a function of that rank: ndcg_cut@k =
    1/log2(r+1), map_cut@k = MRR@k = 1/r, recall@k = success@k = 1 and P@k = 1/k when r <= k, else 0 (the same
    doubles pytrec_eval computes; tests/unit/evals/test_retrieval.py checks every rank to 1,001 against it).
    confidence: per query the max, std and diff1 of its returned scores (mteb's `confidence_scores`), in query
    order: the nAUC of each per-query metric."""
    ranks = [int(r) for r in ranks]
    measures = {"NDCG": lambda r, k: 1 / math.log2(r + 1), "MAP": lambda r, k: 1 / r, "Recall": lambda r, k: 1.0,
                "P": lambda r, k: 1 / k}
    per_query = {f"{name}@{k}": [f(r, k) if r <= k else 0.0 for r in ranks]
                 for name, f in measures.items() for k in k_values}
    mrr = {f"MRR@{k}": per_query[f"MAP@{k}"] for k in k_values}
    n = len(ranks)
    mean = {name: round(sum(v) / n, 5) for name, v in per_query.items()}  # parse_metrics_from_scores
    out = {}
    for prefix, name in (("ndcg", "NDCG"), ("map", "MAP"), ("recall", "Recall")):
        out |= {f"{prefix}_at_{k}": mean[f"{name}@{k}"] for k in k_values}
    out["accuracy"] = mean["Recall@1"]
    out |= {f"precision_at_{k}": mean[f"P@{k}"] for k in k_values}
    out |= {f"mrr_at_{k}": sum(mrr[f"MRR@{k}"]) / n for k in k_values}
    for metric_scores in (per_query, mrr):  # evaluate_abstention: every metric x every confidence function
        for name, values in metric_scores.items():
            for fct in ("max", "std", "diff1"):
                key = f"nAUC_{name}_{fct}".replace("@", "_at_").replace("_P", "_precision").lower()
                out[key] = _nauc(np.asarray(confidence[fct], np.float64), np.array(values))
    out |= {f"hit_rate_at_{k}": mean[f"Recall@{k}"] for k in k_values}  # success@k: recall@k for one document
    return out


def confidence(top_scores: np.ndarray) -> dict[str, float]:
    """mteb's `confidence_scores` of one query's returned scores."""
    if not len(top_scores):
        return {"max": 0.0, "std": 0.0, "diff1": 0.0}
    s = np.sort(np.asarray(top_scores, np.float64))[::-1]
    return {"max": float(s[0]), "std": float(np.std(s)), "diff1": float(s[0] - s[1]) if len(s) > 1 else 0.0}


def _nauc(conf: np.ndarray, metric: np.ndarray) -> float:
    """mteb's `nauc`: the abstention curve's area between the flat and the oracle curves' (ties in confidence
    averaged, as mteb does)."""
    from sklearn.metrics import auc

    def curve(c: np.ndarray, m: np.ndarray) -> np.ndarray:
        if c.size == 0:
            return np.full(len(_ABSTENTION), np.nan)
        order = np.argsort(c, stable=True)
        c, m = c[order], m[order]
        start = np.flatnonzero(np.r_[True, c[1:] != c[:-1]])
        size = np.diff(np.r_[start, len(c)])
        m = np.repeat(np.add.reduceat(m, start) / size, size)
        return np.array([m[min(round(rate * len(c)), len(c) - 1):].mean() for rate in _ABSTENTION])

    raw, oracle = curve(conf, metric), curve(metric, metric)
    flat = oracle[0] * (_ABSTENTION[-1] - _ABSTENTION[0])
    area = auc(_ABSTENTION, oracle)
    return float("nan") if area == flat else float((auc(_ABSTENTION, raw) - flat) / (area - flat))
