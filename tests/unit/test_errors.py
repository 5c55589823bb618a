"""How a library's exception reads in the user's one line (errors.described)."""

from mieb_ray.errors import described


def test_a_library_error_is_its_type_and_first_line():
    assert described(KeyError("x")) == "KeyError: 'x'"
    assert described(OSError("cannot open\n  at frame 1\n  at frame 2")) == "OSError: cannot open"


def test_an_error_without_text_is_its_type_alone():
    assert described(ValueError()) == "ValueError"
    assert described(RuntimeError("  \n")) == "RuntimeError"


def test_the_environment_secrets_never_show(monkeypatch):
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s3cr3t-key")
    assert described(PermissionError("denied for s3cr3t-key")) == "PermissionError: denied for ***"
