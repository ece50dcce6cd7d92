"""docs/inference.md is executed: its Python blocks run in order and the tables they print
match the documented ones (printed to 4 significant digits)."""

import contextlib
import io
import warnings
from pathlib import Path

import numpy as np
import pytest

DOC = Path(__file__).resolve().parents[1] / "docs" / "inference.md"


def blocks(text):
    """(language, body) of every fenced block."""
    out, lang, body = [], None, []
    for line in text.splitlines():
        if line.startswith("```"):
            if lang is None:
                lang, body = line[3:].strip() or "text", []
            else:
                out.append((lang, "\n".join(body)))
                lang = None
        elif lang is not None:
            body.append(line)
    return out


def table_rows(printed):
    """The numeric rows of a printed Summary (between its '---' and closing '===' lines)."""
    lines = printed.splitlines()
    start = next(i for i, s in enumerate(lines) if s.startswith("---"))
    rows = []
    for s in lines[start + 3:]:
        if s.startswith("==="):
            break
        rows.append([float(v) for v in s.split()[-7:] if _number(v)])
    return rows


def _number(v):
    try:
        float(v)
    except ValueError:
        return False
    return True


@pytest.mark.usefixtures("saturation_rule_off")
def test_the_documented_examples_run_and_print_their_tables():
    bl = blocks(DOC.read_text())
    code = [b for lang, b in bl if lang == "python"]
    shown = [b for lang, b in bl if lang == "text" and ("results" in b or "posterior" in b)]
    assert len(code) == 2 and len(shown) == 2
    ns, printed = {}, []
    for src in code:
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf), warnings.catch_warnings():
            warnings.simplefilter("error")  # the documented fits raise no warning
            exec(compile(src, str(DOC), "exec"), ns)
        printed.append(buf.getvalue())
    for got, want in zip(printed, shown, strict=True):
        g, w = table_rows(got), table_rows(want)
        assert len(g) == len(w) > 0
        for a, b in zip(g, w, strict=True):  # estimate and its std err / sd
            np.testing.assert_allclose(a[:2], b[:2], rtol=2e-3, atol=1e-12)
    assert ns["hlcr"].rhat_max_ < 1.01
