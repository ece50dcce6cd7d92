"""Utility under differential privacy: each DP-capable model's held-out metric against epsilon.

Issue 12, section 4. Every model that supports ``fl.DifferentialPrivacy`` (its estimator class
declares ``capabilities.differential_privacy``; the others give the reason there and are listed as
skipped) is fitted on the same federated data with ``epsilon`` in {0.5, 1, 2, 4, 8} at
``delta = 1e-5`` (record-level, the whole fit, initialization included) and without privacy,
for 10^4, 10^5 and 10^6 training records in all; the table gives its held-out metric beside the
non-private fit's, with their ratio.

The data (:func:`privacy_process`, :func:`make_privacy_data`): a Gaussian mixture in ``d = 4``
dimensions with ``K = 3`` well-separated components (weights 0.41, 0.35, 0.24; full
covariances with eigenvalues in [0.5, 1.5] in random directions; means at least 3 apart in
those units), standardized with the mixture's exact mean and per-feature standard deviations
(public: the generating process fixes them, no record is spent). The Bayes rule assigns 99.1%
of the rows to their own component; the true mixture's mean log-likelihood is -3.50 per row.
Rows are grouped in entities of 12 events that share a component (HLCR's hierarchy; for the
other models the rows are plain mixture draws); per entity 10 events train and 2 are held out
(the held-out set is 20% of the training size). Each of 10 equal clients draws its entities'
components from Dirichlet(1.2 * K * weights) proportions of its own (non-IID). Targets: per
component a linear regression ``y = x . beta_k + b_k + N(0, 0.5^2)`` (LatentClassRegression,
HLCR) and a binary label from a per-component logistic model (FedGMM).

Public bounds, from the generating process alone (Monte Carlo with a fixed seed): the clip
radius is the ``clip_quantile`` (default 0.95: 2.78) quantile of ``||x||`` around the origin
(the standardized mean); the target range is the (0.0005, 0.9995) quantiles of ``y``. The noise
is ``"distributed"`` by default (each client adds its share, secure aggregation on, the sum
carries the calibrated noise); ``noise="local"`` puts the full noise on every client's sums.

Metrics (all on the held-out rows): Gaussian mixture, mean log-likelihood per record;
LatentClassRegression and HLCR, mean squared error of the prediction; FedGMM, accuracy with each
client's own mixture weights. ``ratio`` is the private metric over the non-private one (same
data, same settings, no clipping, no noise); ``relative_loss`` the relative worsening (positive
when the private fit is worse).
"""

from __future__ import annotations

import logging
import time
import warnings
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pandas as pd

from ..data.dataset import ClientData, FederatedDataset
from ..engine.fedem.federation import Federation
from ..engine.privacy.dp import DifferentialPrivacy
from ..engine.rounds.loop import PRIVATE_MAX_ROUNDS
from ..plotting import figure

__all__ = [
    "make_privacy_data",
    "privacy_process",
    "privacy_utility",
    "public_bounds",
]

logger = logging.getLogger(__name__)

EPSILONS = (0.5, 1.0, 2.0, 4.0, 8.0)
DELTA = 1e-5
SIZES = (10_000, 100_000, 1_000_000)
#: the process's parameters come from this seed, so every size and seed shares one process
PROCESS_SEED = 20_261_123
EVENTS_PER_ENTITY = 12
TEST_EVENTS_PER_ENTITY = 2


@dataclass(frozen=True)
class MixtureProcess:
    """The generating process (standardized): weights (K,), means (K, d), covariances
    (K, d, d); regression ``beta`` (K, d), ``intercept`` (K,), ``noise_sd``; logistic labels
    ``cls_coef`` (K, d), ``cls_intercept`` (K,)."""

    weights: np.ndarray
    means: np.ndarray
    covariances: np.ndarray
    beta: np.ndarray
    intercept: np.ndarray
    noise_sd: float
    cls_coef: np.ndarray
    cls_intercept: np.ndarray

    @property
    def n_components(self) -> int:
        return int(self.weights.shape[0])

    @property
    def n_features(self) -> int:
        return int(self.means.shape[1])


