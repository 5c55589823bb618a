"""Models: find one (local dir, s3:// prefix or hub repo), describe it from its config alone, and encode with it.

The driver calls `describe` before any Ray work, so a wrong name fails in one line and the hub revision is fixed
for the whole job (`pinned`, where a run describes it more than once); a hub or S3 model's weights are listed
there, not downloaded. Actors then `resolve(info.name, info.revision)` on their own node (the node's cache, or one
download the node's other encoders wait for) and build one `Encoder` each.

Hub pinning: a hub name without --revision uses its PINNED commit when it has one, else the hub's current
`main`, with a warning; either way ModelInfo.revision records the commit actually loaded, so the output names
exactly which weights made it. What differs between model families (CLIP, SigLIP, generic) lives in
families.py: `load_info` picks the family and the Encoder calls through it. Importing this module imports no
torch: Ray's decode tasks import the pipeline module that imports it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fnmatch
import functools
import hashlib
import json
import logging
import os
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from mieb_ray import hubfs, storage
from mieb_ray.encode import families
from mieb_ray.encode.preprocess import ImageSpec
from mieb_ray.errors import UserError, described, first_line
from mieb_ray.runtime.identity import of_files

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)

# The commits public projects pin these repos at (NeMo Curator pins clip-vit-large-patch14 at 32bd642).
PINNED = {
    "openai/clip-vit-base-patch32": "3d74acf9a28c67741b2f4f2ea7635f0aaf6f0268",
    "openai/clip-vit-large-patch14": "32bd64288804d66eefd0ccbe215aa642df71cc41",
}

# Config, tokenizer and processor files (small), then one weight format: safetensors when the repo has it,
# else PyTorch pickles; never both (the openai repos also carry TF and Flax copies of the same weights).
_SMALL = ["*.json", "*.txt", "*.model"]
_WEIGHTS = (["*.safetensors"], ["pytorch_model*.bin"])
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")
_SHA = re.compile(r"^[0-9a-f]{40}$")
_DTYPES = ("float32", "float16", "bfloat16")


@dataclass(frozen=True)
class ModelInfo:
    name: str
    revision: str | None
    architecture: str
    family: str  # a name in families.BY_NAME
    dim: int
    image_config: dict | None
    max_text_length: int

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def default_cache_dir() -> str:
    return storage.cache_dir("models")


def _is_hub(name: str) -> bool:
    return not storage.is_s3(name) and not os.path.exists(name) and bool(_HUB_ID.match(name))


def describe(name: str, revision: str | None = None, modality: str = "image") -> tuple[ModelInfo, dict]:
    """What a job's driver needs of a model: its info (a model that cannot do the job fails here, in one line) and
    its identity. A hub or S3 model's weights are only listed: the encoders download them on their own nodes."""
    path = resolve(name, revision, weights=False)
    info = load_info(path, name, revision, modality=modality)
    return info, identity(name, path, info)


def pinned(name: str, revision: str | None = None) -> tuple[str | None, dict]:
    """For a run that describes the model more than once (eval, audit), after the model is checked: the revision
    it uses throughout (a hub model's commit now, without --revision its main at this moment; else `revision`),
    and the model's identity."""
    info, made_by = describe(name, revision)
    return info.revision or revision, made_by


def resolve(name_or_path: str, revision: str | None = None, cache_dir: str | None = None,
            weights: bool = True, node: str | None = None) -> str:
    """A local directory holding the model's config, weights, tokenizer and processor files; with weights=False a
    hub or S3 model's may hold only the small files (its weights checked to exist). node: the machine's name
    where a job's encoder resolves it, not its driver (a local path the driver found may be missing there)."""
    if storage.is_s3(name_or_path):
        return _from_s3(name_or_path, cache_dir or default_cache_dir(), weights)
    if _is_hub(name_or_path):
        return _from_hub(name_or_path, revision, cache_dir, weights)
    if not os.path.isdir(name_or_path):
        there = f" on {node}, a node where this job encodes: a local --model must be at that path on every node " \
            "that encodes (or give it as s3:// or a hub name)" if node else ""
        raise UserError(f"model path {name_or_path} does not exist{there}" if not os.path.exists(name_or_path)
                        else f"model path {name_or_path} is not a directory{there}")
    if not _select(os.listdir(name_or_path)):
        raise UserError(f"model {name_or_path} has no weights (*.safetensors or pytorch_model*.bin)")
    return os.path.abspath(name_or_path)


