"""Accelerated EM (``Federation(acceleration="squarem")``, issue 23 item 1): the SQUAREM state
on a known linear fixed-point map (rounds saved, the safeguard, the domain), the settings it
refuses, and whole fits of GMM, LCR and LCA against scikit-learn and plain EM."""

import warnings

import numpy as np
import pytest
from sklearn.mixture import GaussianMixture

import fedlatent as fl
from fedlatent.engine.fedem.acceleration import Squarem
from fedlatent.engine.rounds.accelerate import Accelerator
from fedlatent.engine.stats import Stats

# the saturation rule (issue 22) off for this module: its federations' clients are smaller than
# the rule allows, and it tests something else (conftest.py)
pytestmark = pytest.mark.usefixtures("saturation_rule_off_module")


# ---- the accelerator on a linear map F(s) = s* + A (s - s*) ----------------------------------
def linear_map(d=6, rho=0.95, seed=0):
    rng = np.random.default_rng(seed)
    Q, _ = np.linalg.qr(rng.normal(size=(d, d)))
    lam = np.linspace(0.1, rho, d)
    A = Q @ np.diag(lam) @ Q.T  # symmetric: ||F(s) - s*|| shrinks
    star = rng.normal(size=d)
    F = (lambda s: Stats({"s": star + A @ (s["s"] - star)}))
    F.eig = (lam, Q.T @ (0.0 - star))  # the start 0 in the eigenbasis
    return F, (lambda s: -float(np.sum((s["s"] - star) ** 2))), star


def evaluations_to(tol, accel, F, L, star, limit=2000):
    """Map evaluations (rounds) until the point sent is within ``tol`` of the fixed point."""
    x = Stats({"s": np.zeros_like(star)})
    for k in range(1, limit):
        fx = F(x)
        x = fx if accel is None else accel.next_point(x, fx, L(x))
        if np.linalg.norm(x["s"] - star) < tol:
            return k
    return limit


def test_squarem_needs_a_fraction_of_the_plain_map_evaluations():
    F, L, star = linear_map()
    plain = evaluations_to(1e-8, None, F, L, star)
    acc = Accelerator(Squarem(), lambda S: True)
    fast = evaluations_to(1e-8, acc, F, L, star)
    lam, e = F.eig  # plain iteration: ||lam^k e|| < 1e-8 first at k = plain
    assert plain == next(k for k in range(1, 2000) if np.linalg.norm(lam**k * e) < 1e-8) > 300
    assert fast <= plain / 5, (fast, plain)
    assert acc.accepted > 0


def test_safeguard_sends_the_plain_step_after_a_worse_objective():
    F, L, star = linear_map()
    acc = Accelerator(Squarem(step_max0=4.0, mstep=4.0), lambda S: True)
    s0 = Stats({"s": np.zeros_like(star)})
    s1 = F(s0)
    assert acc.next_point(s0, s1, L(s0)) is s1  # a base round: the plain step
    s2 = F(s1)
    s_new = acc.next_point(s1, s2, L(s1))
    r = s1["s"] - s0["s"]
    v = s2["s"] - 2 * s1["s"] + s0["s"]
    a = np.linalg.norm(r) / np.linalg.norm(v)
    assert 1.0 < a < 4.0 and acc.step_max == 4.0  # the S3 step, within its bound
    np.testing.assert_allclose(s_new["s"], s0["s"] + 2 * a * r + a**2 * v, rtol=1e-12)
    # the round at s_new reports a lower objective than at s1: s2 itself is sent next
    assert acc.next_point(s_new, F(s_new), L(s1) - 1e-3) is s2
    assert (acc.rejected, acc.accepted) == (1, 0)
    # the next round (at s2) is a base round again: its plain step is sent
    s3 = F(s2)
    assert acc.next_point(s2, s3, L(s2)) is s3


def test_the_step_bound_grows_when_reached_and_shrinks_after_a_rejection():
    s0, s1 = Stats({"s": np.array([0.0])}), Stats({"s": np.array([1.0])})
    s2 = Stats({"s": np.array([1.9])})  # r = 1, v = -0.1: a = 10, bounded by 4
    acc = Accelerator(Squarem(step_max0=4.0, mstep=4.0), lambda S: True)
    acc.next_point(s0, s1, -1.0)
    out = acc.next_point(s1, s2, -0.5)
    np.testing.assert_allclose(out["s"], [0.0 + 2 * 4 * 1.0 + 16 * -0.1])
    assert acc.step_max == 16.0
    assert acc.next_point(out, s2, -0.6) is s2 and acc.step_max == 4.0


