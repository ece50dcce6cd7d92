"""``fedlatent fit hlcr``: HLCR / FedHLCR on an agent-entity-event table."""

from __future__ import annotations

from pathlib import Path

import typer

from .cli_options import (
    ClientOpt,
    ControlVariatesOpt,
    DataOpt,
    FeaturesOpt,
    ParticipationOpt,
    ProgressOpt,
    QuantizeOpt,
    SeedOpt,
    StepOpt,
    TargetOpt,
)

__all__ = ["register"]

_OUT = typer.Option(..., "--out", help="Output directory (model, history.csv).")


def register(app: typer.Typer, fit_app: typer.Typer) -> None:
    """Add ``fit hlcr`` to the ``fedlatent`` command line."""
    from .cli import fail, load_federated, make_federation

    @fit_app.command("hlcr")
    def fit_hlcr(
        *,
        data: DataOpt,
        client: ClientOpt,
        entity: str = typer.Option(..., "--entity", help="Column with the entity id."),
        target: TargetOpt,
        features: FeaturesOpt = None,
        clusters: int = typer.Option(..., "--clusters", "-k", help="Number of clusters K."),
        alpha: float = typer.Option(1.0, "--alpha"),
        beta: float = typer.Option(1.0, "--beta"),
        delta: float = typer.Option(1.0, "--delta", help="Prior std of the coefficients."),
        sigma: float = typer.Option(1.0, "--sigma", help="Noise std (> 0)."),
        solver: str = typer.Option("federated", "--solver", help="federated | gibbs"),
        max_iter: int = typer.Option(20, "--max-iter"),
        participation: ParticipationOpt = 1.0,
        step_size: StepOpt = 1.0,
        quant_levels: QuantizeOpt = None,
        control_variates: ControlVariatesOpt = False,
        fit_intercept: bool = typer.Option(True, "--intercept/--no-intercept"),
        seed: SeedOpt = 0,
        out: Path = _OUT,
        progress: ProgressOpt = None,
    ):
        """Fit HLCR (gibbs) or FedHLCR (federated); write model.npz/json and history.csv."""
        import numpy as np

        from .data.dataset import DataValidationError
        from .models.hlcr import HLCR

        fd = load_federated(data, client, features, target=target, entity=entity)
        fed = make_federation(participation, step_size, quant_levels, control_variates, seed)
        est = HLCR(clusters, alpha=alpha, beta=beta, delta=delta, sigma=sigma, solver=solver,
                   max_iter=max_iter, federation=fed, fit_intercept=fit_intercept,
                   random_state=seed, verbose=progress)
        try:
            est.fit(fd)
        except (ValueError, DataValidationError) as e:
            fail(str(e))
        out.mkdir(parents=True, exist_ok=True)
        est.save(out / "model")
        est.history_.to_frame().to_csv(out / "history.csv", index=False)
        typer.echo(
            f"HLCR ({solver}): {fd.n_clients} agents, {len(est.labels_)} agent-entity pairs, "
            f"{fd.n_samples} events, {fd.n_features} features, K={clusters}"
        )
        typer.echo(f"iterations: {est.n_rounds_}  converged: {est.converged_}  "
                   f"training MSE: {est.history_.train_mse[-1]:.6g}")
        np.set_printoptions(precision=4, suppress=True)
        typer.echo(f"entities per cluster: {est.cluster_counts_}")
        typer.echo(f"wrote {out / 'model.npz'}, {out / 'model.json'}, {out / 'history.csv'}")
