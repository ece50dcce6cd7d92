"""Command line of FedGMM: ``fedlatent fit fedgmm``, ``fedlatent predict``, ``fedlatent score``.

``fit fedgmm`` writes to ``--out``: ``model.npz`` / ``model.json`` (shared parameters),
``history.csv``, and ``clients/<client>.npz`` (each client's own mixture weights ``pi_c``: in a
deployment each client keeps its file; nothing in ``model.*`` depends on them).
``predict`` and ``score`` read the model directory and a data file, and use each row's client
file for its personalized prediction (eq. (3) of Wu et al., ICML 2023).
"""

from __future__ import annotations

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
    TargetOpt,
)


def _read_frame(path: Path):
    import pandas as pd

    from .cli import fail

    if not path.exists():
        fail(f"data file {path} does not exist")
    if path.suffix.lower() in (".parquet", ".pq"):
        return pd.read_parquet(path)
    return pd.read_csv(path)


def _load_model(model_dir: Path):
    from .cli import fail
    from .models.fedgmm import FedGMM

    if not (model_dir / "model.json").exists():
        fail(f"{model_dir} has no model.json; write one with 'fedlatent fit fedgmm --out DIR'")
    try:
        return FedGMM.load(model_dir / "model")
    except ValueError as e:
        fail(str(e))


def _rows_by_client(df, client: str, est, target: str | None, use_global: bool, model_dir):
    """Yield (row index, client id, X, y, predictor) per client of the file."""
    import numpy as np

    from .cli import fail

    if client not in df.columns:
        fail(f"column {client!r} (--client) is not in the data; columns: {list(df.columns)}")
    missing = [f for f in est.feature_names_in_ if f not in df.columns]
    if missing:
        fail(f"the data lack the model's feature columns {missing}")
    if target is not None and target not in df.columns:
        fail(f"column {target!r} (--target) is not in the data")
    for cid, part in df.groupby(client, sort=False):
        X = part[est.feature_names_in_].to_numpy(dtype=np.float64)
        y = part[target].to_numpy() if target is not None else None
        if use_global:
            pred = None
        else:
            path = model_dir / "clients" / f"{cid}.npz"
            if not path.exists():
                fail(
                    f"client {cid!r} has no weights file {path}; it did not take part in the "
                    "fit: use --global, or adapt it in Python with FedGMM.adapt"
                )
            pred = est.load_client_weights(str(cid), path)
        yield part.index.to_numpy(), str(cid), X, y, pred


