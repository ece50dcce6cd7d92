"""What a verified exchange asks besides its parameters (issue 38): a server that sends the
replayed parameters but changes how a site computes or scales its reply, one field at a time,
is refused at that round by the sites (the fit stops naming the field); unverified, the same
message is answered (the positive control: the field does act on the reply).

Each attack of the catalogue gives the server something: ``mode="batch"``, ``batch_size=1``
a reply of one record; ``control_variates``/``alpha``/``V_reset`` a shift of every reply, so
of the verified aggregate and the replayed ``S_hat``; a weight of zero at every site but one a
secure sum of that site alone (a moved ``cv_init``: tests/engine/test_verified_audit.py).
"""

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

AT, ROUNDS = 3, 5


def _round_of(msg) -> int | None:
    if msg.get("secagg/exchange") != "estep" or "secagg/replay" in msg:
        return None
    return int(np.asarray(msg["secagg/round"]).reshape(-1)[0])


def _weight_to_first(msg, client, first):
    return {**msg, "secagg/weight": 1.0 if client == first else 0.0}


#: name -> (how round AT's message to ``client`` is changed, the field the refusal names)
ATTACKS = {
    "batch of one": (lambda m, c, f: {**m, "mode": "batch", "batch_size": 1}, "'mode'"),
    "batch size only": (lambda m, c, f: {**m, "batch_size": 1}, "'batch_size'"),
    "control variates off": (lambda m, c, f: {**m, "control_variates": False},
                             "'control_variates'"),
    "alpha zero": (lambda m, c, f: {**m, "alpha": 0.0}, "'alpha'"),
    "quantized": (lambda m, c, f: {**m, "quant_levels": 3}, "'quant_levels'"),
    "keep init again": (lambda m, c, f: {**m, "keep_init": True}, "'keep_init'"),
    "control variate reset": (  # (a verified message carries no S_hat: shapes of K=3, d=2)
        lambda m, c, f: {**m, "V_reset/nk": np.zeros(3), "V_reset/sx": np.zeros((3, 2)),
                         "V_reset/sxx": np.zeros((3, 2, 2))}, "V_reset"),
    "one site weighted": (_weight_to_first, "'secagg/weight'"),
    "unit": (lambda m, c, f: {**m, "secagg/unit": 2 * m["secagg/unit"]}, "'secagg/unit'"),
}


class Changing(InProcessRuntime):
    """Round ``at``'s E-step messages changed by ``change(msg, client, first client)``."""

    def __init__(self, fd, change, at=AT):
        super().__init__(fd, record=True)
        self.change, self.at, self.changed = change, at, 0

    def call(self, client_ids, method, messages):
        if method == "estep" and any(_round_of(m) == self.at for m in messages.values()):
            first = sorted(messages)[0]
            messages = {c: self.change(dict(m), c, first) for c, m in messages.items()}
            self.changed += len(messages)
        return super().call(client_ids, method, messages)


def _fit(fd, runtime, verified):
    est = fl.FederatedGaussianMixture(3, n_init=1, tol=0.0, max_rounds=ROUNDS, random_state=0,
                                      federation=fl.Federation(secure_aggregation=True,
                                                               verified=verified))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return est.fit(fd, runtime=runtime)


def _refusals(rt) -> list[str]:
    """The refusals the sites sent up in the fit's E-step exchanges."""
    return [str(r[ERROR_KEY]) for d, c, meth, r in rt.log
            if d == "up" and meth == "estep" and isinstance(r, dict) and ERROR_KEY in r]


@pytest.mark.parametrize("name", list(ATTACKS))
def test_a_verifying_site_refuses_a_changed_round_field(name):
    """Every site (or, for the weights, every site the change concerns) refuses round AT,
    naming the field; the fit stops there, keeping the round before."""
    change, field = ATTACKS[name]
    fd = six_sites(3.0)
    rt = Changing(fd, change)
    with pytest.raises(FederatedFitError) as err:
        _fit(fd, rt, verified=None)
    assert err.value.round == AT, str(err.value)
    assert rt.changed
    said = _refusals(rt)
    assert said and all(field in s and f"round {AT} refused" in s for s in said), said


@pytest.mark.parametrize("name", ["batch of one", "control variates off", "alpha zero",
                                  "one site weighted"])
def test_unverified_the_changed_field_is_answered(name):
    """The positive control: without verification the sites answer the changed round (the
    field acts on their replies; nothing refuses it)."""
    change, _ = ATTACKS[name]
    fd = six_sites(3.0)
    rt = Changing(fd, change)
    try:
        _fit(fd, rt, verified=False)
    except FederatedFitError:
        pass  # (the server's own aggregate check may discard the odd round: not a refusal)
    assert rt.changed and not _refusals(rt)


def test_an_honest_cv_init_passes_and_is_checked_once():
    """The honest fit: cv_init's S_hat is the replayed one (nothing refused) and what was kept
    of it is gone after round 2."""
    fd = six_sites(3.0)
    rt = InProcessRuntime(fd, record=True)
    _fit(fd, rt, verified=None)
    assert not _refusals(rt)
    assert any(meth == "cv_init" for d, c, meth, m in rt.log if d == "down")
    for node in rt.nodes.values():
        assert not [k for k in node.state if k.startswith("verify/cv-start")]
