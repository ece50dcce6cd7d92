"""Cost of secure aggregation per exchange (seconds, bytes) against a plain float sum, one run.

For 10 and 100 clients each sending a 1,000-float message: the once-per-fit key set-up, one
exchange with every participant replying (after a first one), and a fit's first exchange with a
dropout recovered (a fresh set-up: the multi-round rule forbids dropping a past survivor; a first
exchange also agrees the pairwise X25519 secrets, cached for the rest of the fit). The in-memory
driver runs every client in turn on this process, so "clients" is the summed client-side time
(in a deployment they run in parallel: divide by n for one client's time); "server" is the
server's time. Times are CPU seconds of this process (``time.process_time``), so a machine
shared with other jobs does not inflate them; wall time adds transport. The reference is the
plain exchange the engine runs today: copy every client's float64 message (as the in-process
runtime does) and add them up.

Run: ``python benchmarks/bench_secagg.py [--clients 10 100] [--size 1000] [--repeats 3]``.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from fedlatent.engine.secagg import FixedPoint, SecAggConfig, Wire, setup
from fedlatent.engine.secagg.driver import SERVER


def plain_exchange(stats: dict) -> tuple[float, int]:
    """Seconds and bytes of the plain float sum (copies as if crossing a wire)."""
    t0 = time.process_time()
    total, nbytes = None, 0
    for s in stats.values():
        x = np.array(s["x"], copy=True)
        nbytes += x.nbytes
        total = x if total is None else total + x
    return time.process_time() - t0, nbytes


def secure_exchange(server, clients, stats, round, drop=()):
    """One exchange phase by phase (announce, mask, sum, the consistency round, reveal, unmask):
    (client seconds, server seconds, bytes up, bytes down)."""
    wire = Wire()
    ids = sorted(clients)
    t_client = t_server = 0.0
    t0 = time.process_time()
    P = server.announce(round, "x", ids)
    t_server += time.process_time() - t0
    masked = {}
    for u in P:
        ann = json.loads(wire.send("announce", SERVER, u, {"participants": json.dumps(P)})
                         ["participants"])
        if u in drop:
            continue
        t0 = time.process_time()
        y = clients[u].mask(stats[u], round, "x", ann)
        t_client += time.process_time() - t0
        masked[u] = wire.send("masked", u, SERVER, y)
    t0 = time.process_time()
    request = {k: json.dumps(v) for k, v in server.aggregate(masked).items()}
    t_server += time.process_time() - t0
    confirmed, revealed = {}, {}
    survivors = json.loads(request["survivors"])
    for u in survivors:  # the consistency round: each survivor confirms its split
        req = wire.send("consistency", SERVER, u, request)
        t0 = time.process_time()
        r = clients[u].consistency(round, "x", json.loads(req["survivors"]),
                                   json.loads(req["dropped"]))
        t_client += time.process_time() - t0
        confirmed[u] = wire.send("consistency", u, SERVER, r)
    t0 = time.process_time()
    server.collect_confirmations(confirmed)
    t_server += time.process_time() - t0
    for u in survivors:
        req = wire.send("reveal-request", SERVER, u,
                        {"confirm": server.confirmations_for(u)})
        t0 = time.process_time()
        r = clients[u].reveal(round, "x", confirmations=req["confirm"])
        t_client += time.process_time() - t0
        revealed[u] = wire.send("reveal", u, SERVER, r)
    t0 = time.process_time()
    server.unmask(revealed)
    t_server += time.process_time() - t0
    return t_client, t_server, wire.up, wire.down


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, nargs="+", default=[10, 100])
    ap.add_argument("--size", type=int, default=1000, help="floats per client message")
    ap.add_argument("--repeats", type=int, default=3, help="exchanges timed (median)")
    a = ap.parse_args()
    rng = np.random.default_rng(0)
    print(f"message: {a.size} float64 per client; CPU times, medians of {a.repeats} exchanges\n")
    head = (f"{'clients':>7} {'phase':<22} {'clients s':>10} {'server s':>9} {'1 client ms':>11} "
            f"{'up KB':>9} {'down KB':>9} {'x plain time':>12} {'x plain bytes':>13}")
    print(head)
    for n in a.clients:
        ids = [f"c{i:03d}" for i in range(n)]
        cfg = SecAggConfig(threshold=n // 2 + 1, encoding=FixedPoint(scale=2.0**20, bound=1e3))
        stats = {u: {"x": rng.uniform(-1e3, 1e3, size=a.size)} for u in ids}
        plain_s = float(np.median([plain_exchange(stats)[0] for _ in range(max(a.repeats, 5))]))
        plain_b = plain_exchange(stats)[1]
        wire = Wire()
        t0 = time.process_time()
        server, clients = setup(ids, cfg, wire=wire)
        t_setup = time.process_time() - t0
        print(f"{n:>7} {'set-up (once per fit)':<22} {t_setup:>10.3f} {'':>9} "
              f"{1e3 * t_setup / n:>11.2f} {wire.up / 1e3:>9.1f} {wire.down / 1e3:>9.1f} "
              f"{t_setup / plain_s:>12.0f} {wire.up / plain_b:>13.2f}")
        rows = [secure_exchange(server, clients, stats, k) for k in range(a.repeats)]
        tc, ts, up, down = (float(np.median(c)) for c in zip(*rows))
        print(f"{n:>7} {'exchange':<22} {tc:>10.3f} {ts:>9.3f} {1e3 * tc / n:>11.2f} "
              f"{up / 1e3:>9.1f} {down / 1e3:>9.1f} {(tc + ts) / plain_s:>12.0f} "
              f"{up / plain_b:>13.2f}")
        # a dropout: a fresh set-up (the multi-round rule forbids dropping a past survivor)
        server, clients = setup(ids, cfg)
        tc, ts, up, down = secure_exchange(server, clients, stats, 0, drop={ids[-1]})
        print(f"{n:>7} {'1st exchange, 1 drop':<22} {tc:>10.3f} {ts:>9.3f} {1e3 * tc / n:>11.2f} "
              f"{up / 1e3:>9.1f} {down / 1e3:>9.1f} {(tc + ts) / plain_s:>12.0f} "
              f"{up / plain_b:>13.2f}")
        print(f"{n:>7} {'plain float sum':<22} {plain_s:>10.5f} {'':>9} {'':>11} "
              f"{plain_b / 1e3:>9.1f} {0.0:>9.1f} {1:>12} {1:>13.2f}")


if __name__ == "__main__":
    main()
