"""Flower's simulation engine, run in this process without a deprecated entry point.

Flower 1.41 deprecates its Python entry point ``flwr.simulation.run_simulation`` (it logs a
``DEPRECATED FEATURE`` banner on every call) in favour of ``flwr run`` against a SuperLink
started with ``--simulation``. That path starts a SuperLink and a ``flwr-simulation`` process per
run, and took 114-128 s for a 3-client fit where the in-process engine takes 42-45 s on the
project's shared machine. The ``flwr-simulation`` process itself runs the app through
``flwr.simulation.run_simulation._run_simulation``: the engine (an in-memory link state, the
server app on a thread, the Ray backend for the client apps) that both entry points share, and
that the deprecated one only wraps with its banner. :func:`run_engine` calls that function
directly, the way ``flwr-simulation`` does; the ``flower-sim`` extra pins ``flwr[simulation]``
to 1.41.*, and :func:`engine` checks the function's parameters so that another Flower version
fails with one clear error instead of a ``TypeError`` deep in a run.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["ENGINE_PARAMETERS", "engine", "run_engine"]

#: the parameters of Flower's engine function that :func:`run_engine` passes
ENGINE_PARAMETERS = ("num_supernodes", "exit_event", "client_app", "server_app", "backend_name",
                     "backend_config", "verbose_logging")

_FIX = ("fedlatent's Flower simulation runs on flwr 1.41: pip install 'fedlatent[flower-sim]' "
        "(flwr[simulation]==1.41.*)")


def engine() -> Callable[..., Any]:
    """Flower's in-process simulation engine, the function ``flwr-simulation`` runs.

    Returns
    -------
    callable
        ``flwr.simulation.run_simulation._run_simulation``.

    Raises
    ------
    ImportError
        If the installed Flower has no such function or it does not take the parameters
        :data:`ENGINE_PARAMETERS` (a Flower other than 1.41); the message says what to install.
    """
    try:
        from flwr.simulation.run_simulation import _run_simulation
    except ImportError as err:
        raise ImportError(f"Flower's simulation engine is not importable ({err}); {_FIX}") from err
    missing = set(ENGINE_PARAMETERS) - set(inspect.signature(_run_simulation).parameters)
    if missing:
        raise ImportError(f"Flower's simulation engine takes no {sorted(missing)}: this "
                          f"Flower is not 1.41; {_FIX}")
    return _run_simulation


def run_engine(server_app, client_app, num_supernodes: int,
               backend_config: Mapping[str, Any], *, verbose: bool = False) -> None:
    """Run ``server_app`` with ``num_supernodes`` simulated nodes of ``client_app`` on Ray.

    Parameters
    ----------
    server_app : flwr.serverapp.ServerApp
        The server app; it runs on a thread of this process until its ``main`` returns.
    client_app : flwr.clientapp.ClientApp
        The client app each simulated node runs (in Ray actors).
    num_supernodes : int
        The number of simulated nodes (node ``i`` has ``partition-id = i``).
    backend_config : mapping
        Ray's settings: ``client_resources`` and ``init_args``, as for ``run_simulation``.
    verbose : bool, default False
        Flower's DEBUG log lines.

    Raises
    ------
    ImportError
        If the installed Flower is not 1.41 (see :func:`engine`).
    """
    from flwr.supercore.telemetry import EventType

    engine()(num_supernodes=int(num_supernodes),
             exit_event=EventType.PYTHON_API_RUN_SIMULATION_LEAVE,
             client_app=client_app, server_app=server_app, backend_name="ray",
             backend_config={k: dict(v) for k, v in backend_config.items()},
             verbose_logging=bool(verbose))
