"""The simulation runs Flower's engine as ``flwr-simulation`` does, not the deprecated
``run_simulation`` (its banner and one real run: tests/test_docs_code_blocks.py, Flower page)."""

import functools
import importlib

import pytest

pytest.importorskip("flwr")
#: the module (``flwr.simulation.run_simulation`` as an attribute is the function of that name)
ENGINE_MODULE = "flwr.simulation.run_simulation"

pytestmark = pytest.mark.flower


def test_simulate_calls_the_engine_not_the_deprecated_entry_point(monkeypatch, tmp_path):
    import flwr.simulation
    from flower_cases import CASES

    from fedlatent.runtime.flower import simulate

    rs = importlib.import_module(ENGINE_MODULE)
    calls = []

    @functools.wraps(rs._run_simulation)  # the engine's parameters
    def engine(**kwargs):
        calls.append(kwargs)
        raise RuntimeError("engine reached")

    def deprecated(*args, **kwargs):
        raise AssertionError("the deprecated run_simulation was called")

    monkeypatch.setattr(rs, "_run_simulation", engine)
    monkeypatch.setattr(rs, "run_simulation", deprecated)
    monkeypatch.setattr(flwr.simulation, "run_simulation", deprecated)
    fd, make = CASES["gmm"]()
    with pytest.raises(RuntimeError, match="engine reached"):
        simulate(make(), fd, workdir=tmp_path, num_cpus=2)
    (call,) = calls
    assert call["num_supernodes"] == fd.n_clients and call["backend_name"] == "ray"
    assert call["backend_config"]["client_resources"] == {"num_cpus": 1, "num_gpus": 0.0}
    assert call["backend_config"]["init_args"]["num_cpus"] == 2
    assert call["verbose_logging"] is False


def test_another_flower_fails_with_what_to_install(monkeypatch):
    from fedlatent.runtime.flower_engine import engine

    rs = importlib.import_module(ENGINE_MODULE)

    assert engine() is rs._run_simulation
    monkeypatch.setattr(rs, "_run_simulation", lambda num_supernodes, server_app: None)
    with pytest.raises(ImportError, match=r"takes no \['backend_config', 'backend_name', "
                       r"'client_app', 'exit_event', 'verbose_logging'\]: this Flower is not "
                       r"1\.41; .*pip install 'fedlatent\[flower-sim\]'"):
        engine()
    monkeypatch.delattr(rs, "_run_simulation")
    with pytest.raises(ImportError, match=r"simulation engine is not importable .*flower-sim"):
        engine()
