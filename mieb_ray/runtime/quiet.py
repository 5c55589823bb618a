"""A job prints its own lines and Ray's errors, nothing else (--verbose keeps the rest): the CLI runs every
command inside quiet()."""

from __future__ import annotations

import logging
import os
import re
import sys
import threading
import warnings
from contextlib import contextmanager

# Ray's lines that are no error of the job, as its driver writes them to this process's stderr: its C++ log
# (`[2026-12-02 21:16:56,714 E 6571 6571] core_worker.cc:2465: Actor with class name ... restart will fail ...`)
# and the raylets' warnings and retry notices (`(raylet) WARNING: 10 PYTHON worker processes have been started`,
# `(raylet) Task ... failed. There are infinite retries remaining, so the task will be retried`: a task that fails
# for good reaches the job as an exception); a raylet's other lines (a worker killed for memory, say) pass
_RAY_LINE = re.compile(rb"^(\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ [DIWE] \d+ \d+\] [\w/.]+\.cc:\d+: |"
                       rb"(\x1b\[\d+m)?\(raylet(, ip=[\d.]+)?\)(\x1b\[0m)? (WARNING: |Task .* will be retried))")


@contextmanager
def quiet():
    """A job prints its own lines and Ray's errors, nothing else (--verbose keeps the rest). Ray's Python loggers,
    Ray Data's and the workers' output are runtime/cluster.py's; here, the tqdm bars of transformers and the hub
    (the workers' too: hubfs.WORKER_ENV) and of `datasets` (mteb's maps in this process), the hub client's retry
    notices (huggingface_hub's warnings: its retries of a request, in this process), Python's warnings, and
    the lines of Ray core's C++ log and the raylets' warnings that its driver writes straight to the stdout and
    stderr descriptors (among them an actor pool's 'restart will fail', an E line that is no error of the job: a
    failure reaches the job as an exception). Everything else passes, in order."""
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")  # mteb's dataset maps, in this process
    if "transformers" in sys.modules:  # it read the variable at import
        sys.modules["transformers"].utils.logging.disable_progress_bar()
    if "datasets" in sys.modules:
        sys.modules["datasets"].disable_progress_bars()
    hub_log = logging.getLogger("huggingface_hub")
    level = hub_log.level
    hub_log.setLevel(logging.ERROR)  # its retry notices: a request that fails for good reaches the job as an error
    try:
        with _filtered(2, sys.stderr), _filtered(1, sys.stdout), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # libraries' warnings (sklearn's on a class never predicted): not the job's
            yield
    finally:
        hub_log.setLevel(level)


@contextmanager
def _filtered(fd: int, stream):
    """Descriptor `fd` through a pipe whose lines pass unless they are Ray's (_RAY_LINE)."""
    stream.flush()
    saved, (read, write) = os.dup(fd), os.pipe()
    os.dup2(write, fd)
    os.close(write)

    def pump() -> None:
        with open(read, "rb", buffering=0) as lines:
            writable = True
            for line in lines:  # drained to the end even when the reader went away (`| head`): no writer blocks
                if writable and not _RAY_LINE.match(line):
                    try:
                        os.write(saved, line)
                    except OSError:
                        writable = False

    thread = threading.Thread(target=pump, name=f"mieb-fd{fd}", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stream.flush()
        os.dup2(saved, fd)  # the pipe's last writer closes: the pump drains it and ends
        thread.join(timeout=5)
        os.close(saved)