def privacy_process(n_features: int = 4, n_components: int = 3,
                    separation: float = 3.0) -> MixtureProcess:
    """The standardized Gaussian mixture the experiment draws from (see the module notes).

    Means are drawn until every pair is at least ``separation`` apart (in the units of the
    within-component covariances, whose eigenvalues lie in [0.5, 1.5]); then the mixture is
    standardized with its exact mean and per-feature standard deviations.
    """
    rng = np.random.default_rng(PROCESS_SEED)
    d, K = n_features, n_components
    base = np.array([0.35, 0.30, 0.20, 0.15, 0.10, 0.10, 0.05, 0.05])[:K]
    weights = base / base.sum()
    while True:
        means = rng.normal(scale=separation / np.sqrt(2.0), size=(K, d))
        dist = np.linalg.norm(means[:, None] - means[None], axis=-1)
        if np.min(dist[np.triu_indices(K, 1)]) >= separation:
            break
    q, _ = np.linalg.qr(rng.normal(size=(K, d, d)))
    eig = rng.uniform(0.5, 1.5, size=(K, d))
    covs = np.einsum("kij,kj,klj->kil", q, eig, q)
    mean = weights @ means
    second = np.einsum("k,kij->ij", weights, covs + np.einsum("ki,kj->kij", means, means))
    sd = np.sqrt(np.diag(second - np.outer(mean, mean)))
    means = (means - mean) / sd
    covs = covs / np.outer(sd, sd)
    return MixtureProcess(
        weights=weights, means=means, covariances=covs,
        beta=rng.normal(size=(K, d)), intercept=rng.normal(scale=2.0, size=K), noise_sd=0.5,
        cls_coef=rng.normal(scale=2.0, size=(K, d)), cls_intercept=rng.normal(size=K))


def _draw(process: MixtureProcess, z: np.ndarray, rng: np.random.Generator):
    """Rows of components ``z``: X (n, d), regression target, binary label."""
    chol = np.linalg.cholesky(process.covariances)
    eps = rng.standard_normal((z.shape[0], process.n_features))
    X = process.means[z] + np.einsum("nij,nj->ni", chol[z], eps)
    y = (np.einsum("ni,ni->n", X, process.beta[z]) + process.intercept[z]
         + process.noise_sd * rng.standard_normal(z.shape[0]))
    logit = np.einsum("ni,ni->n", X, process.cls_coef[z]) + process.cls_intercept[z]
    label = (rng.random(z.shape[0]) < 1.0 / (1.0 + np.exp(-logit))).astype(np.int64)
    return X, y, label


def public_bounds(process: MixtureProcess | None = None, clip_quantile: float = 0.95,
                  n_draws: int = 400_000) -> tuple[float, tuple[float, float]]:
    """Clip radius and target range from the generating process alone (no data spent).

    Returns
    -------
    clip : float
        The ``clip_quantile`` quantile of ``||x||`` (the standardized mean is the origin).
    target_range : (float, float)
        The (0.0005, 0.9995) quantiles of the regression target.
    """
    process = process or privacy_process()
    rng = np.random.default_rng(PROCESS_SEED + 1)
    z = rng.choice(process.n_components, size=n_draws, p=process.weights)
    X, y, _ = _draw(process, z, rng)
    clip = float(np.quantile(np.linalg.norm(X, axis=1), clip_quantile))
    lo, hi = np.quantile(y, [0.0005, 0.9995])
    return clip, (float(lo), float(hi))


@dataclass(frozen=True)
class PrivacyData:
    """Training and held-out views of one draw, per task: ``"x"`` (features only),
    ``"regression"`` (target y), ``"classification"`` (binary label), ``"entity"`` (target y
    and entity ids)."""

    train: dict[str, FederatedDataset]
    test: dict[str, FederatedDataset]