def test_an_extrapolation_out_of_the_domain_is_shortened_then_dropped():
    s0 = Stats({"nk": np.array([0.5, 0.5])})
    s1 = Stats({"nk": np.array([0.4, 0.6])})
    s2 = Stats({"nk": np.array([0.35, 0.65])})  # a = ||r|| / ||v|| = 2, within the bound 4
    acc = Accelerator(Squarem(step_max0=4.0), lambda S: bool(S["nk"].min() >= 0.0))
    out = acc.extrapolate(s0, s1, s2)
    # a = 2: nk[0] = 0.5 - 2 * 2 * 0.1 + 4 * 0.05 = 0.3 >= 0: kept
    np.testing.assert_allclose(out["nk"], [0.3, 0.7], rtol=1e-12)
    # never in the domain: a = 2, 1.5, 1.25, 1.125 tried (backtracks + 1), then s2 itself
    never = Accelerator(Squarem(backtracks=3), lambda S: False)
    assert never.extrapolate(s0, s1, s2) is s2 and never.out_of_domain == 4
    shorten = Accelerator(Squarem(backtracks=4),
                          lambda S: bool(S["nk"][0] >= 0.31))  # a = 2 fails, a = 1.5 passes
    out = shorten.extrapolate(s0, s1, s2)
    np.testing.assert_allclose(out["nk"][0], 0.5 - 2 * 1.5 * 0.1 + 1.5**2 * 0.05, rtol=1e-12)
    assert shorten.out_of_domain == 1


# ---- settings ----------------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs, message", [
    (dict(participation=0.5), r"participation=0\.5 \(each round's statistic is a random"),
    (dict(step_size=0.5), r"step_size=0\.5"),
    (dict(quantizer=fl.Quantizer(4)), r"quantizer=\.\.\. \(quantized replies"),
    (dict(batch_size=16), r"mini-batch E-steps"),
    (dict(privacy=fl.DifferentialPrivacy(1.0, 1e-5, clip=1.0)),
     r"privacy=\.\.\. \(the clients withhold the objective"),
])
@pytest.mark.parametrize("method", ["squarem", "newton"])
def test_acceleration_is_refused_where_the_map_is_not_exact(kwargs, message, method):
    with pytest.raises(ValueError, match=r"accelerates the exact EM map only; not available "
                                         r"with " + message):
        fl.Federation(acceleration=method, **kwargs).validate()


def test_settings_values_and_config_round_trip():
    fl.Federation(acceleration="squarem", secure_aggregation=True).validate()
    assert fl.Federation().squarem is None
    with pytest.raises(ValueError, match=r"must be None, 'squarem' or a fl\.Squarem\(\.\.\.\), "
                                         r"got 'anderson'"):
        fl.Federation(acceleration="anderson").validate()
    with pytest.raises(ValueError, match=r"Squarem\(step_max0=\.\.\.\) must be a number >= 1"):
        fl.Squarem(step_max0=0.5)
    fed = fl.Federation(acceleration=fl.Squarem(step_max0=8.0, backtracks=2))
    back = fl.Federation.from_config(fed.to_config())
    assert back.squarem == fl.Squarem(step_max0=8.0, mstep=4.0, backtracks=2)


# ---- whole fits ----------------------------------------------------------------------------------
def overlapping_gmm(seed=0, n=2000, clients=20, K=4, d=5, scale=1.5):
    """Four 5-dimensional components whose means are ``scale`` standard deviations apart."""
    rng = np.random.default_rng(seed)
    means = rng.normal(scale=scale, size=(K, d))
    X = means[rng.integers(0, K, n)] + rng.standard_normal((n, d))
    cl = rng.integers(0, clients, n)
    start = dict(weights_init=np.full(K, 1 / K), means_init=X[rng.choice(n, K, replace=False)],
                 precisions_init=np.repeat(np.eye(d)[None], K, 0))
    fd = fl.FederatedDataset.from_arrays({f"c{c:02d}": X[cl == c] for c in range(clients)})
    return X, fd, start


