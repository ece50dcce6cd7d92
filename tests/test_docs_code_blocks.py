"""Every code block of README.md and docs/ runs: examples that stop working fail the suite.

Per page, in a temporary directory: the ```python blocks run in order in one namespace, and the
```bash/```console blocks whose first command starts with ``fedlatent `` run each of their
``fedlatent`` commands through the command line (in-process, typer's CliRunner), in document
order with the Python blocks, so a page can write a CSV file in Python and fit it on the command
line. A block would be skipped when the line before its fence is ``<!-- skip: REASON -->``; none
is (``test_no_block_is_skipped``). The Flower page runs once (``flower_page``) for its page test
and the tests of its simulation and its deployment's progress, ``flower local`` through a pipe
as a user's shell runs it. Other shell blocks (``pip``, ``make``, ``flwr``,
``flower-superlink``...) and output or ``text`` blocks are not commands of fedlatent and are
not run. A block that raises, a command that exits non-zero, or a ``print(...)  # -> TEXT`` line
that prints anything but TEXT (a comment after a print always says what it prints) fails the
page's test with the page and line.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
SKIP = re.compile(r"^<!--\s*skip:\s*(?P<reason>.*?)\s*-->$")
FENCE = re.compile(r"^```(?P<lang>[\w-]*)\s*$")
SHELL = ("bash", "console", "sh", "shell")


@dataclass
class Block:
    """One fenced code block of a page."""

    page: str
    line: int  # of the opening fence, 1-based
    lang: str
    code: str
    skip: str | None  # the reason of a ``<!-- skip: ... -->`` comment, or None

    @property
    def runnable(self) -> bool:
        """A Python block, or a shell block whose first command is ``fedlatent``."""
        return self.lang == "python" or (self.lang in SHELL and bool(self.commands()))

    def commands(self) -> list[list[str]]:
        """The ``fedlatent`` commands of a shell block (none unless the first one is)."""
        text = self.code.replace("\\\n", " ")
        words = [shlex.split(line, comments=True) for line in text.splitlines()]
        words = [w[1:] if w[:1] == ["$"] else w for w in words if w]
        if not words or words[0][0] != "fedlatent":
            return []
        return [w for w in words if w[0] == "fedlatent"]


def parse(text: str, page: str) -> list[Block]:
    """The fenced blocks of a Markdown text, with the skip reason written before each."""
    blocks, lines, i = [], text.splitlines(), 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        start, body = i, []
        i += 1
        while i < len(lines) and lines[i].rstrip() != "```":
            body.append(lines[i])
            i += 1
        before = next((s.strip() for s in reversed(lines[:start]) if s.strip()), "")
        skip = SKIP.match(before)
        blocks.append(Block(page, start + 1, m["lang"], "\n".join(body) + "\n",
                            skip["reason"] if skip else None))
        i += 1
    return blocks


def in_process(words: list[str]) -> tuple[int, str, BaseException | None]:
    """Run a ``fedlatent`` command in this process (typer's CliRunner): exit code, output,
    exception."""
    from typer.testing import CliRunner

    from fedlatent.cli import app

    res = CliRunner().invoke(app, words[1:], prog_name="fedlatent")
    return res.exit_code, res.output, res.exception


#: a ``print(...)`` line's comment stating what it prints: ``print(x)  # -> 2``; a line
#: printing several times (in a loop) lists each, ``# -> None 8 -3.36 | squarem 5 -3.36``
SAYS = re.compile(r"^\s*print\(.*\)\s*#\s*->\s*(?P<said>.*?)\s*$")
#: any comment after a print (which must then say what it prints)
PRINT_COMMENT = re.compile(r"^\s*print\(.*\)\s*#")
_NUMBER = re.compile(r"^[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?$")


def _same_words(said: str, printed: str) -> bool:
    """``printed`` is ``said``, word for word; a number within half a unit of the last digit
    ``said`` shows (printed output depends on the CPU's rounding, never more)."""
    a, b = said.split(), printed.split()
    if len(a) != len(b):
        return False
    for x, y in zip(a, b):
        xs, ys = x.strip(",;()[]"), y.strip(",;()[]")
        if _NUMBER.match(xs) and _NUMBER.match(ys):
            decimals = len(xs.split(".")[1].split("e")[0].split("E")[0]) if "." in xs else 0
            exp = int(xs.lower().split("e")[1]) if "e" in xs.lower() else 0
            if abs(float(xs) - float(ys)) > 0.5 * 10.0 ** (exp - decimals) + 1e-12 * abs(
                    float(xs)):
                return False
        elif x != y:
            return False
    return True


def printed_lines(code: str, where: str, namespace: dict) -> dict[int, list[str]]:
    """Run ``code`` (compiled as ``where``) in ``namespace``; return what each of its lines
    printed (line number -> one text per call)."""
    import builtins
    import io
    import sys

    out: dict[int, list[str]] = {}

    def recording_print(*args, **kwargs):
        if kwargs.get("file") not in (None, sys.stdout):
            return builtins.print(*args, **kwargs)
        frame = sys._getframe(1)
        while frame is not None and frame.f_code.co_filename != where:
            frame = frame.f_back
        buf = io.StringIO()
        builtins.print(*args, **{**kwargs, "file": buf})
        builtins.print(buf.getvalue(), end="")
        if frame is not None:
            out.setdefault(frame.f_lineno, []).append(buf.getvalue().rstrip("\n"))

    namespace["print"] = recording_print
    try:
        exec(compile(code, where, "exec"), namespace)  # noqa: S102 - the docs' code
    finally:
        namespace.pop("print", None)
    return out


def check_printed(code: str, where: str, printed: dict[int, list[str]]) -> None:
    """Each ``print(...)  # -> TEXT`` line printed TEXT (``|`` between several prints);
    a print's comment that does not say what it prints is an error too."""
    for i, line in enumerate(code.splitlines(), start=1):
        m = SAYS.match(line)
        if m is None:
            if PRINT_COMMENT.match(line):
                raise AssertionError(f"{where}+{i}: a comment after a print says what it "
                                     f"prints, as '# -> TEXT': {line.strip()}")
            continue
        said = [t.strip() for t in m.group("said").split(" | ")]
        got = [" ".join(t.split()) for t in printed.get(i, [])]
        if len(said) != len(got) or not all(map(_same_words, said, got)):
            raise AssertionError(f"{where}+{i}: the comment says it prints {' | '.join(said)!r}"
                                 f", it printed {' | '.join(got)!r}")


def run_blocks(blocks: list[Block], run_command=in_process, namespace: dict | None = None) -> int:
    """Run the runnable, not skipped blocks in order; return how many ran. Raises
    AssertionError naming the page and line of a block that raised, a command that failed, or
    a print whose comment (``# -> TEXT``) is not what it printed. ``run_command(words)`` runs
    one ``fedlatent`` command (:func:`in_process` by default); the Python blocks share
    ``namespace`` (a new one by default)."""
    namespace = {"__name__": "__docs__"} if namespace is None else namespace
    ran = 0
    for b in blocks:
        if b.skip is not None or not b.runnable:
            continue
        where = f"{b.page}:{b.line}"
        if b.lang == "python":
            try:
                printed = printed_lines(b.code, where, namespace)
            except Exception as err:
                raise AssertionError(f"{where}: the block raised {err!r}") from err
            check_printed(b.code, where, printed)
        else:
            for words in b.commands():
                code, output, exc = run_command(words)
                assert code == 0, (f"{where}: `{shlex.join(words)}` exited "
                                   f"{code}\n{output}{exc!r}")
        ran += 1
    return ran


def page_blocks(path: Path) -> list[Block]:
    return parse(path.read_text(encoding="utf-8"), str(path.relative_to(ROOT)))


def count(pages=PAGES) -> dict[str, int]:
    """Blocks per kind over the pages: run, skipped (with a reason), not runnable."""
    found = {"run": 0, "skipped": 0, "other": 0}
    for p in pages:
        for b in page_blocks(p):
            key = "skipped" if b.skip is not None else "run" if b.runnable else "other"
            found[key] += 1
    return found


# ---- the Flower page: one run shared by its page test and the tests of what it shows ----------
FLOWER_PAGE = "docs/flower.md"
#: the source tree of the fedlatent under test (a subprocess imports the same one)
SRC = str(Path(__import__("fedlatent").__file__).resolve().parents[1])


@dataclass
class FlowerPageRun:
    """What running the Flower page gave: blocks run, the status of its simulation, the lines
    ``flower local`` printed with the seconds since its start at which each arrived, and
    Flower's log records and warnings."""

    ran: int
    simulation: dict
    arrivals: list[tuple[float, str]]
    flwr_records: list[str]
    flwr_warnings: list[str]


def through_a_pipe(words: list[str], arrivals: list[tuple[float, str]]):
    """Run a ``fedlatent`` command as a user's shell would, its output on a pipe (not a
    terminal), appending each line it prints with its arrival time to ``arrivals``."""
    import os
    import subprocess
    import sys
    import time

    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", ""),
           "MPLBACKEND": "Agg", "FLWR_TELEMETRY_ENABLED": "0", "FLWR_DISABLE_UPDATE_CHECK": "1"}
    start = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "fedlatent.cli", *words[1:]], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    arrivals += [(time.monotonic() - start, line.rstrip()) for line in proc.stdout]
    proc.wait(timeout=900)
    return proc.returncode, "\n".join(text for _, text in arrivals), None