def make_privacy_data(n_records: int, n_clients: int = 10, *,
                      process: MixtureProcess | None = None, concentration: float = 1.2,
                      random_state: int | None = 0) -> PrivacyData:
    """Draw ``n_records`` training rows (and 20% more held out) over ``n_clients`` clients.

    Each client holds ``n_records // n_clients`` training rows (rounded to whole entities of
    10 training + 2 held-out events sharing one component); client ``c``'s entities draw their
    component from ``Dirichlet(concentration * K * weights)`` proportions of its own.
    """
    process = process or privacy_process()
    rng = np.random.default_rng(random_state)
    K, m = process.n_components, EVENTS_PER_ENTITY - TEST_EVENTS_PER_ENTITY
    n_entities = max(1, n_records // n_clients // m)
    names = [f"x{j}" for j in range(process.n_features)]
    entity = np.repeat(np.array([f"e{e:06d}" for e in range(n_entities)]), EVENTS_PER_ENTITY)
    held = np.tile(np.arange(EVENTS_PER_ENTITY) >= m, n_entities)
    views: dict[str, dict[int, tuple]] = {"train": {}, "test": {}}
    for c in range(n_clients):
        share = rng.dirichlet(concentration * K * process.weights)
        z = np.repeat(rng.choice(K, size=n_entities, p=share), EVENTS_PER_ENTITY)
        X, y, label = _draw(process, z, rng)
        for split, rows in (("train", ~held), ("test", held)):
            views[split][c] = (X[rows], y[rows], label[rows], entity[rows])
    out: dict[str, dict[str, FederatedDataset]] = {"train": {}, "test": {}}
    for split, by_client in views.items():
        cid = {c: f"c{c:02d}" for c in by_client}
        out[split] = {
            "x": FederatedDataset({cid[c]: ClientData(v[0]) for c, v in by_client.items()},
                                  names),
            "regression": FederatedDataset(
                {cid[c]: ClientData(v[0], v[1]) for c, v in by_client.items()}, names, "y"),
            "classification": FederatedDataset(
                {cid[c]: ClientData(v[0], v[2]) for c, v in by_client.items()}, names, "y"),
            "entity": FederatedDataset(
                {cid[c]: ClientData(v[0], v[1], v[3]) for c, v in by_client.items()}, names,
                "y", "entity"),
        }
    return PrivacyData(out["train"], out["test"])


# ---- the models and their metrics ---------------------------------------------------------------
@dataclass(frozen=True)
class _Spec:
    """One model of the table: its estimator, the data view it fits, its held-out metric."""

    estimator: str
    task: str
    metric: str
    higher_is_better: bool


SPECS = (
    _Spec("FederatedGaussianMixture", "x", "heldout_loglik", True),
    _Spec("LatentClassRegression", "regression", "mse", False),
    _Spec("FedGMM", "classification", "accuracy", True),
    _Spec("HLCR", "entity", "mse", False),
)


#: ``max_rounds=None``: the non-private reference runs to this tolerance (at most
#: :data:`CONVERGED_ROUNDS` rounds), the private fits run their estimator's default plan
CONVERGED_TOL = 1e-6
CONVERGED_ROUNDS = 1000


def _estimator(spec: _Spec, K: int, max_rounds: int | None, federation: Federation,
               seed: int):
    """An unfitted estimator of ``spec``: tol 0 and ``max_rounds`` rounds (every planned round
    runs); with ``max_rounds=None`` the defaults: a non-private fit converges (tol
    :data:`CONVERGED_TOL`), a private one runs its estimator's default plan."""
    from ..engine.contract.registry import estimator_by_class_name

    cls = estimator_by_class_name(spec.estimator)
    tol = 0.0
    if max_rounds is None and federation.privacy is None:
        tol, max_rounds = CONVERGED_TOL, CONVERGED_ROUNDS
    common = {"max_rounds": max_rounds, "federation": federation, "random_state": seed,
              "tol": tol}
    if spec.estimator == "FederatedGaussianMixture":
        return cls(K, verbose=False, **common)
    if spec.estimator == "LatentClassRegression":
        return cls(K, **common)
    if spec.estimator == "FedGMM":
        return cls(K, K, verbose=False, **common)
    if max_rounds is None:  # HLCR's max_rounds is a number: the engine's private plan
        common["max_rounds"] = PRIVATE_MAX_ROUNDS
    est = cls(K, verbose=False, **common)
    if federation.privacy is not None and "dp_max_events" in est.get_params():
        # the unit of privacy is the entity with its events: every entity has this many
        est.set_params(dp_max_events=EVENTS_PER_ENTITY - TEST_EVENTS_PER_ENTITY)
    return est


def _metric(spec: _Spec, est, test: FederatedDataset) -> float:
    """The held-out metric of a fitted estimator (see the module notes)."""
    if spec.metric == "heldout_loglik":
        return float(est.score(test.pooled().X))
    if spec.metric == "accuracy":
        return float(est.score_dataset(test))
    if spec.task == "entity":  # predictions in the source's row order
        y = test.target_series().to_numpy(dtype=np.float64)
        return float(np.mean((est.predict_dataset(test).to_numpy() - y) ** 2))
    pooled = test.pooled()
    return float(np.mean((est.predict(pooled.X) - pooled.y) ** 2))


def dp_support(spec: _Spec) -> str | None:
    """None when ``spec``'s estimator supports differential privacy, else the reason."""
    from dataclasses import fields

    from ..engine.contract.registry import estimator_by_class_name

    cls = estimator_by_class_name(spec.estimator)
    if cls is None:
        return "not registered"
    caps = cls.capabilities
    if isinstance(caps, property):  # decided per instance: ask a default one
        caps = cls().capabilities
    reason = None if caps.differential_privacy else caps.privacy_refusal
    if reason is None and "privacy" not in {f.name for f in fields(Federation)}:
        return "this version's Federation has no privacy setting"
    return reason


def _privacy(epsilon: float, clip: float, target_range, spec: _Spec, noise: str, seed: int):
    return DifferentialPrivacy(
        epsilon, DELTA, clip=clip, noise=noise, noise_seed=seed,
        target_range=None if spec.task in ("x", "classification") else target_range)


def _fit_one(spec, data: PrivacyData, K, max_rounds, federation, seed):
    """Fit on the training view, score on the held-out view: (metric, epsilon spent, seconds)."""
    est = _estimator(spec, K, max_rounds, federation, seed)
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a ConvergenceWarning: tol=0 runs every round
        est.fit(data.train[spec.task])
    seconds = time.perf_counter() - t0
    spent = getattr(est, "privacy_spent_", None)
    return _metric(spec, est, data.test[spec.task]), (
        float("nan") if spent is None else float(spent[0])), seconds


def _seed_counts(sizes, n_seeds) -> dict[int, int]:
    """Seeds per size: ``n_seeds`` up to 10^5 records, one above (where a fit takes minutes)."""
    return {n: (n_seeds if n <= 100_000 else 1) for n in sizes}


def privacy_utility(
    quick: bool = False,
    out: str | Path | None = None,
    random_state: int = 0,
    *,
    sizes: tuple[int, ...] | None = None,
    epsilons: tuple[float, ...] | None = None,
    models: tuple[str, ...] | None = None,
    n_seeds: int | None = None,
    n_clients: int = 10,
    max_rounds: int | None = 10,
    clip_quantile: float = 0.95,
    noise: str = "distributed",
) -> pd.DataFrame:
    """Utility of differential privacy: each model's held-out metric against epsilon.

    Parameters
    ----------
    quick : bool
        10^4 records, epsilon in {1, 8}, one seed; otherwise 10^4, 10^5 and 10^6 records,
        epsilon in {0.5, 1, 2, 4, 8}, 3 seeds up to 10^5 records and one at 10^6.
    out : path or None
        Directory for ``privacy_utility.png`` (metric against epsilon, one panel per model).
    random_state : int
        Seed of the first draw; seed ``s`` draws the data with ``random_state + s`` and uses it
        for the fits and the noise (``noise_seed``).
    sizes, epsilons, n_seeds : override the sizes, the budgets and the seeds per size (one
        above 10^5 records in any case).
    models : tuple of str or None
        Estimator class names to run (default every model of :data:`SPECS` that supports DP).
    n_clients : int
        Clients, of equal sizes.
    max_rounds : int or None
        Rounds of every fit (the noise is calibrated for them). None: the non-private fit
        converges (tol :data:`CONVERGED_TOL`), the private ones run their default plan.
    clip_quantile : float
        The public clip radius is this quantile of ``||x||`` under the generating process.
    noise : {"local", "distributed"}
        ``"distributed"`` needs secure aggregation (set here when chosen).

    Returns
    -------
    DataFrame, one row per model, record count and epsilon (``inf``: no DP): model, metric,
    n_records, epsilon, delta, value (mean over seeds), value_std, nonprivate (the non-private
    fit's value, same seeds), ratio (value / nonprivate, mean over seeds), relative_loss
    (relative worsening, mean over seeds), epsilon_spent (largest ``privacy_spent_`` over
    seeds), seconds (mean fit time), n_seeds, failed (private fits that raised). ``attrs``:
    ``skipped`` ({model: reason} for models without DP support) and ``settings`` (clip radius,
    target range, rounds, clients, delta, noise).
    """
    sizes = tuple(sizes or ((10_000,) if quick else SIZES))
    epsilons = tuple(epsilons or ((1.0, 8.0) if quick else EPSILONS))
    seeds = _seed_counts(sizes, n_seeds or (1 if quick else 3))
    process = privacy_process()
    K = process.n_components
    clip, target_range = public_bounds(process, clip_quantile)
    specs = [s for s in SPECS if models is None or s.estimator in models]
    skipped = {s.estimator: r for s in specs if (r := dp_support(s)) is not None}
    for name, reason in skipped.items():
        logger.warning("privacy_utility: %s skipped: %s", name, reason)
    specs = [s for s in specs if s.estimator not in skipped]
    plain = Federation()
    base = plain if noise == "local" else replace(plain, secure_aggregation=True)
    run = dict(K=K, max_rounds=max_rounds, plain=plain, base=base, epsilons=epsilons, clip=clip,
               target_range=target_range, noise=noise)
    raw = []
    for n in sizes:
        for s in range(seeds[n]):
            seed = random_state + s
            data = make_privacy_data(n, n_clients, process=process, random_state=seed)
            for spec in specs:
                raw += _spec_rows(spec, data, n, seed, run)
    table = _summarize(pd.DataFrame(raw), specs)
    table.attrs["skipped"] = skipped
    table.attrs["settings"] = {"clip": clip, "target_range": target_range, "delta": DELTA,
                               "max_rounds": max_rounds, "n_clients": n_clients,
                               "noise": noise, "clip_quantile": clip_quantile}
    if out is not None and len(table):
        _plot(table, Path(out) / "privacy_utility.png", table.attrs["settings"])
    return table


def _spec_rows(spec, data, n: int, seed: int, run: dict) -> list[dict]:
    """One model on one draw: the non-private fit, then one private fit per epsilon (a fit
    that raises is a row with its error)."""
    K, max_rounds = run["K"], run["max_rounds"]
    m0, _, sec0 = _fit_one(spec, data, K, max_rounds, run["plain"], seed)
    row = {"model": spec.estimator, "metric": spec.metric, "n_records": n,
           "seed": seed, "nonprivate": m0}
    raw = [{**row, "epsilon": np.inf, "value": m0, "spent": 0.0, "seconds": sec0, "error": ""}]
    for eps in run["epsilons"]:
        fed = replace(run["base"], privacy=_privacy(eps, run["clip"], run["target_range"], spec,
                                                    run["noise"], seed))
        try:
            m, spent, sec = _fit_one(spec, data, K, max_rounds, fed, seed)
            err = ""
        except (ValueError, RuntimeError, ArithmeticError) as e:
            m, spent, sec, err = np.nan, np.nan, np.nan, f"{type(e).__name__}: {e}"
            logger.warning("privacy_utility: %s, %d records, epsilon %g, seed %d "
                           "failed: %s", spec.estimator, n, eps, seed, err)
        raw.append({**row, "epsilon": eps, "value": m, "spent": spent,
                    "seconds": sec, "error": err})
    logger.info("privacy_utility: %s, %d records, seed %d done", spec.estimator, n, seed)
    return raw


def _summarize(raw: pd.DataFrame, specs) -> pd.DataFrame:
    """Means over seeds per (model, n_records, epsilon), with the ratios of each seed."""
    cols = ["model", "metric", "n_records", "epsilon", "delta", "value", "value_std",
            "nonprivate", "ratio", "relative_loss", "epsilon_spent", "seconds", "n_seeds",
            "failed"]
    if raw.empty:
        return pd.DataFrame(columns=cols)
    better = {s.estimator: s.higher_is_better for s in specs}
    raw = raw.assign(
        ratio=raw["value"] / raw["nonprivate"],
        relative_loss=np.where(raw["model"].map(better),
                               raw["nonprivate"] - raw["value"],
                               raw["value"] - raw["nonprivate"]) / raw["nonprivate"].abs(),
        failed=raw["error"] != "")
    g = raw.groupby(["model", "metric", "n_records", "epsilon"], sort=False)
    table = g.agg(value=("value", "mean"),
                  value_std=("value", lambda v: float(np.std(v, ddof=1)) if v.count() > 1
                             else 0.0),
                  nonprivate=("nonprivate", "mean"), ratio=("ratio", "mean"),
                  relative_loss=("relative_loss", "mean"), epsilon_spent=("spent", "max"),
                  seconds=("seconds", "mean"), n_seeds=("seed", "nunique"),
                  failed=("failed", "sum")).reset_index()
    table["delta"] = DELTA
    return table[cols]


def _rounds_label(max_rounds: int | None) -> str:
    """The rounds of the figure's title."""
    if max_rounds is None:
        return "default private plans, non-private fits converged"
    return f"{max_rounds} rounds"


def _plot(table: pd.DataFrame, path: Path, settings: dict) -> None:
    """Metric against epsilon (log x), one line per record count, the non-private value as a
    dashed line of the same colour, bars of one standard deviation over the seeds; one panel per
    model; the legend below the panels."""
    models = list(dict.fromkeys(table["model"]))
    sizes = sorted(table["n_records"].unique())
    colors = dict(zip(sizes, ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple")))
    labels = {"heldout_loglik": "held-out mean log-likelihood per record",
              "mse": "held-out mean squared error", "accuracy": "held-out accuracy"}
    with figure(path, ncols=len(models), figsize=(4.3 * len(models) + 1.0, 4.6),
                squeeze=False) as (fig, axes):
        for ax, model in zip(axes[0], models):
            sub = table[table["model"] == model]
            for n in sizes:
                rows = sub[sub["n_records"] == n].sort_values("epsilon")
                if rows.empty:  # a table put together from partial runs
                    continue
                private = rows[np.isfinite(rows["epsilon"])]
                ax.errorbar(private["epsilon"], private["value"], yerr=private["value_std"],
                            marker="o", color=colors[n], capsize=2,
                            label=f"{n:,} records, DP")
                ax.axhline(float(rows["nonprivate"].iloc[0]), color=colors[n], ls="--",
                           lw=1, label=f"{n:,} records, no DP")
            ax.set_xscale("log")
            ticks = sorted(e for e in sub["epsilon"].unique() if np.isfinite(e))
            ax.set_xticks(ticks, [f"{e:g}" for e in ticks])
            ax.minorticks_off()
            ax.set_title(model)
            ax.set_xlabel("epsilon (delta = 1e-5)")
            ax.set_ylabel(labels[str(sub["metric"].iloc[0])])
        rounds = _rounds_label(settings["max_rounds"])
        fig.suptitle(f"Utility under differential privacy\n{settings['n_clients']} clients, "
                     f"{rounds}, clip radius {settings['clip']:.2f}, "
                     f"{settings['noise']} noise; bars: standard deviation over seeds",
                     fontsize=10)
        handles, labs = axes[0][0].get_legend_handles_labels()
        fig.legend(handles, labs, loc="outside lower center", ncols=len(sizes), fontsize=8)
