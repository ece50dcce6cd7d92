"""Run the benchmarks and write their results, dated, into the documentation's benchmarks page.

One command (``make bench``) regenerates, from one run:

- ``docs/benchmarks/performance.md`` (included by ``docs/benchmarks.md``, the one page with dated
  measurements): every table each benchmark printed;
- with ``--readme PATH``, also the block of PATH between ``<!-- performance:begin -->`` and
  ``<!-- performance:end -->``: each benchmark's final table (the project's README links the
  benchmarks page instead: user pages carry no dated measurements).

Both are headed by the date, the CPU model, the core count, the load average and the versions
of Python, fedlatent, NumPy and scikit-learn, and name the command that wrote them. Each
benchmark runs in its own process, at quick sizes by default (about twenty minutes on a busy 2-core
machine) or with ``--full`` at the largest sizes (an hour or more). What a benchmark prints is
taken as it is, not parsed: its Markdown table rows (``| ... |``, each table with the line
printed before it as its caption) when it prints some, else its whole output as a text block.
Only the per-round ratios of ``bench_gmm.py``, ``bench_lcr.py`` and ``bench_fedgmm.py`` are
read from their printed lines, into one table. A benchmark that fails (non-zero exit, time-out,
nothing printed) is written as failed with the end of its error output: never left out, never
replaced by older numbers.

    python benchmarks/report.py [--full] [--timeout SECONDS] [--out PATH] [--readme PATH]
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib import import_module
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import fedlatent

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
DEFAULT_OUT = ROOT / "docs" / "benchmarks" / "performance.md"
BEGIN, END = "<!-- performance:begin -->", "<!-- performance:end -->"
#: lines of a failed benchmark's error output written under it, and their longest shown
ERROR_LINES, ERROR_WIDTH = 12, 400


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


@dataclass(frozen=True)
class Script:
    """A benchmark whose printed tables are written as they are: its title, what it measures,
    its script (in ``benchmarks/``, or a path) and its arguments at the quick and full sizes."""

    title: str
    what: str
    script: str
    quick: tuple[str, ...]
    full: tuple[str, ...] = ()

    def command(self, full: bool) -> str:
        """The command line, as a reader would type it from the repository's root."""
        path = Path(self.script)
        shown = f"benchmarks/{path.name}" if (HERE / path).parent == HERE else path.name
        return " ".join(("python", shown, *(self.full if full else self.quick)))


