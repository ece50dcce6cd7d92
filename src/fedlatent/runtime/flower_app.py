"""The Flower app directory of fedlatent: a ``pyproject.toml`` (its run configuration) and a README.

The app carries no code: its components are ``fedlatent.runtime.flower``, which must already be
installed beside every node. The standard library only reads TOML, so the few TOML scalars and
tables a run configuration needs are written here.
"""

from __future__ import annotations

import json
import math
import os
import re
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["APP_COMPONENTS", "read_app_config", "toml_value", "write_app"]

APP_COMPONENTS = {
    "serverapp": "fedlatent.runtime.flower:server_app",
    "clientapp": "fedlatent.runtime.flower:client_app",
}
APP_NAME = "fedlatent-app"
APP_PUBLISHER = "fedlatent"
_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")


# --------------------------------------------------------------------------------------------
# TOML writing (the standard library only reads TOML)
# --------------------------------------------------------------------------------------------


def _toml_key(key: str) -> str:
    if not isinstance(key, str) or not key:
        raise ValueError(f"TOML keys must be non-empty strings; got {key!r}")
    return key if _BARE_KEY.match(key) else _toml_string(key)


def _toml_string(value: str) -> str:
    # JSON string escapes (\" \\ \n \t \r \b \f \u00XX) are all valid TOML basic-string
    # escapes; TOML additionally forbids a raw DEL character.
    if any(0xD800 <= ord(c) <= 0xDFFF for c in value):
        raise ValueError(f"string {value!r} holds a lone surrogate; TOML cannot encode it")
    return json.dumps(value, ensure_ascii=False).replace("\x7f", "\\u007f")


def toml_value(value: Any) -> str:
    """One TOML scalar: a bool, int, float or str (the types a Flower run config accepts).

    >>> toml_value('{"k": [1, 2]}')
    '"{\\\\"k\\\\": [1, 2]}"'
    >>> toml_value(0.5), toml_value(True), toml_value(3)
    ('0.5', 'true', '3')
    """
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, str):
        return _toml_string(value)
    raise TypeError(
        f"run config values must be bool, int, float or str; got {type(value).__name__} "
        f"({value!r}): encode structures as a JSON string"
    )


def _toml_table(name: str, values: Mapping[str, Any]) -> str:
    lines = [f"[{name}]"]
    for key, value in values.items():
        if isinstance(value, list):
            rendered = "[" + ", ".join(toml_value(v) for v in value) + "]"
        else:
            rendered = toml_value(value)
        lines.append(f"{_toml_key(key)} = {rendered}")
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------------------------
# The app directory
# --------------------------------------------------------------------------------------------

_APP_README = """\
# fedlatent Flower app

Written by `fedlatent.runtime.flower_local.write_app` (or `fedlatent flower app`).

This app carries no code: its components are

- server: `{serverapp}`
- client: `{clientapp}`

so **fedlatent must already be installed** (with the Flower extra: `pip install
"fedlatent[flower]"`) in the environment of the SuperLink and of every SuperNode.
`[project].dependencies` is empty on purpose; start the SuperLink with
`--disable-runtime-dependency-installation` (machines without internet access would
otherwise fail the run with code 608 while trying to install them).

Each SuperNode names its data file, one Parquet file per client written by
`fedlatent flower partition`, and connects over TLS with its own registered key (the
credentials `fedlatent flower credentials` or `flower partition` made; docs/flower.md):

    flower-supernode --root-certificates ca.crt --auth-supernode-private-key supernode-3 \\
        --superlink HOST:PORT --port 9094 --node-config 'data-path="/abs/path/client.parquet"'

Each site keeps its private state (FedGMM's mixture weights, control variates...) in its
site directory, written atomically after every round it takes part in: `site-dir="/abs/dir"`
in its `--node-config`, by default `<data file stem>.site` beside its data file. After the run a
site predicts with it: `fedlatent predict --model <out-dir> --site-state <site dir> --data
<its file> --out pred.csv`.

Run with `flwr run <this directory> <connection> --stream`. `flwr run` exits 0 even when the
server app failed: read `status.json` in the `out-dir` of `[tool.flwr.app.config]`. A run that
stopped (a crash, `flwr stop`) resumes from the server's checkpoint in `out-dir` and the sites'
states: `flwr run <this directory> <connection> --stream -c resume=true`.

A SuperNode starts a `flower-superexec` child, which starts one `flwr-clientapp` process per
message, all in the SuperNode's process group: start it as a group leader (`setsid
flower-supernode ... &`) and stop it with its children by `kill -TERM -- -<its PID>`.
"""


def write_app(
    out_dir: str | os.PathLike,
    run_config: Mapping[str, Any],
    *,
    components: Mapping[str, str] | None = None,
) -> Path:
    """Write a runnable Flower app directory whose ``[tool.flwr.app.config]`` is ``run_config``.

    Parameters
    ----------
    out_dir : path
        Directory to create (or reuse); ``pyproject.toml`` and ``README.md`` go there.
    run_config : mapping of str to bool, int, float or str
        The app's run configuration, e.g. from ``fedlatent.runtime.flower.run_config_for``.
    components : mapping, optional
        ``{"serverapp": "module:object", "clientapp": ...}``; fedlatent's by default.

    Returns
    -------
    Path
        ``out_dir``.
    """
    for key, value in run_config.items():
        _toml_key(key)
        toml_value(value)  # raises TypeError on anything but a TOML scalar
    components = dict(APP_COMPONENTS if components is None else components)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    from .. import __version__

    parts = [
        "# Written by fedlatent.runtime.flower_local.write_app. fedlatent must be installed\n"
        "# on the SuperLink and on every SuperNode (see README.md).\n",
        _toml_table(
            "project",
            {
                "name": APP_NAME,
                "version": __version__,
                "description": "fedlatent federated latent-variable model on Flower",
                "license": "BSD-3-Clause",
                "dependencies": [],
            },
        ),
        _toml_table("tool.flwr.app", {"publisher": APP_PUBLISHER}),
        _toml_table("tool.flwr.app.components", components),
        _toml_table("tool.flwr.app.config", dict(run_config)),
    ]
    (out / "pyproject.toml").write_text("\n".join(parts), encoding="utf-8")
    (out / "README.md").write_text(_APP_README.format(**components), encoding="utf-8")
    return out


def read_app_config(app_dir: str | os.PathLike) -> dict[str, Any]:
    """The ``[tool.flwr.app.config]`` table of an app directory."""
    path = Path(app_dir) / "pyproject.toml"
    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist; write the app with write_app first")
    with path.open("rb") as f:
        doc = tomllib.load(f)
    return dict(doc.get("tool", {}).get("flwr", {}).get("app", {}).get("config", {}))
