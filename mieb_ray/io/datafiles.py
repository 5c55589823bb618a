"""A dataset repo's splits and their data files, in the order `datasets.load_dataset(repo, revision=...)` reads
them: the one definition every reader of a source (build, the eval suites, the audit) takes, so that a row's
index is its index in `load_dataset(repo)[split]`, which is what mteb loads and what its linear probe's
undersampling and clustering depend on.

It is `datasets`' own resolution, not a copy of it: the card's `configs` (the default one, or a named one),
else its default split patterns; `DataFilesDict.from_patterns` (fsspec's glob: files sorted as strings, so
`train/10.tar` comes before `train/2.tar`); the builder inferred from the extensions. What `datasets` would
list through its own filesystem (the hub's API, a local folder) we give it as a listing made once by
storage.list_files: the repo's relative paths served by fsspec's ReferenceFileSystem, so a mirror on S3
resolves exactly as the hub does, through the same listing and retries as every other read.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from glob import has_magic

from mieb_ray import storage
from mieb_ray.errors import FormatError, first_line

CARD = "README.md"
_BASE = "reference://"  # the listing's root, as datasets sees it


@dataclass(frozen=True)
class RepoFiles:
    """A repo's (or one config's) data files: the builder `datasets` picks (parquet, webdataset, ...) and each
    split's files as URIs under the repo root, in the order it reads them."""

    builder: str
    splits: dict[str, tuple[str, ...]]

    def split(self, name: str, repo: str) -> tuple[str, ...]:
        if name not in self.splits:
            have = ", ".join(self.splits) or "none"
            raise FormatError(f"{repo}: no {name} split (datasets finds: {have})")
        return self.splits[name]


class Repo:
    """One listing of a repo root (the hub at a revision, `ROOT/<repo>` of a mirror on disk or S3) and its card;
    `files(config)` resolves a config's data files from them."""

    def __init__(self, root: str, listing: tuple[tuple[str, ...], str | None] | None = None):
        """listing: (the repo's relative paths, its card's text) as listed before; None: list it now."""
        self.root = root.rstrip("/")
        prefix = self.root + "/"
        if listing is None:
            self.paths = {u[len(prefix):]: u for u in storage.list_files(self.root)}
            self.card = storage.read_text(storage.join(self.root, CARD)) if CARD in self.paths else None
        else:
            self.paths, self.card = {rel: prefix + rel for rel in listing[0]}, listing[1]

    def files(self, config: str | None = None) -> RepoFiles:
        """The data files of `config` (None: the default config, as `load_dataset(repo)` takes it)."""
        try:
            return _resolved(self.root, tuple(self.paths), self.card, config)
        except FormatError:
            raise
        except (FileNotFoundError, ValueError) as exc:  # datasets' EmptyDatasetError, mixed or unknown builders
            raise FormatError(f"{storage.display(self.root)}: datasets cannot read it: "
                              f"{first_line(exc).replace(_BASE, '')}") from None

    def _resolve(self, config: str | None) -> RepoFiles:
        from datasets.data_files import (
            DataFilesDict,
            DataFilesList,
            get_data_patterns,
            resolve_pattern,
            sanitize_patterns,
        )
        from datasets.download.download_config import DownloadConfig
        from datasets.load import _ALL_ALLOWED_EXTENSIONS, infer_module_for_data_files
        from datasets.packaged_modules import _MODULE_TO_EXTENSIONS

        if not self.paths:
            raise FormatError(f"no files under {storage.display(self.root)}")
        options = DownloadConfig(storage_options={"reference": {"fo": {p: "" for p in self.paths},
                                                                 "skip_instance_cache": True}})
        configs = _card_configs(self.card)

        def resolve(params: dict | None) -> dict[str, list[str]]:
            base = f"{_BASE}{params['data_dir']}" if params and params.get("data_dir") else _BASE
            patterns = sanitize_patterns(params["data_files"]) if params and params.get("data_files") is not None \
                else get_data_patterns(base, download_config=options)
            # DataFilesList.from_patterns, less its files' origin metadata (datasets' cache fingerprint, made in a
            # tqdm thread_map that races when sources are planned in parallel threads)
            found = {}
            for split, split_patterns in patterns.items():
                found[split] = []
                for pattern in split_patterns:
                    try:
                        found[split] += resolve_pattern(pattern, base, _ALL_ALLOWED_EXTENSIONS, options)
                    except FileNotFoundError:
                        if not has_magic(pattern):
                            raise
            if empty := [split for split, files in found.items() if not files]:  # datasets: "cannot infer"
                raise FormatError(f"{storage.display(self.root)}: no files for its {empty[0]} split (patterns: "
                                  f"{', '.join(patterns[empty[0]])})")
            return DataFilesDict({split: DataFilesList(files, []) for split, files in found.items()})

        # as datasets' module factories: the builder from the first config's files (or the default patterns'),
        # the files from the config load_dataset takes (the card's default one, unless one is named)
        first = next(iter(configs.values()), None)
        typed_by = first if first and "data_files" in first else None
        files = resolve(typed_by)  # also the files read, unless another config is taken (resolved once: fsspec globs)
        builder, _ = infer_module_for_data_files(files)
        if configs:
            name = config or configs.get_default_config_name()
            if name is None or name not in configs:
                raise FormatError(f"{storage.display(self.root)}: no config {name or '(default)'} in its card "
                                  f"(configs: {', '.join(configs)})")
            if configs[name] is not typed_by:
                files = resolve(configs[name])
        elif config:
            raise FormatError(f"{storage.display(self.root)}: no config {config} (its card declares none)")
        extensions = tuple(_MODULE_TO_EXTENSIONS.get(builder, ()))
        return RepoFiles(builder, {str(split): tuple(self.paths[f[len(_BASE):]] for f in uris
                                                     if f.lower().endswith(extensions))
                                   for split, uris in files.items()})


@lru_cache(maxsize=256)
def _card_configs(card: str | None):
    """The card's `configs` as datasets reads them (MetadataConfigs; empty without a YAML card), parsed once for
    every config resolved from it: a card of many configs takes ~10 ms."""
    from datasets.utils.metadata import MetadataConfigs
    from huggingface_hub import DatasetCard, DatasetCardData

    data = DatasetCard(card).data if card and card.startswith("---") else DatasetCardData()
    return MetadataConfigs.from_dataset_card_data(data)


@lru_cache(maxsize=256)
def _resolved(root: str, paths: tuple[str, ...], card: str | None, config: str | None) -> RepoFiles:
    """Repo._resolve, once per process for the same listing and card: a build's pre-flight and plan, and each
    suite of an eval, resolve the same repos (its card's YAML parsed in Python, datasets' patterns globbed: 10 to
    60 ms a repo)."""
    return Repo(root, (paths, card))._resolve(config)


def split_files(root: str, split: str, config: str | None = None) -> RepoFiles:
    """The repo's files as `datasets` reads them, checked to hold `split`."""
    found = Repo(root).files(config)
    found.split(split, storage.display(root))
    return found
