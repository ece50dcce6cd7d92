"""Run the ratio benchmarks and write their results as a Markdown snippet for the documentation.

Each benchmark (``bench_gmm.py``, ``bench_lcr.py``, ``bench_fedgmm.py``) runs in its own process,
at the sizes given below (small by default, so the whole report takes a few minutes on a shared
2-core machine); its printed timings and ratio are parsed and written as one table, headed by
the date, the CPU model, the core count, the load average and the versions of Python,
fedlatent, NumPy and scikit-learn. ``docs/benchmarks.md`` includes the file.

    python benchmarks/report.py [--full] [--out docs/benchmarks/performance.md]

``--full`` runs each benchmark at its default size (1,000,000 samples: tens of minutes).
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import fedlatent

HERE = Path(__file__).resolve().parent
DEFAULT_OUT = HERE.parent / "docs" / "benchmarks" / "performance.md"


@dataclass(frozen=True)
class Bench:
    """One benchmark script, its arguments and the lines its results are read from."""

    title: str
    script: str
    small: tuple[str, ...]  # arguments of the small (default) run
    reference: str  # what the ratio compares against
    ours: str  # regex with one group: our seconds per round
    theirs: str  # regex with one group: the reference's seconds
    ratio: str  # regex with one group: the printed ratio
    data: str = r"^data: (.*)$"  # the data line the script prints first


BENCHES = (
    Bench("Gaussian mixture", "bench_gmm.py",
          ("--samples", "50000", "--clients", "50", "--rounds", "4"),
          "one scikit-learn `GaussianMixture` EM iteration on the pooled rows",
          r"FederatedGaussianMixture: ([\d.]+) s", r"^scikit-learn GaussianMixture: +([\d.]+) s",
          r"^ratio ours/scikit-learn: ([\d.]+)"),
    Bench("Latent class regression", "bench_lcr.py",
          ("--samples", "100000", "--clients", "50", "--rounds", "4"),
          "one NumPy EM iteration on the pooled rows",
          r"LatentClassRegression: ([\d.]+) s", r"NumPy EM: +([\d.]+) s",
          r"^ratio ours/NumPy: ([\d.]+)"),
    Bench("FedGMM", "bench_fedgmm.py", ("--quick", "--max-rounds", "20"),
          "one centralized E+M iteration of the same model on the pooled arrays",
          r"round \(rounds [^)]*\): ([\d.]+)", r"centralized E\+M iteration [^:]*: ([\d.]+)",
          r"^ratio round / centralized iteration: ([\d.]+)"),
)


def parse(bench: Bench, output: str) -> dict[str, str]:
    """The data description, our seconds, the reference's seconds and the ratio printed by
    ``bench``'s script. Raises ValueError naming the script and the missing line."""
    row = {}
    for key in ("data", "ours", "theirs", "ratio"):
        m = re.search(getattr(bench, key), output, flags=re.MULTILINE)
        if m is None:
            raise ValueError(f"{bench.script}: no line matching {getattr(bench, key)!r} in its "
                             f"output:\n{output}")
        row[key] = m.group(1).strip()
    return row


def cpu_model() -> str:
    """The CPU model from /proc/cpuinfo (Linux), else what ``platform`` knows."""
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8")
    except OSError:
        text = ""
    m = re.search(r"^model name\s*:\s*(.+)$", text, flags=re.MULTILINE)
    return m.group(1).strip() if m else (platform.processor() or platform.machine())


def _version(dist: str) -> str:
    try:
        return version(dist)
    except PackageNotFoundError:
        return "not installed"


def machine() -> dict[str, str]:
    """Date, CPU, cores, load and versions: the header of the report."""
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    return {
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "cpu": cpu_model(),
        "cores": str(os.cpu_count()),
        "load": "n/a" if load is None else f"{load[0]:.1f}",
        "versions": (f"Python {platform.python_version()}, fedlatent {fedlatent.__version__}, "
                     f"NumPy {_version('numpy')}, scikit-learn {_version('scikit-learn')}"),
    }


def to_markdown(rows: list[tuple[Bench, dict[str, str], float]], info: dict[str, str],
                command: str) -> str:
    """The snippet: a header naming the machine, then one table row per benchmark."""
    lines = [
        f"Measured {info['date']} on {info['cpu']} ({info['cores']} cores, load average "
        f"{info['load']} at the end), {info['versions']}; written by `{command}`.",
        "",
        "| Benchmark | Data | fedlatent s per round | Reference | Reference s | Ratio | Run s |",
        "|---|---|---|---|---|---|---|",
    ]
    for bench, row, seconds in rows:
        lines.append(f"| {bench.title} (`{bench.script}`) | {row['data']} | {row['ours']} | "
                     f"{bench.reference} | {row['theirs']} | {row['ratio']} | {seconds:.0f} |")
    return "\n".join(lines) + "\n"


def run(bench: Bench, full: bool) -> tuple[dict[str, str], float]:
    """Run one benchmark script in its own process; its parsed row and its wall seconds."""
    args = () if full else bench.small
    t = time.perf_counter()
    done = subprocess.run([sys.executable, str(HERE / bench.script), *args], check=True,
                          capture_output=True, text=True)
    return parse(bench, done.stdout), time.perf_counter() - t


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--full", action="store_true", help="the benchmarks' default (full) sizes")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    a = ap.parse_args(argv)
    rows = []
    for bench in BENCHES:
        row, seconds = run(bench, a.full)
        print(f"{bench.script}: ratio {row['ratio']} ({seconds:.0f} s)", flush=True)
        rows.append((bench, row, seconds))
    command = "python benchmarks/report.py" + (" --full" if a.full else "")
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(to_markdown(rows, machine(), command), encoding="utf-8")
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
