"""``fedlatent fit sec``: meta clustering of the learners of a CSV/Parquet file."""

from __future__ import annotations

from pathlib import Path

import typer

from .cli_options import (
    ClientOpt,
    DataOpt,
    FeaturesOpt,
    SeedOpt,
    TargetOpt,
)


def register(app: typer.Typer, fit_app: typer.Typer) -> None:
    """Add ``fit sec`` to the ``fedlatent`` command."""

    @fit_app.command("sec")
    def fit_sec(
        *,
        data: DataOpt,
        client: ClientOpt,
        target: TargetOpt,
        features: FeaturesOpt = None,
        clusters: int = typer.Option(None, "--clusters", "-k",
                                     help="Number of clusters (default: chosen from the data)."),
        candidates: str = typer.Option(
            "default", "--candidates",
            help="A candidate set (default, fairness, table2-1...) or comma-separated names "
                 "(lasso_cv, rf, linear, ridge, enet, lars, knn, svr, gb, mlp)."),
        k_selection: str = typer.Option("gap", "--k-selection", help="gap or penalty."),
        max_clusters: int = typer.Option(10, "--max-clusters"),
        standardize: bool = typer.Option(True, "--standardize/--no-standardize",
                                         help="Standardize X and y within each learner."),
        n_jobs: int = typer.Option(None, "--n-jobs", help="Threads for the exchange."),
        seed: SeedOpt = 0,
        out: Path = typer.Option(..., "--out", help="Output directory."),
    ):
        """Cluster learners by their X -> y relationship (SEC); write the similarity matrix
        (similarity.csv), a heat map (similarity.png) and the labels (clusters.csv)."""
        import numpy as np
        import pandas as pd

        from .cli import fail, load_federated, split_list
        from .data.dataset import DataValidationError
        from .models.sec import CANDIDATE_SETS, SEC

        fd = load_federated(data, client, features, target=target)
        names = split_list(candidates) or ["default"]
        spec = names[0] if len(names) == 1 and names[0] in CANDIDATE_SETS else names
        sec = SEC(candidates=spec, n_clusters=clusters, k_selection=k_selection,
                  max_clusters=max_clusters, standardize=standardize, n_jobs=n_jobs,
                  random_state=seed)
        try:
            sec.fit(fd)
        except (DataValidationError, ValueError) as e:
            fail(str(e))
        out.mkdir(parents=True, exist_ok=True)
        ids = sec.learner_ids_
        pd.DataFrame(sec.similarity_, index=ids, columns=ids).to_csv(out / "similarity.csv")
        pd.DataFrame({"learner": ids, "cluster": sec.labels_, "selected": sec.selected_,
                      "n_samples": sec.n_samples_, "in_sample_mse": sec.errors_}).to_csv(
            out / "clusters.csv", index=False)

        from .plotting import pyplot

        plt = pyplot()

        order = np.argsort(sec.labels_, kind="stable")
        L = len(ids)
        fig, ax = plt.subplots(figsize=(min(2 + 0.25 * L, 12), min(1.6 + 0.25 * L, 11)))
        im = ax.imshow(sec.similarity_[np.ix_(order, order)], cmap="viridis", vmin=0, vmax=1)
        if L <= 60:
            ax.set_xticks(range(L), [ids[i] for i in order], rotation=90, fontsize=6)
            ax.set_yticks(range(L), [ids[i] for i in order], fontsize=6)
        ax.set_title(f"SEC similarity exp(-a V), a = {sec.affinity_scale_:.3g}; "
                     f"K = {sec.n_clusters_}")
        fig.colorbar(im, ax=ax)
        fig.tight_layout()
        fig.savefig(out / "similarity.png", dpi=120)
        plt.close(fig)

        typer.echo(f"SEC: {L} learners, {fd.n_samples} samples, {fd.n_features} features; "
                   f"K = {sec.n_clusters_}" + (" (given)" if clusters else f" ({k_selection})"))
        for k, members in sec.clusters().items():
            typer.echo(f"cluster {k} ({len(members)}): {', '.join(members)}")
        typer.echo(f"wrote {out / 'similarity.csv'}, {out / 'similarity.png'}, "
                   f"{out / 'clusters.csv'}")
