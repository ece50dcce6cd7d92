"""The hand-written ``fit`` commands: models whose options have their own names
(``fit gmm --components``, ``fit fedgmm --learners``, ``fit hlcr --clusters``, ``fit sec
--candidates``) and whose summaries or extra files are their own. Each builds its estimator and
calls the one path :func:`fedlatent.cli.fit.fit_and_save`; any other registered model gets the
generic command of :mod:`fedlatent.cli.fit`.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import typer

from .common import (
    ClientOpt,
    ControlVariatesOpt,
    DataOpt,
    FeaturesOpt,
    MaxRoundsOpt,
    OutDirOpt,
    ParticipationOpt,
    ProgressOpt,
    QuantizeOpt,
    SeedOpt,
    StepOpt,
    TargetOpt,
    fail,
    load_dataset,
    split_list,
)
from .fit import build_estimator, echo_written, fit_and_save, fit_app, make_federation, roles_of
from .vocabulary import deprecated, number_or_auto

__all__: list[str] = []  # the commands are registered on fit_app


_number_or_auto = number_or_auto


def _count(components: str | None, old: str | None, old_flag: str, default=None):
    """``--components`` or its deprecated spelling ``old_flag`` (with a warning)."""
    if old is not None:
        deprecated(old_flag, "--components/-k")
        if components is not None and components != old:
            fail(f"--components {components} and {old_flag} {old} disagree; give --components")
        components = old
    return default if components is None else components


def _deprecated_option(flag: str):
    return typer.Option(None, flag, hidden=True, help="Deprecated: --components.")


@fit_app.command("gmm")
def fit_gmm(
    *,
    data: DataOpt,
    client: ClientOpt,
    features: FeaturesOpt = None,
    components: str = typer.Option(..., "--components", "-k",
                                   help="Number of components, or 'auto' (lowest BIC)."),
    covariance_type: str = typer.Option("full", "--covariance-type"),
    participation: ParticipationOpt = 1.0,
    step_size: StepOpt = 1.0,
    quant_levels: QuantizeOpt = None,
    control_variates: ControlVariatesOpt = True,
    max_rounds: MaxRoundsOpt = 100,
    tol: float = typer.Option(1e-3, "--tol"),
    seed: SeedOpt = 0,
    out: OutDirOpt,
    progress: ProgressOpt = None,
):
    """Fit a federated Gaussian mixture; write model.npz/json and history.csv to --out."""
    import numpy as np

    from ..models.gmm import FederatedGaussianMixture

    _, fd = load_dataset(data, client, features)
    fed = make_federation(participation, step_size, quant_levels, control_variates, seed)
    gm = build_estimator(FederatedGaussianMixture, dict(
        n_components=_number_or_auto(components, "--components", int),
        covariance_type=covariance_type, max_rounds=max_rounds,
        tol=tol, federation=fed, random_state=seed, verbose=progress))
    written = fit_and_save(gm, fd, out, roles_of("gmm", client, None, None))
    typer.echo(
        f"FederatedGaussianMixture: {fd.n_clients} clients, {fd.n_samples} samples, "
        f"{fd.n_features} features, K={gm.n_components_} ({covariance_type})"
    )
    typer.echo(f"rounds: {gm.n_rounds_}  converged: {gm.converged_}  "
               f"mean log-likelihood: {gm.lower_bound_:.6f}")
    with np.printoptions(precision=4, suppress=True):
        typer.echo(f"weights: {gm.weights_}")
    echo_written(out, written)


@fit_app.command("fedgmm")
def fit_fedgmm(
    *,
    data: DataOpt,
    client: ClientOpt,
    target: TargetOpt,
    features: FeaturesOpt = None,
    components: str = typer.Option(
        None, "--components", "-k",
        help="M1, the input components, or 'auto' (held-out log-likelihood); default 3."),
    input_components: str | None = _deprecated_option("--input-components"),
    learners: str = typer.Option("3", "--learners", help="M2, or 'auto' (one of the two)."),
    covariance_type: str = typer.Option("full", "--covariance-type"),
    reg_covar: float = typer.Option(1e-6, "--reg-covar"),
    l2: float = typer.Option(1e-3, "--l2"),
    learner_update: str = typer.Option("newton", "--learner-update", help="newton | average"),
    covariance_aggregation: str = typer.Option("exact", "--covariance-aggregation",
                                               help="exact | paper"),
    participation: ParticipationOpt = 1.0,
    step_size: StepOpt = 1.0,
    quant_levels: QuantizeOpt = None,
    control_variates: ControlVariatesOpt = True,
    max_rounds: MaxRoundsOpt = 100,
    tol: float = typer.Option(1e-4, "--tol"),
    seed: SeedOpt = 0,
    out: OutDirOpt,
    progress: ProgressOpt = None,
):
    """Fit FedGMM; write the shared model, history.csv and one weights file per client."""
    from ..models.fedgmm import FedGMM

    _, fd = load_dataset(data, client, features, target)
    fed = make_federation(participation, step_size, quant_levels, control_variates, seed)
    est = build_estimator(FedGMM, dict(
        n_input_components=_number_or_auto(
            _count(components, input_components, "--input-components", "3"), "--components", int),
        n_learners=_number_or_auto(learners, "--learners", int),
        covariance_type=covariance_type, reg_covar=reg_covar, l2=l2,
        learner_update=learner_update, covariance_aggregation=covariance_aggregation,
        federation=fed, max_rounds=max_rounds, tol=tol, random_state=seed, verbose=progress))
    written = fit_and_save(est, fd, out, roles_of("fedgmm", client, target, None))
    typer.echo(
        f"FedGMM: {fd.n_clients} clients, {fd.n_samples} samples, {fd.n_features} features, "
        f"M1={est.n_input_components_}, M2={est.n_learners_}, classes {est.classes_.tolist()}"
    )
    typer.echo(f"rounds: {est.n_rounds_}  converged: {est.converged_}  "
               f"mean log h_c(x, y): {est.lower_bound_:.6f}")
    echo_written(out, written)


@fit_app.command("hlcr")
def fit_hlcr(
    *,
    data: DataOpt,
    client: ClientOpt,
    entity: str = typer.Option(..., "--entity", help="Column with the entity id."),
    target: TargetOpt,
    features: FeaturesOpt = None,
    components: str = typer.Option(None, "--components", "-k",
                                   help="Number of clusters K, or 'auto' (held-out likelihood)."),
    clusters: str | None = _deprecated_option("--clusters"),
    alpha: float = typer.Option(1.0, "--alpha"),
    beta: float = typer.Option(1.0, "--beta"),
    delta: str = typer.Option("auto", "--delta", help="Prior std of the coefficients or 'auto'."),
    sigma: str = typer.Option("auto", "--sigma", help="Noise std (> 0) or 'auto' (estimated)."),
    solver: str = typer.Option("federated", "--solver", help="federated | gibbs"),
    max_rounds: MaxRoundsOpt = 100,
    max_iter: int | None = typer.Option(None, "--max-iter", hidden=True,
                                        help="Deprecated: --max-rounds."),
    participation: ParticipationOpt = 1.0,
    step_size: StepOpt = 1.0,
    quant_levels: QuantizeOpt = None,
    control_variates: ControlVariatesOpt = False,
    fit_intercept: bool = typer.Option(True, "--intercept/--no-intercept"),
    seed: SeedOpt = 0,
    out: OutDirOpt,
    progress: ProgressOpt = None,
):
    """Fit HLCR (gibbs) or FedHLCR (federated); write model.npz/json and history.csv."""
    import numpy as np

    from ..models.hlcr import HLCR

    if max_iter is not None:
        warnings.warn("--max-iter is deprecated; use --max-rounds", FutureWarning, stacklevel=1)
        max_rounds = max_iter
    clusters = _count(components, clusters, "--clusters")
    if clusters is None:
        fail("fit hlcr needs --components K (the number of clusters, or 'auto')")
    _, fd = load_dataset(data, client, features, target=target, entity=entity)
    fed = make_federation(participation, step_size, quant_levels, control_variates, seed)
    n_clusters = _number_or_auto(clusters, "--components", int)
    est = build_estimator(HLCR, dict(
        # --clusters auto: the held-out choice of K (without the random intercept), as before
        # HLCR's own default became the WAIC choice with it (issue 24)
        **({"random_intercept": False} if n_clusters == "auto" else {}),
        n_clusters=n_clusters, alpha=alpha, beta=beta,
        delta=_number_or_auto(delta, "--delta"), sigma=_number_or_auto(sigma, "--sigma"),
        solver=solver,
        max_rounds=max_rounds, federation=fed, fit_intercept=fit_intercept, random_state=seed,
        verbose=progress))
    written = fit_and_save(est, fd, out, roles_of("hlcr", client, target, entity))
    typer.echo(
        f"HLCR ({solver}): {fd.n_clients} agents, {len(est.labels_)} agent-entity pairs, "
        f"{fd.n_samples} events, {fd.n_features} features, K={est.n_clusters_}, "
        f"sigma={est.sigma_:.4g}"
    )
    typer.echo(f"iterations: {est.n_rounds_}  converged: {est.converged_}  "
               f"training MSE: {est.history_.train_mse[-1]:.6g}")
    with np.printoptions(precision=4, suppress=True):
        typer.echo(f"entities per cluster: {est.cluster_counts_}")
    echo_written(out, written)


@fit_app.command("sec")
def fit_sec(
    *,
    data: DataOpt,
    client: ClientOpt,
    target: TargetOpt,
    features: FeaturesOpt = None,
    components: int = typer.Option(None, "--components", "-k",
                                   help="Number of clusters (default: chosen from the data)."),
    clusters: int | None = _deprecated_option("--clusters"),
    candidates: str = typer.Option(
        "default", "--candidates",
        help="A candidate set (default, fairness, table2-1...) or comma-separated names "
             "(lasso_cv, rf, linear, ridge, enet, lars, knn, svr, gb, mlp)."),
    k_selection: str = typer.Option("penalty", "--k-selection", help="penalty or gap."),
    max_clusters: int = typer.Option(None, "--max-clusters",
                                     help="Largest K considered (default: round(sqrt(2 L)))."),
    standardize: bool = typer.Option(True, "--standardize/--no-standardize",
                                     help="Standardize X and y within each learner."),
    n_jobs: int = typer.Option(None, "--n-jobs", help="Threads for the exchange."),
    seed: SeedOpt = 0,
    out: OutDirOpt,
):
    """Cluster learners by their X -> y relationship (SEC); write the model and similarities.

    Writes model.npz/json, the similarity matrix (similarity.csv), a heat map (similarity.png)
    and the labels (clusters.csv).
    """
    import pandas as pd

    from ..models.sec import CANDIDATE_SETS, SEC

    clusters = _count(components, clusters, "--clusters")
    _, fd = load_dataset(data, client, features, target=target)
    names = split_list(candidates) or ["default"]
    spec = names[0] if len(names) == 1 and names[0] in CANDIDATE_SETS else names
    sec = build_estimator(SEC, dict(
        candidates=spec, n_clusters=clusters, k_selection=k_selection, max_clusters=max_clusters,
        standardize=standardize, n_jobs=n_jobs, random_state=seed))

    def write_sec_files(where: Path) -> list[str]:  # inside fit_and_save's all-or-nothing dir
        ids = sec.learner_ids_
        pd.DataFrame(sec.similarity_, index=ids, columns=ids).to_csv(where / "similarity.csv")
        pd.DataFrame({"learner": ids, "cluster": sec.labels_, "selected": sec.selected_,
                      "n_samples": sec.n_samples_, "in_sample_mse": sec.errors_}).to_csv(
            where / "clusters.csv", index=False)
        _similarity_heatmap(sec, where / "similarity.png")
        return ["similarity.csv", "similarity.png", "clusters.csv"]

    written = fit_and_save(sec, fd, out, roles_of("sec", client, target, None),
                           extra=write_sec_files)
    ids = sec.learner_ids_
    typer.echo(f"SEC: {len(ids)} learners, {fd.n_samples} samples, {fd.n_features} features; "
               f"K = {sec.n_clusters_}" + (" (given)" if clusters else f" ({k_selection})"))
    for k, members in sec.clusters().items():
        typer.echo(f"cluster {k} ({len(members)}): {', '.join(members)}")
    echo_written(out, written)


def _similarity_heatmap(sec, path: Path) -> None:
    """SEC's similarity matrix, learners ordered by cluster (then by id), clusters outlined."""
    import numpy as np

    from ..plotting import figure

    ids = [str(c) for c in sec.learner_ids_]
    labels = np.asarray(sec.labels_)
    order = np.lexsort((np.array(ids), labels))
    L = len(ids)
    side = float(np.clip(2.5 + 0.17 * L, 5.0, 16.0))
    font = float(np.clip(280.0 / max(L, 1), 6.0, 10.0))
    step = max(1, int(np.ceil(L / 90)))  # at most ~90 tick labels per axis
    with figure(path, figsize=(side + 1.2, side), tight=False, layout="constrained") as (fig, ax):
        im = ax.imshow(sec.similarity_[np.ix_(order, order)], cmap="viridis", vmin=0, vmax=1)
        ticks = np.arange(0, L, step)
        ax.set_xticks(ticks, [ids[order[i]] for i in ticks], rotation=90, fontsize=font)
        ax.set_yticks(ticks, [ids[order[i]] for i in ticks], fontsize=font)
        bounds = np.flatnonzero(np.diff(labels[order])) + 0.5
        for b in bounds:
            ax.axhline(b, color="white", lw=1.2)
            ax.axvline(b, color="white", lw=1.2)
        if bounds.size < 12:  # name the clusters above the map while the names fit
            mid = (np.concatenate([[-0.5], bounds]) + np.concatenate([bounds, [L - 0.5]])) / 2
            top = ax.secondary_xaxis("top")
            top.set_xticks(mid, [f"cluster {int(k)}" for k in np.unique(labels)],
                           fontsize=font + 1)
            top.tick_params(length=0)
        ax.set_xlabel("learner (ordered by cluster)")
        ax.set_ylabel("learner (ordered by cluster)")
        ax.set_title(f"SEC similarity exp(-a V) of {L} learners, a = {sec.affinity_scale_:.3g}; "
                     f"K = {sec.n_clusters_} (white lines separate clusters)", fontsize=10)
        fig.colorbar(im, ax=ax, shrink=0.8, label="similarity S_ij")
