"""Issue 19, items 5, 7 and 9: a default secure fit is the default plain fit, any participation
runs to the end under secure aggregation, and 'auto' sizes never send a score in the clear."""

import warnings

import numpy as np
import pytest

import fedlatent as fl
from fedlatent.engine.fedem.update import select_active
from fedlatent.models.gmm.init import CANDIDATES_PER_COMPONENT

pytest.importorskip("cryptography")


def quickstart():
    """The README's "Quickstart (Python)" data: 20 clients x 200 rows, means +-3."""
    rng = np.random.default_rng(0)
    data = {f"c{i}": rng.normal(loc=(-3 if i % 2 else 3), size=(200, 2)) for i in range(20)}
    return fl.FederatedDataset.from_arrays(data)


MU3 = np.array([[0.0, 4.0], [-4.0, -2.0], [4.0, -2.0]])


def three_components():
    """12 clients, 2-D, 3 components: each client mostly one component, a fifth the next."""
    rng = np.random.default_rng(1)
    data = {}
    for i in range(12):
        k = i % 3
        data[f"c{i:02d}"] = np.vstack([rng.normal(size=(150, 2)) + MU3[k],
                                       rng.normal(size=(30, 2)) + MU3[(k + 1) % 3]])
    return fl.FederatedDataset.from_arrays(data)


