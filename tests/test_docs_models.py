"""The documentation stays a user's (issue 41): every registered model is on the pages a user
reads to find it (the index's model table and page list, the API reference's estimators page,
the command-line reference's list of fit models, its own page in mkdocs' navigation), and the
user pages carry no dated development notes (dates and issue numbers belong to the benchmarks
page and the repository's history).

The models come from the registry: a model registered later is checked without editing this
test."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from fedlatent.engine.contract.registry import estimator_entries

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"


def _read(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def missing_from_pages(entries=None) -> list[str]:
    """What each registered model lacks: ``"<name>: <where>"`` for every page that should
    name it and does not."""
    entries = estimator_entries() if entries is None else entries
    index, cli = _read(DOCS / "index.md"), _read(DOCS / "cli.md")
    api = _read(DOCS / "api" / "estimators.md") + _read(DOCS / "api" / "index.md")
    nav = _read(ROOT / "mkdocs.yml")
    fit_line = next((ln for ln in cli.splitlines() if ln.startswith("| `fedlatent fit NAME`")),
                    "")
    missing = []
    for name, entry in entries.items():
        cls = entry.cls
        page = f"models/{name}.md"
        checks = {
            "docs/index.md model table": re.search(rf"^\| `fl\.{cls.__name__}` \|", index, re.M),
            "docs/index.md page list": f"]({page})" in index.split("## Pages", 1)[-1],
            f"docs/{page}": (DOCS / page).exists(),
            "mkdocs.yml nav": re.search(rf"^\s+- [^:]+: {re.escape(page)}$", nav, re.M),
            "docs/api/estimators.md": f"::: {cls.__module__}.{cls.__qualname__}" in api,
            "docs/api/index.md": f"`{cls.__name__}`" in api.split("::: ")[0] or
                                 f"`{cls.__name__}`" in _read(DOCS / "api" / "index.md"),
            "docs/cli.md fit models": f"`{name}`" in fit_line,
        }
        missing += [f"{name}: {where}" for where, ok in checks.items() if not ok]
    return missing


def test_every_registered_model_is_on_every_page_that_lists_models():
    assert missing_from_pages() == []


def test_a_model_missing_from_the_pages_is_found():
    """The check reads the registry: a newly registered model that no page names fails it."""
    from fedlatent.engine.contract.registry import EstimatorEntry
    from fedlatent.models.gmm import FederatedGaussianMixture

    class ToyMixture(FederatedGaussianMixture):
        """A model no page knows of."""

    missing = missing_from_pages({"toy": EstimatorEntry("toy", ToyMixture, "A toy")})
    assert missing == [
        "toy: docs/index.md model table", "toy: docs/index.md page list",
        "toy: docs/models/toy.md", "toy: mkdocs.yml nav", "toy: docs/api/estimators.md",
        "toy: docs/api/index.md", "toy: docs/cli.md fit models"]


#: pages for users (the benchmarks page is dated on purpose; architecture.md is for contributors)
USER_PAGES = [ROOT / "README.md",
              *sorted(p for p in DOCS.rglob("*.md")
                      if p.name not in ("benchmarks.md", "architecture.md")
                      and "benchmarks" not in p.parts and "_ext" not in p.parts)]
DATED = re.compile(r"\b20\d\d-\d\d-\d\d\b|\bissue \d+|\bsession\b", re.I)


@pytest.mark.parametrize("page", USER_PAGES, ids=[str(p.relative_to(ROOT)) for p in USER_PAGES])
def test_user_pages_carry_no_dated_development_notes(page):
    found = [f"{page.name}:{i}: {line.strip()[:100]}"
             for i, line in enumerate(_read(page).splitlines(), start=1) if DATED.search(line)]
    assert found == []
