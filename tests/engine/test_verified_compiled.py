"""Where a verifying site's checks run compiled (numba): only where the process's verifying
sites together repay numba's set-up (a simulation of many sites), never in one deployed
site's process (a fresh one per message there), whose checks stay in NumPy. Both ways give
the same numbers (test_replay_flat, test_sumtree_kernel, test_gmm_check_step)."""

from __future__ import annotations

from fresh_process import in_fresh_process

_FIT = """
import warnings
import numpy as np
import fedlatent as fl
rng = np.random.default_rng(0)
fd = fl.FederatedDataset.from_arrays({f"c{i}": rng.normal(size=(40, 2)) + 3 * (i % 2)
                                      for i in range(6)})
est = fl.FederatedGaussianMixture(2, init_params="random", max_rounds=4, tol=0.0,
                                  random_state=0, verbose=False,
                                  federation=fl.Federation(secure_aggregation=True))
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    est.fit(fd)
result = [float(v) for v in est.means_.ravel()]
"""


def test_a_verified_fit_of_a_few_sites_never_sets_numba_up():
    """Six verifying sites in one process (a small simulation, as a deployed site's process
    holds one): every round is checked, in NumPy, and numba is never imported."""
    means, imported = in_fresh_process(_FIT, ("numba",))
    assert len(means) == 4
    assert imported == []


_SCALE = """
import fedlatent.engine.node.verify as verify
from fedlatent.engine.protocol.compiled import worth

class Node:  # (what check_exchange keeps of a node: a weak reference)
    pass

verify._check_exchange = lambda node, method, msg: worth(64)  # (a check of 64 words)
nodes = [Node() for _ in range(verify.SITES_FOR_KERNELS)]
result = [verify.check_exchange(nodes[0], "estep", {})]
result.append(verify.check_exchange(nodes[0], "estep", {}))  # (the same node again)
for node in nodes[1:]:
    last = verify.check_exchange(node, "estep", {})
result.append(last)
del nodes[1:]
import gc
gc.collect()
result.append(verify.check_exchange(nodes[0], "estep", {}))  # (the others gone)
"""


def test_the_checks_run_compiled_from_as_many_sites_as_repay_numba():
    """A check of 64 words is worth compiling only within a process where
    ``SITES_FOR_KERNELS`` verifying sites are alive: not for one site (nor the same one
    twice), yes once the hundredth checks, no again once the others are gone (numba not set
    up in between: the test only asks)."""
    result, imported = in_fresh_process(_SCALE, ("numba",))
    assert result == [False, False, True, False]
    assert imported == []
