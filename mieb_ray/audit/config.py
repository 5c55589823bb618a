"""An audit's settings, as the flags give them, and the checks they must pass before anything is read."""

from __future__ import annotations

from dataclasses import dataclass

from mieb_ray.errors import UserError

MIEB = "mieb"  # --against mieb: the MIEB eval splits of the sources
SELF = "self"  # --against self: the train table's rows that are copies of each other (audit/duplicates.py)
DEFAULT_THRESHOLD = 0.95


@dataclass(frozen=True)
class AuditConfig:
    train: str
    against: tuple[str, ...]  # table URIs, or (MIEB,)
    out: str
    sources: str = "hf"  # where --against mieb reads the eval splits: the hub or a mirror root
    model: str | None = None
    revision: str | None = None
    train_embeddings: str | None = None
    against_embeddings: str | None = None
    threshold: float = DEFAULT_THRESHOLD
    allow_mixed_models: bool = False  # with --train-embeddings: compare embeddings of different models
    resume: bool = False
    overwrite: bool = False
    workers: int | None = None
    gpus_per_worker: float | None = None
    cpus_per_worker: float | None = None  # the embed job's encoders (None: their pool decides)
    executor: str = "auto"  # ray, local (in this process), auto (runtime/placement.py)

    def check(self) -> None:
        if not self.against:
            raise UserError("--against needs at least one table URI, or 'mieb'")
        for special in (MIEB, SELF):
            if special in self.against and len(self.against) > 1:
                raise UserError(f"--against {special} cannot be combined with other tables")
        if self.alone and self.near:
            raise UserError("--against self runs the hash detectors (exact, pixels, pdq); near needs an eval side")
        if self.model and (self.train_embeddings or self.against_embeddings):
            raise UserError("give --model or --train-embeddings/--against-embeddings, not both")
        if bool(self.train_embeddings) != bool(self.against_embeddings):
            raise UserError("--train-embeddings and --against-embeddings go together")
        if not -1.0 <= self.threshold <= 1.0:
            raise UserError(f"--threshold {self.threshold} is not a cosine in [-1, 1]")

    @property
    def near(self) -> bool:
        """The near detector runs: a model, or precomputed embeddings."""
        return bool(self.model or self.train_embeddings)

    @property
    def alone(self) -> bool:
        """--against self: the train table's copies of each other, no eval side."""
        return self.against == (SELF,)
