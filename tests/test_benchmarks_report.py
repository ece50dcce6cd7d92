"""benchmarks/report.py: the benchmarks' printed results, parsed and written as Markdown."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def load_report():
    spec = importlib.util.spec_from_file_location("bench_report", ROOT / "benchmarks" / "report.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


report = load_report()
BY_SCRIPT = {b.script: b for b in report.BENCHES}

#: what the scripts print (copied from runs on the project's machine)
OUTPUTS = {
    "bench_gmm.py": (
        "data: 100 clients, 200,000 samples, d=32, K=3, full covariance; BLAS threads: 1\n"
        "fedlatent FederatedGaussianMixture: 2.286 s per round (median of 4)\n"
        "scikit-learn GaussianMixture:       4.851 s per iteration (pooled data)\n"
        "ratio ours/scikit-learn: 0.47\n"
        "peak memory above the data: ours 99 MiB, scikit-learn 156 MiB (data: 49 MiB pooled)\n"),
    "bench_lcr.py": (
        "data: 50 clients, 100,000 rows, d=8 (+ intercept), K=3; BLAS threads: 1\n"
        "fedlatent LatentClassRegression: 0.105 s per round (median of 4)\n"
        "centralized NumPy EM:            0.090 s per iteration (pooled rows)\n"
        "ratio ours/NumPy: 1.17   (final coefficients agree to 3.1e-15)\n"),
    "bench_fedgmm.py": (
        "data: 30 clients, 30000 samples, d = 32 (0.4 s to generate)\n"
        "federated fit: 20 rounds, converged: False, 31.0 s in all (initialization included)\n"
        "seconds per federated round (rounds 2..20): 1.250\n"
        "seconds per centralized E+M iteration (pooled arrays): 0.700\n"
        "ratio round / centralized iteration: 1.79 (target <= 3)\n"),
}


@pytest.mark.parametrize(("script", "expected"), [
    ("bench_gmm.py", ("100 clients, 200,000 samples, d=32, K=3, full covariance; BLAS threads: 1",
                      "2.286", "4.851", "0.47")),
    ("bench_lcr.py", ("50 clients, 100,000 rows, d=8 (+ intercept), K=3; BLAS threads: 1",
                      "0.105", "0.090", "1.17")),
    ("bench_fedgmm.py", ("30 clients, 30000 samples, d = 32 (0.4 s to generate)",
                         "1.250", "0.700", "1.79")),
])
def test_parse_reads_the_data_the_seconds_and_the_ratio_each_script_prints(script, expected):
    row = report.parse(BY_SCRIPT[script], OUTPUTS[script])
    assert (row["data"], row["ours"], row["theirs"], row["ratio"]) == expected


def test_parse_names_the_script_and_the_line_it_did_not_find():
    text = OUTPUTS["bench_lcr.py"].replace("ratio ours/NumPy", "quotient")
    with pytest.raises(ValueError, match=r"bench_lcr\.py: no line matching .*ratio ours/NumPy"):
        report.parse(BY_SCRIPT["bench_lcr.py"], text)


def test_the_markdown_names_date_machine_versions_and_gives_one_row_per_benchmark():
    info = {"date": "2026-11-26 03:40 UTC", "cpu": "Some CPU @ 2.00GHz", "cores": "2",
            "load": "3.5", "versions": "Python 3.12.1, fedlatent 0.1.0, NumPy 2.4.6, "
            "scikit-learn 1.8.0"}
    rows = [(b, report.parse(b, OUTPUTS[b.script]), 12.4) for b in report.BENCHES]
    text = report.to_markdown(rows, info, "python benchmarks/report.py")
    lines = text.splitlines()
    assert lines[0] == ("Measured 2026-11-26 03:40 UTC on Some CPU @ 2.00GHz (2 cores, load "
                        "average 3.5 at the end), Python 3.12.1, fedlatent 0.1.0, NumPy 2.4.6, "
                        "scikit-learn 1.8.0; written by `python benchmarks/report.py`.")
    table = [line for line in lines if line.startswith("|")]
    assert len(table) == 2 + 3 and all(line.count("|") == 8 for line in table)
    assert [c.strip() for c in table[2].split("|")[3:8]] == [
        "2.286", "one scikit-learn `GaussianMixture` EM iteration on the pooled rows", "4.851",
        "0.47", "12"]


def test_the_machine_header_has_a_date_a_cpu_and_a_core_count():
    info = report.machine()
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d UTC", info["date"])
    assert info["cpu"] and int(info["cores"]) >= 1
    assert re.match(r"Python 3\.\d+\.\d+, fedlatent \d", info["versions"])
