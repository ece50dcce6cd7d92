"""The library's refusals in the command line's words (issue 41): every fix a refusal or a
warning of the library names in Python (``Federation(disclosure=DisclosurePolicy(
min_records=5))``, ``privacy=None``, ``raise max_rounds or tol``) names an option that exists
once the command line says it; a fit that stops naming several sites prints one line per site.

The messages are collected from the library's source (every string of a ``raise``, a
``warnings.warn``, a site's refusal), so a new refusal is checked without editing this test."""

import ast
import re
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

import fedlatent
from fedlatent.cli import app
from fedlatent.cli.errors import cli_words, fault_lines
from fedlatent.engine.contract.registry import estimator_names

SRC = Path(fedlatent.__file__).parent
#: calls whose string arguments are a message a user reads
MESSAGE_CALLS = {"warn", "refuse", "_refused", "refusal_text", "PrivacyBudgetExceeded",
                 "warn_not_converged", "DataValidationError", "FederatedFitError", "ValueError",
                 "TypeError", "PolicyError", "RuntimeError", "KeyError"}
#: Python spellings of a setting that a user of the command line cannot type
PYTHON = re.compile(r"\b(?:Federation|DisclosurePolicy|DifferentialPrivacy|Quantizer|Spider)\("
                    r"|\b(?:privacy|acceleration|secure_aggregation|disclosure|max_rounds|"
                    r"n_clusters|n_components|control_variates|participation)=")


def _text(node) -> str:
    """A string constant or f-string with every formatted value as ``N``."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) else "N" for v in node.values)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return _text(node.left) + _text(node.right)
    return ""


def _name(call: ast.Call) -> str:
    f = call.func
    return f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")


def _docstrings(tree) -> set[int]:
    return {id(n.value) for n in ast.walk(tree)
            if isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant)}


def library_messages() -> list[tuple[str, str]]:
    """``(where, text)`` of every message of the library (not the command line) that spells a
    setting in Python: the strings of a ``raise``, a ``warn``, a refusal, and every other string
    (a refusal returned by a check, a log line), docstrings left out."""
    found: dict[str, str] = {}
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC)
        if rel.parts[0] in ("cli", "experiments") or "example" in rel.name:
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        docs = _docstrings(tree)
        for node in ast.walk(tree):
            parts: list[ast.AST] = []
            if isinstance(node, ast.Call) and _name(node) in MESSAGE_CALLS:
                parts = [*node.args, *(k.value for k in node.keywords)]
            elif isinstance(node, ast.Tuple) and rel.name == "guard.py":  # (rule, why, fix)
                parts = list(node.elts)
            elif isinstance(node, ast.Constant | ast.JoinedStr) and id(node) not in docs:
                parts = [node]
            text = " ".join(t for t in map(_text, parts) if t)
            if text and PYTHON.search(text):
                found.setdefault(" ".join(text.split()), f"{rel}:{node.lineno}")
    # a string inside a collected call is found again alone: keep the longest text
    texts = sorted(found, key=len, reverse=True)
    kept = [t for i, t in enumerate(texts) if not any(t in longer for longer in texts[:i])]
    return sorted((found[t], t) for t in kept)


MESSAGES = library_messages()


def every_flag() -> set[str]:
    flags = set()
    root = typer.main.get_command(app)
    for group in ("fit",):
        g = root.get_command(typer.Context(root), group)
        for name in estimator_names():
            cmd = g.get_command(typer.Context(g), name)
            flags |= {o for p in cmd.params for o in [*p.opts, *p.secondary_opts]}
    return flags


def test_the_library_has_such_messages():
    """The collection finds the refusals it is about (the site's, the disclosure rules', the
    Federation's), so the next test checks them."""
    where = " ".join(w for w, _ in MESSAGES)
    assert len(MESSAGES) >= 40, MESSAGES
    for module in ("guard.py", "disclosure.py", "federation.py", "enforce.py", "estimator.py"):
        assert module in where, module


@pytest.mark.parametrize("where, text", MESSAGES, ids=[w for w, _ in MESSAGES])
def test_every_fix_the_library_names_is_an_option_on_the_command_line(where, text):
    said = cli_words(text)
    assert not PYTHON.search(said), said
    unknown = sorted(set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", said)) - FLAGS)
    assert unknown == [], said


FLAGS = every_flag()


def test_fault_lines_one_per_site_ten_then_a_count():
    faults = {f"s{i:02d}": (f"site 's{i:02d}' refused (privacy.required): the fit is not "
                            "differentially private; fix: fit with "
                            "Federation(privacy=DifferentialPrivacy(...))") for i in range(12)}
    faults["big"] = "refused by the disclosure policy: pass DisclosurePolicy(min_records=3)"
    from fedlatent.engine.protocol.messages import fault_detail

    lines = fault_lines(f"setup: {fault_detail(faults)}; nothing of this exchange was used",
                        faults)
    assert lines[0] == "setup: 13 clients (below); nothing of this exchange was used"
    assert lines[1] == ("  site 's00' refused (privacy.required): the fit is not differentially "
                        "private; fix: fit with --privacy epsilon=E,delta=D,clip=C")
    assert len(lines) == 1 + 10 + 1
    assert lines[-1] == "  ... and 3 more clients"


def test_a_fit_refused_by_every_site_prints_one_line_per_reason(tmp_path):
    import numpy as np
    import pandas as pd

    rng = np.random.default_rng(0)
    df = pd.DataFrame(rng.normal(size=(90, 2)), columns=["a", "b"])
    df["site"] = np.repeat(["s0", "s1", "s2"], 30)
    df.to_csv(tmp_path / "d.csv", index=False)
    res = CliRunner().invoke(app, ["fit", "gmm", "--data", str(tmp_path / "d.csv"), "--client",
                                   "site", "-k", "2", "--min-records", "40",
                                   "--out", str(tmp_path / "o")])
    assert res.exit_code == 2
    lines = res.stderr.splitlines()
    assert lines[0] == "error: setup: 3 clients (below); nothing of this exchange was used"
    assert lines[1].startswith("  clients 's0', 's1', 's2': refused by the disclosure policy")
    assert "--min-records N or --disclosure off" in lines[1]  # (no count below a threshold)
    assert len(lines) == 2 and all(len(line) < 400 for line in lines)
