"""An audit's settings, as the flags give them, and the checks they must pass before anything is read."""

from __future__ import annotations

from dataclasses import dataclass

from mieb_ray import flags, formats
from mieb_ray.errors import UserError
from mieb_ray.runtime.pools import cpus_option, gpus_option, workers_option

MIEB = "mieb"  # --against mieb: the MIEB eval splits of the sources
SELF = "self"  # --against self: the train table's rows that are copies of each other (audit/duplicates.py)
DEFAULT_THRESHOLD = 0.95


@dataclass(frozen=True)
class AuditConfig:
    train: str = flags.option(flag="--train", parse=flags.existing, required=True,
                              help="a mieb-train output, or any Parquet/WebDataset table with key and image (local or "
                                   "s3://)")
    against: tuple[str, ...] = flags.option(  # table URIs, or (MIEB,) or (SELF,)
        flag="--against", parse=flags.tables, required=True,
        help=f"'{MIEB}' for the MIEB eval splits of the sources (read from --sources), '{SELF}' for the groups of "
             f"--train's rows that are copies of each other ({formats.DUPLICATES}), or comma-separated tables with "
             "key and image; a table's eval task is the last component of its path")
    out: str = flags.option(flag="--out", parse=flags.output, required=True,
                            help="output folder: " + ", ".join((formats.PAIRS, formats.SUMMARY, formats.REPORT,
                                                                 formats.AUDIT_ERRORS)))
    sources: str = flags.sources_option("hf", "with --against mieb, where the eval splits are read: ")
    model: str | None = flags.option(None, flag="--model", parse=flags.model,
                                     help="find near-duplicates too: embed both sides with this CLIP model first "
                                          "(reused only when made from the same model commit or files, input and "
                                          "settings)")
    revision: str | None = flags.option(
        None, flag="--revision", help="hub commit of --model (default: the pinned one for the openai CLIPs, else the "
                                      "hub's main as the run starts, for the whole run)")
    train_embeddings: str | None = flags.option(
        None, flag="--train-embeddings", parse=flags.existing,
        help="instead of --model: embed output of the train images, keyed as --train")
    against_embeddings: str | None = flags.option(
        None, flag="--against-embeddings", parse=flags.existing,
        help="instead of --model: embed output of the eval images, keyed as --against (mieb: <slug>/<split>/<index>)")
    threshold: float = flags.option(DEFAULT_THRESHOLD, flag="--threshold", check=flags.cosine, cli_default=None,
                                    help="near-duplicate cosine, at or above which a pair is reported (default: "
                                         f"{DEFAULT_THRESHOLD})")
    allow_mixed_models: bool = flags.option(  # with --train-embeddings: compare embeddings of different models
        False, flag="--allow-mixed-models", action="store_true", help=flags.MIXED_MODELS_HELP)
    resume: bool = flags.option(False, flag="--resume", action="store_true",
                                help="continue an unfinished run: skip the units it hashed")
    overwrite: bool = flags.option(False, flag="--overwrite", action="store_true",
                                   help="replace a complete audit already at --out")
    workers: int | None = workers_option("with --model: ")
    gpus_per_worker: float | None = gpus_option("with --model: ")
    cpus_per_worker: float | None = cpus_option("with --model: ")  # the embed job's encoders (None: their pool decides)
    executor: str = flags.executor_option()

    def check(self) -> None:
        flags.check(self)
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

    @property
    def near(self) -> bool:
        """The near detector runs: a model, or precomputed embeddings."""
        return bool(self.model or self.train_embeddings)

    @property
    def alone(self) -> bool:
        """--against self: the train table's copies of each other, no eval side."""
        return self.against == (SELF,)
