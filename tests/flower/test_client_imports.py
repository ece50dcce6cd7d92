"""What a Flower client process imports: Flower starts one ``flwr-clientapp`` process per message,
so every message pays the ClientApp's imports. The component the app directory names, a GMM
client's ``setup`` and ``estep`` answered through it, import neither SciPy, pandas nor
scikit-learn, nor the server's round loop; the reply is the in-process node's to a relative
1e-12 (another process, and the lean app's own imports: tests/tolerance.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import fedlatent as fl
from fedlatent.engine.protocol.messages import pack
from tolerance import assert_close

pytestmark = pytest.mark.flower

HEAVY = ("scipy", "pandas", "sklearn", "pyarrow", "tqdm", "numba", "torch", "skops",
         "fedlatent.engine.rounds.loop", "fedlatent.engine.fedem.update",
         "fedlatent.engine.estimation.estimator",
         "fedlatent.models.gmm.estimator")

MODEL_CONFIG = {"n_components": 2, "covariance_type": "full", "reg_covar": 1e-6}

# One flwr-clientapp process, minus the transport: load the component the app directory names,
# answer a setup and an estep message through the ClientApp object, write the replies.
CHILD = textwrap.dedent('''
    import importlib, json, os, sys, time
    import numpy as np
    from flwr.app import Context, Message, Metadata, RecordDict
    from fedlatent.runtime.flower_app import APP_COMPONENTS

    module, attr = APP_COMPONENTS["clientapp"].split(":")
    app = getattr(importlib.import_module(module), attr)
    from fedlatent.runtime.flower_records import MESSAGE_TYPE, decode, encode

    path, params_file, out_file, heavy = sys.argv[1:5]
    ctx = Context(run_id=1, node_id=7, node_config={"data-path": path}, state=RecordDict(),
                  run_config={})

    def ask(i, msg):
        md = Metadata(run_id=1, message_id=f"m{i}", src_node_id=0, dst_node_id=7,
                      reply_to_message_id="", group_id="", created_at=time.time(), ttl=600.0,
                      message_type=MESSAGE_TYPE)
        return decode(app(Message(content=encode(msg), metadata=md), ctx).content)

    msgs = json.loads(sys.argv[5])
    setup = ask(1, msgs["setup"])
    with np.load(params_file) as z:
        estep = ask(2, {**msgs["estep"], **{k: z[k] for k in z.files}})
    np.savez(out_file, **{k: v for k, v in estep.items() if isinstance(v, np.ndarray)})
    print(json.dumps({"setup": setup,
                      "scalars": {k: v for k, v in estep.items()
                                  if not isinstance(v, np.ndarray)},
                      "imported": [m for m in heavy.split(",") if m in sys.modules],
                      "blas_env": os.environ.get("OPENBLAS_NUM_THREADS")}))
''')


def _site(tmp_path):
    """A one-client data file whose node cache is written (as after a node's first message)."""
    from fedlatent.data.files import write_client_files
    from fedlatent.runtime.flower_site import _load_node_data, site_dir

    rng = np.random.default_rng(13)
    X = np.vstack([rng.normal(-2.0, 1.0, (150, 3)), rng.normal(2.0, 0.5, (170, 3))])
    fd = fl.FederatedDataset.from_arrays({"site-0": X})
    path = write_client_files(fd, tmp_path / "data")["site-0"]
    _load_node_data(path, site_dir({}, path))
    return fd, path


def test_gmm_client_answers_setup_and_estep_without_scipy_pandas_or_sklearn(tmp_path):
    pytest.importorskip("flwr")
    from fedlatent.engine.node.client import ClientNode
    from fedlatent.models.gmm.math import compute_precision_cholesky
    from fedlatent.runtime.flower_site import RUN

    fd, path = _site(tmp_path)
    covs = np.stack([np.eye(3) * 1.5, np.eye(3) * 0.4 + 0.1])
    params = {"weights": np.array([0.4, 0.6]), "means": np.array([[-1.0, -2.0, -1.5],
                                                                  [2.0, 1.5, 2.5]]),
              "precisions_cholesky": compute_precision_cholesky(covs, "full"),
              "center": np.array([0.1, -0.2, 0.3])}
    np.savez(tmp_path / "params.npz", **pack("params", params))
    run = json.dumps({"estimator": "gmm", "params": MODEL_CONFIG}, sort_keys=True)
    msgs = {"setup": {"fedlatent.method": "setup", "model": "gmm",
                      "model_config": json.dumps(MODEL_CONFIG), "disclosure": "", RUN: run},
            "estep": {"fedlatent.method": "estep", "seed": 5, "round": 1, "mode": "full",
                      RUN: run}}
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(path), str(tmp_path / "params.npz"),
         str(tmp_path / "reply.npz"), ",".join(HEAVY), json.dumps(msgs)],
        capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["imported"] == []
    assert got["setup"] == {"n_units": 320}
    # a deployed site's process: the BLAS it loads later runs on one thread (site_threads)
    assert got["blas_env"] == os.environ.get("OPENBLAS_NUM_THREADS", "1")

    # the same node in-process answers the same, to rounding
    node = ClientNode("site-0", fd["site-0"])
    node.handle("setup", {"model": "gmm", "model_config": json.dumps(MODEL_CONFIG)})
    want = node.handle("estep", {"seed": 5, "round": 1, "mode": "full",
                                 **pack("params", params)})
    with np.load(tmp_path / "reply.npz") as z:
        arrays = {k: z[k] for k in z.files}
    assert sorted(arrays) == ["delta/nk", "delta/sx", "delta/sxx"]
    for k, v in arrays.items():
        assert_close(v, want[k], err_msg=k)
    assert sorted(got["scalars"]) == ["n", "objective"] and got["scalars"]["n"] == 320
    assert_close(got["scalars"]["objective"], want["objective"], err_msg="objective")
    assert float(arrays["delta/nk"].sum()) == pytest.approx(1.0, abs=1e-12)  # mean statistic
    # the node kept its state in its site directory (written after the round)
    assert sorted(p.suffix for p in (path.parent / (path.stem + ".site")).glob("state-*")) == [
        ".json", ".npz"]