@pytest.fixture(scope="module")
def flower_page(tmp_path_factory, one_ray):
    """Run every block of the Flower page once (the simulation in this process, ``flower
    local`` through a pipe), recording Flower's log records and warnings."""
    import logging
    import os
    import warnings

    pytest.importorskip("flwr")
    pytest.importorskip("ray")
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append
    flwr_logger = logging.getLogger("flwr")
    flwr_logger.addHandler(handler)
    arrivals: list[tuple[float, str]] = []
    namespace: dict = {"__name__": "__docs__"}
    cwd = os.getcwd()
    os.chdir(tmp_path_factory.mktemp("flower-page"))
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            ran = run_blocks(page_blocks(ROOT / FLOWER_PAGE),
                             run_command=lambda words: through_a_pipe(words, arrivals),
                             namespace=namespace)
    finally:
        os.chdir(cwd)
        flwr_logger.removeHandler(handler)
    est = namespace.get("est")
    return FlowerPageRun(ran, dict(getattr(est, "flower_status_", {})), arrivals,
                         [r.getMessage() for r in records],
                         [f"{w.category.__name__}: {w.message}" for w in caught
                          if "flwr" in str(w.filename)])


@pytest.mark.slow
@pytest.mark.flower
@pytest.mark.deployment
def test_the_simulation_prints_no_deprecation_banner(flower_page):
    """``simulate`` uses Flower's engine as ``flwr-simulation`` does, not the deprecated
    ``run_simulation`` (whose banner says ``DEPRECATED FEATURE``)."""
    assert flower_page.simulation.get("status") == "ok", flower_page.simulation
    assert 1 <= flower_page.simulation.get("rounds", 0) <= 3, flower_page.simulation
    assert not [m for m in flower_page.flwr_records if "DEPRECATED" in m.upper()]
    assert not [w for w in flower_page.flwr_warnings if "eprecat" in w]