def register(app: typer.Typer, fit_app: typer.Typer) -> None:
    """Add the FedGMM commands to the ``fedlatent`` app."""

    @fit_app.command("fedgmm")
    def fit_fedgmm(
        *,
        data: DataOpt,
        client: ClientOpt,
        target: TargetOpt,
        features: FeaturesOpt = None,
        input_components: int = typer.Option(3, "--input-components", help="M1."),
        learners: int = typer.Option(3, "--learners", help="M2."),
        covariance_type: str = typer.Option("full", "--covariance-type"),
        reg_covar: float = typer.Option(1e-6, "--reg-covar"),
        l2: float = typer.Option(1e-3, "--l2"),
        learner_update: str = typer.Option("newton", "--learner-update",
                                           help="newton | average"),
        covariance_aggregation: str = typer.Option("exact", "--covariance-aggregation",
                                                   help="exact | paper"),
        participation: ParticipationOpt = 1.0,
        step_size: StepOpt = 1.0,
        quant_levels: QuantizeOpt = None,
        control_variates: ControlVariatesOpt = True,
        max_rounds: MaxRoundsOpt = 100,
        tol: float = typer.Option(1e-4, "--tol"),
        seed: SeedOpt = 0,
        out: Path = typer.Option(..., "--out", help="Output directory."),
        progress: ProgressOpt = None,
    ):
        """Fit FedGMM; write the shared model, history.csv and one weights file per client."""
        from .cli import fail, load_federated, make_federation
        from .models.fedgmm import FedGMM

        fd = load_federated(data, client, features, target)
        fed = make_federation(participation, step_size, quant_levels, control_variates, seed)
        est = FedGMM(
            input_components, learners, covariance_type=covariance_type, reg_covar=reg_covar,
            l2=l2, learner_update=learner_update, covariance_aggregation=covariance_aggregation,
            federation=fed, max_rounds=max_rounds, tol=tol, random_state=seed, verbose=progress,
        )
        try:
            est.fit(fd)
        except ValueError as e:
            fail(str(e))
        out.mkdir(parents=True, exist_ok=True)
        est.save(out / "model")
        est.history_.to_csv(out / "history.csv")
        est.save_client_weights(out / "clients")
        typer.echo(
            f"FedGMM: {fd.n_clients} clients, {fd.n_samples} samples, {fd.n_features} features, "
            f"M1={input_components}, M2={learners}, classes {est.classes_.tolist()}"
        )
        typer.echo(
            f"rounds: {est.n_rounds_}  converged: {est.converged_}  "
            f"mean log h_c(x, y): {est.lower_bound_:.6f}"
        )
        typer.echo(f"wrote {out / 'model.npz'}, {out / 'model.json'}, {out / 'history.csv'}, "
                   f"{out / 'clients'}/")

    @app.command("predict")
    def predict(
        *,
        model: Path = typer.Option(..., "--model", help="Directory written by 'fit fedgmm'."),
        data: DataOpt,
        client: ClientOpt,
        out: Path = typer.Option(..., "--out", help="CSV of predictions."),
        use_global: bool = typer.Option(False, "--global",
                                        help="Global weights instead of each client's."),
    ):
        """Personalized predictions (eq. (3)) of a fitted FedGMM for every row."""
        import numpy as np
        import pandas as pd

        from .cli import fail

        est = _load_model(model)
        df = _read_frame(data)
        frames = []
        for idx, cid, X, _, pers in _rows_by_client(df, client, est, None, use_global, model):
            try:
                proba = est.predict_proba(X) if pers is None else pers.predict_proba(X)
            except ValueError as e:
                fail(f"client {cid!r}: {e}")
            f = pd.DataFrame(proba, index=idx,
                             columns=[f"proba_{c}" for c in est.classes_.tolist()])
            f.insert(0, "prediction", est.classes_[np.argmax(proba, axis=1)])
            f.insert(0, client, cid)
            frames.append(f)
        res = pd.concat(frames).sort_index()
        out.parent.mkdir(parents=True, exist_ok=True)
        res.to_csv(out, index_label="row")
        typer.echo(f"wrote {len(res)} predictions to {out}")

    @app.command("score")
    def score(
        *,
        model: Path = typer.Option(..., "--model", help="Directory written by 'fit fedgmm'."),
        data: DataOpt,
        client: ClientOpt,
        target: TargetOpt = None,
        out: Path = typer.Option(..., "--out", help="CSV of novelty scores."),
        use_global: bool = typer.Option(False, "--global",
                                        help="Global weights instead of each client's."),
    ):
        """Novelty scores per row: log p(x), log p(y|x), log p(x, y) (low = novel)."""
        import pandas as pd

        from .cli import fail

        est = _load_model(model)
        df = _read_frame(data)
        frames = []
        for idx, cid, X, y, pers in _rows_by_client(df, client, est, target, use_global, model):
            try:
                sc = est.score_samples(X, y) if pers is None else pers.score_samples(X, y)
            except ValueError as e:
                fail(f"client {cid!r}: {e}")
            sc.index = idx
            sc.insert(0, client, cid)
            frames.append(sc)
        res = pd.concat(frames).sort_index()
        out.parent.mkdir(parents=True, exist_ok=True)
        res.to_csv(out, index_label="row")
        typer.echo(f"wrote {len(res)} novelty scores to {out}")