def test_gmm_client_describes_its_data_without_scipy_pandas_or_sklearn(tmp_path):
    """A node's first message, ``describe``, checks the GMM's settings with the describer the
    model registers (models/gmm/describe.py), not the estimator: before, it imported
    scikit-learn, SciPy and pandas (about a CPU second in each node, before the server heard
    from any)."""
    pytest.importorskip("flwr")
    from fedlatent.engine.contract.registry import describe_message

    _, path = _site(tmp_path)
    child = CHILD.split("\nmsgs = json.loads")[0] + textwrap.dedent('''
        reply = ask(1, {**json.loads(sys.argv[5]), "fedlatent.method": "describe"})
        print(json.dumps({"reply": reply,
                          "imported": [m for m in heavy.split(",") if m in sys.modules],
                      "blas_env": os.environ.get("OPENBLAS_NUM_THREADS")}))
    ''')
    msg = describe_message(fl.FederatedGaussianMixture(2, random_state=0))
    out = subprocess.run(
        [sys.executable, "-c", child, str(path), "", "", ",".join(HEAVY), json.dumps(msg)],
        capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["imported"] == []
    assert got["reply"]["client_id"] == "site-0" and got["reply"]["n_samples"] == 320
    assert json.loads(got["reply"]["feature_names"]) == ["x0", "x1", "x2"]


def test_engine_serves_every_public_name_without_importing_the_server_loop():
    import fedlatent.engine as engine

    code = (
        "import sys, fedlatent.engine as e\n"
        f"early = [m for m in {list(HEAVY)!r} if m in sys.modules]\n"
        "names = {n: getattr(e, n) for n in e.__all__}\n"
        "exec('from fedlatent.engine import ' + ', '.join(e.__all__))\n"
        "print(early, all(n in dir(e) for n in e.__all__), len(names))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == ["[]", "True", str(len(engine.__all__))]
    with pytest.raises(AttributeError, match="module 'fedlatent.engine' has no attribute 'Nope'"):
        engine.Nope  # noqa: B018


@pytest.mark.parametrize("cov_type, cov", [("full", np.array([[[1.0, 2.0], [2.0, 1.0]]])),
                                           ("tied", np.array([[1.0, 2.0], [2.0, 1.0]]))])
def test_precision_cholesky_of_a_matrix_that_is_not_positive_definite_is_refused(cov_type, cov):
    from fedlatent.models.gmm.math import compute_precision_cholesky

    with pytest.raises(ValueError, match="a covariance matrix is not positive definite .*raise "
                                         "reg_covar or lower n_components"):
        compute_precision_cholesky(cov, cov_type)
