"""What the install pages promise (issue 41): no release on the package index (so no `pip
install fedlatent`), and the core packages the Flower extra moves named with Flower's own pins,
read from the installed Flower's metadata (a Flower that changes its pins fails this test until
the pages say so)."""

import re
from importlib.metadata import requires
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", ROOT / "docs" / "install.md"]
#: the core install's packages Flower 1.41 holds below the versions a plain install picks
MOVED = ("typer", "rich", "packaging", "cryptography")


USER_PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_install_from_a_clone_not_from_the_package_index(page):
    assert "no release on the package index" in " ".join(page.read_text(encoding="utf-8").split())


@pytest.mark.parametrize("page", USER_PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_page_installs_from_the_package_index(page):
    text = page.read_text(encoding="utf-8")
    assert re.findall(r"pip install ['\"]?fedlatent\b\S*", text) == []


@pytest.mark.flower
@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_the_pages_name_flowers_pins_of_core_packages(page):
    pytest.importorskip("flwr")
    caps = {}
    for req in requires("flwr") or []:
        m = re.match(r"([A-Za-z0-9_.-]+)\s*(?:\[[^]]*\])?\s*([^;]*)", req)
        upper = re.search(r"<\s*([\w.]+)", m.group(2)) if m and ";" not in req else None
        if upper:
            caps[m.group(1).lower()] = re.sub(r"(\.0)+$", "", upper.group(1))
    text = " ".join(page.read_text(encoding="utf-8").split())
    assert [f"{n}<{caps[n]}" for n in MOVED if f"`{n}<{caps[n]}`" not in text] == []
