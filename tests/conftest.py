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
