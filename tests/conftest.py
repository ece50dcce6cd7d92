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


@pytest.fixture(scope="session")
def one_ray():
    """One Ray instance for every Flower simulation of a test worker.

    Flower's Ray backend starts Ray for each simulation (``ray.init`` unless Ray is running)
    and shuts it down after it (``RayBackend.terminate``): 10-40 s a start on 2 busy cores, for
    about a dozen simulations. Tests that ask for this fixture keep the first instance running
    (``ray.shutdown`` does nothing while they run) and shut it down once, when the worker's
    session ends. Each simulation still starts and kills its own actors: only the Ray daemons
    are shared, and every simulation of the suite asks for the same two CPUs.
    """
    ray = pytest.importorskip("ray")
    real_shutdown = ray.shutdown
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ray, "shutdown", lambda *args, **kwargs: None)
        yield
    if ray.is_initialized():
        real_shutdown()


#: fixtures that start a real Flower deployment (tests/flower/test_deploy.py, the Flower page of
#: tests/test_docs_code_blocks.py): a test asking for one must be marked ``deployment``
DEPLOYMENT_FIXTURES = {"deployment", "runs", "flower_page"}


def pytest_collection_modifyitems(config, items):
    """``make test`` runs ``-m "not deployment"`` (``make test-deployment`` runs the rest, and
    CI both): a test that starts a deployment without the mark would slip into ``make test``'s
    budget unnoticed, so collecting one is an error naming it."""
    unmarked = [item.nodeid for item in items
                if DEPLOYMENT_FIXTURES & set(getattr(item, "fixturenames", ()))
                and item.get_closest_marker("deployment") is None]
    if unmarked:
        raise pytest.UsageError("tests that start a Flower deployment need "
                                f"@pytest.mark.deployment: {unmarked[:10]}"
                                + (f" and {len(unmarked) - 10} more" if len(unmarked) > 10
                                   else ""))


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


@pytest.fixture
def saturation_rule_off(monkeypatch):
    """The saturation rule of the disclosure policy (issue 22) switched off for one test, the
    same as giving its fits ``DisclosurePolicy(max_parameters_per_record=math.inf)``: for
    tests of something else (exactness, resume, persistence, faults) on federations whose
    clients are too small for the rule (e.g. ``blobs_fd``: 50 clients of 3 to 44 rows, where
    a 3-component full mixture in 4 dimensions sends 45 numbers). The rule itself is tested in
    ``tests/engine/test_rules_saturation.py``; every other rule stays on."""
    import fedlatent.engine.node.client as client
    import fedlatent.engine.privacy.disclosure as disclosure

    monkeypatch.setattr(disclosure, "check_reply_numbers", lambda *a, **k: None)
    monkeypatch.setattr(client, "check_reply_numbers", lambda *a, **k: None)


@pytest.fixture
def rare_level_rule_off(monkeypatch):
    """The rare-level rule (issue 22) switched off for one test, as
    :func:`saturation_rule_off`: for tests of something else whose small clients hold a
    category of 1 or 2 records by chance. Tested in ``tests/engine/test_rules_levels.py``."""
    import fedlatent.engine.privacy.disclosure as disclosure

    monkeypatch.setattr(disclosure, "check_level_counts", lambda *a, **k: None)


@pytest.fixture(scope="module")
def saturation_rule_off_module():
    """:func:`saturation_rule_off` for a whole module, module-scoped fits included (the input
    catalogues fit 8-row clients through the command line, which takes no policy)."""
    import fedlatent.engine.node.client as client
    import fedlatent.engine.privacy.disclosure as disclosure

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(disclosure, "check_reply_numbers", lambda *a, **k: None)
        mp.setattr(client, "check_reply_numbers", lambda *a, **k: None)
        yield
