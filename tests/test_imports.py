"""What importing fedlatent costs: a Flower client process (one per message) imports only what its
model needs, and a model is found by its name."""

import subprocess
import sys

import pytest

from fedlatent.engine.contract.model import model_from_config


def test_import_fedlatent_leaves_models_pandas_and_sklearn_unimported():
    code = (
        "import sys, fedlatent, fedlatent.engine.contract.model as m\n"
        "m.model_from_config('gmm', {'n_components': 2})\n"
        "print(sorted(k for k in ('pandas', 'sklearn', 'numba', 'fedlatent.models.hlcr',\n"
        "      'fedlatent.models.sec', 'fedlatent.models.fedgmm', 'fedlatent.models.gmm')\n"
        "      if k in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "['fedlatent.models.gmm']"


def test_unknown_model_lists_every_registered_model():
    # "kmeans" names a module of fedlatent.models that registers no model; other tests may have
    # registered toy models too, so check the four are listed, not the exact list
    with pytest.raises(KeyError, match=r"unknown model 'kmeans'; known: \[") as err:
        model_from_config("kmeans", {})
    listed = str(err.value).split("known: ")[1]
    assert all(f"'{m}'" in listed for m in ("fedgmm", "gmm", "hlcr", "sec"))
