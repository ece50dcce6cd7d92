"""What each site checks a verified exchange against must be what every site was told: a
server that tells one site other federation units (with the unit and weight that fit them,
so the site's own checks pass) or another federation at setup is refused when the first
exchange's tokens are compared: the site's pair masks and tokens bind its setup, units and
seed (with the transcript of the exchange before, from the second exchange on:
:func:`fedlatent.engine.node.verify_fields.bound`), and its neighbours refuse to reveal
anything of that exchange."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest

import fedlatent as fl
from fedlatent.engine.faults import FederatedFitError
from fedlatent.engine.transport.inprocess import InProcessRuntime
from verified_doubles import six_sites

pytest.importorskip("cryptography")


class Reveals(InProcessRuntime):
    """Counts the reveals the sites answered (``revealed``: the exchanges, by round)."""

    def call(self, client_ids, method, messages):
        out = super().call(client_ids, method, messages)
        if method == "secagg":
            from fedlatent.engine.protocol.messages import ERROR_KEY

            self.revealed = getattr(self, "revealed", []) + [
                messages[c]["round"] for c, r in out.items()
                if messages[c].get("step") == "reveal" and ERROR_KEY not in r]
        return out


class OtherUnits(Reveals):
    """Site ``site`` is told the federation has ``factor`` times its units, in every secure
    exchange's message, with the unit and weight those units give it."""

    def __init__(self, fd, site="c0", factor=2.0):
        super().__init__(fd, record=True)
        self.site, self.factor, self.told = site, factor, 0

    def call(self, client_ids, method, messages):
        m = messages.get(self.site)
        if m is not None and "secagg/unit" in m:
            m = dict(m)
            m["secagg/unit"] = float(m["secagg/unit"]) / self.factor
            m["secagg/weight"] = float(m["secagg/weight"]) / self.factor
            if "verify/units" in m:
                u = np.asarray(m["verify/units"], dtype=np.float64)
                m["verify/units"] = np.array([u[0] * self.factor, u[1]])
            messages = {**messages, self.site: m}
            self.told += 1
        return super().call(client_ids, method, messages)


class OtherSetup(Reveals):
    """Site ``site``'s setup says another federation (control variates off), as verify/."""

    def __init__(self, fd, site="c0"):
        super().__init__(fd, record=True)
        self.site, self.told = site, 0

    def call(self, client_ids, method, messages):
        m = messages.get(self.site)
        if method == "setup" and m is not None and m.get("verify"):
            raw = json.loads(m["verify"])
            raw["federation"]["on_invalid"] = "raise"  # (a setting no round check reads)
            messages = {**messages, self.site: {**m, "verify": json.dumps(raw)}}
            self.told += 1
        return super().call(client_ids, method, messages)

    def broadcast(self, client_ids, method, msg):
        return self.call(client_ids, method, {c: msg for c in client_ids})


@pytest.fixture(autouse=True)
def _server_checks_off(monkeypatch):
    """The server is the one cheating: its own checks of the aggregates (the units a sum
    claims, the model's invariants) are off, as a cheating server would leave them."""
    from fedlatent.engine.secagg import secure, secure_checks

    monkeypatch.setattr(secure.SecureChannel, "units_slack", lambda self, n: float("inf"))
    monkeypatch.setattr(secure_checks, "_rebuilt", lambda *a, **kw: None)


def _fit(fd, runtime):
    est = fl.FederatedGaussianMixture(3, n_init=1, tol=0.0, max_rounds=4, random_state=0,
                                      federation=fl.Federation(secure_aggregation=True))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return est.fit(fd, runtime=runtime)


@pytest.mark.parametrize("runtime", [OtherUnits, OtherSetup])
def test_a_site_told_other_settings_stops_the_first_exchange(runtime):
    """The told site's own checks pass (its unit and weight fit what it was told); its
    neighbours' tokens differ from the ones it expects, so not even the first exchange (a
    start's, with no transcript before it) is revealed, by any site: its sum, the told site's
    reply weighted as the server chose, never forms. The fit stops, saying the server told
    them different things."""
    fd = six_sites(3.0)
    rt = runtime(fd)
    with pytest.raises(FederatedFitError) as err:
        _fit(fd, rt)
    assert rt.told
    assert "told them different setups, units or seeds" in str(err.value), str(err.value)
    assert getattr(rt, "revealed", []) == []


def test_the_honest_fit_binds_the_same_settings_everywhere():
    """Every site binds the same setup, units and seed: the fit runs its rounds."""
    fd = six_sites(3.0)
    rt = Reveals(fd)
    est = _fit(fd, rt)
    assert len(rt.revealed) > 6 * 4  # (every site reveals in every exchange: start and rounds)
    assert len(est.history_) == 4 and not any(r.skipped for r in est.history_)
