"""Every code block of README.md and docs/ runs: examples that stop working fail the suite.

Per page, in a temporary directory: the ```python blocks run in order in one namespace, and the
```bash/```console blocks whose first command starts with ``fedlatent `` run each of their
``fedlatent`` commands through the command line (in-process, typer's CliRunner), in document
order with the Python blocks, so a page can write a CSV file in Python and fit it on the command
line. A block is skipped only when the line before its fence is ``<!-- skip: REASON -->``; other
shell blocks (``pip``, ``make``, ``flwr``, ``flower-superlink``...) and output or ``text``
blocks are not commands of fedlatent and are not run. A block that raises, or a command that
exits non-zero, fails the page's test with the page and line.
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


def run_blocks(blocks: list[Block]) -> int:
    """Run the runnable, not skipped blocks in order; return how many ran. Raises
    AssertionError naming the page and line of a block that raised or a command that failed."""
    from typer.testing import CliRunner

    from fedlatent.cli import app

    namespace: dict = {"__name__": "__docs__"}
    ran = 0
    for b in blocks:
        if b.skip is not None or not b.runnable:
            continue
        where = f"{b.page}:{b.line}"
        if b.lang == "python":
            try:
                exec(compile(b.code, where, "exec"), namespace)  # noqa: S102 - the docs' code
            except Exception as err:
                raise AssertionError(f"{where}: the block raised {err!r}") from err
        else:
            for words in b.commands():
                res = CliRunner().invoke(app, words[1:], prog_name="fedlatent")
                assert res.exit_code == 0, (f"{where}: `{shlex.join(words)}` exited "
                                            f"{res.exit_code}\n{res.output}{res.exception!r}")
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


#: pages whose examples fit several models (SEC's select and exchange, HLCR's Gibbs sweeps and
#: its choice of K): 10-60 s each on a loaded 2-core machine
SLOW = {"docs/models/sec.md", "docs/models/hlcr.md"}


@pytest.mark.parametrize("path", [
    pytest.param(p, id=str(p.relative_to(ROOT)),
                 marks=[pytest.mark.slow] if str(p.relative_to(ROOT)) in SLOW else [])
    for p in PAGES])
def test_every_code_block_of_the_page_runs(path, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MPLBACKEND", "Agg")
    blocks = page_blocks(path)
    expected = sum(b.runnable and b.skip is None for b in blocks)
    assert run_blocks(blocks) == expected


def test_the_runner_fails_on_a_block_that_raises_or_a_command_that_fails(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    text = ("# page\n\n```python\nx = 1\n```\n\n```python\nassert x == 2, 'x is 1'\n```\n")
    with pytest.raises(AssertionError, match=r"page\.md:7: the block raised .*x is 1"):
        run_blocks(parse(text, "page.md"))
    cli = "```bash\nfedlatent predict --model nowhere/ --data none.csv --out p.csv\n```\n"
    with pytest.raises(AssertionError, match=r"page\.md:1: `fedlatent predict .*` exited 2"):
        run_blocks(parse(cli, "page.md"))


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
