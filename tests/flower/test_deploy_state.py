"""On a real loopback deployment: a FedGMM run stopped after round 2 (``flwr stop``) and resumed
(server checkpoint + the sites' own states) ends as the uninterrupted in-process fit, and a site
then predicts with the state it kept exactly as the in-process personalized prediction.

One deployment serves both runs (Flower keeps a node's ``context.state`` per run, so the resumed
run's nodes start from nothing but their site directories)."""

from __future__ import annotations

import json
import threading
import time
import warnings

import numpy as np
import pytest

import fedlatent as fl
from fedlatent.runtime.flower_local import pid_alive, write_app

pytestmark = [pytest.mark.flower, pytest.mark.slow]

FITTED = ("weights_x_", "means_", "precisions_cholesky_", "coef_", "weights_y_")


def case():
    from fedlatent.data.fedgmm_data import make_fedgmm_synthetic

    sp = make_fedgmm_synthetic(n_clients=3, n_samples_per_client=100, n_features=3,
                               mean_scale=2.0, fractions=(0.8, 0.1, 0.1), random_state=5)
    # random initialization: one query; no control variates: no extra exchange after round 1
    fed = fl.Federation(control_variates=False)
    return sp.train, lambda: fl.FedGMM(2, 2, max_rounds=3, tol=0.0, init_params="random",
                                       federation=fed, random_state=12)


def test_stopped_deployment_resumes_and_sites_predict_with_their_state(tmp_path):
    pytest.importorskip("flwr")
    from fedlatent.data.files import write_client_files
    from fedlatent.runtime.flower import load_result, run_config_for
    from fedlatent.runtime.flower_local import LocalDeployment, _stop_run, run_app

    fd, make = case()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref = make().fit(fd)
    paths = write_client_files(fd, tmp_path / "data")
    files = [paths[c] for c in fd.client_ids]
    out = tmp_path / "out"
    app = write_app(tmp_path / "app", run_config_for(make(), out_dir=out, min_nodes=3,
                                                     round_timeout=120.0))
    t0 = time.monotonic()
    first: dict[str, object] = {}
    with LocalDeployment(files, workdir=tmp_path / "dep") as dep:
        # 1. the run is stopped (flwr stop) once round 2 has ended
        t = threading.Thread(target=lambda: first.setdefault("error", _run(run_app, app, dep)))
        t.start()
        stopped_at = None
        while t.is_alive() and stopped_at is None:
            try:
                st = json.loads((out / "status.json").read_text())
            except (OSError, ValueError):
                st = {}
            if st.get("round", 0) >= 2:
                stopped_at = int(st["round"])
                _stop_run(dep, dep.workdir / "flwr-run-0.log")
            time.sleep(0.1)
        t.join()
        assert stopped_at == 2, "the run ended before round 2"
        assert isinstance(first["error"], RuntimeError), first  # the run did not finish
        assert json.loads((out / "status.json").read_text())["status"] != "ok"
        # 2. resumed: the server's checkpoint and each site's own state
        run_app(app, dep, overrides={"resume": True}, timeout=900)
        pids = dep.all_pids()
    assert [p for p in pids if pid_alive(p)] == []
    wall = time.monotonic() - t0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        est = load_result(out)
    assert est.flower_status_["resumed_from"] in (1, 2)
    assert len(est.history_) == 3
    for a in FITTED:
        x, y = np.asarray(getattr(est, a)), np.asarray(getattr(ref, a))
        assert float(np.max(np.abs(x - y))) <= 1e-10 * max(1.0, float(np.max(np.abs(y)))), a
    # 3. a site predicts with the state it kept: the in-process personalized prediction
    cid = fd.client_ids[1]
    site = files[1].with_name(files[1].stem + ".site")
    mine = est.load_site_state(site)
    assert mine.client == cid
    X = fd[cid].X
    np.testing.assert_allclose(mine.predict_proba(X), ref.personalize(cid).predict_proba(X),
                               rtol=0, atol=1e-10)
    print(f"stop + resume on a loopback deployment: {wall:.0f} s")


def _run(run_app, app, dep):
    try:
        run_app(app, dep, timeout=900)
    except BaseException as e:  # noqa: BLE001 - examined in the test thread
        return e
    return None
