"""Seconds per round and startup cost of one federated GMM fit in the three runtimes, and the
deployment's round against Flower's own floor.

The same data (3 clients, 20,000 rows each, d = 8, K = 3, full covariances) and the same seed
are fitted in-process, on Flower's simulation engine (Ray) and on a real loopback deployment
(one SuperLink and three SuperNode processes). Prints, for each runtime, the fixed cost (everything
but the rounds: starting the engine or the processes, nodes joining and describing their data,
shutting down), the mean seconds per round as the server measures it (send,
client E-steps, receive, M-step) and its ratio to the in-process round measured in the same run,
and checks that the three fits agree.

On the same deployment it also runs an *empty* Message-API app written here (``floor_app.py``,
shipped inside its app directory): a ServerApp that sends each node a few floats per round and
waits for the replies (pulling on the same schedule as fedlatent's server), and a ClientApp that
adds one to them. Its seconds per round are Flower's floor on this machine (SuperNode polling,
one ClientApp process per message); the benchmark prints fedlatent's deployment round over it.

    .venv/bin/python benchmarks/bench_flower.py [--rows 20000] [--rounds 8] [--skip-deploy]
                                                [--skip-sim] [--floor-rounds 10]

Needs ``pip install fedlatent[flower-sim]`` (``fedlatent[flower]`` with ``--skip-sim``).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

import fedlatent as fl

#: The empty app: Flower's floor. Written into its app directory (only the app's *.py travel).
FLOOR_APP = '''\
"""Flower's floor: each round sends every node a few floats and waits for the replies."""
import json
import time
from pathlib import Path

import numpy as np
from flwr.app import Array, ArrayRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp

server_app = ServerApp()
client_app = ClientApp()


def _push_pull(grid, msgs):
    ids = set(str(i) for i in grid.push_messages(msgs))
    got, pause = [], 0.02          # the pull schedule of fedlatent's FlowerRuntime
    while ids:
        for rep in grid.pull_messages(list(ids)):
            ids.discard(str(rep.metadata.reply_to_message_id))
            got.append(rep)
        if ids:
            time.sleep(pause)
            pause = min(0.2, pause * 1.5)
    return got


@server_app.main()
def main(grid: Grid, context: Context) -> None:
    cfg = context.run_config
    started = time.time()
    nodes = sorted(grid.get_node_ids())
    while len(nodes) < int(cfg["min-nodes"]):
        time.sleep(0.2)
        nodes = sorted(grid.get_node_ids())
    seconds = []
    for k in range(int(cfg["rounds"])):
        t0 = time.perf_counter()
        x = np.full(4, float(k))
        msgs = [Message(RecordDict({"x": ArrayRecord({"x": Array(x)})}), dst_node_id=n,
                        message_type="query.floor") for n in nodes]
        replies = _push_pull(grid, msgs)
        total = sum(float(r.content["x"]["x"].numpy().sum()) for r in replies)
        assert total == len(nodes) * 4 * (k + 1), total
        seconds.append(time.perf_counter() - t0)
        if k == 0:  # every node's answer to the app's first message (epoch seconds)
            answered = time.time()
    out = Path(str(cfg["out-dir"]))
    out.mkdir(parents=True, exist_ok=True)
    (out / "floor.json").write_text(json.dumps({"seconds": seconds, "app_started_at": started,
                                                "answered_at": answered}))
    # what fedlatent's run_app reads to judge the run
    (out / "status.json").write_text(json.dumps({"status": "ok", "round": len(seconds)}))


@client_app.query("floor")
def floor(msg: Message, context: Context) -> Message:
    x = msg.content["x"]["x"].numpy() + 1.0
    return Message(RecordDict({"x": ArrayRecord({"x": Array(x)})}), reply_to=msg)
