"""Shared fixtures: small federated data sets made here (no downloads)."""

import os
from pathlib import Path

import pytest

from federations import make_blobs_federation

os.environ.setdefault("MPLBACKEND", "Agg")


@pytest.fixture(scope="session", autouse=True)
def _one_blas_thread_for_small_test_problems():
    """Test problems are small: BLAS/OpenMP thread pools only add contention on 2 cores."""
    from threadpoolctl import threadpool_limits

    with threadpool_limits(1):
        yield


@pytest.fixture
def blobs_fd():
    return make_blobs_federation()


@pytest.fixture(autouse=True)
def saved_figures(monkeypatch):
    """Every figure a test saves is checked as it is saved (tests/figure_checks.py): one that is
    hard to read fails the test, naming the file and what is wrong. The fixture's value is
    ``[(file name, problems)]`` of the figures saved so far."""
    from matplotlib.figure import Figure

    from figure_checks import figure_problems

    seen: list[tuple[str, list[str]]] = []
    original = Figure.savefig

    def savefig(self, fname, *args, **kwargs):
        name = Path(str(getattr(fname, "name", fname))).name
        problems = figure_problems(self)
        seen.append((name, problems))
        if problems:
            raise AssertionError(f"figure {name} is hard to read: {'; '.join(problems)}")
        return original(self, fname, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", savefig)
    return seen


#: test files that take minutes, started first (``make test`` runs ``-n 2 --dist loadfile``:
#: one file per worker at a time, handed out in collection order), so that no worker begins one
#: near the end while the others idle
SLOW_FILES = ("flower/test_deploy.py", "cli/test_cli_progress.py", "flower/test_simulation.py",
              "test_sec_experiments.py", "test_sec_real.py", "test_figures.py")


def pytest_collection_modifyitems(config, items):
    """The slow files first, in :data:`SLOW_FILES`' order; the rest as collected."""
    root = Path(__file__).parent

    def rank(item):
        try:
            rel = Path(str(item.path)).relative_to(root).as_posix()
        except ValueError:
            return len(SLOW_FILES)
        return SLOW_FILES.index(rel) if rel in SLOW_FILES else len(SLOW_FILES)

    items.sort(key=rank)  # stable: each file's tests keep their order
