"""Issue 11, "done when": with one of 20 clients multiplying every number it sends by -50, every
model either excludes it (recorded in ``history_``, parameters within 1% of the fit without that
client) or stops with a message naming it; never a silently poisoned fit."""

import re
import warnings

import numpy as np
import pytest

import fedlatent as fl
from federations import make_blobs_federation
from fedlatent.engine import FederatedFitError, InProcessRuntime, Runtime
from test_estimators import _lcr_data

N_CLIENTS = 20


def _times(value, factor):
    if isinstance(value, np.ndarray) and value.dtype.kind == "f":
        return value * factor
    if isinstance(value, float | np.floating):
        return float(value) * factor
    return value


class Multiplying(Runtime):
    """In-process clients; ``victim`` multiplies every float it sends by ``factor``, in every
    exchange (``rounds_from=None``) or only in the round loop's replies from that round on."""

    def __init__(self, fd, victim, factor=-50.0, rounds_from=None):
        self.inner = InProcessRuntime(fd)
        self.victim, self.factor, self.rounds_from = victim, factor, rounds_from
        self.hits = 0

    @property
    def client_ids(self):
        return self.inner.client_ids

    def call(self, client_ids, method, messages):
        out = self.inner.call(client_ids, method, messages)
        if self.victim not in out:
            return out
        if self.rounds_from is not None and (
                method != "estep" or int(messages[self.victim]["round"]) < self.rounds_from):
            return out
        self.hits += 1
        out[self.victim] = {k: _times(v, self.factor) for k, v in out[self.victim].items()}
        return out


def _fedgmm_data():
    return fl.datasets.make_fedgmm_synthetic(n_clients=N_CLIENTS, n_samples_per_client=30,
                                             n_components=2, n_features=3,
                                             random_state=0).train


def _hlcr_data():
    return fl.datasets.make_synthhlcr(n_agents=N_CLIENTS, n_entities=4, n_clusters=2,
                                      n_features=3, events_per_entity=4, random_state=0)


def _case(name, federation=None, rounds=4):
    """(estimator, data, fitted parameter compared with the fit without the victim)."""
    if name in ("gmm", "gmm-random-start"):
        init = "random" if name == "gmm-random-start" else "kmeans-federated"
        est = fl.FederatedGaussianMixture(3, max_rounds=rounds, tol=0.0, random_state=0,
                                          init_params=init, federation=federation)
        return est, make_blobs_federation(n_clients=N_CLIENTS), "means_"
    if name == "lcr":
        # one start: the rounds and the liar's hits counted are those of one fit
        est = fl.LatentClassRegression(2, max_rounds=rounds, tol=0.0, random_state=0,
                                       n_init=1, federation=federation)
        return est, _lcr_data(n_clients=N_CLIENTS), "coef_"
    if name == "fedgmm":
        est = fl.FedGMM(2, 2, max_rounds=rounds, tol=0.0, random_state=0, verbose=False,
                        federation=federation)
        return est, _fedgmm_data(), "means_"
    if name == "hlcr":
        # one chain: the rounds and the liar's hits counted are those of one chain
        return fl.HLCR(2, sigma=1.0, delta=1.0, max_rounds=rounds, random_state=0,
                       n_chains=1, federation=federation), \
            _hlcr_data(), "coef_"
    if name == "sec":
        fd, _ = fl.datasets.make_sec_simulation1(n_learners=N_CLIENTS, n_samples=20, snr=64.0,
                                                 random_state=0)
        return fl.SEC(candidates="linear", random_state=0), fd, None
    raise KeyError(name)


