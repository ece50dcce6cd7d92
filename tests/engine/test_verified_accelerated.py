"""Verified rounds of accelerated EM (issue 38): a verifying site replays the statistic SQUAREM
or subspace Newton sends and each extra point from the verified aggregates
(engine/node/verify_points.py), so an accelerated secure fit is verified by default and equals
the unverified one to 1e-10; an extra point's parameters moved by 1e-6 (relative), or one more
point than the history gives (a probe), is refused at that round by every site; the replay
lives in the node's state, so a node rebuilt for each message (as on Flower) replays too."""

from __future__ import annotations

import re
import warnings

import numpy as np
import pytest

import fedlatent as fl
from fedlatent.engine.contract import registry
from fedlatent.engine.faults import FederatedFitError
from fedlatent.engine.protocol.messages import ERROR_KEY, unpack
from fedlatent.engine.transport.inprocess import InProcessRuntime
from verified_doubles import Rebuilt, moved, six_sites

#: the round the deviating server deviates in: the second with extra points (subspace Newton
#: sends 1 point at round 4, then 2 a round, on these data)
K = 5
CASES = [("gmm", "squarem"), ("gmm", "newton"), ("fedgmm", "newton")]


def _data(name: str):
    """The example's data; GMM's on three overlapping 2-d Gaussians over six sites (the
    example's blobs converge in four rounds, before any accelerator acts)."""
    if name != "gmm":
        return registry.estimator_entries()[name].load_example().case().data()
    return six_sites()


def _fit(name: str, acc, runtime=None, rounds: int = 15, **fed):
    """A secure fit of ``name`` under ``acceleration=acc``: (estimator, runtime)."""
    fd = _data(name)
    est = registry.estimator_entries()[name].load_example().case().make()
    if "n_init" in est.get_params():
        est.set_params(n_init=1)
    est.set_params(tol=1e-10, max_rounds=rounds, federation=fl.Federation(
        secure_aggregation=True, acceleration=acc, **fed))
    rt = runtime or InProcessRuntime(fd, record=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        est.fit(fd, runtime=rt)
    return est, rt


def _sent(rt) -> list[dict]:
    """The E-step messages of the fit's rounds (not its queries), every client's copy."""
    return [m for d, c, meth, m in rt.log if d == "down" and meth == "estep"
            and m.get("secagg/exchange") == "estep"]


def _fitted(est) -> dict[str, np.ndarray]:
    return {k: v for k, v in vars(est).items()
            if k.endswith("_") and isinstance(v, np.ndarray) and v.dtype.kind == "f"}


def test_verification_stays_on_with_acceleration():
    for acc in ("squarem", "newton"):
        assert fl.Federation(secure_aggregation=True, acceleration=acc).verifies
        fl.Federation(secure_aggregation=True, acceleration=acc, verified=True).validate()


@pytest.mark.parametrize("name,acc", CASES)
def test_accelerated_verified_and_unverified_secure_fits_agree(name, acc):
    a, rt = _fit(name, acc)  # (verified: the default under secure aggregation)
    b, _ = _fit(name, acc, verified=False)
    plain, _ = _fit(name, None, verified=False)
    assert all("verify/A" in m for m in _sent(rt) if int(m["round"]) > 1)  # verified rounds
    assert len(a.history_) == len(b.history_) == 15
    fa, fb, fp = _fitted(a), _fitted(b), _fitted(plain)
    assert len(fa) >= 2
    for k in fa:
        assert np.allclose(fa[k], fb[k], rtol=1e-10, atol=1e-10, equal_nan=True), k
    # the accelerator acted: the fit is not plain EM's after as many rounds
    assert max(float(np.max(np.abs(fa[k] - fp[k]))) for k in fa) > 1e-6
    one = sorted({c for d, c, meth, m in rt.log})[0]
    points = sum(int(m.get("points", 0) or 0) for d, c, meth, m in rt.log
                 if c == one and d == "down" and meth == "estep"
                 and m.get("secagg/exchange") == "estep")
    assert points >= (15 if acc == "newton" else 0)  # (1 at round 4, then 2 a round)


class Deviating(InProcessRuntime):
    """A server that changes round ``K``'s E-step messages by ``change(message)``."""

    def __init__(self, fd, change, **kw):
        super().__init__(fd, **kw)
        self.change, self.replies = change, None

    def call(self, client_ids, method, messages):
        if method == "estep" and any(int(m.get("secagg/round", 0)) == K
                                     and m.get("secagg/exchange") == "estep"
                                     for m in messages.values()):
            messages = {c: self.change(dict(m)) for c, m in messages.items()}
            self.replies = super().call(client_ids, method, messages)
            return self.replies
        return super().call(client_ids, method, messages)


def _moved(msg):
    """One coordinate moved by 1e-6 (relative): the largest entry of the last extra point's
    parameters, or of the round's parameters in a round without extra points (SQUAREM)."""
    j = int(msg.get("points", 0) or 0)
    return moved(msg, f"params{j or ''}")


def _probe(msg):
    """One more extra point than the history gives: the round's parameters, moved by 1%."""
    j = int(msg.get("points", 0) or 0) + 1
    msg["points"] = j
    for k, v in unpack(msg, "params").items():
        msg[f"params{j}/{k}"] = np.asarray(v, dtype=np.float64) * 1.01
    return msg


@pytest.mark.parametrize("name,acc", CASES)
@pytest.mark.parametrize("change", [_moved, _probe], ids=["moved-1e-6", "probe-point"])
def test_a_deviating_accelerated_server_is_refused_at_that_round_by_every_site(name, acc,
                                                                                change):
    fd = _data(name)
    rt = Deviating(fd, change)
    with pytest.raises(FederatedFitError):
        _fit(name, acc, rt)
    m = 2 if acc == "newton" else 0  # the points round K carries honestly
    if change is _probe:
        why = (rf"it carries {m + 1} extra point\(s\), the history of verified aggregates "
               rf"gives {m}; extra point {m + 1} is not derived from it")
    elif m:
        why = (rf"extra point {m}'s parameter '\w+' differs from the replay of the verified "
               r"aggregate by [0-9.e-]+ at")
    else:
        why = r"parameter '\w+' differs from the replay of the verified aggregate by [0-9.e-]+"
    assert sorted(rt.replies) == sorted(fd.client_ids)
    for c, reply in rt.replies.items():  # every site, naming the round and what it refused
        assert re.match(rf"client {c!r}: round {K} refused: {why}", reply[ERROR_KEY]), \
            (c, reply[ERROR_KEY])


@pytest.mark.parametrize("change", [_moved, _probe], ids=["moved-1e-6", "probe-point"])
def test_the_same_accelerated_server_is_answered_unverified(change):
    """The positive control: unverified, the deviating server's round is answered."""
    fd = _data("gmm")
    est, _ = _fit("gmm", "newton", Deviating(fd, change), rounds=8, verified=False)
    assert len(est.history_) == 8


def test_the_replay_survives_a_node_rebuilt_for_each_message():
    fd = _data("gmm")
    a, _ = _fit("gmm", "newton", Rebuilt(fd, record=True), rounds=10)
    b, _ = _fit("gmm", "newton", rounds=10, verified=False)
    fa, fb = _fitted(a), _fitted(b)
    for k in fa:
        assert np.allclose(fa[k], fb[k], rtol=1e-10, atol=1e-10, equal_nan=True), k
