"""A start's queries are checked before they are answered (issue 38): a verifying site
replays the model's start code from the committed seed and the verified exchanges so far,
and answers a query only if it is the next one that code asks, with its payload. A server
that moves the k-means centres of a hard-assignment query (a probe: each site's sums over
the cells of centres of its choosing) is refused at that query, by every site, before any
sum of it leaves; on the code before, every site answered it and refused only the first
round's parameters."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import fedlatent as fl
from fedlatent.engine.faults import FederatedFitError
from fedlatent.engine.protocol.messages import ERROR_KEY
from fedlatent.engine.transport.inprocess import InProcessRuntime
from verified_doubles import six_sites

pytest.importorskip("cryptography")


class MovedCentres(InProcessRuntime):
    """The ``j``-th hard-assignment query's centres moved by ``by`` (every site alike)."""

    def __init__(self, fd, j=1, by=0.25):
        from fedlatent.engine.site.policy import SitePolicy

        super().__init__(fd, record=True, policies=SitePolicy())  # (a site's own policy: no
        # public starts, as a simulation's relaxed sites allow)
        self.j, self.by, self.seen = j, by, 0

    def call(self, client_ids, method, messages):
        if method == "query" and any(m.get("query") == "hard_stats" for m in messages.values()):
            self.seen += 1
            if self.seen == self.j:
                messages = {c: {**m, "centers": np.asarray(m["centers"]) + self.by}
                            for c, m in messages.items()}
        return super().call(client_ids, method, messages)


def _fit(fd, runtime, **fed):
    est = fl.FederatedGaussianMixture(3, n_init=1, tol=0.0, max_rounds=3, random_state=0,
                                      federation=fl.Federation(secure_aggregation=True, **fed))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return est.fit(fd, runtime=runtime)


@pytest.mark.parametrize("j", [1, 2])
def test_moved_centres_are_refused_at_their_query(j):
    """Every site refuses the moved query (the first, from the moments and the seed; or the
    second, from the first's sums), naming the start exchange; the fit stops before its first
    round."""
    fd = six_sites(3.0)
    rt = MovedCentres(fd, j=j)
    with pytest.raises(FederatedFitError):
        _fit(fd, rt)
    refusals = [str(r[ERROR_KEY]) for d, c, meth, r in rt.log
                if d == "up" and meth == "query" and ERROR_KEY in r]
    assert len(refusals) == len(fd.client_ids), refusals
    assert all(f"start exchange {j + 1} ('hard_stats') refused" in s and "centers" in s
               for s in refusals), refusals
    assert not [m for d, c, meth, m in rt.log if d == "down" and meth == "estep"]


def test_unverified_the_moved_centres_are_answered():
    """The positive control: without verification every site answers the moved query."""
    fd = six_sites(3.0)
    rt = MovedCentres(fd, j=1)
    _fit(fd, rt, verified=False)
    assert rt.seen >= 1
    assert not [r for d, c, meth, r in rt.log if d == "up" and meth == "query"
                and ERROR_KEY in r]
