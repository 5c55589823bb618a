"""`eval --exclude` for the tasks mteb scores (evals/mteb_suite.py): a task cleaned of every row that holds an image
the audit flagged, by mteb's own data-cleaning machinery (`mteb.data_cleaning`: the row filter behind its
`remove_duplicates` and `remove_train_leakage`, which knows each task type's content columns, and keeps a retrieval
split's judgements and top-ranked lists valid as it drops documents and queries, and drops a query left without a
positive, as mteb's evaluation does).

An image is named as the collect pass keys it (mteb_keys.py): `sha256:` of its stored bytes, or, for a
picture a task makes in memory (Compositionality's), `pixels:` and mteb's own content hash of the decoded image.
A row goes when any of its images is flagged: a query with its text, an STS pair, a compositionality example.
"""

from __future__ import annotations

import copy
import logging
from typing import NamedTuple

from mieb_ray.evals.mteb_keys import PIXELS, SHA, image_key, pixels_key, stored_bytes

FILTER = "mieb_ray_exclude"


def image_keys(value, pixels: bool) -> list[str]:
    """The keys of an undecoded Image value ({bytes, path}) or a list of them; with `pixels`, each image's
    `pixels:` key too (decoded as `datasets` decodes it)."""
    if isinstance(value, list):
        return [k for v in value for k in image_keys(v, pixels)]
    if not isinstance(value, dict) or not ({"bytes", "path"} & set(value)):
        return []  # a text, a label
    data = stored_bytes(value)
    if data is None:
        return []
    keys = [image_key(data)]
    if pixels:
        import datasets

        keys.append(pixels_key(datasets.Image().decode_example({"bytes": data, "path": None})))
    return keys


class Cleaned(NamedTuple):
    task: object  # the loaded task without its rows that hold a flagged image
    found: set[str]  # the flagged keys it held
    images: int  # the images its rows hold (0: nothing an audit could flag)


def flagged_in(flags, name: str) -> frozenset[str]:
    """The flagged eval keys (io/contamination.Flags) that task `name` may hold: every `sha256:` key, and the
    `pixels:` keys of the pictures the audit read in that task. A `pixels:` key is made only where mteb's task
    makes its pictures in memory (Compositionality's), and looking for one means decoding each of a task's images:
    a task that holds none is not decoded for another task's."""
    return frozenset(k for k in flags.eval if not k.startswith(PIXELS) or name in flags.eval_tasks.get(k, ()))


def cleaned(task, flagged: frozenset[str]) -> Cleaned:
    """The task cleaned (an aggregate: each of its sub-tasks). Its name and metadata stay its own: its clean
    scores sit beside its scores."""
    from mteb.abstasks.aggregated_task import AbsTaskAggregate

    if isinstance(task, AbsTaskAggregate):
        parts = [cleaned(sub, flagged) for sub in task.metadata.tasks]
        clean = copy.copy(task)
        clean.metadata = task.metadata.model_copy(update={"tasks": [p.task for p in parts]})
        return Cleaned(clean, set().union(*(p.found for p in parts)), sum(p.images for p in parts))
    return _rows_kept(task, flagged)


def _rows_kept(task, flagged: frozenset[str]) -> Cleaned:
    from mteb.abstasks.retrieval import AbsTaskRetrieval
    from mteb.data_cleaning._filtering import _CleaningFilter, _filter_task_rows

    if isinstance(task, AbsTaskRetrieval):  # the older corpus/queries layout, converted as evaluation converts it
        task.convert_v1_dataset_format_to_v2(num_proc=None)
    pixels = any(k.startswith(PIXELS) for k in flagged)
    found: set[str] = set()
    images = 0

    def keep(rows) -> list[int]:
        nonlocal images
        kept = []
        for i, row in enumerate(rows):  # a row: its content columns; images undecoded (_decoding below)
            keys = [k for value in row for k in image_keys(value, pixels)]
            images += sum(k.startswith(SHA) for k in keys)
            hit = set(keys) & flagged
            found.update(hit)
            if not hit:
                kept.append(i)
        return kept

    task.dataset = _decoding(task.dataset, False)
    log = logging.getLogger("mteb.data_cleaning")  # its warning that the scores differ: what --exclude is for
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        clean = _filter_task_rows(task, _CleaningFilter(FILTER, keep, compares_rows=False))
    finally:
        log.setLevel(level)
        task.dataset = _decoding(task.dataset, True)
    clean.dataset = _decoding(clean.dataset, True)
    clean.metadata = task.metadata  # not "<name> (mieb_ray_exclude)": the scores are filed under the task
    return Cleaned(clean, found, images)


def _decoding(data, decode: bool):
    """`data` (a task's nested dicts of datasets) with every Image column's decoding set: off, the filter reads the
    stored bytes rather than decoding every image; on again, for the evaluation. The Arrow data is not touched."""
    import datasets

    if isinstance(data, datasets.Dataset):
        for name, feature in data.features.copy().items():  # a deep copy: its Image features may be changed
            images = [image for image in _images(feature) if image.decode != decode]
            for image in images:
                image.decode = decode
            if images:
                data = data.cast_column(name, feature)  # a cast of the table's schema, not a rewrite of its rows
        return data
    if isinstance(data, dict):  # DatasetDict, a retrieval split, {subset: ...}: changed in place, its type kept
        for key, value in data.items():
            data[key] = _decoding(value, decode)
    return data


def _images(feature) -> list:
    """The Image features in a column's feature (itself, or inside a list of images)."""
    import datasets

    if isinstance(feature, datasets.Image):
        return [feature]
    inner = getattr(feature, "feature", None)
    return _images(inner) if inner is not None else []