@pytest.mark.slow
@pytest.mark.flower
@pytest.mark.deployment
def test_flower_local_of_the_page_reports_at_least_every_ten_seconds(flower_page):
    """The page's ``flower local gmm`` (a real loopback deployment, stdout on a pipe) prints a
    line at least every 10 s once the deployment is ready, up to its last round."""
    arrivals = flower_page.arrivals
    times = [0.0] + [t for t, _ in arrivals]
    gaps = [b - a for a, b in zip(times, times[1:])]
    ready = next(i for i, (_, text) in enumerate(arrivals) if text.startswith("deployment ready"))
    shown = [f"{g:5.1f} s  {text}" for g, (_, text) in zip(gaps, arrivals)]
    assert max(gaps[ready + 1:]) <= 10.0, "\n".join(shown)
    assert any(text.startswith("round 3:") for _, text in arrivals), arrivals


#: pages whose examples fit several models (SEC's select and exchange, HLCR's Gibbs sweeps and
#: its choice of K): 10-60 s each on a loaded 2-core machine; the Flower page runs a simulation
#: (Ray) and a loopback deployment (about 100 s), once for its tests (``flower_page``)
SLOW = {"docs/models/sec.md", "docs/models/hlcr.md", FLOWER_PAGE}


def page_marks(page: str) -> list:
    """``slow`` for the pages of :data:`SLOW`, and ``flower`` and ``deployment`` for the Flower
    page (its ``flower local`` starts a loopback deployment)."""
    return ([pytest.mark.slow] if page in SLOW else []) + (
        [pytest.mark.flower, pytest.mark.deployment] if page == FLOWER_PAGE else [])


