"""mteb 2.26.24's metrics of the tasks that classify or cluster, the same sklearn and scipy calls. Pure: no Ray."""

from __future__ import annotations

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
