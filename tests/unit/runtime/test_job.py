"""A job's output rules (mieb_ray/runtime/job.py): a complete output refused, an unfinished one resumed or
overwritten, other settings or units refused naming what differs, the error rate enforced, stale files removed, the
manifest last; a unit that never comes back is an error, one that comes twice counts once."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from mieb_ray import storage
from mieb_ray.errors import UserError
from mieb_ray.runtime import units
from mieb_ray.runtime.job import Job

pytestmark = pytest.mark.timeout(300)


def test_a_job_refuses_to_replace_work_by_mistake(tmp_path):
    out = tmp_path / "out"
    ours = re.compile(r"^\d+\.txt$")
    job = Job("test", str(out), "a complete test", ours)
    job.start()
    job.earlier({}, {"v": 1})
    job.progress.record("u0", {"lo": 0}, {"rows": 1})
    (out / "0.txt").write_text("x")
    plain = Job("test", str(out), "a complete test", ours)
    plain.start()
    with pytest.raises(UserError, match=r"out holds an unfinished run of test \(2 files\); pass --resume to "
                                        r"continue it or --overwrite to start again$"):
        plain.earlier({"u0": {"lo": 0}}, {"v": 1})
    with pytest.raises(UserError, match=r"out holds an unfinished run of test \(2 files\), started with other "
                                        r"settings \(v 1 -> 2\); pass --resume"):
        plain.earlier({"u0": {"lo": 0}}, {"v": 2})
    resumed = Job("test", str(out), "a complete test", ours, resume=True)
    resumed.start()
    assert resumed.earlier({"u0": {"lo": 0}, "u1": {"lo": 1}}, {"v": 1}) == {"u0": {"rows": 1}}
    assert resumed.earlier({"u0": {"lo": 5}}, {"v": 1}) == {}  # its input changed: made again
    with pytest.raises(UserError, match=r"started with other settings: v 1 -> 2; pass --resume with its settings"):
        resumed.earlier({"u0": {"lo": 0}}, {"v": 2})
    with pytest.raises(UserError, match=r"started with other settings: 1 of its units are not in this run's plan "
                                        r"\(e\.g\. u0\); pass"):  # other --datasets: its work is never orphaned
        resumed.earlier({"u9": {"lo": 0}}, {"v": 1})
    assert (out / "0.txt").exists() and (out / storage.PROGRESS / "u0.json").exists()  # refusals change nothing
    again = Job("test", str(out), "a complete test", ours, overwrite=True)
    again.start()  # the unfinished run's files are gone
    assert not (out / "0.txt").exists() and not (out / storage.PROGRESS).exists()
    again.earlier({}, {"v": 1})
    (out / "1.txt").write_text("x")
    (out / "7.txt").write_text("stale")
    with pytest.raises(UserError, match=r"^3 of 10 rows could not be made \(x: 3\), more than --max-error-rate 0.1; "
                                        r"see .*out/_errors$"):
        again.check_errors(3, 7, 0.1, "made", "x: 3")
    again.check_errors(1, 9, 0.1, "made")
    assert again.finish({"format": "test"}, {"1.txt"}) == {"format": "test"}
    assert sorted(p.name for p in out.iterdir()) == ["1.txt", storage.MANIFEST]  # the stale file removed
    with pytest.raises(UserError, match="already holds a complete test"):
        Job("test", str(out), "a complete test", ours).start()


def lossy(batch: dict) -> dict:
    """A last stage that loses unit 1 and hands unit 2 back twice."""
    units_out = [u for u in batch["unit"] if u != 1] + [u for u in batch["unit"] if u == 2]
    return {"unit": np.array(units_out, dtype=np.int64),
            "result": np.array([json.dumps({"rows": 1}) for _ in units_out], dtype=object)}


def test_a_unit_that_never_comes_back_is_an_error_and_one_that_comes_twice_counts_once(tmp_path):
    job = Job("test", str(tmp_path / "out"), "a complete test", re.compile("^$"), log=lambda _: None)
    assert job.run([0, 2], [units.Stage(lossy)], "local") == [{"rows": 1}, {"rows": 1}]
    with pytest.raises(RuntimeError, match=r"^1 of 3 units did not come back \(e\.g\. unit 1\)"):
        job.run([0, 1, 2], [units.Stage(lossy)], "local")
