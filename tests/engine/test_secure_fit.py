"""Secure aggregation in the engine: every model's fit equals the plain fit to fixed-point
rounding, with partial participation, the quantizer and control variates; the parameters are
a function of the seed while the client messages are fresh; dropouts after the set-up are
recovered in any round, and too few survivors stop the round with a clear message."""

import re
import warnings

import numpy as np
import pytest

pytest.importorskip("cryptography")

import fedlatent as fl  # noqa: E402
from fedlatent.data.fedgmm_data import make_fedgmm_synthetic  # noqa: E402
from fedlatent.engine.fedem.update import select_active  # noqa: E402
from fedlatent.engine.rounds.loop import FederatedFitError  # noqa: E402
from tolerance import assert_same  # noqa: E402

N_CLIENTS = 12


def quorum_seed(start, rounds, n=N_CLIENTS, p=0.7):
    """The first seed from ``start`` whose participation draws give every round at least the
    default threshold floor(n/2)+1 (fewer would stop the secure fit, by design)."""
    seed = start
    while any(len(select_active([f"{i}" for i in range(n)], p, seed, k, False)) <= n // 2
              for k in range(2, rounds + 1)):
        seed += 1
    return seed


def blobs(n_clients=N_CLIENTS, seed=0):
    rng = np.random.default_rng(seed)
    data = {}
    for c in range(n_clients):
        n = int(rng.integers(20, 60))
        z = rng.random(n) < (0.2 + 0.6 * (c % 2))
        data[f"c{c:02d}"] = np.where(z[:, None], rng.normal(-2, 1, (n, 2)),
                                     rng.normal([2, 1], 0.7, (n, 2)))
    return fl.FederatedDataset.from_arrays(data)


def lines(n_clients=N_CLIENTS, seed=0):
    rng = np.random.default_rng(seed)
    data = {}
    for c in range(n_clients):
        n = int(rng.integers(30, 80))
        x = rng.uniform(0, 10, size=(n, 1))
        z = rng.random(n) < (0.15 + 0.7 * (c % 2))
        data[f"s{c:02d}"] = (x, np.where(z, 5 + 2 * x[:, 0], 15 - x[:, 0]) + rng.normal(size=n))
    return fl.FederatedDataset.from_arrays(data)


def federation(secure, **kw):
    return fl.Federation(participation=0.7, quantizer=fl.Quantizer(8), control_variates=True,
                         secure_aggregation=secure, **kw)


