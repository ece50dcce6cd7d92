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


def commands(contexts: bool = False) -> list[tuple]:
    """Every command and subcommand of ``fedlatent`` (the words after it) with its command
    object (and, with ``contexts``, its context), listed from the app: a new command is in
    the list."""
    import typer

    from fedlatent.cli import app

    found, todo = [], [((), typer.main.get_command(app), None)]
    while todo:
        path, cmd, parent = todo.pop(0)
        ctx = typer.Context(cmd, info_name=path[-1] if path else "fedlatent", parent=parent)
        found.append((path, cmd, ctx) if contexts else (path, cmd))
        for name in getattr(cmd, "list_commands", lambda ctx: [])(ctx):
            todo.append(((*path, name), cmd.get_command(ctx, name), ctx))
    return found


def declared_help(cmd, name: str) -> str | None:
    """The help parameter ``name`` declares in ``cmd``'s function (``typer.Argument(help=...)``
    in its annotation or as its default), whatever became of it in the command object."""
    import inspect
    import typing

    fn = inspect.unwrap(cmd.callback) if getattr(cmd, "callback", None) else None
    if fn is None:
        return None
    try:
        hint = typing.get_type_hints(fn, include_extras=True).get(name)
    except (NameError, TypeError):
        hint = None
    found = [getattr(m, "help", None) for m in getattr(hint, "__metadata__", ())]
    param = inspect.signature(fn).parameters.get(name)
    found.append(getattr(param.default, "help", None) if param is not None else None)
    return next((h for h in found if isinstance(h, str) and h), None)


def cut_help(cmd, output: str, ctx=None) -> list[str]:
    """What the help ``output`` of ``cmd`` leaves out or cuts: every visible parameter's help
    (arguments' too) and, for a group, every command's one-line description must be in it
    whole (wrapped anywhere, never shortened: rich cuts with "\u2026", click with "...")."""
    text = "".join(output.replace("\\[", "[").split())
    wanted = [(p.name, getattr(p, "help", None) or declared_help(cmd, p.name))
              for p in cmd.params if not getattr(p, "hidden", False)]
    wanted = [(name, words) for name, words in wanted if words]
    for name in getattr(cmd, "list_commands", lambda ctx: [])(ctx):
        sub = cmd.get_command(ctx, name)
        if sub is not None and not sub.hidden:
            wanted.append((name, sub.short_help or (sub.help or "").strip().split("\n\n")[0]))
    missing = [f"{name}: {words!r}" for name, words in wanted
               if "".join(words.split()) not in text]
    return missing + [line for line in output.splitlines() if "\u2026" in line]


def every_help() -> None:
    """``--help`` of every command and subcommand: exit 0, its usage, and whole (COLUMNS wide,
    :func:`cut_help`)."""
    from typer.testing import CliRunner

    from fedlatent.cli import app

    runner = CliRunner(env={"COLUMNS": "200"})
    for path, cmd, ctx in commands(contexts=True)[1:]:  # the root: through the entry point
        start = time.perf_counter()
        res = runner.invoke(app, [*path, "--help"], prog_name="fedlatent")
        problems = cut_help(cmd, res.output, ctx)
        ok = res.exit_code == 0 and "Usage" in res.output and not problems
        report(ok, time.perf_counter() - start, ["fedlatent", *path, "--help"],
               f"exit code {res.exit_code}\n{res.output}{res.exception or ''}\n"
               f"left out or cut: {problems}")


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
