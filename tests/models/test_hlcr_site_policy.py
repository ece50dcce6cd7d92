"""HLCR's extra chains under sites that hold a policy (issue 21): a site answers each (run,
exchange, round) once, and a second chain asks the same rounds with other draws, so each chain
is set up as a run of its own (before, every site refused chain 2's first round: "one-answer")."""

import warnings

import numpy as np

from fedlatent.engine.contract.registry import example
from fedlatent.engine.site import SitePolicy
from fedlatent.engine.transport.inprocess import InProcessRuntime


def test_a_two_chain_federated_fit_under_site_policies_equals_the_fit_without():
    case = example("hlcr").case("flower")
    fd = case.data()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        plain = case.make().set_params(n_chains=2).fit(fd)
        rt = InProcessRuntime(fd, policies=SitePolicy())
        guarded = case.make().set_params(n_chains=2).fit(fd, runtime=rt)
    assert guarded.n_chains_ == 2
    for k in ("coef", "sigma"):
        np.testing.assert_allclose(guarded.chains_[k], plain.chains_[k], rtol=1e-12)
    for c in fd.client_ids:
        ledger = rt.nodes[c].guard.ledger
        runs = [e["run"] for e in ledger.of("plan")]
        assert len(runs) == 2 and runs[1] == runs[0] + "-chain2"
        assert ledger.of("refusal") == []