@pytest.mark.parametrize("path", [
    pytest.param(p, id=str(p.relative_to(ROOT)), marks=page_marks(str(p.relative_to(ROOT))))
    for p in PAGES])
def test_every_code_block_of_the_page_runs(path, tmp_path, monkeypatch, request):
    blocks = page_blocks(path)
    expected = sum(b.runnable and b.skip is None for b in blocks)
    if str(path.relative_to(ROOT)) == FLOWER_PAGE:  # run once for this test and the next ones
        assert request.getfixturevalue("flower_page").ran == expected
        return
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MPLBACKEND", "Agg")
    assert run_blocks(blocks) == expected


def test_the_runner_fails_on_a_block_that_raises_or_a_command_that_fails(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    text = ("# page\n\n```python\nx = 1\n```\n\n```python\nassert x == 2, 'x is 1'\n```\n")
    with pytest.raises(AssertionError, match=r"page\.md:7: the block raised .*x is 1"):
        run_blocks(parse(text, "page.md"))
    cli = "```bash\nfedlatent predict --model nowhere/ --data none.csv --out p.csv\n```\n"
    with pytest.raises(AssertionError, match=r"page\.md:1: `fedlatent predict .*` exited 2"):
        run_blocks(parse(cli, "page.md"))


def test_the_runner_fails_when_a_print_is_not_what_its_comment_says(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    good = "```python\nx = 0.123456\nprint(x, 'a')  # -> 0.1235 a\nfor k in (1, 2):\n" \
           "    print(k * 2)  # -> 2 | 4\n```\n"
    assert run_blocks(parse(good, "page.md")) == 1
    wrong = "```python\nprint(1 + 1)  # -> 3\n```\n"
    with pytest.raises(AssertionError, match=r"page\.md:1\+1: the comment says it prints '3', "
                                             r"it printed '2'"):
        run_blocks(parse(wrong, "page.md"))
    loop = "```python\nfor k in (1, 2, 3):\n    print(k)  # -> 1 | 2\n```\n"
    with pytest.raises(AssertionError, match="it printed '1 | 2 | 3'"):
        run_blocks(parse(loop, "page.md"))
    prose = "```python\nprint(2)  # two\n```\n"
    with pytest.raises(AssertionError, match="says what it prints"):
        run_blocks(parse(prose, "page.md"))
    rounded = "```python\nprint(-3.3647594)  # -> -3.36476\n```\n"
    assert run_blocks(parse(rounded, "page.md")) == 1
    off = "```python\nprint(-3.3648)  # -> -3.36476\n```\n"
    with pytest.raises(AssertionError, match="it printed '-3.3648'"):
        run_blocks(parse(off, "page.md"))


def test_a_skip_needs_a_reason_and_applies_to_the_next_block_only():
    text = ("<!-- skip: needs Ray -->\n```python\nraise SystemExit\n```\n"
            "```bash\nfedlatent --version\n```\n"
            "```bash\npip install fedlatent\n```\n```text\nfedlatent fit NAME\n```\n")
    blocks = parse(text, "page.md")
    assert [(b.lang, b.skip, b.runnable) for b in blocks] == [
        ("python", "needs Ray", True), ("bash", None, True), ("bash", None, False),
        ("text", None, False)]
    assert run_blocks(blocks) == 1
    for p in PAGES:
        for b in page_blocks(p):
            assert b.skip is None or b.skip, f"{b.page}:{b.line}: a skip without a reason"


def test_most_blocks_run():
    """Skips stay the exception: at most one runnable block in five is skipped."""
    found = count()
    assert found["run"] >= 4 * found["skipped"], found


def test_no_block_is_skipped():
    """Every runnable block of README.md and docs/ runs (a slow example shows lean settings,
    or shares one run with the test of what it shows, as the Flower page does)."""
    skipped = [f"{b.page}:{b.line} ({b.skip})" for p in PAGES for b in page_blocks(p)
               if b.skip is not None]
    assert skipped == []
    assert count()["run"] >= 30
