"""The command line of a user's install, run by .ci/plain_install with the python of a venv made
by a plain ``pip install .`` (no extras, no dev tools).

    python .ci/cli_smoke.py              # every --help, then the README's CLI quickstart
    python .ci/cli_smoke.py --min typer fedlatent
                                         # the lowest DIST version OF declares ('' if none)

Runs ``fedlatent --help`` (the installed entry point), ``--help`` of every command and subcommand
(listed from the app itself, so a new command is covered; in-process, through typer's CliRunner,
to stay fast) and the ``fedlatent fit/predict/score`` lines of the README's "Quickstart (command
line)" block, as written there, on small generated CSV files. Prints one line per command;
stops with exit code 1 and the command's output at the first failure.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
QUICKSTART = "## Quickstart (command line)"


def versions() -> str:
    found = []
    for dist in ("fedlatent", "typer", "click"):
        try:
            found.append(f"{dist} {metadata.version(dist)}")
        except metadata.PackageNotFoundError:
            found.append(f"no {dist}")
    return ", ".join(found)


def lowest(dist: str, of: str) -> str:
    """The largest ``DIST>=X`` lower bound among OF's requirements ('' when there is none)."""
    bounds = [m.group(1) for r in metadata.requires(of) or []
              if (m := re.match(rf"{re.escape(dist)}\s*(?:\[[^]]*\])?\s*[^;]*?>=\s*([\w.]+)",
                                r, re.IGNORECASE))]
    return max(bounds, key=lambda v: [int(x) if x.isdigit() else 0 for x in v.split(".")],
               default="")


def report(ok: bool, seconds: float, words: list[str], output: str) -> None:
    print(f"{'ok  ' if ok else 'FAIL'} {seconds:5.1f}s  {shlex.join(words)}", flush=True)
    if not ok:
        print(output, flush=True)
        sys.exit(1)


def run(words: list[str], cwd: Path) -> None:
    """``words`` through the installed entry point (a new process, as a user runs it)."""
    exe = Path(sys.executable).with_name(words[0])
    start = time.perf_counter()
    res = subprocess.run([str(exe), *words[1:]], cwd=cwd, stdin=subprocess.DEVNULL,
                         capture_output=True, text=True, timeout=600)
    report(res.returncode == 0, time.perf_counter() - start, words, res.stdout + res.stderr)


def commands() -> list[tuple[tuple[str, ...], object]]:
    """Every command and subcommand of ``fedlatent`` (the words after it) with its command
    object, listed from the app: a new command is in the list."""
    import typer

    from fedlatent.cli import app

    found, todo = [], [((), typer.main.get_command(app), None)]
    while todo:
        path, cmd, parent = todo.pop(0)
        found.append((path, cmd))
        ctx = typer.Context(cmd, info_name=path[-1] if path else "fedlatent", parent=parent)
        for name in getattr(cmd, "list_commands", lambda ctx: [])(ctx):
            todo.append(((*path, name), cmd.get_command(ctx, name), ctx))
    return found


def every_help() -> None:
    from typer.testing import CliRunner

    from fedlatent.cli import app

    runner = CliRunner()
    for path, _ in commands()[1:]:  # the root: through the entry point
        start = time.perf_counter()
        res = runner.invoke(app, [*path, "--help"], prog_name="fedlatent")
        ok = res.exit_code == 0 and "Usage" in res.output
        report(ok, time.perf_counter() - start, ["fedlatent", *path, "--help"],
               f"exit code {res.exit_code}\n{res.output}{res.exception or ''}")


def quickstart_lines() -> list[list[str]]:
    """The fit, predict and score lines of the README's command-line quickstart."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    if QUICKSTART not in text:
        sys.exit(f"README.md has no section {QUICKSTART!r}")
    block = text.split(QUICKSTART, 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    lines = [shlex.split(line, comments=True) for line in block.replace("\\\n", " ").splitlines()]
    lines = [w for w in lines if w[:1] == ["fedlatent"] and w[1] in ("fit", "predict", "score")]
    if sorted({w[1] for w in lines}) != ["fit", "predict", "score"]:
        sys.exit(f"the README quickstart should fit, predict and score; found {lines}")
    return lines


def write_data(where: Path) -> None:
    """data.csv and new.csv: three clients, two features, three clusters (numpy is a core
    dependency)."""
    import numpy as np

    rng = np.random.default_rng(0)
    for name, n in (("data.csv", 300), ("new.csv", 60)):
        centers = np.array([[-4.0, 0.0], [0.0, 4.0], [4.0, 0.0]])[rng.integers(0, 3, n)]
        x = centers + rng.normal(size=(n, 2))
        rows = [f"c{i % 3},{a:.5f},{b:.5f}" for i, (a, b) in enumerate(x)]
        (where / name).write_text("client,x1,x2\n" + "\n".join(rows) + "\n")


def main() -> None:
    if sys.argv[1:2] == ["--min"]:
        print(lowest(*sys.argv[2:4]))
        return
    print(f"cli smoke test: {versions()}", flush=True)
    with tempfile.TemporaryDirectory(prefix="fedlatent-smoke-") as tmp:
        run(["fedlatent", "--help"], Path(tmp))
        every_help()
        write_data(Path(tmp))
        for words in quickstart_lines():
            run(words, Path(tmp))


if __name__ == "__main__":
    main()
