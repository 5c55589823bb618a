"""Errors a user can act on, at the bottom of the package: every layer raises them, the CLI prints them as one
line without a traceback, and a worker's reach the driver as themselves (`surfaced`)."""

from __future__ import annotations

import os
import re
from contextlib import contextmanager


class UserError(Exception):
    """Bad input or environment (a wrong path, a missing bucket, an unknown dataset, a malformed source)."""


class StorageError(UserError):
    """A store (local disk, S3, the hub) refused or failed a request."""


class FormatError(UserError):
    """A file that is not what it should be: an unreadable Parquet file or tar, a missing column or member."""


class TransientStorageError(StorageError):
    """A remote error that may pass (the hub's 429/5xx, timeouts, resets) and outlasted the local retries: one
    line for the user, and the one error the runtime runs a unit or task again on (runtime/tasks.py)."""


def redact(text: str) -> str:
    """`text` without the secrets of this environment (the hub token, the AWS secret key) in it."""
    for name in ("HF_TOKEN", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        secret = os.environ.get(name)
        if secret and len(secret) >= 4:
            text = text.replace(secret, "***")
    return text


def first_line(exc: BaseException) -> str:
    """An exception's first line (a pyarrow or tarfile message can run to several)."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def described(exc: BaseException) -> str:
    """An exception of a library as one line for the user: its type and first line ("KeyError: 'x'"), its type
    alone when it has no text, without this environment's secrets."""
    line = first_line(exc)
    return redact(f"{type(exc).__name__}: {line}" if str(exc).strip() else line)


def find_user_error(exc: BaseException) -> UserError | None:
    """The UserError behind `exc`, looking through Ray's wrappers (RayTaskError.cause) and __cause__ chains."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        cause = getattr(exc, "cause", None)
        if isinstance(cause, UserError):  # Ray's wrapper is a UserError too, but its text is a worker traceback
            return cause
        if isinstance(exc, UserError):
            return exc
        exc = cause or exc.__cause__ or exc.__context__
    return None


@contextmanager
def surfaced():
    """Inside the block, an exception with a UserError behind it (a worker's, in Ray's wrappers) is raised as
    that UserError: the job's one line, never a worker traceback."""
    try:
        yield
    except Exception as exc:
        user = find_user_error(exc)
        if user is None:
            raise
        _drop_retry_note(user)
        if user is exc:
            raise
        raise user from None


_RAY_DATA_NOTE = re.compile(r"\nFailed to .* after \d+/\d+ attempts \(total backoff .*", re.S)


def _drop_retry_note(exc: UserError) -> None:
    """Ray Data appends its retry advice to the message of a stage's exception; ours is one line, and a UserError
    is not retried."""
    if exc.args and isinstance(exc.args[0], str):
        exc.args = (_RAY_DATA_NOTE.sub("", exc.args[0]), *exc.args[1:])