def _from_hub(repo: str, revision: str | None, cache_dir: str | None, weights: bool = True) -> str:
    from huggingface_hub.errors import GatedRepoError, HfHubHTTPError, RepositoryNotFoundError, RevisionNotFoundError

    if revision is None and repo in PINNED:
        revision = PINNED[repo]
    elif revision is None:
        log.warning("model %s is not pinned: using the hub's current main (pass --revision to pin it)", repo)
    at = f" at revision {revision}" if revision else ""
    try:  # a copy cached on this machine needs no network
        return _snapshot(repo, revision, cache_dir, local_files_only=True)
    except (HfHubHTTPError, OSError, ValueError, LookupError):
        pass
    try:
        storage.probe_hub()
    except storage.StorageError as exc:
        raise UserError(f"model {repo} is not a local directory or cached here, and {exc}") from None
    try:
        return _snapshot(repo, revision, cache_dir, local_files_only=False, weights=weights)
    except GatedRepoError:
        raise UserError(f"model {repo} is gated on the hub: accept its conditions on its page, then set HF_TOKEN to "
                        "a token of that account") from None
    except RepositoryNotFoundError:  # the hub's answer for a private repo without access too
        raise UserError(f"model {repo} is not a local directory, and the hub has no model repo {repo} (or it is "
                        "private and HF_TOKEN gives no access to it)") from None
    except RevisionNotFoundError:
        raise UserError(f"model {repo} has no revision {revision} on the hub (a commit, branch or tag)") from None
    except (HfHubHTTPError, OSError, ValueError) as exc:  # offline without a cached copy, the hub failing
        # huggingface_hub's retries that ran out say "cannot find the requested files in the local cache"
        cause = hubfs.transient_cause(exc)
        why = f"the hub kept failing: {described(cause)}" if cause else first_line(exc)
        raise UserError(f"model {repo} is not a local directory and cannot be fetched from the "
                        f"Hugging Face hub{at}: {why}") from exc
    except LookupError:
        raise UserError(f"model {repo}{at} has no weights (*.safetensors or pytorch_model*.bin)") from None


def _snapshot(repo: str, revision: str | None, cache_dir: str | None, local_files_only: bool,
              weights: bool = True) -> str:
    """The snapshot of the small files plus the first weight format the repo has (weights=False: the small files,
    the weights only listed); LookupError when it has none."""
    from huggingface_hub import HfApi, snapshot_download

    if not weights:
        path = snapshot_download(repo, revision=revision, allow_patterns=_SMALL, cache_dir=cache_dir,
                                 local_files_only=local_files_only)
        commit = os.path.basename(path)  # the snapshot's folder is named for the commit it holds
        if not _select(HfApi().list_repo_files(repo, revision=commit)):
            raise LookupError(repo)
        return path
    for patterns in _WEIGHTS:
        path = snapshot_download(repo, revision=revision, allow_patterns=_SMALL + patterns, cache_dir=cache_dir,
                                 local_files_only=local_files_only)
        if _select(os.listdir(path), patterns):
            return path
    raise LookupError(repo)


def _select(paths: list[str], weights: list[str] | None = None) -> list[str]:
    """The files a model needs from a listing: the small ones plus one weight format."""
    small = _small(paths)
    for pats in [weights] if weights else _WEIGHTS:
        found = [p for p in paths if any(fnmatch.fnmatch(p, pat) for pat in pats)]
        if found:
            return small + found
    return []


def _small(paths: list[str]) -> list[str]:
    return [p for p in paths if any(fnmatch.fnmatch(p, pat) for pat in _SMALL)]