@pytest.fixture(scope="module")
def gmm_case():
    X, fd, start = overlapping_gmm(seed=3, n=800)
    sk = GaussianMixture(4, tol=1e-6, max_iter=1000, **start).fit(X)
    gm = fl.FederatedGaussianMixture(4, tol=1e-6, max_rounds=1000, random_state=0, **start,
                                     federation=fl.Federation(acceleration="squarem"),
                                     verbose=False).fit(fd)
    return X, fd, start, sk, gm


def test_gmm_rounds_to_tolerance_against_scikit_learn(gmm_case):
    """From the same start: at most a third of scikit-learn's EM iterations (30 rounds
    against 151), at a log-likelihood at least scikit-learn's (both stop at tol 1e-6)."""
    X, _, _, sk, gm = gmm_case
    assert gm.converged_ and sk.converged_
    assert gm.n_iter_ <= sk.n_iter_ / 3, (gm.n_iter_, sk.n_iter_)
    assert gm.score(X) >= sk.score(X), (gm.score(X), sk.score(X))


def test_the_fit_ends_on_an_em_step(gmm_case):
    """The final parameters are the EM step from the last round's (not an extrapolation no
    round evaluated): their log-likelihood is at least the last objective recorded."""
    X, _, _, _, gm = gmm_case
    assert gm.score(X) >= gm.history_[-1].objective - 1e-12
    objectives = np.array([r.objective for r in gm.history_])
    assert np.all(np.isfinite(objectives))


def test_secure_aggregation_gives_the_same_accelerated_rounds():
    """The accelerator reads only the aggregate: under secure aggregation (sums in a fixed-point
    ring) its first rounds are the plain channel's to the ring's rounding."""
    X, fd, start = overlapping_gmm(seed=3, n=300, clients=5)
    runs = []
    warnings.simplefilter("ignore", fl.ConvergenceWarning)
    for secure in (False, True):
        fed = fl.Federation(acceleration="squarem", secure_aggregation=secure)
        runs.append(fl.FederatedGaussianMixture(4, tol=0.0, max_rounds=8, random_state=0,
                                                **start, federation=fed,
                                                verbose=False).fit(fd))
    plain_ch, secure_ch = ([r.objective for r in est.history_] for est in runs)
    np.testing.assert_allclose(secure_ch, plain_ch, rtol=1e-9)
    np.testing.assert_allclose(runs[1].means_, runs[0].means_, rtol=1e-7, atol=1e-9)


def test_resume_is_refused_with_acceleration(gmm_case, tmp_path):
    _, fd, start, _, _ = gmm_case
    gm = fl.FederatedGaussianMixture(4, max_rounds=5, random_state=0, **start, verbose=False,
                                     federation=fl.Federation(acceleration="squarem"))
    with pytest.raises(ValueError, match=r"resume=True is not available with "
                                         r"Federation\(acceleration=\.\.\.\)"):
        gm.fit(fd, checkpoint=tmp_path / "ck", resume=True)


def lcr_federation(seed=5, n=600, clients=10):
    rng = np.random.default_rng(seed)
    beta = rng.normal(size=(3, 3))
    X = rng.uniform(-2, 2, size=(n, 2))
    z = rng.integers(0, 3, n)
    y = (X * beta[z, :2]).sum(1) + beta[z, 2] + np.array([1.0, 1.2, 0.8])[z] * rng.normal(size=n)
    cl = rng.integers(0, clients, n)
    fd = fl.FederatedDataset.from_arrays({f"c{c:02d}": (X[cl == c], y[cl == c])
                                          for c in range(clients)})
    start = dict(weights_init=np.full(3, 1 / 3), coef_init=rng.normal(size=(3, 2)),
                 intercept_init=rng.normal(size=3), noise_variance_init=np.full(3, 2.0))
    return X, y, fd, start


def flexmix_em(X, y, start, tol=1e-6, max_iter=5000):
    """Centralized EM for a mixture of linear regressions on the pooled rows (flexmix's loop:
    stop when the mean log-likelihood changes by less than ``tol``); returns the iterations
    and the last mean log-likelihood."""
    Xt = np.hstack([X, np.ones((len(X), 1))])
    w, var = start["weights_init"], start["noise_variance_init"]
    beta = np.hstack([start["coef_init"], start["intercept_init"][:, None]])
    last = -np.inf
    for it in range(1, max_iter + 1):
        logp = (-0.5 * np.log(2 * np.pi * var) - 0.5 * (y[:, None] - Xt @ beta.T) ** 2 / var
                + np.log(w))
        ll = np.logaddexp.reduce(logp, axis=1)
        r = np.exp(logp - ll[:, None])
        if abs(ll.mean() - last) < tol:
            return it, ll.mean()
        last = ll.mean()
        A = np.einsum("nk,ni,nj->kij", r, Xt, Xt)
        beta = np.linalg.solve(A, np.einsum("nk,ni,n->ki", r, Xt, y)[..., None])[..., 0]
        var = (r * (y[:, None] - Xt @ beta.T) ** 2).sum(0) / r.sum(0) + 1e-6
        w = r.sum(0) / len(y)
    return max_iter, last