SCRIPTS = (
    Script("Rounds to tolerance", "rounds of plain and accelerated federated EM (SQUAREM; "
           "subspace Newton, three points a round) to tol 1e-6 against scikit-learn's EM "
           "iterations (GMM, K = 4, d = 5, overlapping, 20 clients), against flexmix-style EM "
           "(LCR), and plain against accelerated (FedGMM, LCA)", "rounds_to_tol.py",
           ("--seeds", "1"), ()),
    Script("Accelerated EM variants (prototype)", "a centralized NumPy prototype counting the "
           "rounds of accelerated EM variants that send several points a round (SQUAREM's "
           "step lengths; Newton on F(s) - s in the span of the last steps, its Jacobian from "
           "secants or finite differences) against scikit-learn's EM iterations on "
           "rounds_to_tol.py's data: what a third of them takes (B'' is the engine's "
           "acceleration=\"newton\")",
           "accel_variants.py", ("--quick",), ()),
    Script("A round at 100,000 clients against scikit-learn's iteration", "a round of plain "
           "federated EM with every reply check on (the screen of the replies, the disclosure "
           "rules but saturation) at 100,000 clients of 10 rows against one scikit-learn EM "
           "iteration on the pooled rows from the same start, one BLAS thread, same process "
           "(one process; --full: median of three)", "bench_clients.py",
           ("--round-table", "--sizes", "100000", "--repeats", "1"),
           ("--round-table", "--sizes", "100000", "--repeats", "3")),
    Script("Whole default fit against scikit-learn", "a whole default fit, initialization "
           "included, on clients of 10 rows against scikit-learn's whole default fit on the "
           "pooled rows, one BLAS thread, same process (10,000 and 100,000 clients, one "
           "process each; --full: median of three)",
           "bench_clients.py", ("--whole", "--repeats", "1"), ("--whole",)),
    Script("Where the whole fit's time goes", "the whole default fit at 100,000 clients of 10 "
           "rows part by part (setup, the start's exchanges, each round's E-step, reply screen, "
           "weighted sum, mirror, M-step) against scikit-learn's k-means start, E-steps and "
           "M-steps, CPU seconds in one process (the second fit of each)",
           "bench_whole_account.py", (), ()),
    Script("A fresh process: the quickstart's first fit, predict and score", "wall seconds of "
           "the README quickstart's first fit in a new process (numba's cache as installed "
           "and empty) and of `fedlatent predict` and `fedlatent score` on 200 rows, whole "
           "commands", "bench_startup.py", ("--repeats", "3"), ("--repeats", "5")),
    Script("A deployed round against Flower's empty round", "rounds of the default fit, plain "
           "and under acceleration=\"newton\"; then a loopback deployment's GMM round (3 "
           "sites of 40 rows) against Flower's empty Message-API round on the same "
           "deployment, in both of Flower's isolation modes, and when the server app had "
           "every node's first answer", "bench_flower_round.py",
           ("--rounds", "4", "--floor-rounds", "6", "--newton-seeds", "3"),
           ("--rounds", "6", "--floor-rounds", "10", "--newton-seeds", "6")),
    Script("FedHLCR against the Gibbs sampler", "CPU seconds of the whole default fit "
           "`fl.HLCR()` (every agent each round) against `solver=\"gibbs\"` on SYNTHHLCR "
           "(quick: 40 agents and 600 entities; --full: 130 agents and 2,400 entities)",
           "bench_hlcr.py", ("--quick", "--gibbs"), ("--gibbs",)),
    Script("Secure aggregation (SecAgg+) against plain", "set-up and round of a secure fit "
           "against the plain per-client round, GMM d = 4, K = 3, p = 0.7, in-process "
           "(10 and 100 clients; --full: 10, 100 and 1,000)", "bench_secagg_scale.py",
           ("--clients", "10", "100"), ("--clients", "10", "100", "1000")),
    Script("Verified secure rounds: the checks a site adds", "CPU and bytes down a site adds "
           "to check a secure round's projected sum tree and replay the server's update and "
           "M-step, against the unverified secure round's, GMM d = 4, K = 3, full "
           "participation, each site replaying alone (100 clients; --full: 1,000)",
           "bench_verified_round.py",
           ("--clients", "100"), ("--clients", "1000")),
    Script("Privacy-utility at epsilon 1", "held-out metric of each DP-capable model at "
           "epsilon 1, delta 1e-5, against the non-private fit on the same data "
           "(`fl.experiments.privacy_utility`; quick: its quick size; --full: 10^5 records, "
           "three seeds)", "report.py", ("--privacy-table",),
           ("--privacy-table", "--full")),
)


@dataclass(frozen=True)
class Run:
    """One benchmark process: wall seconds, what it printed and, when it failed, why."""

    seconds: float
    stdout: str
    stderr: str
    error: str | None = None  # None: it succeeded