def _from_s3(uri: str, cache_dir: str, weights: bool = True) -> str:
    """The prefix's model files on this machine (storage.local_copy: once per machine and version of its files;
    every actor on the node lists it and downloads nothing). weights=False: the small files only (a copy of
    their own)."""
    uri = uri.rstrip("/")
    stamps = storage.files_under(uri)
    files = _select(list(stamps))
    if not files:  # (a missing bucket is said by the listing)
        raise UserError(f"no model files (*.safetensors or pytorch_model*.bin) at {storage.display(uri)}")
    return storage.local_copy(uri, {f: stamps[f] for f in (files if weights else _small(files))}, cache_dir)


def identity(name: str, path: str, info: ModelInfo) -> dict:
    """What decides a model's embeddings (runtime/identity.py): a hub model's name and resolved commit; an S3
    prefix's files it loads from by their sizes and times, as an input table's are (no download); a local folder's
    by their sha256. A model overwritten with other weights is not taken for the old one."""
    if info.revision is not None and _is_hub(name):
        return {"name": info.name, "revision": info.revision}
    if storage.is_s3(name):
        uri = name.rstrip("/")
        stamps = storage.files_under(uri)
        return {"name": info.name, "files": of_files({f"{uri}/{f}": stamps[f] for f in _select(list(stamps))}, uri)}
    content = hashlib.sha256()
    for rel in sorted(_select(os.listdir(path))):
        with open(os.path.join(path, rel), "rb") as f:
            content.update(f"{rel}\0".encode() + hashlib.file_digest(f, "sha256").digest())
    return {"name": info.name, "content": content.hexdigest()}


def _model_class(config: dict):
    """The transformers class the config names (never remote code), else the AutoModel class for its type."""
    import transformers
    from transformers.models.auto.modeling_auto import MODEL_MAPPING_NAMES

    for name in [*(config.get("architectures") or []), MODEL_MAPPING_NAMES.get(config.get("model_type", ""))]:
        cls = getattr(transformers, name, None) if isinstance(name, str) else None
        if isinstance(cls, type) and issubclass(cls, transformers.PreTrainedModel):
            return cls
    return None


def _read_json(path: str, shown: str) -> dict | None:
    """A model file's JSON object; None where the file is absent."""
    if not os.path.exists(path):
        return None
    try:
        with open(path, "rb") as f:
            found = json.load(f)
    except ValueError as exc:  # UnicodeDecodeError is one
        raise UserError(f"model {shown}: {os.path.basename(path)} is not valid JSON ({exc})") from None
    if not isinstance(found, dict):
        raise UserError(f"model {shown}: {os.path.basename(path)} holds a JSON {type(found).__name__}, not an object")
    return found


def load_info(path: str, name: str, revision: str | None, modality: str = "image") -> ModelInfo:
    """Describe the model from its config, tokenizer and processor files (no weights, no torch model), and fail
    early, in one line, if it cannot embed `modality` ("image" or "text")."""
    shown = storage.display(name)
    config = _read_json(os.path.join(path, "config.json"), shown)
    if config is None:
        raise UserError(f"model {shown} has no config.json")
    if not isinstance(config.get("model_type", ""), str) or not isinstance(config.get("architectures") or [], list):
        raise UserError(f"model {shown}: config.json's model_type is not a string or its architectures not a list")
    cls = _model_class(config)
    arch = cls.__name__ if cls else (config.get("architectures") or [config.get("model_type", "?")])[0]
    family = families.family_of(config.get("model_type"))
    why = families.unsupported(family, cls, modality)
    if why:
        raise UserError(f"model {shown} ({arch}) cannot embed {modality}s: {why}")

    try:
        full = cls.config_class.from_dict(config)  # the class's defaults filled in: old hub configs omit them
        dim = family.dim(full, modality)
    except (ValueError, TypeError, AttributeError) as exc:
        raise UserError(f"model {shown} ({arch}): {exc}") from None
    image_config = _image_config(path, shown, required=modality == "image")
    if modality == "text":
        load_tokenizer(path, shown)  # a missing backend (sentencepiece) fails here, not in every actor
    tokenizer_config = _read_json(os.path.join(path, "tokenizer_config.json"), shown) or {}
    text = getattr(full, "text_config", None) or full
    lengths = [n for n in (getattr(text, "max_position_embeddings", None), tokenizer_config.get("model_max_length"))
               if isinstance(n, int) and n < 1_000_000]  # tokenizers say 1e30 for "no limit"
    parent, leaf = os.path.split(os.path.abspath(path))
    snapshot = leaf if os.path.basename(parent) == "snapshots" and _SHA.match(leaf) else None
    return ModelInfo(name=shown, revision=(snapshot or revision) if _is_hub(name) else None, architecture=arch,
                     family=family.name, dim=int(dim), image_config=image_config,
                     max_text_length=min(lengths, default=512))  # 512: BERT-style text models


