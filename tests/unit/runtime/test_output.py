"""One rule for every job: an unfinished output needs --resume or --overwrite, and a run with other settings or
other datasets is refused, saying what differs, before it touches anything (the real command line, a fresh
process, the earlier output byte for byte after the refusal)."""

from __future__ import annotations

import subprocess
import sys

import pytest
from support.paths import tree

from mieb_ray.pipelines.build import BuildConfig, build


class Stop(KeyboardInterrupt):
    pass


@pytest.fixture
def unfinished(mirror, tmp_path):
    """A build of cifar10 stopped after its first unit was committed (as Ctrl-C would)."""
    out = tmp_path / "train"

    def log(line: str) -> None:
        if " units, " in line:  # the first progress line: a unit is committed
            raise Stop

    with pytest.raises(Stop):
        build(BuildConfig(mirror[0], str(out), datasets="cifar10", rows_per_shard=10, executor="local"), log=log)
    assert not (out / "_manifest.json").exists() and (out / "_progress").is_dir()
    return out


def command(mirror, out, *flags):
    return subprocess.run([sys.executable, "-m", "mieb_ray", "build", "--sources", mirror[0], "--out", str(out),
                           "--rows-per-shard", "10", "--executor", "local", *flags], capture_output=True, text=True,
                          timeout=120)


@pytest.mark.parametrize("flags, says", [
    (["--datasets", "mnist"], ", started with other settings (datasets [\"cifar10\"] -> [\"mnist\"]; 1 of its units "
                              "are not in this run's plan (e.g. cifar10/000000000000)); pass --resume to continue it "
                              "or --overwrite to start again"),
    (["--datasets", "mnist", "--resume"], " started with other settings: datasets [\"cifar10\"] -> [\"mnist\"]; 1 of "
                                          "its units are not in this run's plan (e.g. cifar10/000000000000); pass "
                                          "--resume with its settings to continue it, or --overwrite to start again "
                                          "with these"),
    (["--datasets", "cifar10"], "; pass --resume to continue it or --overwrite to start again"),
    (["--datasets", "cifar10", "--resume", "--format", "webdataset"], " started with other settings: format "
                                                                      "\"parquet\" -> \"webdataset\"; pass --resume "
                                                                      "with its settings"),
])
def test_an_unfinished_build_is_never_replaced_by_mistake(mirror, unfinished, flags, says):
    before = tree(unfinished)
    done = command(mirror, unfinished, *flags)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr[-2000:]
    line = done.stderr.strip().splitlines()[-1]
    assert line.startswith(f"mieb-ray: error: {unfinished} holds an unfinished run of build (")
    assert says in line, line
    assert tree(unfinished) == before


def test_resume_with_the_same_settings_finishes_it(mirror, unfinished):
    done = command(mirror, unfinished, "--datasets", "cifar10", "--resume")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "[build] resuming: 1 of 2 units already built" in done.stdout


def test_an_unfinished_build_of_an_older_format_is_refused_naming_its_version(mirror, unfinished):
    """mieb-train 3 keys rows by their place in `datasets`' order, 2 did not: a resume would mix the two."""
    import json

    from mieb_ray.formats import MIEB_TRAIN

    FORMAT_VERSION = MIEB_TRAIN.version

    for record in (unfinished / "_progress").rglob("*.json"):
        data = json.loads(record.read_text())
        data["settings"]["format_version"] = FORMAT_VERSION - 1  # as an older mieb-ray wrote it
        record.write_text(json.dumps(data))
    before = tree(unfinished)
    for flags in ([], ["--resume"]):
        done = command(mirror, unfinished, "--datasets", "cifar10", *flags)
        assert done.returncode == 1 and done.stderr.strip().splitlines()[-1] == (
            f"mieb-ray: error: {unfinished} holds an unfinished run of build (2 files) in format version "
            f"{FORMAT_VERSION - 1}; this mieb-ray writes version {FORMAT_VERSION}: pass --overwrite to start again")
    assert tree(unfinished) == before
    assert command(mirror, unfinished, "--datasets", "cifar10", "--overwrite").returncode == 0
