"""Griffe extension for the API reference: Sphinx roles in docstrings rendered as code.

The docstrings are numpydoc and name objects with Sphinx roles (``:meth:`bic```,
``:class:`~fedlatent.Federation```), which Markdown would show verbatim. Each role becomes inline
code of its target (the last component after ``~``, the text before ``<target>``), before the
docstring is parsed. Loaded by mkdocs.yml (``extensions``); not a page of the site.
"""

from __future__ import annotations

import re
from typing import Any

from griffe import Extension, Object

ROLE = re.compile(r":(?:py:)?(?:func|meth|class|mod|data|attr|obj|exc|const):`(?P<target>[^`]+)`")


def _code(match: re.Match) -> str:
    target = match["target"].strip()
    shown = re.match(r"(?P<text>.+?)\s*<[^>]+>$", target)
    if shown:
        return f"`{shown['text']}`"
    if target.startswith("~"):
        target = target[1:].rsplit(".", 1)[-1]
    return f"`{target}`"


def roles_as_code(text: str) -> str:
    """``text`` with every Sphinx cross-reference role replaced by inline code."""
    return ROLE.sub(_code, text)


class SphinxRolesAsCode(Extension):
    """Rewrite the roles of each docstring as it is collected."""

    def on_instance(self, *, obj: Object, **kwargs: Any) -> None:  # noqa: D102
        if obj.docstring is not None:
            obj.docstring.value = roles_as_code(obj.docstring.value)
