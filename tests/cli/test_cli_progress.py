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

import fedlatent

LINE = re.compile(r"^\d\d:\d\d:\d\d fedem_toy (\d+)/(\d+): (homogeneous|heterogeneous) clients, "
                  r"seed \d+, .+ \(\d+ rounds\)$")
STARTING = re.compile(r"^\d\d:\d\d:\d\d experiment fedem_toy: starting \(quick\)$")
DRAWING = re.compile(r"^\d\d:\d\d:\d\d fedem_toy: (drawing|wrote) .+fedem_toy_(h|weight)\.png$")
#: the source tree of the fedlatent under test (the subprocesses import the same one)
SRC = str(Path(fedlatent.__file__).resolve().parents[1])

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
    assert [DRAWING.match(text).groups() for _, text in lines[-4:]] == [
        ("drawing", "h"), ("wrote", "h"), ("drawing", "weight"), ("wrote", "weight")]
    assert STARTING.match(lines[0][1]), lines[:2]  # printed as soon as the command runs
    steps = [LINE.match(text) for _, text in lines[1:-4]]
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


@pytest.mark.usefixtures("saturation_rule_off")
@pytest.mark.slow
def test_experiment_quick_reports_at_least_every_ten_seconds(tmp_path):
    """The real ``fedlatent experiment fedem_toy --quick`` (about 160 s on the shared machine)."""
    code, out, lines, total = _run(["-m", "fedlatent.cli"], ["experiment", "fedem_toy",
                                                             "--quick", "--out", str(tmp_path)],
                                   timeout=900)
    assert code == 0, (out, lines)
    # from the command's first line (it prints one as soon as it runs; before it, the
    # interpreter starts, as the flower local test counts from "deployment ready")
    assert STARTING.match(lines[0][1]), lines[:2]
    times = [lines[0][0]] + [t for t, text in lines if LINE.match(text) or DRAWING.match(text)]
    times.append(total)
    gaps = [b - a for a, b in zip(times, times[1:])]
    assert len(times) == 2 + 2 * 4 * 7 + 4
    assert max(gaps) <= 10.0, max(gaps)


# ---- flower local: a line while no round ends ---------------------------------------------------
def test_waiting_on_a_deployment_reports_every_few_seconds(tmp_path):
    import json

    from fedlatent.runtime.flower_local import _wait_reporting

    (tmp_path / "status.json").write_text(json.dumps(
        {"status": "running", "round": 0, "exchanges": 3, "exchange": "init_means"}))
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(2.4)"])
    calls: list[tuple[float, dict | None, float]] = []
    start = time.monotonic()
    _wait_reporting(proc, start + 60, tmp_path / "status.json", on_round=lambda s: None,
                    on_wait=lambda s, t: calls.append((time.monotonic() - start, s, t)),
                    wait_every=0.5)
    assert len(calls) >= 3
    assert all(s["exchanges"] == 3 for _, s, _ in calls)
    times = [0.0] + [t for t, _, _ in calls]
    assert max(b - a for a, b in zip(times, times[1:])) <= 1.2
    assert all(abs(elapsed - t) < 0.3 for t, _, elapsed in calls)


@pytest.mark.parametrize("status, line", [
    (None, "... 12 s: waiting for the server app to start and the clients to answer"),
    ({"round": 0, "exchanges": 4, "exchange": "init_kmeans"},
     "... 12 s: initialization: 4 exchanges with the clients done (last: init_kmeans)"),
    ({"round": 2, "exchanges": 9}, "... 12 s: round 3 running"),
])
def test_the_waiting_line_says_what_the_server_does(capsys, status, line):
    from fedlatent.cli.flower_run import _print_wait

    _print_wait(status, 12.2)
    assert capsys.readouterr().out == line + "\n"


# The real loopback deployment (``flower local gmm`` with stdout on a pipe, a line at least every
# 10 s): the command of docs/flower.md, run once with that page's other examples and checked in
# tests/test_docs_code_blocks.py (test_flower_local_of_the_page_reports_at_least_every_ten_seconds).
