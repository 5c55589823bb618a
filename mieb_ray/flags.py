"""Every option of every job, defined once: a config dataclass's field made with `option()` carries its flag,
the check of its value, its default and its help. The command line adds a config's flags from its fields
(`add_flags`) and makes the config from what it parsed (`values`); a config made in Python is checked by the
same checks (`check`). So a default, a range or a help text lives in one place, the config.

The checks: numbers against their range, local paths for existence and kind, URIs for their scheme; each takes
the flag's text (or, from a config made in Python, the value) and refuses in one line (`mieb-ray: error:
argument --workers: ...`), before Ray starts and before anything is written. What needs the store itself (an S3
bucket, a hub repo, a model's files) is checked by the job, still before any work.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re

from mieb_ray import formats
from mieb_ray.errors import UserError

EXECUTORS = ("auto", "ray", "local")  # where a job's work runs (runtime/placement.py)

_SCHEME = re.compile(r"^([a-zA-Z][a-zA-Z0-9+.-]*)://")


class Parser(argparse.ArgumentParser):
    """argparse, with a bad flag as one line like every other error of the command (exit 2), not a usage block."""

    def error(self, message: str):
        self.exit(2, f"mieb-ray: error: {message} (see {self.prog} --help)\n")


def _number(text, kind=float) -> float:
    if not isinstance(text, str):  # a value a config was made with in Python
        return text
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


def tables(text) -> tuple[str, ...]:
    """audit --against: 'mieb', 'self', or comma-separated existing tables."""
    if not isinstance(text, str):
        return tuple(text)
    existing_list(",".join(p for p in text.split(",") if p not in ("mieb", "self")))  # among tables: the job says
    return tuple(p for p in text.split(",") if p)


def model(text: str) -> str:
    """A hub name (org/name), a local model folder or an s3:// prefix. A path-like name that is not there is
    refused here; a hub name is checked (and fetched) by the job."""
    if _scheme(text) is None and (text.startswith((".", "/", "~")) or text.count("/") > 1 or os.path.exists(text)):
        existing_folder(os.path.expanduser(text))
    return text


def detectors(text) -> tuple[str, ...]:
    """Audit detectors, comma-separated (formats.DETECTORS)."""
    chosen = tuple(d.strip() for d in text.split(",") if d.strip()) if isinstance(text, str) else tuple(text)
    unknown = [d for d in chosen if d not in formats.DETECTORS]
    if unknown or not chosen:
        raise argparse.ArgumentTypeError(f"unknown detector {unknown[0]!r}; valid: {', '.join(formats.DETECTORS)}"
                                         if unknown else f"no detector given; valid: {', '.join(formats.DETECTORS)}")
    return chosen


def names(text) -> tuple[str, ...]:
    """Comma-separated names (columns to carry), as a tuple."""
    return tuple(n for n in text.split(",") if n) if isinstance(text, str) else tuple(text)


# ---------------------------------------------------------------------------------------------- options

def option(default=dataclasses.MISSING, *, flag: str | tuple[str, ...], help: str, check=None, parse=None, **cli):
    """A config field that is also a command-line flag: its flag (or flags), its default, its help and its check,
    here once. check: a function above that parses the flag's text and checks a value alike (numbers, choices of
    names), applied on the command line and to a config made in Python; parse: one that checks the text only
    (paths, which the job checks itself, in its own words, when given in Python). cli: more of argparse's settings
    (choices, action, metavar, required, a `cli_default` the flag has where the config has none)."""
    flags_ = (flag,) if isinstance(flag, str) else tuple(flag)
    return dataclasses.field(default=default, metadata={"flags": flags_, "check": check, "parse": parse or check,
                                                        "help": help, "cli": cli})


SOURCES_HELP = ("'hf' for the Hugging Face hub at the pinned revisions (default), or a mirror of it: a root (local "
                "path or s3://bucket/prefix) holding <org>/<repo>/ folders as the hub's `--local-dir` downloads make "
                "them; --data is the same flag")


def sources_option(default=dataclasses.MISSING, what: str = ""):
    """--sources (--data): where the catalog's sources or a task's data are read."""
    return option(default, flag=("--sources", "--data"), parse=sources, cli_default="hf", help=what + SOURCES_HELP)


MIXED_MODELS_HELP = ("score embeddings whose manifests name different models (name or revision), with a warning "
                     "(default: refused)")


def executor_option():
    """--executor: where a job's work runs (runtime/placement.py)."""
    return option("auto", flag="--executor", choices=EXECUTORS,
                  help="where the work runs: ray, local (in this process, Ray never started) or auto (default): in "
                       "this process when no cluster was asked for and the work is small, else on Ray (the rule: "
                       "docs/architecture.md)")


