"""Errors a user can act on: the CLI prints them as one line, without a traceback."""


class UserError(Exception):
    """Bad input or environment (a wrong path, a missing bucket, an unknown dataset, a malformed source)."""


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
