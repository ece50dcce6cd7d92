"""The documentation site: Material theme, the API reference and the generated performance page.

`make docs` builds the site with ``--strict`` (a reference that does not resolve fails it); these
tests check what the build cannot: that the reference covers the public objects a user imports,
and that the performance page includes the tables benchmarks/report.py writes.
"""

from __future__ import annotations

import importlib
import importlib.util
import re
from pathlib import Path

import pytest

import fedlatent as fl
from fedlatent.runtime import flower_deployment

ROOT = Path(__file__).resolve().parents[1]
CONFIG = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")


def documented() -> dict[str, object]:
    """``{identifier: object}`` of every ``::: identifier`` line of docs/api/."""
    found = {}
    for page in sorted((ROOT / "docs" / "api").glob("*.md")):
        for ident in re.findall(r"^::: ([\w.]+)\s*$", page.read_text(encoding="utf-8"), re.M):
            module, _, name = ident.rpartition(".")
            found[ident] = getattr(importlib.import_module(module), name)
    return found


def test_the_site_uses_material_mkdocstrings_and_stays_strict():
    assert re.search(r"^theme:\n  name: material$", CONFIG, re.M)
    assert re.search(r"^  - mkdocstrings:$", CONFIG, re.M)
    assert re.search(r"^strict: true$", CONFIG, re.M)
    assert "content.code.copy" in CONFIG and "navigation.sections" in CONFIG


def test_the_api_reference_documents_every_public_object_and_is_in_the_nav():
    from fedlatent.runtime.flower import simulate

    objects = set(map(id, documented().values()))
    wanted = {"FederatedGaussianMixture": fl.FederatedGaussianMixture,
              "LatentClassRegression": fl.LatentClassRegression, "FedGMM": fl.FedGMM,
              "HLCR": fl.HLCR, "SEC": fl.SEC, "FederatedDataset": fl.FederatedDataset,
              "Federation": fl.Federation, "DisclosurePolicy": fl.DisclosurePolicy,
              "DifferentialPrivacy": fl.DifferentialPrivacy,
              "InProcessRuntime": fl.InProcessRuntime, "simulate": simulate,
              "LocalDeployment": flower_deployment.LocalDeployment,
              "experiments.available": fl.experiments.available}
    missing = sorted(name for name, obj in wanted.items() if id(obj) not in objects)
    assert missing == []
    pages = sorted(p.name for p in (ROOT / "docs" / "api").glob("*.md"))
    assert [p for p in pages if f"api/{p}" not in CONFIG] == []


def test_the_performance_page_includes_the_generated_tables():
    page = (ROOT / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    assert '--8<-- "benchmarks/performance.md"' in page
    snippet = (ROOT / "docs" / "benchmarks" / "performance.md").read_text(encoding="utf-8")
    assert re.match(r"Measured \d{4}-\d\d-\d\d \d\d:\d\d UTC on .+ \(\d+ cores, load average "
                    r"[\d.]+ at the end\), Python 3\.\d+\.\d+, fedlatent ", snippet)
    rows = [line for line in snippet.splitlines() if line.startswith("| ") and "`bench_" in line]
    assert [re.search(r"`(bench_\w+\.py)`", r)[1] for r in rows] == [
        "bench_gmm.py", "bench_lcr.py", "bench_fedgmm.py"]
    assert all(float(r.split("|")[6]) > 0 for r in rows)  # the ratio column


def test_sphinx_roles_of_the_docstrings_become_inline_code_in_the_reference():
    pytest.importorskip("griffe")
    spec = importlib.util.spec_from_file_location("sphinx_roles",
                                                  ROOT / "docs" / "_ext" / "sphinx_roles.py")
    ext = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ext)
    text = ("Kept by :meth:`bic` (:func:`fedlatent.engine.contract.starts.best`, "
            ":class:`~fl.Federation`, "
            ":py:mod:`the engine <fedlatent.engine>`); ``x`` and `y` stay.")
    assert ext.roles_as_code(text) == ("Kept by `bic` (`fedlatent.engine.contract.starts.best`, "
                                       "`Federation`, `the engine`); ``x`` and `y` stay.")
    assert "extensions: [docs/_ext/sphinx_roles.py]" in CONFIG
