"""Run code in a fresh interpreter and say which heavy modules it imported (for the tests that
a deployed node's paths stay light: tests/models/test_gmm_describe.py, test_gmm_saved.py)."""

from __future__ import annotations

import json
import subprocess
import sys


def in_fresh_process(code: str, watch: tuple[str, ...]) -> tuple[object, list[str]]:
    """``(result, imported)``: ``code`` run by a new ``python -c`` (it must leave its answer,
    anything JSON can carry, in a variable ``result``), and those of the modules ``watch``
    that are in its ``sys.modules`` at the end, in ``watch``'s order. A failing ``code``
    raises CalledProcessError with its stderr."""
    tail = (f"\nimport json as _json, sys as _sys\n"
            f"print(_json.dumps([result, [m for m in {list(watch)!r} if m in _sys.modules]]))\n")
    out = subprocess.run([sys.executable, "-c", code + tail], capture_output=True, text=True)
    if out.returncode:
        raise subprocess.CalledProcessError(out.returncode, "python -c", out.stdout, out.stderr)
    result, imported = json.loads(out.stdout.strip().splitlines()[-1])
    return result, imported