def execute(script: str | Path, args: tuple[str, ...], timeout: float | None) -> Run:
    """Run ``script`` (in ``benchmarks/`` or a path) with ``args`` in its own process (and
    process group, so a time-out also ends the processes it started)."""
    t = time.perf_counter()
    proc = subprocess.Popen([sys.executable, str(HERE / script), *args], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        return Run(time.perf_counter() - t, out, err, f"timed out after {timeout:.0f} s")
    seconds = time.perf_counter() - t
    if proc.returncode != 0:
        return Run(seconds, out, err, f"exit code {proc.returncode} after {seconds:.0f} s")
    if not out.strip():
        return Run(seconds, out, err, "printed nothing")
    return Run(seconds, out, err)


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


def header(info: dict[str, str], command: str) -> str:
    """The first line of the page and of the README block: date, machine, versions, command."""
    total = f" in {info['total']}" if "total" in info else ""
    return (f"Measured {info['date']} on {info['cpu']} ({info['cores']} cores, load average "
            f"{info['load']} at the end), {info['versions']}; written by `{command}`{total}.")


def ratio_table(rows: list[tuple[Bench, dict[str, str], float]]) -> list[str]:
    """One row per per-round benchmark; a row without a ratio (``{"error": ...}``) says failed."""
    lines = ["| Benchmark | Data | fedlatent s per round | Reference | Reference s | Ratio "
             "| Run s |", "|---|---|---|---|---|---|---|"]
    for bench, row, seconds in rows:
        if "error" in row:
            why = row["error"].replace("|", "\\|")
            lines.append(f"| {bench.title} (`{bench.script}`) | **failed**: {why} | - | "
                         f"{bench.reference} | - | failed | {seconds:.0f} |")
            continue
        lines.append(f"| {bench.title} (`{bench.script}`) | {row['data']} | {row['ours']} | "
                     f"{bench.reference} | {row['theirs']} | {row['ratio']} | {seconds:.0f} |")
    return lines


def to_markdown(rows: list[tuple[Bench, dict[str, str], float]], info: dict[str, str],
                command: str) -> str:
    """The header naming the machine, then the per-round ratios, one table row per benchmark."""
    return "\n".join([header(info, command), "", *ratio_table(rows)]) + "\n"


_ROW = re.compile(r"^\s*\|.*\|\s*$")


def tables(stdout: str) -> list[list[str]]:
    """The Markdown tables a benchmark printed, each as its caption (the last non-empty line
    printed before it, if any and not a table's) followed by its rows; [] when it printed
    none."""
    found, caption, rows = [], None, []
    for line in [*stdout.splitlines(), ""]:
        if _ROW.match(line):
            rows.append(line.strip())
            continue
        if rows:
            found.append(([caption] if caption else []) + rows)
            caption, rows = None, []
        if line.strip():
            caption = line.strip()
    return found


def captured(stdout: str, final_only: bool) -> list[str]:
    """What a benchmark printed, as Markdown: its tables (the last one if ``final_only``), or,
    when it printed no Markdown row, its whole output as a text block."""
    found = tables(stdout)
    if not found:
        text = re.sub(r"\n{3,}", "\n\n", stdout.strip("\n").replace("```", "'''"))
        return ["```text", *[line.rstrip() for line in text.splitlines()], "```"]
    lines = []
    for table in found[-1:] if final_only else found:
        if not _ROW.match(table[0]):  # its caption, a paragraph of its own
            lines += [table[0], ""]
            table = table[1:]
        lines += [*table, ""]
    return lines[:-1]


def failure(run: Run, lines: int) -> list[str]:
    """A failed benchmark: why, and the last ``lines`` lines of its error output (paths of
    this checkout shown relative to it, each line cut at ``ERROR_WIDTH`` characters)."""
    tail = run.stderr.replace(str(ROOT) + os.sep, "").strip().splitlines()[-lines:]
    tail = [t.rstrip().replace("```", "'''") for t in tail]
    tail = [t if len(t) <= ERROR_WIDTH else t[:ERROR_WIDTH - 4] + " ..." for t in tail]
    out = [f"**failed**: {run.error}."]
    return out + (["", "```text", *tail, "```"] if tail else [])


def section(bench: Script, run: Run, full: bool, brief: bool) -> list[str]:
    """One benchmark's part: a title line naming its command and time, then its tables (the
    final one if ``brief``, as in the README) or its failure."""
    title = (f"**{bench.title}** (`{bench.command(full)}`, {run.seconds:.0f} s)" if brief else
             f"### {bench.title}")
    lines = [title, ""]
    if not brief:
        lines += [f"`{bench.command(full)}`, {run.seconds:.0f} s: {bench.what}.", ""]
    body = failure(run, 1 if brief else ERROR_LINES) if run.error else captured(run.stdout, brief)
    return lines + body + [""]


def page(runs: list[tuple[Script, Run]], rows: list, info: dict[str, str], command: str,
         full: bool) -> str:
    """``docs/benchmarks/performance.md``: the header, every table of every benchmark, then
    the per-round ratios."""
    lines = [header(info, command), ""]
    for bench, run in runs:
        lines += section(bench, run, full, brief=False)
    lines += ["### Seconds per round against the centralized iteration", "",
              "Each benchmark's quick size (`--full`: its default size); a ratio is "
              "fedlatent's seconds per federated round (in-process, every client takes part) "
              "over the reference's seconds per iteration on the pooled rows, same run.", "",
              *ratio_table(rows)]
    return "\n".join(lines) + "\n"


def readme_block(runs: list[tuple[Script, Run]], rows: list, info: dict[str, str],
                 command: str, full: bool) -> str:
    """The README's block (between the markers): the header, each benchmark's final table,
    the per-round ratios; the full tables are in docs/benchmarks.md."""
    lines = [header(info, command) + " Every table: "
             "[docs/benchmarks.md](docs/benchmarks.md#performance).", ""]
    for bench, run in runs:
        lines += section(bench, run, full, brief=True)
    lines += ["**Seconds per round against the centralized iteration**", "", *ratio_table(rows)]
    return "\n".join(lines) + "\n"


def replace_block(text: str, block: str, where: str = "README.md") -> str:
    """``text`` with what lies between its one ``BEGIN`` and its one ``END`` marker lines
    replaced by ``block``; everything else, the markers included, unchanged."""
    begins, ends = text.count(BEGIN), text.count(END)
    if begins != 1 or ends != 1 or text.index(BEGIN) > text.index(END):
        raise ValueError(f"{where}: expected one {BEGIN} line, then one {END} line (found "
                         f"{begins} and {ends}); add them where the performance block belongs")
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    body = block.strip("\n")
    return f"{head}{BEGIN}\n{body}{chr(10) if body else ''}{END}{tail}"


def privacy_table(full: bool) -> None:
    """Print the privacy-utility rows at epsilon 1 as a Markdown table (``--privacy-table``,
    run by the report in a process of its own)."""
    privacy_utility = import_module("fedlatent.experiments.privacy_utility").privacy_utility
    kw = dict(sizes=(100_000,), n_seeds=3) if full else dict(quick=True)
    # each model's own private plan (max_rounds=None), as a user's private fit runs
    table = privacy_utility(epsilons=(1.0,), max_rounds=None, **kw)
    settings, skipped = table.attrs.get("settings", {}), table.attrs.get("skipped", {})
    rounds = settings.get("max_rounds", "?")
    print(f"epsilon 1, delta {settings.get('delta', 1e-5):g}, {settings.get('noise', '?')} "
          f"noise, {settings.get('n_clients', '?')} clients, rounds: "
          f"{'each fit its default plan' if rounds is None else rounds}; held-out metric of "
          "the private and the non-private fit on the same data and seeds"
          + "".join(f"; {name} skipped ({why})" for name, why in skipped.items()))
    print("| model | metric | records | seeds | private | non-private | relative loss "
          "| failed fits |")
    print("|---|---|---|---|---|---|---|---|")
    for r in table[table["epsilon"] == 1.0].itertuples():
        print(f"| {r.model} | {r.metric} | {r.n_records:,} | {r.n_seeds} | {r.value:.4f} | "
              f"{r.nonprivate:.4f} | {100 * r.relative_loss:.2f}% | {r.failed} |")


def run_ratio(bench: Bench, full: bool, timeout: float | None) -> tuple[dict[str, str], float]:
    """One per-round benchmark: its parsed row (``{"error": ...}`` when it failed) and its
    wall seconds."""
    run = execute(bench.script, () if full else bench.small, timeout)
    if run.error:
        return {"error": run.error}, run.seconds
    try:
        return parse(bench, run.stdout), run.seconds
    except ValueError as e:
        return {"error": str(e).splitlines()[0]}, run.seconds


def run_all(scripts, benches, full: bool, timeout: float | None):
    """Every benchmark, one after the other, each in its own process."""
    runs, rows = [], []
    for bench in scripts:
        run = execute(bench.script, bench.full if full else bench.quick, timeout)
        print(f"{bench.command(full)}: {run.error or 'done'} ({run.seconds:.0f} s)", flush=True)
        runs.append((bench, run))
    for bench in benches:
        row, seconds = run_ratio(bench, full, timeout)
        print(f"{bench.script}: {row.get('error') or 'ratio ' + row['ratio']} ({seconds:.0f} s)",
              flush=True)
        rows.append((bench, row, seconds))
    return runs, rows


def write(runs, rows, command: str, full: bool, out: Path, readme: Path | None) -> None:
    """Write the page and, when ``readme`` is given, its block (one header for both)."""
    info = machine()
    total = sum(run.seconds for _, run in runs) + sum(seconds for _, _, seconds in rows)
    info["total"] = f"{total / 60:.0f} min"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(page(runs, rows, info, command, full), encoding="utf-8")
    print(f"wrote {out}")
    if readme is not None:
        text = readme.read_text(encoding="utf-8")
        block = readme_block(runs, rows, info, command, full)
        readme.write_text(replace_block(text, block, readme.name), encoding="utf-8")
        print(f"wrote the performance block of {readme}")


def main(argv: list[str] | None = None, scripts=SCRIPTS, benches=BENCHES) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    size = ap.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="the quick sizes (the default)")
    size.add_argument("--full", action="store_true", help="the largest sizes (an hour or more)")
    ap.add_argument("--timeout", type=float, default=None,
                    help="seconds after which a benchmark is stopped and reported as failed "
                    "(default 1800, with --full 7200)")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--readme", type=Path, default=None,
                    help="also rewrite this file's performance block (between its markers)")
    ap.add_argument("--no-readme", action="store_true", help="write only --out (the default)")
    ap.add_argument("--privacy-table", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.privacy_table:
        privacy_table(a.full)
        return
    readme = None if a.no_readme else a.readme
    if readme is not None:  # refuse a README without its markers before an hour of benchmarks
        replace_block(readme.read_text(encoding="utf-8"), "", readme.name)
    timeout = a.timeout or (7200.0 if a.full else 1800.0)
    runs, rows = run_all(scripts, benches, a.full, timeout)
    command = "python benchmarks/report.py" + (" --full" if a.full else "")
    write(runs, rows, command, a.full, a.out, readme)


if __name__ == "__main__":
    main()