'''


def make_data(rows: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    centers = rng.normal(scale=3.0, size=(3, 8))
    data = {}
    for i in range(3):
        z = rng.choice(3, size=rows, p=np.roll([0.7, 0.2, 0.1], i))
        data[f"site-{i}"] = centers[z] + rng.normal(size=(rows, 8))
    return fl.FederatedDataset.from_arrays(data)


def max_diff(a, b) -> float:
    """Largest absolute difference of the fitted weights, means and covariances."""
    return max(float(np.max(np.abs(getattr(a, k) - getattr(b, k))))
               for k in ("weights_", "means_", "covariances_"))


def write_floor_app(app_dir: Path, out_dir: Path, rounds: int, min_nodes: int) -> Path:
    from fedlatent.runtime.flower_local import write_app

    write_app(app_dir, {"out-dir": str(out_dir), "rounds": int(rounds),
                        "min-nodes": int(min_nodes)},
              components={"serverapp": "floor_app:server_app",
                          "clientapp": "floor_app:client_app"})
    (app_dir / "floor_app.py").write_text(FLOOR_APP)
    return app_dir


def deployment(fd, est, tmp: Path, floor_rounds: int):
    """fedlatent's fit and the empty app on one loopback deployment: (fitted estimator,
    empty-round seconds). The empty app runs before and after the fit (half of
    ``floor_rounds`` each), so that a change of the machine's load during the run weighs on both
    alike."""
    from fedlatent.data.files import write_client_files
    from fedlatent.runtime.flower import load_result, run_config_for
    from fedlatent.runtime.flower_local import LocalDeployment, run_app, write_app

    paths = write_client_files(fd, tmp / "data")
    files = [paths[c] for c in fd.client_ids]
    app = write_app(tmp / "app", run_config_for(est, out_dir=tmp / "dep", min_nodes=len(files)))
    half = max(2, floor_rounds // 2)
    floors = [write_floor_app(tmp / f"floor-app-{i}", tmp / f"floor-{i}", half, len(files))
              for i in (0, 1)]
    with LocalDeployment(files, workdir=tmp / "deploy") as dep:
        run_app(floors[0], dep, timeout=1800)
        t0 = time.perf_counter()
        run_app(app, dep, timeout=1800)
        wall = time.perf_counter() - t0
        run_app(floors[1], dep, timeout=1800)
    fitted = load_result(tmp / "dep")
    fitted.flower_deployment_ = {"startup_seconds": dep.startup_seconds, "wall": wall}
    # the first empty round of a run includes the nodes' first contact with it: left out
    secs = [json.loads((tmp / f"floor-{i}" / "floor.json").read_text())["seconds"][1:]
            for i in (0, 1)]
    return fitted, secs[0] + secs[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=20000)
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--floor-rounds", type=int, default=10)
    ap.add_argument("--skip-deploy", action="store_true")
    ap.add_argument("--skip-sim", action="store_true")
    args = ap.parse_args()
    warnings.simplefilter("ignore")
    fd = make_data(args.rows)

    def est():
        return fl.FederatedGaussianMixture(3, max_rounds=args.rounds, tol=0.0, random_state=5)

    rows = []
    t0 = time.perf_counter()
    ref = est().fit(fd)
    wall = time.perf_counter() - t0
    per_round = float(np.mean([r.seconds for r in ref.history_]))
    rows.append(("in-process", 0.0, per_round, wall, 0.0))
    floor = None
    with tempfile.TemporaryDirectory() as tmp:
        if not args.skip_sim:
            from fedlatent.runtime.flower import simulate

            t0 = time.perf_counter()
            sim = simulate(est(), fd, workdir=Path(tmp) / "sim")
            wall = time.perf_counter() - t0
            st = sim.flower_status_
            rows.append(("flower simulation", wall - st["fit_seconds"],
                         st["seconds_per_round"], wall, max_diff(sim, ref)))
        if not args.skip_deploy:
            dep, floor = deployment(fd, est(), Path(tmp), args.floor_rounds)
            st = dep.flower_status_
            wall = dep.flower_deployment_["wall"] + dep.flower_deployment_["startup_seconds"]
            rows.append(("flower deployment", wall - st["fit_seconds"],
                         st["seconds_per_round"], wall, max_diff(dep, ref)))
            print(f"deployment: processes up in {dep.flower_deployment_['startup_seconds']:.1f} s,"
                  f" nodes described their data {st['startup_seconds']:.1f} s after the server "
                  "app started")

    base = rows[0][2]
    print(f"federated GMM, 3 clients x {args.rows} rows, d = 8, K = 3, {args.rounds} rounds")
    print(f"{'runtime':<20}{'fixed s':>11}{'s/round':>10}{'ratio':>8}{'total s':>10}"
          f"{'max |diff|':>12}")
    for name, start, pr, wall, diff in rows:
        print(f"{name:<20}{start:>11.2f}{pr:>10.3f}{pr / base:>8.1f}{wall:>10.2f}{diff:>12.1e}")
    if floor is not None:
        empty = float(np.median(floor))
        # round 1 is the initialization round (and the control variates' start): left out
        fed = [r.seconds for r in dep.history_][1:]
        ours = float(np.median(fed))
        print(f"Flower's floor (empty Message-API round, same deployment, before and after the "
              f"fit): {empty:.2f} s per round (median of {', '.join(f'{s:.2f}' for s in floor)})")
        print(f"fedlatent deployment round (median of rounds 2-{len(fed) + 1}: "
              f"{', '.join(f'{s:.2f}' for s in fed)}): {ours:.2f} s")
        print(f"fedlatent round / empty round = {ours / empty:.2f}")


if __name__ == "__main__":
    main()
