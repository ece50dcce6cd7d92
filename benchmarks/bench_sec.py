"""Wall time of the whole SEC protocol against the number of learners (20, 100, 400).

Default candidates (LassoCV and a random forest of 50 trees of depth 3), Simulation 1 data
(p = 5, SNR = 2^4, 50 observations per learner). Prints the time of each step, how the total
grows with L (the Exchange is L^2 model evaluations), and, in the same run, the ratio of the
Exchange run with joblib threads (``n_jobs``) to the serial Exchange on the same fitted models.

    .venv/bin/python benchmarks/bench_sec.py [--sizes 20,100,400] [--n-jobs 2]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from fedlatent.data.sec_data import make_sec_simulation1
from fedlatent.engine import InProcessRuntime
from fedlatent.engine.protocol.exchange import setup_clients
from fedlatent.models.sec import SEC, make_candidates
from fedlatent.models.sec import serialize as sec_serialize
from fedlatent.models.sec.protocol import exchange_step, select_step, sender


def clear_caches() -> None:
    """Forget loaded models, so each timed exchange deserializes them as a fresh learner would."""
    sec_serialize._cache.clear()
    sec_serialize._forest_cache.clear()


def run(L: int, n_jobs: int, seed: int = 0) -> dict:
    fd, _ = make_sec_simulation1(n_learners=L, random_state=seed)
    sec = SEC(random_state=seed, n_jobs=1)
    sec._validate_params()
    sec._validate_data(fd)
    cids = fd.client_ids
    rt = InProcessRuntime(fd)
    send = sender(rt)  # the checked exchange, as in fit
    t0 = time.perf_counter()
    setup_clients(rt, sec._make_model(fd))
    common = make_candidates(None)
    sel = select_step(send, cids, {c: common for c in cids}, seed, n_features=fd.n_features,
                      standardize=True)
    clear_caches()
    t1 = time.perf_counter()
    blobs = [np.asarray(sel[c]["model"], dtype=np.uint8) for c in cids]
    E = exchange_step(send, cids, blobs, seed, batch=sec.exchange_batch)
    t2 = time.perf_counter()
    e = np.array([float(sel[c]["e"]) for c in cids])
    n = np.array([int(sel[c]["n"]) for c in cids])
    k = int(np.unique(sec._cluster(E, e, n, seed)["labels"]).size)
    t3 = time.perf_counter()
    clear_caches()
    t4 = time.perf_counter()
    E2 = exchange_step(send, cids, blobs, seed, batch=sec.exchange_batch, n_jobs=n_jobs)
    t5 = time.perf_counter()
    assert np.allclose(E, E2, rtol=1e-12, atol=0)
    return {"L": L, "select": t1 - t0, "exchange": t2 - t1, "cluster": t3 - t2,
            "total": t3 - t0, "exchange_parallel": t5 - t4, "K": k,
            "rf_share": float(np.mean([sel[c]["selected"] == 1 for c in cids]))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="20,100,400")
    ap.add_argument("--n-jobs", type=int, default=2)
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    run(10, 1)  # warm-up: imports (skops builds its trusted-type table on import), caches
    rows = [run(L, args.n_jobs) for L in sizes]
    print(f"{'L':>5} {'select s':>9} {'exchange s':>11} {'cluster s':>10} {'total s':>8} "
          f"{'exch. par s':>12} {'par/serial':>10} {'K':>3} {'RF sel.':>7}")
    for r in rows:
        print(f"{r['L']:>5} {r['select']:>9.2f} {r['exchange']:>11.2f} {r['cluster']:>10.2f} "
              f"{r['total']:>8.2f} {r['exchange_parallel']:>12.2f} "
              f"{r['exchange_parallel'] / r['exchange']:>10.2f} {r['K']:>3} "
              f"{r['rf_share']:>7.2f}")
    base = rows[0]
    for r in rows[1:]:
        f = r["L"] / base["L"]
        print(f"L x{f:g}: total x{r['total'] / base['total']:.1f}, select "
              f"x{r['select'] / base['select']:.1f} (linear would be x{f:g}), exchange "
              f"x{r['exchange'] / base['exchange']:.1f} (quadratic would be x{f * f:g})")


if __name__ == "__main__":
    main()
