"""``fedlatent flower``: run a fit on a Flower deployment.

- ``flower credentials`` writes a deployment's TLS certificates and SuperNode keys
  (:mod:`fedlatent.runtime.flower_credentials`);
- ``flower partition`` writes one data file per client (what each site keeps) and prints the
  SuperLink's and each site's commands, with TLS and SuperNode authentication (the credentials
  made if they are not there yet; ``--insecure`` only when asked for, and then said);
- ``flower app MODEL`` writes the Flower app directory (``pyproject.toml`` with the run config)
  that ``flwr run`` submits to a SuperLink;
- ``flower local MODEL`` does it all on this machine (:mod:`fedlatent.cli.flower_run`), on
  127.0.0.1 without TLS (loopback only, and it says so).

``app`` and ``local`` have one command per registered model, whose options are the model's
option table (:mod:`fedlatent.cli.options`: the same names, defaults and help as ``fedlatent
fit MODEL``) and ``--param NAME=VALUE``. The JSON of ``--params``/``--federation`` still works
for one release, with a warning. Both check that the Flower extra is installed before anything
is written or started.
"""

from __future__ import annotations

import enum
import json
import shlex
from pathlib import Path
from typing import Any

import typer

from .common import (
    CATEGORICAL_CHOICES,
    CATEGORICAL_HELP,
    HELP,
    ClientOpt,
    CommandGroup,
    DataOpt,
    EntityOpt,
    FeaturesOpt,
    TargetOpt,
    fail,
    load_dataset,
    read_frame,
    split_list,
)
from .fit import ModelGroup

__all__ = ["flower_app", "model_rows"]

_FLOWER_EXTRA = "pip install 'fedlatent[flower]'"


def _require_flower() -> None:
    """Exit with one line unless Flower is importable (before anything is written)."""
    import importlib.util

    try:
        found = importlib.util.find_spec("flwr") is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        fail(f"the Flower extra is not installed; install it with: {_FLOWER_EXTRA}")


def deployment_rows() -> list:
    """The options of a deployment every ``app`` and ``local`` command has."""
    from .options import Row

    return [
        Row("round_timeout", ("--round-timeout",), "Seconds to wait for the replies of one "
            "exchange. [default: 120]", kind="float", metavar="SECONDS"),
        Row("node_wait", ("--node-wait",), "Seconds to wait for --min-nodes SuperNodes. "
            "[default: 120]", kind="float", metavar="SECONDS"),
        Row("params", ("--params",), "Deprecated: the model's options and --param NAME=VALUE.",
            hidden=True),
        Row("federation_json", ("--federation",), "Deprecated: --participation, --step-size, "
            "--quantize, --secure-aggregation, --privacy...", hidden=True),
    ]


def model_rows(entry) -> list:
    """The model's option table and ``--param`` (what ``fit MODEL`` takes for the model)."""
    from .options import model_table, param_row

    return [*model_table(entry), param_row()]


def estimator_of(entry, values: dict[str, Any]):
    """The estimator the command's ``values`` describe (with the deprecated JSON of
    ``--params``/``--federation``); exits with the reason when it cannot be built."""
    from .vocabulary import build_estimator, deprecated

    base: dict[str, Any] = {}
    raw = values.get("params")
    if raw is not None:
        deprecated("--params JSON", "the model's options (--components, --max-rounds...) and "
                   "--param NAME=VALUE")
        try:
            base = json.loads(raw)
        except ValueError as e:
            fail(f"--params is not valid JSON ({e}): {raw!r}")
        if not isinstance(base, dict):
            fail(f"--params must be a JSON object like '{{\"n_components\": 3}}'; got {raw!r}")
    if values.get("federation_json"):
        deprecated("--federation JSON", "--participation, --step-size, --quantize, "
                   "--secure-aggregation, --privacy")
        try:
            base["federation"] = json.loads(values["federation_json"])
        except ValueError as e:
            fail(f"--federation is not valid JSON ({e}): {values['federation_json']!r}")
    try:
        return build_estimator(entry, values, values.get("param"), base=base)
    except TypeError as e:  # an unknown key of --params
        fail(f"cannot build {entry.name} from --params/--federation: {e}")


