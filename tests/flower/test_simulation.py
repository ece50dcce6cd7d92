"""Flower simulation (run_simulation, Ray) gives the in-process fit, and only statistics cross."""

import json

import numpy as np
import pytest
from flower_cases import CASES, assert_same_fit, fit_inprocess

pytest.importorskip("flwr")
pytest.importorskip("ray")

pytestmark = [pytest.mark.flower, pytest.mark.slow,
              pytest.mark.usefixtures("one_ray"),  # Ray started once per worker
              # the cases stop after 2-4 rounds on purpose (fewer messages)
              pytest.mark.filterwarnings("ignore::fedlatent.ConvergenceWarning")]


def raw_leaks(fd, arrays) -> list[str]:
    """Keys of message arrays holding a raw row of X, a client's whole y, or a row's bytes."""
    rows = {tuple(r) for _, cd in fd.items() for r in cd.X}
    row_bytes = [r.tobytes() for _, cd in fd.items() for r in cd.X[:50]]
    ys = [np.asarray(cd.y, float) for _, cd in fd.items() if cd.y is not None]
    d = fd.n_features
    bad = []
    for key, a in arrays.items():
        if a.dtype == np.uint8:
            blob = a.tobytes()
            if any(b in blob for b in row_bytes):
                bad.append(key)
            continue
        flat = np.asarray(a, float).ravel()
        if flat.size >= d:
            win = np.lib.stride_tricks.sliding_window_view(flat, d)
            if any(tuple(w) in rows for w in win):
                bad.append(key)
                continue
        for y in ys:
            if flat.size >= y.size and y.size >= 3:
                win = np.lib.stride_tricks.sliding_window_view(flat, y.size)
                if np.any(np.all(win == y, axis=1)):
                    bad.append(key)
                    break
    return bad


@pytest.mark.parametrize("name", sorted(CASES))
def test_simulation_equals_inprocess_and_sends_no_rows(name, tmp_path):
    from fedlatent.runtime.flower import simulate

    fd, ref = fit_inprocess(name)
    _, make = CASES[name]()
    est = simulate(make(), fd, workdir=tmp_path, record=True, num_cpus=2)
    assert_same_fit(name, ref, est, rtol=1e-8)
    st = est.flower_status_
    assert st["status"] == "ok" and st["clients"] == fd.client_ids and st["lost"] == {}
    # what crossed: statistics, models and scalars only
    index = json.loads((tmp_path / "out" / "messages.json").read_text())
    methods = {m["method"] for m in index}
    assert "setup" in methods
    with np.load(tmp_path / "out" / "messages.npz", allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    assert arrays, "no array crossed: the recording is empty"
    assert raw_leaks(fd, arrays) == []


def test_leak_detector_finds_a_raw_row():
    fd, _ = CASES["gmm"]()
    X = fd[fd.client_ids[0]].X
    assert raw_leaks(fd, {"ok": X.mean(axis=0), "bad": X[3:5].ravel()}) == ["bad"]


def test_simulation_reports_a_nodes_data_error_by_client(tmp_path):
    import fedlatent as fl
    from fedlatent.runtime.flower import simulate

    fd, make = CASES["fedgmm"]()
    cid = fd.client_ids[1]
    # a label only that node sees (one-class clients are accepted: issue 14)
    bad = fd.map(lambda c, cd: fl.data.ClientData(cd.X, np.full_like(cd.y, 7)) if c == cid
                 else cd)
    with pytest.raises(ValueError, match=f"client '{cid}': y has labels \\[7\\] that are not in"):
        simulate(make().set_params(classes=[0, 1]), bad, workdir=tmp_path, num_cpus=2)
    status = json.loads((tmp_path / "out" / "status.json").read_text())
    assert status["status"] == "error" and f"client '{cid}'" in status["error"]
