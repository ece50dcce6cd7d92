"""Shared fixtures: small federated data sets made here (no downloads)."""

import os

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
