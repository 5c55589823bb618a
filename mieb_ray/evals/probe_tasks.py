"""MIEB's linear-probe tasks (mteb 2.26.24's `ImageClassification`, `AbsTaskClassification`) over the catalog's
sources, and how mteb draws their training samples. Pure: no Ray, no I/O.

Each task trains sklearn's LogisticRegression(max_iter=100, random_state=42) on `samples_per_label` train rows
per label and scores it on the eval split, `experiments` times, and reports the mean of each metric and every
experiment's. Its repo, revision, splits and label column are the catalog source's
(tests/unit/evals/test_linear_probe.py checks each against mteb's task). Its train split is the source's, all of
it: rows mieb-train leaves out (Caltech101's background class) are sampled too, and Birdsnap's corrupted row 3854
is not (mteb's `dataset_transform`).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import numpy as np

from mieb_ray.evals.source_task import SourceTask

SEED = 42  # AbsTask.seed: the undersampling's RandomState and the classifier's random_state
MAX_ITER = 100  # AbsTaskClassification.evaluator_model = LogisticRegression(max_iter=100)


@dataclass(frozen=True)
class ProbeTask(SourceTask):
    samples_per_label: int = 16
    experiments: int = 5
    drop_train: tuple[int, ...] = ()  # train rows mteb's dataset_transform removes (source indices)

    def train_key(self, index: int | str) -> str:
        """How mieb-train (and `mieb-ray embed` of it) keys a train row."""
        return f"{self.slug}/{index}"


TASKS = (
    ProbeTask("Birdsnap", "birdsnap", drop_train=(3854,)),
    ProbeTask("CIFAR10", "cifar10"),
    ProbeTask("CIFAR100", "cifar100"),
    ProbeTask("Caltech101", "caltech101"),
    ProbeTask("Country211", "country211"),
    ProbeTask("DTD", "dtd"),
    ProbeTask("EuroSAT", "eurosat"),
    ProbeTask("FER2013", "fer2013"),
    ProbeTask("Food101Classification", "food101"),
    ProbeTask("GTSRB", "gtsrb"),
    ProbeTask("Imagenet1k", "imagenet1k"),
    ProbeTask("MNIST", "mnist"),
    ProbeTask("OxfordPets", "oxfordpets"),
    ProbeTask("PatchCamelyon", "patchcamelyon"),
    ProbeTask("RESISC45", "resisc45"),
    ProbeTask("STL10", "stl10", samples_per_label=8, experiments=10),
    ProbeTask("SUN397", "sun397"),
    ProbeTask("StanfordCars", "stanfordcars"),
    ProbeTask("UCF101", "ucf101"),
)
BY_NAME = {t.name: t for t in TASKS}


def select_tasks(names: list[str] | None) -> list[ProbeTask]:
    """The tasks named (the registry has checked the names), or all."""
    return [BY_NAME[n] for n in names] if names else list(TASKS)


def train_rows(task: ProbeTask, rows: int) -> np.ndarray:
    """The source indices of the train split mteb samples from, in its order (mteb's positions -> indices)."""
    keep = np.ones(rows, dtype=bool)
    keep[[i for i in task.drop_train if i < rows]] = False
    return np.flatnonzero(keep)


def samples(labels: list, per_label: int, experiments: int, seed: int = SEED) -> list[list[int]]:
    """Each experiment's training rows (positions in `labels`, in the order mteb feeds them to the classifier),
    as mteb's `_undersample_data` draws them: experiment i shuffles the previous experiment's order once more with
    a fresh RandomState(seed), then takes the first `per_label` rows of each label in that order."""
    order = list(range(len(labels)))
    drawn = []
    for _ in range(experiments):
        np.random.RandomState(seed).shuffle(order)
        taken, counts = [], defaultdict(int)
        for i in order:
            if counts[labels[i]] < per_label:
                taken.append(i)
                counts[labels[i]] += 1
        drawn.append(taken)
    return drawn