def _options(config_cls, only=None) -> list[dataclasses.Field]:
    """The fields of `config_cls` that are options: all, in field order, or those named in `only`, in its order."""
    fields = {f.name: f for f in dataclasses.fields(config_cls) if "flags" in f.metadata}
    return list(fields.values()) if only is None else [fields[name] for name in only]


def add_flags(parser: argparse.ArgumentParser, config_cls, only=None) -> None:
    """A flag for each option of `config_cls` (of those named in `only`, in its order: the order --help lists
    them)."""
    for f in _options(config_cls, only):
        cli = dict(f.metadata["cli"])
        default = cli.pop("cli_default", None if f.default is dataclasses.MISSING else f.default)
        kwargs = {"dest": f.name, "help": f.metadata["help"], **cli}
        if cli.get("action") != "store_true":
            kwargs["default"] = default
        if cli.get("action") is None and f.metadata["parse"] is not None:
            kwargs["type"] = f.metadata["parse"]
        parser.add_argument(*f.metadata["flags"], **kwargs)


def values(args: argparse.Namespace, config_cls, only=None) -> dict:
    """{field: value} of the options of `config_cls` a parser made with add_flags parsed; a flag left at None
    where the config has a default of its own (shown as such in --help) takes that default."""
    return {f.name: getattr(args, f.name) for f in _options(config_cls, only) if hasattr(args, f.name)
            and not (getattr(args, f.name) is None and f.default not in (None, dataclasses.MISSING))}


def check(config) -> None:
    """A config made in Python checked by its options' own checks: one line naming the flag, as the command line
    would refuse it."""
    for f in _options(type(config)):
        value = getattr(config, f.name)
        if value is None or isinstance(value, bool):
            continue
        choices = f.metadata["cli"].get("choices")
        if choices is not None and value not in choices:
            raise UserError(f"unknown {f.metadata['flags'][0]} {value!r}; valid: {', '.join(choices)}")
        if f.metadata["check"] is not None:
            try:
                f.metadata["check"](value)
            except argparse.ArgumentTypeError as exc:
                raise UserError(f"{f.metadata['flags'][0]} {value}: {exc}") from None


def reference(parser: argparse.ArgumentParser) -> str:
    """The flags page (docs/cli.md): every command and flag as `parser` defines them."""
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
    lines = ["# Command-line reference", "",
             "Generated from the parser (`mieb_ray.cli.reference()`); `mieb-ray COMMAND --help` says the same.", ""]
    for name, command in commands.items():
        lines += [f"## mieb-ray {name}", "", command.description, "", "| flag | default | meaning |", "|---|---|---|"]
        for action in command._actions:
            if not action.option_strings or action.dest == "help":
                continue
            default = "" if action.default in (None, argparse.SUPPRESS, False) else f"`{action.default}`"
            shown = ", ".join(f"`{f}`" for f in action.option_strings)
            if action.choices:
                shown += " " + "\\|".join(f"`{c}`" for c in action.choices)
            lines.append(f"| {shown} | {default} | {(action.help or '').replace('|', chr(92) + '|')} |")
        lines.append("")
    return "\n".join(lines)