def _run_config(est, *, result_dir: Path, min_nodes: int, round_timeout: float,
                node_wait: float, data_name: str = "", resume: bool = False) -> dict:
    try:
        from ..runtime.flower import run_config_for
    except ImportError as e:  # pragma: no cover - flwr missing
        fail(f"{e}; install the Flower extra: {_FLOWER_EXTRA}")
    if min_nodes < 1:
        fail(f"--min-nodes must be >= 1, got {min_nodes}")
    try:
        return run_config_for(est, out_dir=result_dir, min_nodes=min_nodes,
                              round_timeout=round_timeout, node_wait=node_wait,
                              data_name=data_name, resume=resume)
    except ValueError as e:
        fail(str(e))


def _supernode_command(path: Path, superlink: str, port: int, security: list[str]) -> str:
    node_config = f"data-path={json.dumps(str(path.resolve()))}"
    return shlex.join(["flower-supernode", *security, "--superlink", superlink,
                       "--port", str(port), "--node-config", node_config])


def _deployment_credentials(where: Path, n: int, superlink: str):
    """The credentials in ``where`` for ``n`` SuperNodes, made if none are there (the
    SuperLink's certificate for loopback and ``superlink``'s host)."""
    from ..runtime.flower_credentials import LOOPBACK, make_credentials, read_credentials

    if not (where / "certificates" / "ca.crt").exists():
        host = superlink.rsplit(":", 1)[0].strip("[]")
        typer.echo(f"wrote the deployment's credentials to {where} (keep certificates/ca.key "
                   "offline; each keys/supernode-<i> goes to its site only)")
        return make_credentials(where, n, hosts=(host, *[h for h in LOOPBACK if h != host]))
    return read_credentials(where, n)


def _client_dir_files(data: Path) -> list[Path]:
    files = sorted(data.glob("*.parquet"))
    if not files:
        fail(f"{data} holds no .parquet client files; write them with 'fedlatent flower "
             "partition' or give --data a table file and --client")
    return files


def _split_rows(data: Path, n: int, features: str | None, target: str | None, seed: int):
    """Rows of a table without a client column shuffled into ``n`` equal clients (features: the
    numeric columns but the target, unless named)."""
    import numpy as np
    import pandas as pd

    from ..data.partition import split_arrays

    df = read_frame(data)
    cols = split_list(features) or [
        c for c in df.columns if c != target and pd.api.types.is_numeric_dtype(df[c])
    ]
    missing = [c for c in [*cols, *([target] if target else [])] if c not in df.columns]
    if missing:
        fail(f"columns {missing} are not in {data}; columns: {list(df.columns)}")
    if n < 1 or n > len(df):
        fail(f"--split-rows must be between 1 and the {len(df)} rows of {data}, got {n}")
    perm = np.random.default_rng(seed).permutation(len(df))
    parts = [np.sort(p) for p in np.array_split(perm, n)]
    # the dataset validates itself on construction
    return split_arrays(df[cols].to_numpy(dtype=np.float64), parts,
                        None if target is None else df[target].to_numpy(), feature_names=cols)


flower_app = typer.Typer(
    cls=CommandGroup,
    no_args_is_help=True,
    help="Run a fit on a Flower deployment (needs the Flower extra of fedlatent).",
)


#: the values of --categorical
Categorical = enum.Enum("Categorical", {c.replace("-", "_"): c for c in CATEGORICAL_CHOICES},
                        type=str)