def fit(est, fd, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", fl.ConvergenceWarning)
        return est.fit(fd, **kw)


def rel(a, b):
    return np.max(np.abs(np.asarray(a) - np.asarray(b))) / max(np.max(np.abs(b)), 1e-300)


def gmm(secure, init="random", **kw):
    return fl.FederatedGaussianMixture(2, init_params=init, federation=federation(secure, **kw),
                                       max_rounds=8, tol=0.0,
                                       random_state=quorum_seed(4, 8), verbose=False)


def test_gmm_with_secure_aggregation_equals_the_plain_fit():
    fd = blobs()
    plain = fit(gmm(False), fd, runtime=fl.InProcessRuntime(fd, batched=False))
    # under secure aggregation kmeans-federated (local centroids, not sums) becomes the start
    # drawn from the pooled moments: the plain fit's init_params="random"
    secure = fit(gmm(True, init="kmeans-federated"), fd)
    assert list(secure.history_.to_frame()["participants"]) == list(
        plain.history_.to_frame()["participants"])
    assert min(plain.history_.to_frame()["participants"][1:]) < N_CLIENTS  # partial
    for name in ("weights_", "means_", "covariances_"):
        assert rel(getattr(secure, name), getattr(plain, name)) < 1e-6, name
    assert rel(secure.means_, plain.means_) > 0  # fixed-point rounding, not the same floats


def test_lcr_with_secure_aggregation_equals_the_plain_fit():
    fd = lines()

    def est(secure):
        return fl.LatentClassRegression(2, federation=federation(secure), max_rounds=8, tol=0.0,
                                        random_state=quorum_seed(1, 8))

    plain, secure = fit(est(False), fd), fit(est(True), fd)
    assert min(plain.history_.to_frame()["participants"][1:]) < N_CLIENTS
    for name in ("weights_", "coef_", "intercept_", "noise_variance_"):
        assert rel(getattr(secure, name), getattr(plain, name)) < 1e-6, name


def test_fedgmm_with_secure_aggregation_equals_the_plain_fit():
    fd = make_fedgmm_synthetic(n_clients=N_CLIENTS, n_samples_per_client=60, n_features=3,
                               mean_scale=2.0, fractions=(0.8, 0.1, 0.1), random_state=0).train

    def est(secure, init):
        return fl.FedGMM(2, 2, init_params=init, federation=federation(secure), max_rounds=6,
                         tol=0.0, random_state=quorum_seed(2, 6), verbose=False)

    plain, secure = fit(est(False, "random"), fd), fit(est(True, "kmeans-federated"), fd)
    assert min(plain.history_.to_frame()["participants"][1:]) < N_CLIENTS
    for name in ("weights_x_", "means_", "covariances_", "coef_", "weights_y_"):
        assert rel(getattr(secure, name), getattr(plain, name)) < 1e-6, name


def test_same_seed_same_parameters_exactly_but_fresh_client_messages():
    fd = blobs()
    runs = []
    for _ in range(2):
        rt = fl.InProcessRuntime(fd, record=True)
        est = fit(gmm(True), fd, runtime=rt)
        masked = [m for d, c, meth, m in rt.log if d == "up" and meth == "estep"]
        runs.append((est, masked, rt.log))
    (a, ma, _), (b, mb, _) = runs
    for name in ("weights_", "means_", "covariances_"):  # exact: one seed, one code path
        assert_same(getattr(a, name), getattr(b, name), err_msg=name)
    assert len(ma) == len(mb) > 0
    for x, y in zip(ma, mb):
        assert sorted(x) == sorted(y) and all(np.asarray(v).dtype == np.uint64 for v in x.values())
        assert all((x[k] != y[k]).any() for k in x)  # fresh masks every run
    # the history counts every byte of a round: masked replies, the consistency round and the
    # reveal
    from fedlatent.engine.protocol.messages import message_nbytes

    up: dict = {}
    log = runs[1][2]
    for (_, _, meth, down), (_, _, _, reply) in zip(log[::2], log[1::2]):
        if meth == "estep" or (meth == "secagg" and down.get("step") in ("consistency",
                                                                          "reveal")):
            k = int(down["round"])
            up[k] = up.get(k, 0) + message_nbytes(reply)
    hist = b.history_.to_frame()
    assert [up[k] for k in range(2, 9)] == hist["bytes_up"].tolist()[1:]
    assert hist["bytes_up"].iloc[0] > up[1]  # the key set-up counts in round 1
    # nothing a client sent in a round is one of its statistics in the clear
    assert all(set(m) <= {"delta/nk", "delta/sx", "delta/sxx", "n", "objective/hi",
                                 "objective/lo"} for m in ma)


class DropAt(fl.InProcessRuntime):
    """Clients that compute (and mask) their round-``at`` reply but never deliver it."""

    def __init__(self, fd, at, drop):
        super().__init__(fd)
        self.at, self.drop = at, set(drop)

    def call(self, client_ids, method, messages):
        replies = super().call(client_ids, method, messages)
        if method == "estep":
            k = int(next(iter(messages.values()))["round"]) if messages else 0
            if k == self.at:
                replies = {c: r for c, r in replies.items() if c not in self.drop}
        return replies


def test_a_client_dropping_in_round_3_is_recovered_and_the_round_is_the_survivors_sum():
    """Unverified (verified rounds stop at such a dropout: c02 was in round 2's sum and never
    confirms round 3, tests/engine/test_verified_faults.py)."""
    fd = blobs(n_clients=6)
    seen = {}

    def run(secure, verified=False):
        est = fl.FederatedGaussianMixture(
            2, init_params="random", max_rounds=4, tol=0.0, random_state=0, verbose=False,
            federation=fl.Federation(quantizer=fl.Quantizer(8), secure_aggregation=secure,
                                     **({"verified": verified} if secure else {})))
        S = {}
        fit(est, fd, runtime=DropAt(fd, 3, ["c02"]),
            callbacks=[lambda k, p, S_hat, rec: S.__setitem__(k, S_hat.copy())])
        seen[secure] = S
        return est

    run(False)
    secure = run(True)
    with pytest.raises(FederatedFitError, match=r"^round 3, exchange 'estep': .*\['c02'\] "
                       r"took part in the sum of the exchange before"):
        run(True, verified=None)  # (the default: verified when the sites can replay)
    rec = secure.history_.to_frame()
    assert rec["participants"].tolist() == [6, 6, 5, 5]  # c02 excluded after its recovery
    assert secure.history_[2].missing == ["c02"] and secure.history_[3].missing == ["c02"]
    for k in ("nk", "sx", "sxx"):  # round 3: the survivors' sum, as the plain loop's
        assert rel(seen[True][3][k], seen[False][3][k]) < 1e-9


def test_fewer_survivors_than_the_threshold_stops_the_round():
    fd = blobs(n_clients=5)
    est = fl.FederatedGaussianMixture(2, init_params="random", max_rounds=5, tol=0.0,
                                      random_state=0, verbose=False,
                                      federation=fl.Federation(secure_aggregation=True))
    with pytest.raises(FederatedFitError, match=(
            r"^round 3, exchange 'estep': 2 of 5 participants replied, fewer than the "
            r"threshold 3; the sum cannot be unmasked, so this exchange is abandoned; kept the "
            r"parameters of round 2$")) as err:
        fit(est, fd, runtime=DropAt(fd, 3, ["c00", "c01", "c03"]))
    assert err.value.round == 3 and set(err.value.last_good) >= {"weights", "means"}


def test_too_few_clients_drawn_skip_the_round_before_anything_is_sent():
    # (issue 19, item 7: such a round used to end the fit; it is now skipped and recorded)
    fd = blobs(n_clients=6)
    seed = next(s for s in range(100) if len(select_active([str(i) for i in range(6)], 0.5, s,
                                                           2, False)) < 4)
    est = fl.FederatedGaussianMixture(2, init_params="random", max_rounds=3, tol=0.0,
                                      random_state=seed, verbose=False,
                                      federation=fl.Federation(participation=0.5,
                                                               secure_aggregation=True))
    rt = fl.InProcessRuntime(fd, record=True)
    fit(est, fd, runtime=rt)
    assert est.n_iter_ == 3
    assert re.match(r"^[0-3] clients drawn \[.*\] \(participation 0.5\), fewer than the secure "
                    r"aggregation threshold 4: skipped", est.history_[1].skipped)
    assert not [m for d, c, meth, m in rt.log
                if d == "down" and meth == "estep" and int(m["round"]) == 2]


def test_threshold_and_settings_are_checked():
    fd = blobs(n_clients=5)
    est = fl.FederatedGaussianMixture(2, init_params="random", max_rounds=2, verbose=False,
                                      federation=fl.Federation(secure_aggregation=True,
                                                               secagg_threshold=2))
    with pytest.raises(ValueError, match=r"secure aggregation threshold 2 for 5 clients: it must "
                       r"be an integer in \[3, 5\]"):
        fit(est, fd)
    with pytest.raises(ValueError, match=r"Federation\(track_h=True\) needs every client's "
                       "statistic"):
        fl.Federation(secure_aggregation=True, track_h=True).validate()


@pytest.mark.usefixtures("saturation_rule_off")
def test_a_statistic_beyond_the_bound_is_refused_naming_the_client_and_field():
    fd = fl.FederatedDataset.from_arrays({f"c{i}": np.full((4, 1), 10.0 ** (i + 2))
                                          for i in range(3)})
    est = fl.FederatedGaussianMixture(1, init_params="random", max_rounds=2, verbose=False,
                                      federation=fl.Federation(secure_aggregation=True))
    with pytest.raises(ValueError, match=r"client 'c2': field 'sxx' has \|value\| .* beyond the "
                       r"declared bound 1.04858e\+06"):
        fit(est, fd)


@pytest.mark.parametrize("name, kw, why", [
    ("SEC", {}, "SEC's replies are fitted local models and per-pair losses, not sums"),
    ("HLCR", {"solver": "gibbs"}, "solver='gibbs' pools the rows in one place; use "
     "solver='federated'")])
def test_models_without_secure_sums_refuse_it(name, kw, why):
    est = getattr(fl, name)(**kw)
    est.federation = fl.Federation(secure_aggregation=True)  # SEC takes no federation argument
    with pytest.raises(ValueError, match=rf"^{name} refuses Federation\(secure_aggregation="
                       rf"True\): {why}.*; fit it with secure_aggregation=False$"):
        est._start(lines(4), None)


@pytest.mark.usefixtures("saturation_rule_off")
def test_fedhlcr_with_secure_aggregation_equals_the_plain_fit():
    fd = fl.datasets.make_synthhlcr(n_agents=N_CLIENTS, n_entities=36, entities_per_agent=4,
                                    events_per_entity=8, n_clusters=2, n_features=3, sigma=0.5,
                                    random_state=3)

    def est(secure):  # sigma and delta estimated by the server's Gibbs steps, from the sums
        return fl.HLCR(n_clusters=2, max_rounds=6, random_state=quorum_seed(3, 6),
                       federation=federation(secure))

    plain, secure = fit(est(False), fd), fit(est(True), fd)
    assert min(plain.history_.to_frame()["participants"][1:]) < N_CLIENTS
    for name in ("coef_", "intercept_", "precisions_", "c_", "cluster_counts_", "draws_sigma_"):
        assert rel(getattr(secure, name), getattr(plain, name)) < 1e-6, name


def test_auto_sizes_are_refused_under_secure_aggregation():
    est = fl.FederatedGaussianMixture("auto", federation=fl.Federation(secure_aggregation=True))
    with pytest.raises(ValueError, match=r"^FederatedGaussianMixture: a size 'auto' is chosen by "
                       r"scores each client sends"):
        est._start(blobs(4), None)


def test_a_lying_client_is_caught_on_the_aggregate_of_the_initialization_round():
    fd = blobs(n_clients=5)
    rt = fl.InProcessRuntime(fd)
    node = rt.nodes["c01"]
    honest = node._estep

    def lie(msg):
        reply = honest(msg)
        reply["delta/nk"] = reply["delta/nk"] - 50.0  # negative counts, hidden in the sum
        return reply

    node._estep = lie
    est = fl.FederatedGaussianMixture(2, init_params="random", max_rounds=3, verbose=False,
                                      federation=fl.Federation(secure_aggregation=True))
    with pytest.raises(FederatedFitError, match=r"^round 1: the aggregate of clients \['c00', "
                       r"'c01', 'c02', 'c03', 'c04'\] breaks the model's invariants: .*; client "
                       r"'c01' sent it \(located by 3 group tests over sub-cohorts of at least 3 "
                       r"clients\); fit again without it"):
        fit(est, fd, runtime=rt)
