"""The ``fedlatent`` command line. It mirrors the library: fit, predict, experiment, demo."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path

import typer

from .cli_options import (
    ClientOpt,
    ControlVariatesOpt,
    DataOpt,
    FeaturesOpt,
    MaxRoundsOpt,
    ParticipationOpt,
    ProgressOpt,
    QuantizeOpt,
    SeedOpt,
    StepOpt,
)

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Federated latent-variable models: federated EM, FedGMM, HLCR/FedHLCR, SEC.",
)
fit_app = typer.Typer(no_args_is_help=True, help="Fit a model on a CSV/Parquet file.")
app.add_typer(fit_app, name="fit")


def fail(message: str, code: int = 2) -> None:
    """Print an error to stderr and exit non-zero (nothing has been written)."""
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


def split_list(value: str | None) -> list[str] | None:
    if value is None:
        return None
    items = [v.strip() for v in value.split(",") if v.strip()]
    return items or None


def load_federated(data: Path, client: str, features: str | None, target: str | None = None,
                   entity: str | None = None):
    """Read and validate a data file; on bad input exit with the validation message."""
    from .data.dataset import DataValidationError, FederatedDataset

    try:
        return FederatedDataset.read_table(
            data, client=client, features=split_list(features), target=target, entity=entity
        )
    except DataValidationError as e:
        fail(str(e))


def make_federation(participation: float, step_size: float, quant_levels: int | None,
                    control_variates: bool, seed: int | None):
    from .engine.federation import Federation, Quantizer

    fed = Federation(
        participation=participation,
        step_size=step_size,
        quantizer=Quantizer(quant_levels) if quant_levels else None,
        control_variates=control_variates,
        random_state=seed,
    )
    try:
        fed.validate()
    except ValueError as e:
        fail(str(e))
    return fed


@fit_app.command("gmm")
def fit_gmm(
    *,
    data: DataOpt,
    client: ClientOpt,
    features: FeaturesOpt = None,
    components: int = typer.Option(..., "--components", "-k", help="Number of components."),
    covariance_type: str = typer.Option("full", "--covariance-type"),
    participation: ParticipationOpt = 1.0,
    step_size: StepOpt = 1.0,
    quant_levels: QuantizeOpt = None,
    control_variates: ControlVariatesOpt = True,
    max_rounds: MaxRoundsOpt = 100,
    tol: float = typer.Option(1e-3, "--tol"),
    seed: SeedOpt = 0,
    out: Path = typer.Option(..., "--out", help="Output directory (model, history.csv)."),
    progress: ProgressOpt = None,
):
    """Fit a federated Gaussian mixture; write model.npz/json and history.csv to --out."""
    import numpy as np

    from .models.gmm import FederatedGaussianMixture

    fd = load_federated(data, client, features)
    fed = make_federation(participation, step_size, quant_levels, control_variates, seed)
    gm = FederatedGaussianMixture(
        components, covariance_type=covariance_type, max_rounds=max_rounds, tol=tol,
        federation=fed, random_state=seed, verbose=progress,
    )
    try:
        gm.fit(fd)
    except ValueError as e:
        fail(str(e))
    out.mkdir(parents=True, exist_ok=True)
    gm.save(out / "model")
    gm.history_.to_csv(out / "history.csv")
    typer.echo(
        f"FederatedGaussianMixture: {fd.n_clients} clients, {fd.n_samples} samples, "
        f"{fd.n_features} features, K={components} ({covariance_type})"
    )
    typer.echo(
        f"rounds: {gm.n_rounds_}  converged: {gm.converged_}  "
        f"mean log-likelihood: {gm.lower_bound_:.6f}"
    )
    np.set_printoptions(precision=4, suppress=True)
    typer.echo(f"weights: {gm.weights_}")
    typer.echo(f"wrote {out / 'model.npz'}, {out / 'model.json'}, {out / 'history.csv'}")


@app.command("demo")
def demo(
    *,
    out: Path = typer.Option(Path("demo-output"), "--out", help="Where to write the plot."),
    seed: SeedOpt = 0,
    progress: ProgressOpt = None,
):
    """Fit a heterogeneous federated mixture, compare with centralized EM, write a plot."""
    from .demo import run_demo

    summary = run_demo(out, seed=seed, progress=progress)
    typer.echo(summary)


@app.command("experiment")
def experiment(
    *,
    name: str = typer.Argument(..., help="Experiment function in fedlatent.experiments."),
    quick: bool = typer.Option(False, "--quick", help="The small size used in tests."),
    out: Path = typer.Option(Path("experiment-output"), "--out"),
    seed: SeedOpt = 0,
):
    """Run a paper reproduction; print its table and write plots to --out."""
    from . import experiments

    names = sorted(experiments.__all__)
    if name not in names:
        fail(f"unknown experiment {name!r}; available: {', '.join(names)}")
    fn = getattr(experiments, name)
    table = fn(quick=quick, out=out, random_state=seed)
    out.mkdir(parents=True, exist_ok=True)
    table.to_csv(out / f"{name}.csv", index=False)
    import pandas as pd

    with pd.option_context("display.max_rows", 200, "display.width", 160):
        typer.echo(table.to_string(index=False))
    typer.echo(f"wrote {out / (name + '.csv')}")


# Commands of other models live in their own modules: cli_<model>.register(app, fit_app).
for _mod in ("cli_fedgmm", "cli_hlcr", "cli_sec", "cli_flower"):
    if importlib.util.find_spec(f"fedlatent.{_mod}") is not None:
        importlib.import_module(f"fedlatent.{_mod}").register(app, fit_app)


def main() -> None:  # pragma: no cover - entry point
    app()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
