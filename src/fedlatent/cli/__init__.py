"""The ``fedlatent`` command line. It mirrors the library: fit, predict, score, experiment, demo,
and flower (deployments).

One module per concern: :mod:`~fedlatent.cli.common` (options, errors, data files),
:mod:`~fedlatent.cli.fit` (``fit NAME`` for every registered model, one fitting path) with the
hand-written commands of :mod:`~fedlatent.cli.fit_models`, :mod:`~fedlatent.cli.predict`
(``predict``, ``score``), :mod:`~fedlatent.cli.experiment`, :mod:`~fedlatent.cli.flower`,
:mod:`~fedlatent.cli.demo`, :mod:`~fedlatent.cli.site` (a site's policy and ledger). Lists of
models and experiments come from the registry and from :func:`fedlatent.experiments.available`,
never from a list kept here.
"""

from __future__ import annotations

import typer

from . import fit_models  # noqa: F401  (registers the hand-written fit commands)
from .common import CliGroup
from .demo import demo
from .experiment import experiment_app
from .fit import fit_app
from .flower import flower_app
from .flower_run import local_app
from .predict import predict, score
from .site import site_app

__all__ = ["app", "main"]

app = typer.Typer(
    cls=CliGroup,
    add_completion=False,
    no_args_is_help=True,
    help="Federated latent-variable models: federated EM, FedGMM, HLCR/FedHLCR, SEC...",
)


def _print_version(value: bool) -> None:
    if value:
        from .. import __version__

        typer.echo(f"fedlatent {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", is_eager=True, callback=_print_version,
                                 help="Print the version of fedlatent and exit."),
) -> None:
    """Federated latent-variable models: federated EM, FedGMM, HLCR/FedHLCR, SEC..."""


app.add_typer(fit_app, name="fit")
app.command("predict")(predict)
app.command("score")(score)
app.add_typer(experiment_app, name="experiment")
app.command("demo")(demo)
flower_app.add_typer(local_app, name="local")
app.add_typer(flower_app, name="flower")
app.add_typer(site_app, name="site")


def main() -> None:  # pragma: no cover - entry point
    app()
