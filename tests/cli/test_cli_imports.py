"""Issue 40 item 3: ``fedlatent predict`` and ``fedlatent score`` of a saved model import that
model's modules only (the registry finds the module registering the saved class), and no
numba: what a command-line call waits for is the estimator's own imports, not every model's;
a saved Gaussian mixture is read by its reader (fedlatent.models.gmm.saved), without
scikit-learn, whose import alone costs about a second of CPU."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from fedlatent.cli import app

pytestmark = pytest.mark.usefixtures("saturation_rule_off_module")

#: runs the command line in a fresh process, then names the model packages it imported
RUN = """
import json, sys
sys.argv = ["fedlatent"] + json.loads(sys.argv[1])
from fedlatent.cli import app
try:
    app(prog_name="fedlatent")
except SystemExit:
    pass
print(json.dumps([sorted({k.split(".")[2] for k in sys.modules
                          if k.startswith("fedlatent.models.") and k.count(".") >= 2}),
                  "numba" in sys.modules, "sklearn" in sys.modules]))
"""


@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli-imports")
    rng = np.random.default_rng(0)
    df = pd.DataFrame(rng.normal(size=(120, 2)), columns=["a", "b"])
    df["site"] = np.repeat(["s1", "s2", "s3"], 40)
    df.loc[df["site"] == "s2", ["a", "b"]] += 4.0
    df.to_csv(root / "data.csv", index=False)
    res = CliRunner().invoke(app, ["fit", "gmm", "--data", str(root / "data.csv"), "--client",
                                   "site", "--features", "a,b", "-k", "2", "--out",
                                   str(root / "fit")])
    assert res.exit_code == 0, res.output
    return root


@pytest.mark.parametrize("command", [["predict", "--out", "pred.csv"], ["score"]])
def test_predict_and_score_import_the_saved_model_alone(fitted, command):
    args = [command[0], "--model", str(fitted / "fit"), "--data", str(fitted / "data.csv"),
            *command[1:]]
    out = subprocess.run([sys.executable, "-c", RUN, json.dumps(args)], cwd=fitted,
                         capture_output=True, text=True, check=True)
    models, numba, sklearn = json.loads(out.stdout.strip().splitlines()[-1])
    assert (models, numba, sklearn) == (["gmm"], False, False)  # its reader: no scikit-learn
    if command[0] == "predict":
        assert len(pd.read_csv(fitted / "pred.csv")) == 120
    else:
        assert "mean log-likelihood" in out.stdout
