"""The catalog of the sources and their class-list data files."""

from __future__ import annotations

from importlib import resources

from mieb_ray.errors import UserError
from mieb_ray.sources.catalog import (
    EVAL_TOTAL_ROWS,
    HUB,
    PARQUET,
    SOURCES,
    TOTAL_ROWS,
    WEBDATASET,
    Source,
)

__all__ = ["EVAL_TOTAL_ROWS", "PARQUET", "SOURCES", "TOTAL_ROWS", "WEBDATASET", "Source", "by_slug", "select",
           "read_labels", "hub_labels", "expected_names", "UnknownDatasetError"]

_BY_SLUG = {s.slug: s for s in SOURCES}


class UnknownDatasetError(UserError, ValueError):
    pass


def by_slug(slug: str) -> Source:
    return select([slug])[0]


def select(names: str | list[str] | None) -> list[Source]:
    """Sources named in `names` (comma-separated or a list; None or "all" = every source), catalog order."""
    if names is None or names == "all":
        return list(SOURCES)
    wanted = [n.strip() for n in (names.split(",") if isinstance(names, str) else names) if n.strip()]
    unknown = [n for n in wanted if n not in _BY_SLUG]
    if unknown or not wanted:
        raise UnknownDatasetError(
            f"unknown dataset {', '.join(map(repr, unknown)) or '(none given)'}; valid: {', '.join(_BY_SLUG)}")
    return [s for s in SOURCES if s.slug in wanted]


def read_labels(filename: str) -> list[str]:
    """A class list shipped in sources/labels/, one name per line, index = label id.

    splitlines(), never readlines(): mteb reads its template files with readlines() and so puts a
    newline inside every ImageNet/Country211/GTSRB/PatchCamelyon caption.
    """
    return resources.files("mieb_ray.sources").joinpath("labels", filename).read_text("utf-8").splitlines()


def hub_labels(slug: str) -> list[str] | None:
    """The ClassLabel names the catalog expects a `hub`-named source to hold (labels/hub/<slug>.txt), else None.

    birdsnap.txt is OpenAI CLIP's list (data/prompts.md), the only copy we have: the hub's own list holds
    the same 500 birds in taxonomic order and with apostrophes and hyphens (0 "Cooper's Hawk").
    """
    path = resources.files("mieb_ray.sources").joinpath("labels", "hub", f"{slug}.txt")
    return path.read_text("utf-8").splitlines() if path.is_file() else None


def expected_names(source: Source) -> list[str]:
    """The class list the catalog expects of a source: its hub list for `hub` names, else its own labels file."""
    return (hub_labels(source.slug) or []) if source.names == HUB else read_labels(source.names)