@flower_app.command("partition")
def partition(
    *,
    data: DataOpt,
    client: ClientOpt,
    features: FeaturesOpt = None,
    target: TargetOpt = None,
    entity: EntityOpt = None,
    weight: str | None = typer.Option(None, "--weight", help=HELP["weight"]),
    categorical: Categorical | None = typer.Option(None, "--categorical",
                                                   help=CATEGORICAL_HELP),
    categorical_columns: str | None = typer.Option(None, "--categorical-columns",
                                                   help=HELP["categorical_columns"]),
    out: Path = typer.Option(..., "--out", help="Directory for the client files."),
    superlink: str = typer.Option("127.0.0.1:8000", "--superlink",
                                  help="SuperLink address shown in the printed commands."),
    credentials: Path | None = typer.Option(
        None, "--credentials",
        help="The deployment's TLS certificates and SuperNode keys (default: <out>/credentials,"
             " made there if missing; see 'fedlatent flower credentials')."),
    insecure: bool = typer.Option(
        False, "--insecure", help="Print commands without TLS or SuperNode authentication "
                                  "(a test on one machine only)."),
):
    """Write one Parquet file per client and print the SuperLink's and each site's commands
    (TLS and SuperNode authentication unless --insecure)."""
    from ..data.files import write_client_files

    _, fd = load_dataset(data, client, features, target=target, entity=entity,
                         categorical=None if categorical is None else categorical.value,
                         categorical_columns=categorical_columns, weight=weight)
    files = write_client_files(fd, out)
    typer.echo(f"wrote {len(files)} client files to {out}")
    cred = None if insecure else _deployment_credentials(
        (credentials or out / "credentials").resolve(), fd.n_clients, superlink)
    _print_superlink(cred, superlink)
    for i, cid in enumerate(fd.client_ids):
        # the id as a JSON string: a newline in an id cannot start a line of the commands
        typer.echo(f"# client {json.dumps(cid)} ({fd[cid].n_samples} rows)")
        security = ["--insecure"] if cred is None else [
            "--root-certificates", str(cred.ca),
            "--auth-supernode-private-key", str(cred.node_keys[i])]
        typer.echo(_supernode_command(files[cid], superlink, 9094 + i, security))


def _print_superlink(cred, superlink: str) -> None:
    """The SuperLink's command, and how the SuperNodes' keys are registered with it."""
    port = superlink.rsplit(":", 1)[-1]
    if cred is None:
        typer.echo("warning: --insecure: no TLS and no SuperNode authentication; anyone on the "
                   "network reads every message and any node can join (one machine only)",
                   err=True)
        typer.echo("# SuperLink\n" + shlex.join(["flower-superlink", "--insecure", "--port",
                                                  port]))
        return
    typer.echo("# SuperLink (TLS; only registered SuperNodes are admitted)\n" + shlex.join([
        "flower-superlink", "--ssl-ca-certfile", str(cred.ca), "--ssl-certfile",
        str(cred.server_cert), "--ssl-keyfile", str(cred.server_key),
        "--enable-supernode-auth", "--port", port]))
    typer.echo(f"# register the SuperNodes (a flwr connection to {superlink} with "
               f"root-certificates = {json.dumps(str(cred.ca))})")
    for i in range(len(cred.node_keys)):
        typer.echo(shlex.join(["flwr", "supernode", "register", str(cred.node_public(i)),
                               "<connection>"]))

@flower_app.command("credentials")
def credentials_cmd(
    out: Path = typer.Argument(..., help="Directory to write certificates/ and keys/ into."),
    supernodes: int = typer.Option(..., "--supernodes", help="SuperNode key pairs to make."),
    host: list[str] = typer.Option(
        None, "--host", help="A name or address the SuperLink is reached at (repeat; default: "
                             "localhost, 127.0.0.1, ::1)."),
):
    """Write a deployment's TLS certificates (its own CA, the SuperLink's certificate) and one
    SuperNode authentication key pair per site, made with the cryptography package."""
    from ..runtime.flower_credentials import LOOPBACK, make_credentials

    try:
        cred = make_credentials(out, supernodes, hosts=tuple(host) if host else LOOPBACK)
    except (FileExistsError, ValueError) as err:
        fail(str(err))
    typer.echo(f"wrote {cred.ca}, {cred.server_cert} and {cred.server_key} (the SuperLink's; "
               f"keep {cred.ca.with_name('ca.key')} offline)")
    typer.echo(f"wrote {len(cred.node_keys)} SuperNode key pairs in {cred.node_keys[0].parent} "
               "(each private key goes to its site only; the .pub files are registered with "
               "the SuperLink: flwr supernode register)")



class AppGroup(ModelGroup):
    """``flower app MODEL``: a command per registered model."""

    @staticmethod
    def make(entry):
        return app_command(entry)


