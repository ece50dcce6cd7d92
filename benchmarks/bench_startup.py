"""What a fresh process waits for (issue 40, items 2 and 3): the README quickstart's first fit,
``fedlatent predict`` and ``fedlatent score`` on 200 rows, each in a new process.

Each measurement starts a new Python process and reports wall seconds (median of
``--repeats`` processes, one BLAS thread):

- the README quickstart's ``FederatedGaussianMixture(n_components=2, random_state=0).fit(fd)``
  (20 clients of 200 rows): its first call in the process (imports done before, timed apart),
  then the same fit again (warm), with numba's on-disk cache as it is and with an empty one
  (a fresh install's very first run), and whether the process imported numba;
- ``fedlatent predict`` and ``fedlatent score`` of a model fitted by ``fedlatent fit gmm`` on
  the quickstart's ``data.csv``, on its 200-row ``new.csv``: the whole command, process start
  to exit.

    python benchmarks/bench_startup.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

_ENV = {**os.environ, **{k: "1" for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS",
                                          "MKL_NUM_THREADS")}}

QUICKSTART = """
import json, sys, time
t0 = time.perf_counter()
import numpy as np
import fedlatent as fl
est = fl.FederatedGaussianMixture
t1 = time.perf_counter()
rng = np.random.default_rng(0)
data = {f"c{i}": rng.normal(loc=(-3 if i % 2 else 3), size=(200, 2)) for i in range(20)}
fd = fl.FederatedDataset.from_arrays(data, feature_names=["x1", "x2"])
t2 = time.perf_counter()
gm = fl.FederatedGaussianMixture(n_components=2, random_state=0).fit(fd)
t3 = time.perf_counter()
fl.FederatedGaussianMixture(n_components=2, random_state=0).fit(fd)
t4 = time.perf_counter()
print(json.dumps({"imports": t1 - t0, "first": t3 - t2, "warm": t4 - t3,
                  "numba": "numba" in sys.modules}))
"""


def quickstart(empty_cache: bool) -> dict:
    """The quickstart's fits in a fresh process (numba's cache emptied when asked)."""
    env = dict(_ENV)
    with tempfile.TemporaryDirectory(prefix="numba-cache-") as tmp:
        if empty_cache:
            env["NUMBA_CACHE_DIR"] = tmp
        out = subprocess.run([sys.executable, "-c", QUICKSTART], env=env, capture_output=True,
                             text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def command(args: list[str], cwd: Path) -> tuple[float, float]:
    """Wall and CPU seconds (user + system) of ``fedlatent ARGS`` in ``cwd``, process start to
    exit (the CPU seconds say what the command costs when the machine is loaded)."""
    exe = Path(sys.executable).with_name("fedlatent")
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run([str(exe), *args], cwd=cwd, env=_ENV, check=True, capture_output=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def cli_files(work: Path) -> None:
    """The quickstart's ``data.csv`` and ``new.csv`` (10 rows per client), and a model."""
    import pandas as pd

    rng = np.random.default_rng(0)
    data = {f"c{i}": rng.normal(loc=(-3 if i % 2 else 3), size=(200, 2)) for i in range(20)}
    df = pd.DataFrame(np.vstack(list(data.values())), columns=["x1", "x2"])
    df.insert(0, "client", np.repeat(list(data), 200))
    df.to_csv(work / "data.csv", index=False)
    df.groupby("client").head(10).to_csv(work / "new.csv", index=False)
    command(["fit", "gmm", "--data", "data.csv", "--client", "client", "--features", "x1,x2",
             "--components", "3", "--out", "fit/"], work)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    rows = {False: [quickstart(False) for _ in range(a.repeats)], True: [quickstart(True)]}
    with tempfile.TemporaryDirectory(prefix="fedlatent-cli-") as tmp:
        work = Path(tmp)
        cli_files(work)
        pred = [command(["predict", "--model", "fit/", "--data", "new.csv", "--out",
                         "pred.csv"], work) for _ in range(a.repeats)]
        score = [command(["score", "--model", "fit/", "--data", "new.csv"], work)
                 for _ in range(a.repeats)]

    def med(xs):
        return float(np.median(xs))

    print(f"fresh processes, one BLAS thread, wall seconds (median of {a.repeats}; the empty "
          "numba cache once); load average at the end "
          f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    print("| what | seconds | numba imported | CPU seconds |")
    print("|---|---|---|---|")
    for empty, label in ((False, "numba cache as installed"), (True, "empty numba cache")):
        r = rows[empty]
        print(f"| README quickstart: imports (fedlatent, its estimator), {label} | "
              f"{med([x['imports'] for x in r]):.2f} | | |")
        print(f"| README quickstart: first fit in the process, {label} | "
              f"{med([x['first'] for x in r]):.2f} | {'yes' if r[0]['numba'] else 'no'} | |")
        print(f"| README quickstart: the same fit again, {label} | "
              f"{med([x['warm'] for x in r]):.2f} | | |")
    for what, runs in (("predict", pred), ("score", score)):
        print(f"| `fedlatent {what}` on 200 rows (whole command) | "
              f"{med([r[0] for r in runs]):.2f} | | {med([r[1] for r in runs]):.2f} |")


if __name__ == "__main__":
    main()
