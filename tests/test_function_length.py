"""No function of the library is over 80 lines (issue 26): a long function is decomposed."""

import ast
from pathlib import Path

import fedlatent

SRC = Path(fedlatent.__file__).resolve().parent
LIMIT = 80

def long_functions(root: Path = SRC, limit: int = LIMIT) -> dict[str, int]:
    """``{"path:function": lines}`` of every function of ``root`` longer than ``limit`` lines
    (from ``def`` to its last line, docstring included)."""
    found = {}
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = node.end_lineno - node.lineno + 1
                if lines > limit:
                    found[f"{path.relative_to(root).as_posix()}:{node.name}"] = lines
    return found


def test_no_function_is_over_80_lines():
    assert long_functions() == {}


def test_the_check_counts_from_def_to_the_last_line(tmp_path):
    body = "".join(f"    x{i} = {i}\n" for i in range(80))
    (tmp_path / "m.py").write_text(f"def long():\n{body}\n\ndef limit():\n{body[:-13]}")
    assert long_functions(tmp_path) == {"m.py:long": 81}