def _fit(est, fd, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", fl.ConvergenceWarning)
        return est.fit(fd, **kw)


#: where each model stops and why, when the victim lies from its first reply on
FIRST_EXCHANGE = {
    "gmm": r"initialization \(moments\): client '{v}': value 'sxx': the moment matrix "
           r"\[\[sum x x\^T, sum x\], \[., n\]\] of block 0 is not positive semi-definite",
    "gmm-random-start": r"initialization \(moments\): client '{v}': value 'sxx': the moment "
                        r"matrix .* is not positive semi-definite",
    "fedgmm": r"initialization \(moments\): client '{v}': value 'sxx': the moment matrix .* is "
              r"not positive semi-definite",
    "lcr": r"initialization \(random memberships\): client '{v}': value 'stat/nk' has values "
           r"below 0",
    "hlcr": r"initialization \(agent sizes\): client '{v}': value 'n_entities' has values "
            r"below 1",
    "sec": r"SEC select: client '{v}': value 'e' has values below 0",
}


@pytest.mark.usefixtures("saturation_rule_off")
@pytest.mark.parametrize("name", list(FIRST_EXCHANGE))
def test_a_client_multiplying_everything_by_minus_50_is_named_before_any_round(name):
    est, fd, _ = _case(name)
    assert fd.n_clients == N_CLIENTS
    victim = fd.client_ids[3]
    rt = Multiplying(fd, victim)
    with pytest.raises(FederatedFitError,
                       match=FIRST_EXCHANGE[name].format(v=victim) + ".*nothing of this "
                       "exchange was used"):
        _fit(est, fd, runtime=rt)
    assert rt.hits >= 1
    assert not hasattr(est, "history_")  # no fit, poisoned or not, was stored


ROUND_MODELS = ["gmm", "lcr", "fedgmm", "hlcr"]


@pytest.mark.usefixtures("saturation_rule_off")
@pytest.mark.parametrize("name", ROUND_MODELS)
def test_lying_in_the_initialization_round_stops_the_fit_naming_the_client(name):
    """Honest initialization exchanges, then -50 times its statistic in round 1 (the
    initialization E-step, which every client must answer)."""
    est, fd, _ = _case(name)
    victim = fd.client_ids[3]
    with pytest.raises(FederatedFitError, match=rf"clients \['{victim}'\] did not answer the "
                       rf"initialization round validly \(every client must\): client "
                       rf"'{victim}': count '(nk|n_entities)' is negative"):
        _fit(est, fd, runtime=Multiplying(fd, victim, rounds_from=1))


@pytest.mark.usefixtures("saturation_rule_off")
@pytest.mark.parametrize("name, rounds", [("gmm", 25), ("lcr", 25), ("fedgmm", 6),
                                          ("hlcr", 6)])
def test_lying_in_later_rounds_is_excluded_and_recorded(name, rounds):
    """From round 2 on every reply of the victim is refused (its rebuilt statistic has negative
    counts) and recorded; without control variates an excluded client weighs nothing, so the
    deterministic models end within 1% of the fit without it."""
    fed = fl.Federation(control_variates=False)
    est, fd, attr = _case(name, fed, rounds)
    victim = fd.client_ids[3]
    rt = Multiplying(fd, victim, rounds_from=2)
    _fit(est, fd, runtime=rt)
    assert rt.hits == rounds - 1
    assert est.history_[0].rejected == {} and est.history_[0].participants == N_CLIENTS
    for rec in est.history_[1:]:
        assert list(rec.rejected) == [victim] and rec.participants == N_CLIENTS - 1
        assert re.search(r"count '\w+' is negative|the moment matrix .* is not positive "
                         r"semi-definite", rec.rejected[victim]), rec.rejected
    if name in ("gmm", "lcr"):  # HLCR samples labels, FedGMM's start includes the victim
        ref, _, _ = _case(name, fed, rounds)
        _fit(ref, fd.subset([c for c in fd.client_ids if c != victim]))
        a, b = getattr(est, attr), getattr(ref, attr)
        order = lambda m: m[np.argsort(m[:, 0])]  # noqa: E731
        assert np.max(np.abs(order(a) - order(b))) <= 0.01 * np.max(np.abs(b))
    assert all(np.all(np.isfinite(np.asarray(v))) for k, v in vars(est).items()
               if k.endswith("_") and isinstance(v, np.ndarray) and v.dtype.kind == "f")
