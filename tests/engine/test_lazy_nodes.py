"""Issue 23 item 3 (the 100,000-client whole fit): the in-process runtime builds a client object
when it is first needed. A batched fit answers every exchange from the batch's arrays, so it
builds almost none; whoever asks for the nodes gets every client, each having handled the
setup and holding the batch's state, as when all were built up front."""

from __future__ import annotations

import math
import warnings

import numpy as np

import fedlatent as fl
from fedlatent.engine.transport.inprocess import InProcessRuntime
from tolerance import assert_close


def _fd(n=40, seed=0):
    rng = np.random.default_rng(seed)
    return fl.FederatedDataset.from_arrays(
        {f"c{i:02d}": rng.normal(size=(12, 2)) + 4.0 * (i % 2) for i in range(n)})


def _fit(fd, runtime):
    fed = fl.Federation(disclosure=fl.DisclosurePolicy(max_parameters_per_record=math.inf))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fl.FederatedGaussianMixture(2, max_rounds=4, tol=0.0, random_state=0,
                                           federation=fed).fit(fd, runtime=runtime)


def test_a_batched_fit_builds_almost_no_client_object():
    fd = _fd()
    rt = InProcessRuntime(fd)
    assert len(rt._nodes) == 0
    _fit(fd, rt)
    assert rt.batched_calls > 0
    assert len(rt._nodes) <= 1  # (the first client: the policy the server sent them all)


def test_the_nodes_asked_for_after_a_batched_fit_are_every_client_set_up_with_its_state():
    fd = _fd()
    lazy, eager = InProcessRuntime(fd), InProcessRuntime(fd)
    eager.nodes  # noqa: B018 - every client object built before the fit, as before
    a, b = _fit(fd, lazy), _fit(fd, eager)
    assert_close(a.means_, b.means_)
    states = lazy.get_client_states()
    assert list(states) == fd.client_ids
    nodes = lazy.nodes
    assert list(nodes) == fd.client_ids and all(n.model is not None for n in nodes.values())
    want = eager.get_client_states()
    for c in fd.client_ids:
        assert states[c].keys() == want[c].keys() == nodes[c].state.keys()
        for k in want[c]:
            assert_close(nodes[c].state[k], want[c][k])


def test_client_states_before_any_exchange_are_empty_and_build_nothing():
    fd = _fd(5)
    rt = InProcessRuntime(fd)
    assert rt.get_client_states() == {c: {} for c in fd.client_ids}
    assert rt.client_state("model/labels") == {}
    assert len(rt._nodes) == 0
