"""The command line's value types: every flag's value checked as it is parsed, before Ray starts and before
anything is written, and refused in one line (`mieb-ray: error: argument --workers: ...`).

Numbers against their range, local paths for existence and kind, URIs for their scheme. What needs the store
itself (an S3 bucket, a hub repo, a model's files) is checked by the job, still before any work.
"""

from __future__ import annotations

import argparse
import os
import re

from mieb_ray.errors import UserError
from mieb_ray.io import contamination

_SCHEME = re.compile(r"^([a-zA-Z][a-zA-Z0-9+.-]*)://")


class Parser(argparse.ArgumentParser):
    """argparse, with a bad flag as one line like every other error of the command (exit 2), not a usage block."""

    def error(self, message: str):
        self.exit(2, f"mieb-ray: error: {message} (see {self.prog} --help)\n")


def _number(text: str, kind=float) -> float:
    try:
        return kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{'a whole number' if kind is int else 'a number'} is needed, not "
                                         f"{text!r}") from None


def count(text: str) -> int:
    """A whole number, at least 1 (workers, rows, batch sizes)."""
    n = _number(text, int)
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {text}")
    return n


def fraction(text: str) -> float:
    """A fraction in [0, 1] (an error rate)."""
    x = _number(text)
    if not 0 <= x <= 1:
        raise argparse.ArgumentTypeError(f"must be a fraction from 0 to 1, not {text}")
    return x


def cpus(text: str) -> float:
    """A number of CPUs for a Ray actor: more than 0."""
    x = _number(text)
    if not x > 0:
        raise argparse.ArgumentTypeError(f"must be more than 0, not {text}")
    return x


def gpus(text: str) -> float:
    """GPUs per encoder: 0 (CPUs), a fraction (shared), or 1; an encoder uses one GPU at most."""
    x = _number(text)
    if not 0 <= x <= 1:
        raise argparse.ArgumentTypeError(f"must be from 0 to 1, not {text}: an encoder uses one GPU at most (a "
                                         "fraction shares one; more --workers use more GPUs)")
    return x


def cosine(text: str) -> float:
    """A cosine similarity threshold in (0, 1]."""
    x = _number(text)
    if not 0 < x <= 1:
        raise argparse.ArgumentTypeError(f"must be a cosine above 0 and at most 1, not {text}")
    return x


def _scheme(text: str) -> str | None:
    found = _SCHEME.match(text)
    if found and found.group(1).lower() != "s3":
        raise argparse.ArgumentTypeError(f"{text}: only local paths and s3:// URIs are supported, not "
                                         f"{found.group(1)}://")
    return found.group(1).lower() if found else None


def output(text: str) -> str:
    """Where a job writes: a local folder (made if missing, but not a file) or s3://bucket/prefix."""
    if not text:
        raise argparse.ArgumentTypeError("an output path is needed")
    if _scheme(text) is None and os.path.exists(text) and not os.path.isdir(text):
        raise argparse.ArgumentTypeError(f"{text} is a file, not a folder")
    return text


def existing(text: str) -> str:
    """What a job reads: an existing local file or folder, or an s3:// URI (checked by the job)."""
    if _scheme(text) is None and not os.path.exists(text):
        raise argparse.ArgumentTypeError(f"{text} does not exist")
    return text


def existing_list(text: str) -> str:
    """One or several comma-separated existing paths or s3:// URIs (embedding outputs)."""
    for part in (p for p in text.split(",") if p):
        existing(part)
    return text


def existing_folder(text: str) -> str:
    """An existing local folder, or an s3:// URI."""
    existing(text)
    if _scheme(text) is None and not os.path.isdir(text):
        raise argparse.ArgumentTypeError(f"{text} is a file, not a folder")
    return text


def sources(text: str) -> str:
    """'hf' (the hub) or a mirror of it: an existing local folder or an s3:// URI."""
    return text if text == "hf" else existing_folder(text)


def tables(text: str) -> str:
    """audit --against: 'mieb', 'self', or comma-separated existing tables."""
    existing_list(",".join(p for p in text.split(",") if p not in ("mieb", "self")))  # among tables: the job says
    return text


def model(text: str) -> str:
    """A hub name (org/name), a local model folder or an s3:// prefix. A path-like name that is not there is
    refused here; a hub name is checked (and fetched) by the job."""
    if _scheme(text) is None and (text.startswith((".", "/", "~")) or text.count("/") > 1 or os.path.exists(text)):
        existing_folder(os.path.expanduser(text))
    return text


def detectors(text: str) -> tuple[str, ...]:
    """Audit detectors, comma-separated (io/contamination.py)."""
    try:
        return contamination.detectors(text)
    except UserError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
