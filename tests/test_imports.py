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


_LOADED = ("import sys\n"
           "print(sorted({k.split('.')[2] for k in sys.modules\n"
           "              if k.startswith('fedlatent.models.') and k.count('.') >= 2}),\n"
           "      'numba' in sys.modules)\n")


@pytest.mark.parametrize("ask, models", [
    ("import fedlatent as fl; fl.FederatedGaussianMixture", ["gmm"]),
    ("from fedlatent.engine.contract.registry import estimator_by_class_name as f; "
     "assert f('FedGMM').__name__ == 'FedGMM'", ["fedgmm", "gmm", "logistic"]),  # its parts
    ("from fedlatent.engine.contract.registry import estimator_class as f; "
     "assert f('gmm').__name__ == 'FederatedGaussianMixture'", ["gmm"]),
    ("from fedlatent.engine.contract.registry import estimator_from_config as f; "
     "f('lcr', {'n_components': 2})", ["concomitant", "lcr", "logistic"]),  # its GLM gate
])
def test_an_estimator_asked_for_loads_its_model_alone_and_no_numba(ask, models):
    """Issue 40 item 3: the registry imports the module registering an estimator (a saved
    model's class, ``fl.FedGMM``, a deployment's name), not every model, and a GMM, LCR or
    FedGMM estimator imports no numba (its kernels load when a large problem calls them)."""
    out = subprocess.run([sys.executable, "-c", ask + "\n" + _LOADED], capture_output=True,
                         text=True, check=True)
    assert out.stdout.strip() == f"{models} False"


def test_a_class_no_model_registers_is_none_after_every_model_is_loaded():
    from fedlatent.engine.contract.registry import _defining_module, estimator_by_class_name

    assert _defining_module("NoSuchEstimator") is None
    assert _defining_module("FedGMMModel") is None  # a model's math: no estimator
    assert _defining_module("SEC") == "fedlatent.models.sec.estimator"
    assert estimator_by_class_name("NoSuchEstimator") is None
