"""Progress of long work off a terminal (issue 26, item 5): ``fedlatent experiment`` writes one
timestamped line per step to stderr when stderr is not a terminal (here: a pipe)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

LINE = re.compile(r"^\d\d:\d\d:\d\d fedem_toy (\d+)/(\d+): (homogeneous|heterogeneous) clients, "
                  r"seed \d+, .+ \(\d+ rounds\)$")
SRC = str(Path(__file__).resolve().parents[2] / "src")

#: the CLI with fedem_toy shrunk (the command always runs its --quick size)
SMALL_TOY = """
import functools, sys
import fedlatent.experiments as e
from fedlatent.experiments.fedem_toy import fedem_toy
e.fedem_toy = functools.partial(fedem_toy, n_clients=8, n_per_client=30, n_seeds=1, rounds=6,
                                settings=["EM (p=1)", "FedEM p=1", "naive FedEM p=1"])
from fedlatent.cli import app
app(sys.argv[1:], prog_name="fedlatent")
"""


def _env():
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", ""),
           "MPLBACKEND": "Agg"}
    env.pop("FEDLATENT_DEBUG", None)
    return env


def _run(code_or_module: list[str], args: list[str], timeout: float):
    """Run ``python ...`` with stdout and stderr on pipes (not terminals); the stderr lines
    with the seconds since the start at which each arrived, and the total seconds."""
    start = time.monotonic()
    proc = subprocess.Popen([sys.executable, *code_or_module, *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=_env())
    arrivals: list[tuple[float, str]] = []

    def read():
        for line in proc.stderr:
            arrivals.append((time.monotonic() - start, line.rstrip("\n")))

    reader = threading.Thread(target=read)
    reader.start()
    out = proc.stdout.read()
    proc.wait(timeout=timeout)
    reader.join()
    return proc.returncode, out, arrivals, time.monotonic() - start


def test_experiment_off_a_terminal_logs_one_line_per_step(tmp_path):
    code, out, lines, _ = _run(["-c", SMALL_TOY], ["experiment", "fedem_toy", "--quick",
                                                   "--out", str(tmp_path)], timeout=300)
    assert code == 0, (out, lines)
    steps = [LINE.match(text) for _, text in lines]
    assert all(steps), [text for _, text in lines]
    assert [int(m.group(1)) for m in steps] == list(range(1, 7))
    assert {int(m.group(2)) for m in steps} == {6}  # 2 cases x 1 seed x 3 settings
    assert "wrote " in out and "fedem_toy.csv" in out


def test_no_progress_silences_the_lines(tmp_path):
    code, out, lines, _ = _run(["-c", SMALL_TOY], ["experiment", "fedem_toy", "--quick",
                                                   "--no-progress", "--out", str(tmp_path)],
                               timeout=300)
    assert code == 0, (out, lines)
    assert lines == []


@pytest.mark.slow
def test_experiment_quick_reports_at_least_every_ten_seconds(tmp_path):
    """The real ``fedlatent experiment fedem_toy --quick`` (about 160 s on the shared machine)."""
    code, out, lines, total = _run(["-m", "fedlatent.cli"], ["experiment", "fedem_toy",
                                                             "--quick", "--out", str(tmp_path)],
                                   timeout=900)
    assert code == 0, (out, lines)
    times = [0.0] + [t for t, text in lines if LINE.match(text)] + [total]
    gaps = [b - a for a, b in zip(times, times[1:])]
    assert len(times) == 2 + 2 * 4 * 7
    assert max(gaps) <= 10.0, max(gaps)