def _image_config(path: str, shown: str, required: bool) -> dict | None:
    """The image processor's settings (families.image_config), checked against what preprocess can reproduce
    when images are to be embedded; None for a model without an image processor."""
    if not any(os.path.exists(os.path.join(path, f)) for f in ("preprocessor_config.json", "processor_config.json")):
        return None
    try:
        config = families.image_config(path)
        if required:
            ImageSpec.from_processor_config(config)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        if not required:
            return None
        first = first_line(exc)
        raise UserError(f"model {shown}: its image preprocessing cannot be reproduced: {first}") from None
    return config


@functools.lru_cache(maxsize=1)  # load_info's check and the actor's Encoder share one load (Gemma's takes seconds)
def load_tokenizer(path: str, shown: str):
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(path, trust_remote_code=False)
    except ImportError as exc:  # e.g. SiglipTokenizer without sentencepiece: transformers' message is a paragraph
        first = " ".join(str(exc).split()).split(". ")[0]
        fix = "pip install sentencepiece" if "sentencepiece" in first.lower() else "install the package it names"
        raise UserError(f"model {shown}'s tokenizer cannot be loaded: {first} ({fix})") from None
    except (OSError, ValueError) as exc:
        first = first_line(exc)
        raise UserError(f"model {shown}'s tokenizer cannot be loaded: {first}") from None


def _torch_dtype(dtype: str, device: torch.device) -> torch.dtype:
    import torch

    if dtype == "auto":
        if device.type != "cuda":
            return torch.float32
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    if dtype not in _DTYPES:
        raise UserError(f"unknown dtype {dtype!r}: use auto, {', '.join(_DTYPES)}")
    return getattr(torch, dtype)


def cuda_problem(device: str) -> str:
    """Why torch cannot run on `device` ("cuda..."), in one line: the GPUs this process was given, torch's CUDA
    build and the NVIDIA driver, which together decide it."""
    import torch

    given = os.environ.get("CUDA_VISIBLE_DEVICES")
    who = f"this encoder was given GPU {given}" if given else f"this encoder was asked for {device}"
    build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU-only build"
    return (f"{who}, but torch {torch.__version__} ({build}) sees no CUDA device (NVIDIA driver: {_driver()}); "
            "install a torch build this driver runs (docs/cluster.md), or pass --gpus-per-worker 0 to encode on CPUs")


def _driver() -> str:
    try:
        with open("/proc/driver/nvidia/version") as f:
            found = re.search(r"Kernel Module\s+(?:for \S+\s+)?([\d.]+)", f.read())
        return found.group(1) if found else "unknown version"
    except OSError:
        return "none found"


def _weights(cls, path: str, info: ModelInfo, dtype):
    """The model loaded from its files; files that cannot make it (truncated weights, weights of other shapes than
    its config.json says) in one line."""
    from safetensors import SafetensorError

    try:
        return cls.from_pretrained(path, dtype=dtype, trust_remote_code=False)
    except (OSError, ValueError, RuntimeError, SafetensorError) as exc:
        why = "its weights' shapes are not those its config.json gives" if "mismatched_sizes" in str(exc) \
            else first_line(exc)
        raise UserError(f"model {info.name} ({info.architecture}) cannot be loaded from its files: {why}") from None


