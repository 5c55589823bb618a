"""What the tests and benchmarks know of the demo's mirror (mieb_ray/demo_data/mirror.py): the rows the build
keeps of a mirror, and the rows of a full-scale one."""

from __future__ import annotations

from mieb_ray.demo_data.mirror import label_order
from mieb_ray.sources import by_slug, select


def kept_rows(written: dict[str, int]) -> dict[str, int]:
    """Rows of each source that mieb-train keeps, given make_mirror's train rows written per slug: those whose
    label the build does not drop (the labels cycle as label_order says)."""
    out = {}
    for slug, n in written.items():
        source, order = by_slug(slug), label_order(slug)
        cycles, rest = divmod(n, len(order))
        dropped = cycles * sum(c in source.drop for c in order) + sum(c in source.drop for c in order[:rest])
        out[slug] = n - dropped
    return out


def hub_rows() -> dict[str, int]:
    """Train rows of the real hub splits: the catalog's rows plus the rows the build drops (caltech101's
    30 background_google rows). make_mirror(root, hub_rows()) is a full-scale mirror whose kept_rows()
    add up to TOTAL_ROWS."""
    return {s.slug: s.split_rows for s in select(None)}
