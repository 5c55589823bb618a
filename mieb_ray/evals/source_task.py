"""What every MIEB task over one catalog source knows: its mteb name, its source, its eval split, and how the
eval split's rows are keyed (what `build --split eval` writes)."""

from __future__ import annotations

from dataclasses import dataclass

from mieb_ray.sources import Source, by_slug


@dataclass(frozen=True)
class SourceTask:
    name: str  # mteb's task name
    slug: str  # the catalog source

    @property
    def source(self) -> Source:
        return by_slug(self.slug)

    @property
    def split(self) -> str:
        """The eval split."""
        return self.source.eval_split

    def key_prefix(self) -> str:
        """Image embeddings of the eval split's rows are keyed `<slug>/<split>/<index>`."""
        return f"{self.slug}/{self.split}/"
