"""``fedlatent flower``: run a fit on a Flower deployment.

- ``flower credentials`` writes a deployment's TLS certificates and SuperNode keys
  (:mod:`fedlatent.runtime.flower_credentials`);
- ``flower partition`` writes one data file per client (what each site keeps) and prints the
  SuperLink's and each site's commands, with TLS and SuperNode authentication (the credentials
  made if they are not there yet; ``--insecure`` only when asked for, and then said);
- ``flower app`` writes the Flower app directory (``pyproject.toml`` with the run config) that
  ``flwr run`` submits to a SuperLink;
- ``flower local`` does it all on this machine: partition if needed, start a SuperLink and one
  SuperNode per client on 127.0.0.1 (loopback: without TLS, and it says so), run (printing every
  round), collect the model, and stop every process (also on an error or Ctrl-C); ``--resume``
  continues a run that stopped from the server's checkpoint and the sites' states (each site
  keeps its private state in ``<data file stem>.site`` beside its data file).

Both check that the Flower extra is installed before anything is written or started.

The model is named as in the registry (``fedlatent fit --help`` lists them); ``local`` and
``app`` take the options every ``fit`` command takes (``--components``, ``--participation``,
``--seed``, ``--max-rounds``...: :mod:`fedlatent.cli.vocabulary`) and ``--param NAME=VALUE`` for
the estimator's other parameters. The JSON of ``--params``/``--federation`` still works for one
release, with a warning.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Annotated

import typer

from .common import (
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
from .fit import ParamOpt

__all__ = ["flower_app"]

_MODEL = typer.Argument(..., help="Model, a registered name: see 'fedlatent fit --help'.")
_PARAMS = typer.Option("{}", "--params", hidden=True,
                       help="Deprecated: the shared options and --param NAME=VALUE.")
_FEDERATION = typer.Option(None, "--federation", hidden=True,
                           help="Deprecated: --participation, --step-size, --quantize...")
_MIN_NODES = typer.Option(None, "--min-nodes", help="SuperNodes the server waits for.")
_ROUND_TIMEOUT = typer.Option(
    120.0, "--round-timeout", help="Seconds to wait for the replies of one round."
)
_NODE_WAIT = typer.Option(120.0, "--node-wait", help="Seconds to wait for --min-nodes nodes.")
_SeedOpt = Annotated[int | None, typer.Option(
    "--seed", help="Seed of every random draw of the run (default: the random_state in --params, "
                   "else 0), so that a deployed run is reproducible.")]
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


def _estimator(model: str, params: str, federation: str | None, seed: int | None = None,
               param: list[str] | None = None):
    """The estimator named on the command line; exit with the reason when it cannot be built.

    Its parameters: the shared options (:mod:`.vocabulary`), ``--param NAME=VALUE``, and the
    deprecated JSON of ``--params``/``--federation``."""
    from ..engine.contract.registry import estimator_class, estimator_from_config, estimator_names
    from .fit import parse_params
    from .vocabulary import SHARED, apply_shared, deprecated

    if model not in estimator_names():
        fail(f"unknown model {model!r}; choose one of {', '.join(estimator_names())}")
    if params != "{}":
        deprecated("--params JSON", "the shared options (--components, --max-rounds...) and "
                   "--param NAME=VALUE")
    if federation:
        deprecated("--federation JSON", "--participation, --step-size, --quantize, "
                   "--secure-aggregation, --privacy")
    try:
        p = json.loads(params)
    except ValueError as e:
        fail(f"--params is not valid JSON ({e}): {params!r}")
    if not isinstance(p, dict):
        fail(f"--params must be a JSON object like '{{\"n_components\": 3}}'; got {params!r}")
    if federation:
        try:
            p["federation"] = json.loads(federation)
        except ValueError as e:
            fail(f"--federation is not valid JSON ({e}): {federation!r}")
    cls = estimator_class(model)
    extra = parse_params(param, cls, model)
    if hasattr(extra.get("federation"), "to_config"):  # --param federation={...}: as JSON
        extra["federation"] = extra["federation"].to_config()
    p.update(extra)
    try:
        p = apply_shared(cls, p, SHARED.get(), as_config=True)
    except ValueError as e:
        fail(str(e))
    if seed is not None:
        given = p.get("random_state")
        if given is not None and given != seed:
            fail(f"--seed {seed} and the random_state {given!r} of --params disagree; give the "
                 "seed once")
        p["random_state"] = seed
    elif p.get("random_state") is None:
        p["random_state"] = 0  # a deployed run is reproducible by default
    try:
        est = estimator_from_config(model, p)
    except (TypeError, ValueError) as e:
        fail(f"cannot build {model} from --params/--federation: {e}")
    return est


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
        fail(f"--clients must be between 1 and the {len(df)} rows of {data}, got {n}")
    perm = np.random.default_rng(seed).permutation(len(df))
    parts = [np.sort(p) for p in np.array_split(perm, n)]
    # the dataset validates itself on construction
    return split_arrays(df[cols].to_numpy(dtype=np.float64), parts,
                        None if target is None else df[target].to_numpy(), feature_names=cols)


class FlowerGroup(CommandGroup):
    """The ``flower`` group: ``local`` and ``app`` take the shared options of every fit."""

    def get_command(self, ctx: typer.Context, name: str):
        from .vocabulary import with_shared

        cmd = super().get_command(ctx, name)
        return with_shared(cmd) if cmd is not None and name in ("local", "app") else cmd


flower_app = typer.Typer(
    cls=FlowerGroup,
    no_args_is_help=True,
    help="Run a fit on a Flower deployment (needs the Flower extra of fedlatent).",
)


@flower_app.command("partition")
def partition(
    *,
    data: DataOpt,
    client: ClientOpt,
    features: FeaturesOpt = None,
    target: TargetOpt = None,
    entity: EntityOpt = None,
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

    _, fd = load_dataset(data, client, features, target=target, entity=entity)
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


@flower_app.command("app")
def write_app_cmd(
    *,
    model: str = _MODEL,
    out: Path = typer.Option(..., "--out", help="Directory of the Flower app to write."),
    params: str = _PARAMS,
    federation: str | None = _FEDERATION,
    param: ParamOpt = None,
    seed: _SeedOpt = None,
    min_nodes: int | None = typer.Option(
        None, "--min-nodes",
        help="SuperNodes the server waits for (default: the number of client files in --data)."),
    data: Path | None = typer.Option(
        None, "--data",
        help="The directory of client files from 'fedlatent flower partition' (counts the sites "
             "for --min-nodes)."),
    round_timeout: float = _ROUND_TIMEOUT,
    node_wait: float = _NODE_WAIT,
    result_dir: Path | None = typer.Option(
        None, "--result-dir",
        help="Where the server app writes status.json, the model and history.csv, on the "
             "SuperLink's machine (default: <out>/result)."),
    data_name: str = typer.Option(
        "", "--data-name",
        help="File name inside each node's data-path when that names a directory."),
):
    """Write a Flower app directory (pyproject.toml + README.md) for `flwr run`."""
    _require_flower()
    from ..runtime.flower_local import write_app

    est = _estimator(model, params, federation, seed, param)
    if min_nodes is None:
        if data is not None:
            min_nodes = len(_client_dir_files(data))
        else:
            min_nodes = 1
            typer.echo("warning: --min-nodes not given and no --data to count the sites: the "
                       "server starts with the first node that joins; give --min-nodes N",
                       err=True)
    result = (result_dir or out / "result").resolve()
    config = _run_config(est, result_dir=result, min_nodes=min_nodes,
                         round_timeout=round_timeout, node_wait=node_wait,
                         data_name=data_name)
    app_dir = write_app(out, config)
    typer.echo(f"wrote {app_dir / 'pyproject.toml'} and {app_dir / 'README.md'}")
    typer.echo(f"run it: flwr run {shlex.quote(str(app_dir))} <connection> --stream "
               "(resume a run that stopped: add -c resume=true); the connection trusts the "
               "deployment's ca.crt (root-certificates): see 'fedlatent flower credentials'")
    typer.echo(f"results: {result} (status.json, model.npz/json, history.csv)")

def _print_round(status: dict) -> None:
    last = status.get("last") or {}
    missing = last.get("missing") or []
    typer.echo(f"round {status.get('round')}: objective {last.get('objective', float('nan')):.6g}"
               f", {last.get('participants', '?')} clients answered"
               + (f" (missing {', '.join(map(str, missing))})" if missing else "")
               + (f", {last['seconds']:.1f} s" if "seconds" in last else ""))


class _Beat:
    """After :meth:`start`, a line every ``every`` seconds until the ``with`` block ends (a
    step whose end nobody reports, such as stopping the deployment's processes)."""

    def __init__(self, every: float = 5.0) -> None:
        import threading

        self.every, self._done, self._thread = every, threading.Event(), None

    def start(self, text: str) -> None:
        import threading
        import time

        t0 = time.monotonic()

        def beat() -> None:
            while not self._done.wait(self.every):
                typer.echo(f"... {time.monotonic() - t0:.0f} s: {text}")

        self._thread = threading.Thread(target=beat, daemon=True)
        self._thread.start()

    def __enter__(self) -> _Beat:
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        if self._thread is not None:
            self._thread.join()


def _print_wait(status: dict | None, seconds: float) -> None:
    """A line while no round ends: what the server is doing (initialization exchanges)."""
    status = status or {}
    done = int(status.get("round") or 0)
    if done:
        what = f"round {done + 1} running"
    elif status.get("exchanges"):
        what = (f"initialization: {status['exchanges']} exchanges with the clients done "
                f"(last: {status.get('exchange')})")
    else:
        what = "waiting for the server app to start and the clients to answer"
    typer.echo(f"... {seconds:.0f} s: {what}")


@flower_app.command("local")
def local(
    *,
    model: str = _MODEL,
    data: Path = typer.Option(
        ..., "--data",
        help="A table file (with --client, or --clients N to split its rows) or a "
             "directory of client files from 'fedlatent flower partition'."),
    clients: int | None = typer.Option(
        None, "--clients", help="Number of SuperNodes (checked against the client files)."),
    client: str | None = typer.Option(None, "--client",
                                      help="Client column of a table file."),
    features: FeaturesOpt = None,
    target: TargetOpt = None,
    entity: EntityOpt = None,
    params: str = _PARAMS,
    federation: str | None = _FEDERATION,
    param: ParamOpt = None,
    min_nodes: int | None = _MIN_NODES,
    round_timeout: float = _ROUND_TIMEOUT,
    node_wait: float = _NODE_WAIT,
    timeout: float = typer.Option(3600.0, "--timeout", help="Seconds for the whole run."),
    seed: _SeedOpt = None,
    resume: bool = typer.Option(
        False, "--resume",
        help="Continue the run that stopped in --out from the server's checkpoint and the "
             "sites' states (same model, parameters and data)."),
    out: Path = typer.Option(..., "--out",
                             help="Output: result/ (model, history), deploy/ (logs), data/."),
):
    """Partition if needed, start a loopback Flower deployment, fit, collect, stop it all."""
    _require_flower()
    typer.echo("note: flower local runs on 127.0.0.1 without TLS or SuperNode authentication "
               "(loopback only); for a deployment across machines use 'flower partition'",
               err=True)
    from ..runtime.flower_local import write_app

    est = _estimator(model, params, federation, seed, param)
    out = out.resolve()
    if resume and not (out / "result" / "checkpoint.npz").exists():
        fail(f"--resume: there is no checkpoint {out / 'result' / 'checkpoint.npz'} to resume "
             "from; run without --resume")
    files = _local_files(data, out / "data", clients=clients, client=client, features=features,
                         target=target, entity=entity, seed=seed)
    n_min = len(files) if min_nodes is None else min_nodes
    config = _run_config(est, result_dir=out / "result", min_nodes=n_min,
                         round_timeout=round_timeout, node_wait=node_wait, resume=resume)
    result = _deploy_and_run(files, write_app(out / "app", config), out / "deploy", timeout)
    _print_outcome(result)


def _local_files(data: Path, data_dir: Path, *, clients: int | None, client: str | None,
                 features: str | None, target: str | None, entity: str | None,
                 seed: int | None) -> list[Path]:
    """The client files of ``flower local``: ``data``'s own when it is a directory of client
    files, else the table split by its ``client`` column (or into ``clients`` random parts)
    and written into ``data_dir``; exits with an error line when the options disagree."""
    from ..data.files import write_client_files

    if data.is_dir():
        files = _client_dir_files(data)
    else:
        if client is not None:
            _, fd = load_dataset(data, client, features, target=target, entity=entity)
        elif clients is not None:
            if entity is not None:
                fail("--entity needs --client: entities cannot be split across random clients")
            fd = _split_rows(data, clients, features, target, 0 if seed is None else seed)
        else:
            fail("give --client COLUMN (or --clients N to split the rows) for a table file")
        paths = write_client_files(fd, data_dir)
        files = [paths[c] for c in fd.client_ids]
    if clients is not None and clients != len(files):
        fail(f"--clients {clients} but the data hold {len(files)} clients")
    return files


def _deploy_and_run(files: list[Path], app_dir: Path, workdir: Path, timeout: float) -> Path:
    """Start a loopback deployment of ``files`` in ``workdir``, run the app with a line per
    round (and while waiting), stop every process (also on Ctrl-C or SIGTERM: exit 130);
    return the server's result directory."""
    import signal

    from ..runtime.flower_local import LocalDeployment, run_app

    def on_sigterm(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    previous = signal.signal(signal.SIGTERM, on_sigterm)
    typer.echo(f"starting a SuperLink and {len(files)} SuperNodes on 127.0.0.1 "
               f"(logs in {workdir})")
    try:
        with _Beat() as beat, LocalDeployment(files, workdir=workdir) as dep:
            typer.echo(f"deployment ready in {dep.startup_seconds:.1f} s "
                       f"(SuperLink {dep.address}, PIDs {dep.pids})")
            result = run_app(app_dir, dep, timeout=timeout, on_round=_print_round,
                             on_wait=_print_wait)
            typer.echo(f"run finished in {dep.last_run_seconds:.1f} s; stopping every Flower "
                       "process")
            beat.start("stopping every Flower process")  # until the deployment has stopped
    except KeyboardInterrupt:
        typer.echo("interrupted: every Flower process stopped", err=True)
        raise typer.Exit(130) from None
    except RuntimeError as e:
        fail(str(e), code=1)
    finally:
        signal.signal(signal.SIGTERM, previous)
    return result


def _print_outcome(result: Path) -> None:
    """The last lines of ``flower local``: rounds, seconds per round, lost clients, files."""
    status = json.loads((result / "status.json").read_text())
    typer.echo(f"every Flower process stopped; {status.get('rounds')} rounds"
               + (f", {status['seconds_per_round']:.1f} s per round"
                  if status.get("seconds_per_round") else ""))
    if status.get("lost"):
        typer.echo(f"clients lost on the way: {status['lost']}")
    typer.echo(f"wrote {result} (model.npz/json, history.csv, status.json)")


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
