"""``fedlatent fit hlcr``: HLCR / FedHLCR on an agent-entity-event table."""

from __future__ import annotations

from pathlib import Path

import typer

__all__ = ["register"]

_DATA = typer.Option(..., "--data", help="CSV or Parquet file, one row per event.")
_OUT = typer.Option(..., "--out", help="Output directory (model, history.csv).")


def register(app: typer.Typer, fit_app: typer.Typer) -> None:
    """Add ``fit hlcr`` to the ``fedlatent`` command line."""
    from .cli import fail, load_federated, make_federation

    @fit_app.command("hlcr")
    def fit_hlcr(
        data: Path = _DATA,
        client: str = typer.Option(..., "--client", help="Column with the agent (client) id."),
        entity: str = typer.Option(..., "--entity", help="Column with the entity id."),
        target: str = typer.Option(..., "--target", help="Numeric response column."),
        features: str = typer.Option(None, "--features", help="Comma-separated feature columns "
                                     "(default: every other column)."),
        clusters: int = typer.Option(..., "--clusters", "-k", help="Number of clusters K."),
        alpha: float = typer.Option(1.0, "--alpha"),
        beta: float = typer.Option(1.0, "--beta"),
        delta: float = typer.Option(1.0, "--delta", help="Prior std of the coefficients."),
        sigma: float = typer.Option(1.0, "--sigma", help="Noise std (> 0)."),
        solver: str = typer.Option("federated", "--solver", help="federated | gibbs"),
        max_iter: int = typer.Option(20, "--max-iter"),
        participation: float = typer.Option(1.0, "--participation",
                                            help="Fraction of agents per iteration."),
        step_size: float = typer.Option(1.0, "--step-size", help="Smoothing gamma."),
        quant_levels: int = typer.Option(None, "--quantize", help="Quantizer levels."),
        control_variates: bool = typer.Option(False,
                                              "--control-variates/--no-control-variates"),
        fit_intercept: bool = typer.Option(True, "--intercept/--no-intercept"),
        seed: int = typer.Option(0, "--seed"),
        out: Path = _OUT,
        progress: bool = typer.Option(None, "--progress/--no-progress"),
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