class Encoder:
    """Loaded once per actor; the family (families.py) decides the tokenizer's arguments and the feature calls.

    device: where the caller decided it runs (the embed job: cuda for an encoder given a GPU, cpu for one given
    none, whatever CUDA_VISIBLE_DEVICES says); None: cuda when torch sees one (a process of its own). A cuda
    device torch cannot use is a one-line error, never a silent run on the CPU."""

    def __init__(self, path: str, info: ModelInfo, device: str | None = None, dtype: str = "auto", raw: bool = False,
                 compile: bool = False):
        import torch
        import transformers

        self.path, self.info, self.family = path, info, families.BY_NAME[info.family]
        device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        if device.startswith("cuda") and not torch.cuda.is_available():
            raise UserError(cuda_problem(device))
        self.device = torch.device(device)
        self.dtype = _torch_dtype(dtype, self.device)
        cls = getattr(transformers, info.architecture)  # load_info checked it is a transformers model class
        # to(device) after loading: device_map= would need accelerate, which we do not depend on
        self.model = _weights(cls, path, info, self.dtype).to(self.device).eval()
        self._tokenizer = None
        self.raw = raw  # the model's own vectors, not L2-normalised (mteb's CLIP wrapper adds an image's and a text's)
        self._image_call = functools.partial(self.family.image_features, self.model)
        if compile:  # inductor's fused kernels; the batch dimension symbolic, so a unit's last batch compiles nothing
            self._image_call = torch.compile(self._image_call, dynamic=True)

    def image_features(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """Float (n, 3, h, w), already normalised -> L2-normalised float32 (n, dim), left on the device."""
        import torch

        with torch.inference_mode(), _strict_float32(self.device, self.dtype):
            pixel_values = pixel_values.to(self.device, self.dtype, non_blocking=True)
            return self._checked(_unit(self._image_call(pixel_values), self.raw))

    def encode_pixel_values(self, pixel_values: torch.Tensor) -> np.ndarray:
        """image_features as a numpy array."""
        return self.image_features(pixel_values).cpu().numpy()

    def encode_texts(self, texts: list[str]) -> np.ndarray:
        """Tokenised as the family says (padded to the batch's longest for CLIP, to max_length for SigLIP),
        truncated to the model's limit (77 for CLIP, 64 for SigLIP) -> L2-normalised float32 (n, dim)."""
        import torch

        if not len(texts):
            return np.zeros((0, self.info.dim), np.float32)
        if self._tokenizer is None:
            self._tokenizer = load_tokenizer(self.path, self.info.name)
        batch = self._tokenizer(list(texts), **self.family.tokenizer_kwargs(self.info.max_text_length))
        with torch.inference_mode(), _strict_float32(self.device, self.dtype):
            return self._checked(_unit(self.family.text_features(self.model, batch.to(self.device)),
                                       self.raw)).cpu().numpy()

    def _checked(self, emb: torch.Tensor) -> torch.Tensor:
        if emb.ndim != 2 or emb.shape[1] != self.info.dim:  # a generic model's dim is read from its config by name
            raise RuntimeError(f"model {self.info.name} made embeddings of shape {tuple(emb.shape)}, not (n, "
                               f"{self.info.dim}) as its config says")
        return emb


@contextlib.contextmanager
def _strict_float32(device: torch.device, dtype: torch.dtype):
    """float32 on a GPU as on a CPU: no TF32 (10-bit mantissa) in convolutions (cuDNN allows it by default: CLIP's
    patch embedding) or matrix products, whose error would move scores off mteb's float32 ones."""
    import torch

    if device.type != "cuda" or dtype != torch.float32:
        yield
        return
    backends = (torch.backends.cudnn, torch.backends.cuda.matmul)
    before = [b.allow_tf32 for b in backends]
    for b in backends:
        b.allow_tf32 = False
    try:
        yield
    finally:
        for b, was in zip(backends, before):
            b.allow_tf32 = was


def _unit(out, raw: bool = False) -> torch.Tensor:
    import torch

    # transformers 5 returns an output object whose pooler_output is the projected embedding; 4.x a tensor.
    # Normalised in float32: a bf16 norm would round every component again.
    emb = getattr(out, "pooler_output", out).float()
    return emb if raw else torch.nn.functional.normalize(emb, dim=-1)
