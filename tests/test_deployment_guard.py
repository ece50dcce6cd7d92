"""The collection guard of tests/conftest.py: a test that asks for a Flower deployment fixture
without ``@pytest.mark.deployment`` would run inside ``make test``'s budget, so collecting it is
an error naming it."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def guard(request):
    """tests/conftest.py as pytest loaded it (``import conftest`` could give tests/cli's)."""
    want = Path(__file__).with_name("conftest.py").resolve()
    for plugin in request.config.pluginmanager.get_plugins():
        if Path(getattr(plugin, "__file__", None) or "/").resolve() == want:
            return plugin
    raise AssertionError("tests/conftest.py is not loaded")


class _Item:
    def __init__(self, nodeid: str, fixtures: tuple[str, ...], marked: bool):
        self.nodeid, self.fixturenames, self.marked = nodeid, fixtures, marked

    def get_closest_marker(self, name: str):
        return object() if self.marked and name == "deployment" else None


def test_the_guard_knows_the_deployment_fixtures(guard):
    assert guard.DEPLOYMENT_FIXTURES == {"deployment", "runs", "flower_page"}


def test_an_unmarked_deployment_test_is_refused_by_name(guard):
    items = [_Item("t.py::ok", ("deployment",), True), _Item("t.py::plain", ("tmp_path",), False),
             _Item("t.py::bad", ("runs", "tmp_path"), False)]
    with pytest.raises(pytest.UsageError,
                       match=r"need @pytest.mark.deployment: \['t.py::bad'\]$"):
        guard.pytest_collection_modifyitems(None, items)


def test_marked_and_plain_tests_pass_the_guard(guard):
    items = [_Item("t.py::ok", ("flower_page",), True), _Item("t.py::plain", (), False)]
    assert guard.pytest_collection_modifyitems(None, items) is None


def test_the_guard_names_ten_and_counts_the_rest(guard):
    items = [_Item(f"t.py::bad{i}", ("deployment",), False) for i in range(13)]
    with pytest.raises(pytest.UsageError, match=r"'t.py::bad9'\] and 3 more$"):
        guard.pytest_collection_modifyitems(None, items)
