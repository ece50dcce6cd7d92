"""The contributor's path (docs/architecture.md, section 4), checked: every registered model has
an example the generic tests run, a reconstruction-attack adapter, a page in the documentation's
navigation and an entry on the API page; the architecture page names every test file that is
parametrized by the registry. A model missing from any of them fails here, naming what is
missing (issue 43)."""

import re
from pathlib import Path

import pytest

from fedlatent.engine.contract import registry

ROOT = Path(__file__).resolve().parents[1]
#: what a test file that runs every registered model calls
REGISTRY_CALLS = re.compile(r"estimator_names\(\)|estimator_entries\(\)|load_example\(|"
                            r"\bADAPTERS\b")


def _nav_pages() -> list[Path]:
    """The Markdown pages mkdocs.yml's navigation lists."""
    text = (ROOT / "mkdocs.yml").read_text()
    nav = text[text.index("\nnav:"):]
    return [ROOT / "docs" / m for m in re.findall(r":\s*([\w/.-]+\.md)\s*$", nav, re.M)]


def contributor_gaps(name: str, entry) -> list[str]:
    """What registered estimator ``name`` lacks on the contributor's path ([] when nothing)."""
    from attacks.models import ADAPTERS

    gaps = []
    try:
        entry.load_example()
    except (LookupError, TypeError) as err:
        gaps.append(f"an Example for the generic tests ({err})")
    if name not in ADAPTERS:
        gaps.append("a reconstruction-attack adapter in tests/attacks/models.py (ADAPTERS)")
    cls = entry.cls.__name__
    if not any(cls in page.read_text() for page in _nav_pages() if page.parent.name == "models"):
        gaps.append(f"a page under 'Models' in mkdocs.yml's nav naming {cls}")
    directive = f"::: {entry.cls.__module__}.{entry.cls.__qualname__}"
    if directive not in (ROOT / "docs" / "api" / "estimators.md").read_text():
        gaps.append(f"'{directive}' on docs/api/estimators.md")
    return gaps


@pytest.mark.parametrize("name", registry.estimator_names())
def test_every_registered_model_is_on_every_step_of_the_path(name):
    assert contributor_gaps(name, registry.estimator_entries()[name]) == []


def test_a_model_missing_from_the_path_is_named(monkeypatch):
    """A registered estimator no test, adapter or page knows of has every gap."""
    from fedlatent.models.gmm import FederatedGaussianMixture

    class Newcomer(FederatedGaussianMixture):
        pass

    Newcomer.__module__ = "fedlatent.models.newcomer.estimator"
    entry = registry.EstimatorEntry("newcomer", Newcomer, "a model no page knows of")
    gaps = contributor_gaps("newcomer", entry)
    assert len(gaps) == 4, gaps
    assert gaps[0].startswith("an Example for the generic tests (estimator 'newcomer' has no "
                              "example")
    assert "ADAPTERS" in gaps[1] and "Newcomer" in gaps[2]
    assert gaps[3] == ("'::: fedlatent.models.newcomer.estimator.test_a_model_missing_from_the_"
                       "path_is_named.<locals>.Newcomer' on docs/api/estimators.md")


def test_the_architecture_page_names_every_generic_test_file():
    """The test files parametrized by the registry (they call estimator_names(),
    estimator_entries(), load_example() or name ADAPTERS) are each named in section 4 of
    docs/architecture.md, and so are mkdocs.yml and the API page."""
    page = (ROOT / "docs" / "architecture.md").read_text()
    section = page[page.index("## 4."):page.index("## 5.")]
    generic = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests").rglob("*.py")
                     if p.name != "conftest.py" and p.name != Path(__file__).name
                     and REGISTRY_CALLS.search(p.read_text()))
    assert "tests/test_estimators.py" in generic and "tests/attacks/models.py" in generic
    missing = [f for f in generic + ["mkdocs.yml", "docs/api/estimators.md"]
               if f"`{f}`" not in section]
    assert missing == []
