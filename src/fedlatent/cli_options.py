"""Command-line options shared by the ``fedlatent`` commands, declared once.

Each is an ``Annotated`` type: a command writes ``data: DataOpt`` (required) or
``seed: SeedOpt = 0`` (with its default).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

__all__ = [
    "ClientOpt",
    "ControlVariatesOpt",
    "DataOpt",
    "FeaturesOpt",
    "MaxRoundsOpt",
    "ParticipationOpt",
    "ProgressOpt",
    "QuantizeOpt",
    "SeedOpt",
    "StepOpt",
    "TargetOpt",
]

DataOpt = Annotated[
    Path,
    typer.Option("--data", help="CSV or Parquet file, one row per sample (per event for HLCR)."),
]
ClientOpt = Annotated[
    str, typer.Option("--client", help="Column with the client (agent, learner) id of each row.")
]
FeaturesOpt = Annotated[
    str | None,
    typer.Option("--features", help="Comma-separated feature columns (default: all the others)."),
]
TargetOpt = Annotated[str | None, typer.Option("--target", help="Response (label) column.")]
SeedOpt = Annotated[int, typer.Option("--seed", help="Seed of every random draw of the run.")]
ParticipationOpt = Annotated[
    float, typer.Option("--participation", help="Probability that a client takes part in a round.")
]
StepOpt = Annotated[
    float, typer.Option("--step-size", help="Stochastic-approximation step (FedHLCR's gamma).")
]
QuantizeOpt = Annotated[
    int | None, typer.Option("--quantize", help="Quantizer levels (compression); none by default.")
]
ControlVariatesOpt = Annotated[bool, typer.Option("--control-variates/--no-control-variates")]
MaxRoundsOpt = Annotated[int, typer.Option("--max-rounds", help="Rounds at most.")]
ProgressOpt = Annotated[
    bool | None,
    typer.Option("--progress/--no-progress", help="Progress bars (default: on a terminal)."),
]