def app_command(entry):
    """``fedlatent flower app NAME``: the model's option table and the app's own options."""
    from .options import Row, build_command

    rows = [Row("out", ("--out",), "Directory of the Flower app to write.", kind="path",
                required=True, metavar="DIR"),
            Row("data", ("--data",), "The directory of client files from 'fedlatent flower "
                "partition' (counts the sites for --min-nodes).", kind="path", metavar="DIR"),
            Row("min_nodes", ("--min-nodes",), "SuperNodes the server waits for [default: "
                "the number of client files in --data].", kind="int", metavar="N"),
            Row("result_dir", ("--result-dir",), "Where the server app writes status.json, "
                "the model and history.csv, on the SuperLink's machine [default: <out>/result].",
                kind="path", metavar="DIR"),
            Row("data_name", ("--data-name",), "File name inside each node's data-path when "
                "that names a directory."),
            *deployment_rows(), *model_rows(entry)]
    return build_command(entry.name, rows, lambda values: _write_app(entry, values),
                         help=f"Write a Flower app directory (pyproject.toml + README.md) "
                              f"fitting {entry.cls.__name__} for `flwr run`.",
                         short_help=entry.description)


def _write_app(entry, values: dict[str, Any]) -> None:
    _require_flower()
    from ..runtime.flower_local import write_app

    est = estimator_of(entry, values)
    out, data, min_nodes = values["out"], values["data"], values["min_nodes"]
    if min_nodes is None:
        if data is not None:
            min_nodes = len(_client_dir_files(data))
        else:
            min_nodes = 1
            typer.echo("warning: --min-nodes not given and no --data to count the sites: the "
                       "server starts with the first node that joins; give --min-nodes N",
                       err=True)
    result = (values["result_dir"] or out / "result").resolve()
    config = _run_config(est, result_dir=result, min_nodes=min_nodes,
                         round_timeout=values["round_timeout"] or 120.0,
                         node_wait=values["node_wait"] or 120.0,
                         data_name=values["data_name"] or "")
    app_dir = write_app(out, config)
    typer.echo(f"wrote {app_dir / 'pyproject.toml'} and {app_dir / 'README.md'}")
    typer.echo(f"run it: flwr run {shlex.quote(str(app_dir))} <connection> --stream "
               "(resume a run that stopped: add -c resume=true); the connection trusts the "
               "deployment's ca.crt (root-certificates): see 'fedlatent flower credentials'")
    typer.echo(f"results: {result} (status.json, model.npz/json, history.csv)")


flower_app.add_typer(typer.Typer(cls=AppGroup, no_args_is_help=True,
                                 help="Write a Flower app directory for `flwr run` (one "
                                      "command per registered model)."), name="app")


def predict_at_site(est, data: Path, site_state: Path, out: Path) -> None:
    """``fedlatent predict --site-state DIR``: predict a site's rows with the private state the
    site kept after a deployed fit (FedGMM's ``pi_c``): the personalized predictions the
    in-process fit gives for that client. ``data`` is the site's client file (``fedlatent
    flower partition``) or any table with the model's feature columns (all rows the site's)."""
    import numpy as np
    import pandas as pd

    from ..data.dataset import DataValidationError
    from ..data.files import read_client_file
    from .common import write_atomic

    if not hasattr(est, "load_site_state"):
        fail(f"{type(est).__name__} keeps no per-site state that changes its predictions; "
             "predict without --site-state")
    try:
        pred = est.load_site_state(site_state)
    except (FileNotFoundError, ValueError) as e:
        fail(str(e))
    try:
        fd = read_client_file(data)
    except DataValidationError:  # not a client file: a table of the site's rows
        df = read_frame(data)
        missing = [f for f in est.feature_names_in_ if f not in df.columns]
        if missing:
            fail(f"{data} misses the model's feature columns {missing}")
        X = df[[str(f) for f in est.feature_names_in_]]
    else:
        if fd.client_ids != [pred.client]:
            fail(f"{data} holds client {fd.client_ids[0]!r}, the site state {site_state} client "
                 f"{pred.client!r}: give the site's own data file")
        X = pd.DataFrame(fd[pred.client].X, columns=fd.feature_names)
    try:
        values = pred.predict(X)
        proba = pred.predict_proba(X)
    except ValueError as e:
        fail(str(e))
    res = pd.DataFrame({"client": np.full(len(X), pred.client, dtype=object),
                        "prediction": values})
    for j, c in enumerate(np.asarray(est.classes_).tolist()):
        res[f"proba_{c}"] = proba[:, j]
    write_atomic(out, lambda tmp: res.to_csv(tmp, index_label="row"))
    typer.echo(f"wrote {len(res)} predictions of site {pred.client!r} to {out}")