def fit(est, fd, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", fl.ConvergenceWarning)
        return est.fit(fd, **kw)


def rel(a, b):
    return np.max(np.abs(np.asarray(a) - np.asarray(b))) / max(np.max(np.abs(b)), 1e-300)


def gmm(K, secure, **kw):
    return fl.FederatedGaussianMixture(
        K, random_state=0, verbose=False,
        federation=fl.Federation(secure_aggregation=True) if secure else None, **kw)


def same_fit(plain, secure, names=("weights_", "means_", "covariances_")):
    assert secure.n_iter_ == plain.n_iter_
    assert secure.converged_ == plain.converged_
    for name in names:
        assert rel(getattr(secure, name), getattr(plain, name)) < 1e-6, name


def test_readme_quickstart_secure_default_is_the_plain_default():
    fd = quickstart()
    plain, secure = fit(gmm(2, False), fd), fit(gmm(2, True), fd)
    same_fit(plain, secure)
    assert plain.converged_
    order = np.argsort(secure.means_[:, 0])
    np.testing.assert_allclose(secure.means_[order], [[-3, -3], [3, 3]], atol=0.1)
    np.testing.assert_allclose(secure.weights_, [0.5, 0.5], atol=0.01)


def test_three_components_secure_default_is_the_plain_default():
    fd = three_components()
    plain, secure = fit(gmm(3, False), fd), fit(gmm(3, True), fd)
    same_fit(plain, secure)
    # every true mean has a fitted mean within 0.1
    dist = np.linalg.norm(secure.means_[:, None, :] - MU3[None], axis=2)
    assert dist.min(axis=0).max() < 0.1
    for covariance_type in ("tied", "diag", "spherical"):
        p = fit(gmm(3, False, covariance_type=covariance_type, max_rounds=5, tol=0.0), fd)
        s = fit(gmm(3, True, covariance_type=covariance_type, max_rounds=5, tol=0.0), fd)
        same_fit(p, s)


def test_fedgmm_secure_default_start_is_the_plain_default_start():
    fd = fl.datasets.make_fedgmm_synthetic(n_clients=8, n_samples_per_client=80, n_features=2,
                                           mean_scale=3.0, random_state=0).train

    def est(secure):
        return fl.FedGMM(2, 2, max_rounds=4, tol=0.0, random_state=0, verbose=False,
                         federation=fl.Federation(secure_aggregation=secure))

    plain, secure = fit(est(False), fd), fit(est(True), fd)
    same_fit(plain, secure, ("weights_x_", "means_", "covariances_", "coef_", "weights_y_"))


def test_a_per_client_start_under_secure_aggregation_warns_once():
    fd = quickstart()
    with pytest.warns(UserWarning, match=r"init_params='kmeans-federated' sends each client's "
                      r"local k-means centroids, which secure aggregation does not allow: this "
                      r"fit starts from the pooled moments \('random'\), a weaker start") as rec:
        fit(gmm(2, True, init_params="kmeans-federated", max_rounds=2), fd)
    assert sum("kmeans-federated" in str(w.message) for w in rec) == 1
    with warnings.catch_warnings():  # the default start: no warning
        warnings.simplefilter("error", UserWarning)
        fit(gmm(2, True, max_rounds=2), fd)


# ---- item 7: secure aggregation under any participation --------------------------------------
def test_secure_fit_with_partial_participation_runs_every_round_and_records_skips():
    fd = three_components()
    cids = list(fd.client_ids)
    est = fl.FederatedGaussianMixture(
        3, max_rounds=50, tol=0.0, random_state=0, verbose=False,
        federation=fl.Federation(participation=0.7, secure_aggregation=True))
    fit(est, fd)  # the threshold is 7 of 12
    h = est.history_.to_frame()
    assert est.n_iter_ == 50 and list(h["round"]) == list(range(1, 51))
    small = [k for k in range(2, 51) if len(select_active(cids, 0.7, est.seed_, k, False)) < 7]
    assert len(small) >= 1  # the public draw has rounds below the threshold
    skipped = h[h["skipped"] != ""]
    assert list(skipped["round"]) == small
    assert (skipped["participants"] == 0).all() and (skipped["bytes_up"] == 0).all()
    assert (skipped["bytes_down"] == 0).all() and skipped["objective"].isna().all()
    assert skipped["skipped"].str.contains(
        r"clients drawn .* fewer than the secure aggregation threshold 7: skipped, nothing "
        r"exchanged").all()
    ran = h[h["skipped"] == ""]
    assert (ran["participants"] >= 7).all() and len(ran) == 50 - len(small)
    dist = np.linalg.norm(est.means_[:, None, :] - MU3[None], axis=2)
    assert dist.min(axis=0).max() < 0.2


def test_a_skipped_round_keeps_the_parameters():
    fd = three_components()
    cids = list(fd.client_ids)
    seed = next(s for s in range(100)
                if len(select_active(cids, 0.7, s, 3, False)) < 7)
    seen = {}

    def keep(k, params, S_hat, record):
        seen[k] = ({n: np.array(v) for n, v in params.items()}, record.skipped)

    est = fl.FederatedGaussianMixture(
        3, max_rounds=3, tol=0.0, random_state=seed, verbose=False,
        federation=fl.Federation(participation=0.7, secure_aggregation=True))
    fit(est, fd, callbacks=[keep])
    assert seen[3][1].startswith(f"{len(select_active(cids, 0.7, seed, 3, False))} clients drawn")
    for name, v in seen[2][0].items():
        np.testing.assert_array_equal(seen[3][0][name], v)


def test_skipped_rounds_survive_save_and_load(tmp_path):
    fd = three_components()
    cids = list(fd.client_ids)
    seed = next(s for s in range(100)
                if len(select_active(cids, 0.7, s, 2, False)) < 7)
    est = fit(fl.FederatedGaussianMixture(
        3, max_rounds=2, tol=0.0, random_state=seed, verbose=False,
        federation=fl.Federation(participation=0.7, secure_aggregation=True)), fd)
    est.save(tmp_path / "m")
    back = fl.FederatedGaussianMixture.load(tmp_path / "m")
    assert [r.skipped for r in back.history_] == [r.skipped for r in est.history_]
    assert back.history_[1].skipped.endswith("the parameters of round 1 kept")


# ---- item 9: 'auto' sizes never leak -------------------------------------------------------
def _lines():
    rng = np.random.default_rng(0)
    data = {}
    for c in range(6):
        x = rng.uniform(0, 10, size=(40, 1))
        y = np.where(rng.random(40) < 0.5, 2 * x[:, 0], -x[:, 0]) + rng.normal(0, 0.3, 40)
        data[f"c{c}"] = (x, y)
    return fl.FederatedDataset.from_arrays(data)


AUTO = [
    ("gmm", lambda fed: fl.FederatedGaussianMixture("auto", federation=fed, verbose=False),
     "n_components"),
    ("lcr", lambda fed: fl.LatentClassRegression("auto", federation=fed), "n_components"),
    ("fedgmm", lambda fed: fl.FedGMM("auto", 2, federation=fed, verbose=False),
     "n_input_components"),
]


def _data(name):
    if name == "lcr":
        return _lines()
    if name == "fedgmm":
        return fl.datasets.make_fedgmm_synthetic(n_clients=6, n_samples_per_client=40,
                                                 n_features=2, random_state=0).train
    return quickstart()


@pytest.mark.parametrize("name, make, param", AUTO)
def test_auto_under_secure_aggregation_is_refused_before_any_exchange(name, make, param):
    fd = _data(name)
    rt = fl.InProcessRuntime(fd, record=True)
    est = make(fl.Federation(secure_aggregation=True))
    with pytest.raises(ValueError, match=(
            rf"^{type(est).__name__}: a size 'auto' is chosen by scores each client sends in "
            rf"the clear \({param}='auto': .*\), which secure aggregation would not hide; give "
            rf"{param} a number or fit with secure_aggregation=False$")):
        est.fit(fd, runtime=rt)
    assert rt.log == []  # not one message, so no client's log-likelihood, crossed


@pytest.mark.parametrize("name, make, param", AUTO[:2])
def test_auto_under_differential_privacy_is_refused_before_any_exchange(name, make, param):
    fd = _data(name)
    rt = fl.InProcessRuntime(fd, record=True)
    dp = fl.DifferentialPrivacy(epsilon=1.0, delta=1e-5, clip=5.0,
                                **({"target_range": (-20.0, 20.0)} if name == "lcr" else {}))
    est = make(fl.Federation(privacy=dp))
    with pytest.raises(ValueError, match=rf"^{type(est).__name__}: .*'auto' is chosen by .* "
                       r"outside the privacy budget; give .* under differential privacy$"):
        est.fit(fd, runtime=rt)
    assert rt.log == []


# ---- the default start's exchanges: disclosure and reply checks ------------------------------
def test_small_hard_assignment_cells_merge_in_every_count_scope():
    from fedlatent.engine.privacy.disclosure import DisclosurePolicy
    from fedlatent.models.gmm.model import hard_labels

    # rows 0-4 nearest centre 0, row 5 alone nearest centre 1 (a cell of one row is the row)
    d2 = np.array([[0.0, 9.0]] * 5 + [[4.0, 1.0]])
    for scope in ("client", "aggregate"):  # plain, and secure aggregation's scope
        labels = hard_labels(d2, DisclosurePolicy(count_scope=scope))
        assert labels.tolist() == [0] * 6, scope
    assert hard_labels(d2, DisclosurePolicy.off()).tolist() == [0] * 5 + [1]


def test_default_start_sends_no_small_block_and_checks_each_reply():
    from fedlatent.engine.rounds.loop import FederatedFitError

    fd = three_components()
    rt = fl.InProcessRuntime(fd, record=True)
    fit(gmm(3, False, max_rounds=1), fd, runtime=rt)
    nk = [np.asarray(m["stat/nk"]) for d, c, meth, m in rt.log
          if d == "up" and meth == "query" and "stat/nk" in m]
    assert len(nk) == 3 * 12  # candidates, then two Lloyd steps, from every client
    assert all(np.all((v == 0) | (v >= 3)) for v in nk)

    class Tamper(fl.InProcessRuntime):
        def call(self, client_ids, method, messages):
            out = super().call(client_ids, method, messages)
            if method == "query" and messages["c03"].get("query") == "hard_stats":
                out["c03"] = {**out["c03"], "stat/nk": np.asarray(out["c03"]["stat/nk"]) + 1}
            return out

    tampered = 180 + 3 * CANDIDATES_PER_COMPONENT  # one more row in each candidate's cell
    with pytest.raises(FederatedFitError, match=r"^k-means initialization \(hard-assignment "
                       r"sums to candidate centres\): client 'c03': value 'stat/nk': counts 'nk' "
                       rf"sum to {tampered}, not to the 180 units; nothing of this exchange was "
                       r"used"):
        fit(gmm(3, False, max_rounds=1), fd, runtime=Tamper(fd))


def test_too_few_populated_candidates_start_from_the_pooled_moments_with_one_warning():
    rng = np.random.default_rng(1)
    data = {f"c{i}": rng.normal(size=(30, 2)) for i in range(3)}
    data["c1"][4, 0] = 1e100  # stretches the pooled Gaussian: every row nears one candidate
    fd = fl.FederatedDataset.from_arrays(data)
    # (plain only: secure aggregation refuses such values, beyond its fixed-point bound)
    with pytest.warns(UserWarning, match=r"^init_params='kmeans-sums': only 1 of the "
                      rf"{2 * CANDIDATES_PER_COMPONENT} candidate centres \(or k-means groups\) "
                      r"gathered rows, fewer than the 2 components; this fit starts from the "
                      r"pooled moments") as rec:
        est = fit(gmm(2, False, max_rounds=3), fd)
    assert sum("kmeans-sums" in str(w.message) for w in rec) == 1
    assert rec[0].filename == __file__  # points at the caller's fit
    assert np.isfinite(est.means_).all() and np.isfinite(est.covariances_).all()