def test_lcr_rounds_against_centralized_em():
    """From the same start: at most a third of the centralized EM's iterations (52 rounds
    against 195), at a log-likelihood at least its own (both stop at tol 1e-6)."""
    X, y, fd, start = lcr_federation()
    iters, ll = flexmix_em(X, y, start)
    est = fl.LatentClassRegression(3, tol=1e-6, max_rounds=2000, random_state=1, reg_noise=1e-6,
                                   federation=fl.Federation(acceleration="squarem"), **start)
    est.fit(fd, progress=False)
    assert est.converged_
    assert est.n_iter_ <= iters / 3, (est.n_iter_, iters)
    assert est.history_[-1].objective >= ll - 1e-9, (est.history_[-1].objective, ll)


def test_lca_accelerated_rounds_beat_as_many_plain_rounds():
    rng = np.random.default_rng(1)
    P = rng.uniform(0.2, 0.8, size=(3, 6))
    X = (rng.random((600, 6)) < P[rng.integers(0, 3, 600)]).astype(float)
    cl = rng.integers(0, 10, 600)
    fd = fl.FederatedDataset.from_arrays({f"c{c:02d}": X[cl == c] for c in range(10)})
    fits = []
    for acc in ("squarem", None):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", fl.ConvergenceWarning)
            fits.append(fl.LatentClassAnalysis(3, tol=0.0, max_rounds=25, random_state=1,
                                               federation=fl.Federation(acceleration=acc))
                        .fit(fd))
    fast, plain = (f.history_[-1].objective for f in fits)
    objectives = [r.objective for r in fits[0].history_]
    assert fast > plain + 1e-4, (fast, plain)
    # the safeguard: a round whose objective fell (a rejected extrapolation) is followed by
    # the EM step from the point before it, which regains at least that point's level
    drops = [k for k in range(1, len(objectives) - 1) if objectives[k] < objectives[k - 1]]
    assert all(objectives[k + 1] >= objectives[k - 1] for k in drops)


@pytest.mark.parametrize("method", ["squarem", "newton"])
def test_hlcr_is_refused_naming_the_sampler(method, saturation_rule_off):
    """Both accelerators refuse a round that is a sampler's sweep, not an EM map (the rule
    off: Newton's three statistics a reply exceed it on these small sites)."""
    fd = fl.datasets.make_synthhlcr(6, 6, 2, 5, 2, 2, sigma=0.5, random_state=0)
    est = fl.HLCR(2, sigma=0.5, max_rounds=3, random_state=0,
                  federation=fl.Federation(acceleration=method))
    with pytest.raises(ValueError, match=r"not available for model 'hlcr': its round is a Gibbs "
                                         r"sweep"):
        est.fit(fd)


def test_the_config_without_acceleration_is_the_one_of_before():
    """Off, the recorded federation has no new key (old checkpoints still resume); on, the
    settings are recorded in full."""
    assert "acceleration" not in fl.Federation().to_config()
    assert fl.Federation(acceleration="squarem").to_config()["acceleration"] == {
        "step_max0": 4.0, "mstep": 4.0, "backtracks": 4}


def test_without_an_objective_the_steps_are_plain():
    """A round whose objective is not finite cannot be safeguarded: the plain EM step (after
    an extrapolation: the EM step it replaced), and no extrapolation follows."""
    F, L, star = linear_map()
    acc = Accelerator(Squarem(), lambda S: True)
    x = Stats({"s": np.zeros_like(star)})
    for _ in range(6):
        fx = F(x)
        nxt = acc.next_point(x, fx, float("nan"))
        assert nxt is fx
        x = nxt
    s1 = F(x)
    acc.next_point(x, s1, L(x))
    s2 = F(s1)
    s_new = acc.next_point(s1, s2, L(s1))
    assert s_new is not s2
    assert acc.next_point(s_new, F(s_new), float("nan")) is s2
