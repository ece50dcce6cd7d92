"""What every ``fedlatent`` command shares: options declared once, :func:`fail`, reading a data
file, and the one handler that turns errors and warnings into one-line messages.

Options are ``Annotated`` types: a command writes ``data: DataOpt`` (required) or
``seed: SeedOpt = 0`` (with its default).

Every error a user can cause ends the command with one line ``error: ...`` on stderr and a
non-zero exit code (2; 1 for an unexpected error, which also says how to see its traceback:
``FEDLATENT_DEBUG=1``). Warnings print as one line ``warning: ...``.
"""

from __future__ import annotations

import difflib
import os
import sys
import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, NoReturn

import typer
from typer.core import TyperGroup

from .options import CATEGORICAL_CHOICES, CATEGORICAL_HELP, HELP

if TYPE_CHECKING:
    import numpy as np
    import pandas as pd

    from ..data.dataset import FederatedDataset

__all__ = [
    "CATEGORICAL_CHOICES",
    "CATEGORICAL_HELP",
    "HELP",
    "ClientOpt",
    "CliGroup",
    "CommandGroup",
    "DataOpt",
    "EntityOpt",
    "FeaturesOpt",
    "OutDirOpt",
    "ProgressOpt",
    "SeedOpt",
    "TargetOpt",
    "fail",
    "file_order",
    "frame_dataset",
    "load_dataset",
    "one_line",
    "read_frame",
    "split_list",
    "staged_dir",
    "user_errors",
    "write_atomic",
]

# ---- options -------------------------------------------------------------------------------
DataOpt = Annotated[Path, typer.Option("--data", help=HELP["data"])]
ClientOpt = Annotated[str, typer.Option("--client", help=HELP["client"])]
FeaturesOpt = Annotated[str | None, typer.Option("--features", help=HELP["features"])]
TargetOpt = Annotated[str | None, typer.Option("--target", help=HELP["target"])]
EntityOpt = Annotated[str | None, typer.Option("--entity", help=HELP["entity"])]
OutDirOpt = Annotated[Path, typer.Option("--out", help=HELP["out"])]
SeedOpt = Annotated[int, typer.Option("--seed", help=HELP["seed"] + " [default: 0]")]
ProgressOpt = Annotated[bool | None, typer.Option("--progress/--no-progress",
                                                   help=HELP["progress"])]

# ---- the click underneath typer ---------------------------------------------------------------
# typer < 0.26 runs on the click package, typer >= 0.26 on its own copy (typer._click, without
# the click package installed): fedlatent never imports click. Its exceptions come from typer's
# public names: typer.Exit and typer.Abort, and the module of typer.BadParameter (click's
# exceptions module, or typer's copy of it) for the usage errors.
_CLICK_ERRORS = sys.modules[typer.BadParameter.__module__]
#: an error of the command line (unknown option, bad value...): one line, exit 2
UsageError: type[Exception] = _CLICK_ERRORS.UsageError
#: every error click (or typer's copy) formats itself
ClickException: type[Exception] = _CLICK_ERRORS.ClickException
#: ``no_args_is_help`` (click >= 8.2 raises it; older versions print the help and exit 0)
NoArgsIsHelpError: type[Exception] | tuple[()] = getattr(_CLICK_ERRORS, "NoArgsIsHelpError", ())


# ---- messages ------------------------------------------------------------------------------
def one_line(text: object) -> str:
    """``text`` on one line (newlines and runs of spaces become one space)."""
    return " ".join(str(text).split())


def fail(message: str, code: int = 2) -> NoReturn:
    """Print ``error: message`` to stderr and exit non-zero (nothing has been written)."""
    typer.echo(f"error: {one_line(message)}", err=True)
    raise typer.Exit(code)


def _library_errors() -> tuple[type[BaseException], ...]:
    import zipfile

    from ..data.dataset import DataValidationError
    from ..engine.protocol.messages import ClientReplyError
    from ..engine.rounds.loop import FederatedFitError

    return (ValueError, KeyError, TypeError, OSError, ArithmeticError, zipfile.BadZipFile,
            DataValidationError, FederatedFitError, ClientReplyError)


def _is_library_error(err: BaseException) -> bool:
    """An error of the input or of the run, said in one line: the known kinds, and every
    exception class fedlatent (or skops, reading a model file) defines."""
    module = type(err).__module__ or ""
    return isinstance(err, _library_errors()) or module.split(".")[0] in ("fedlatent", "skops")


def _describe(err: BaseException) -> str:
    if isinstance(err, KeyError) and len(err.args) == 1 and isinstance(err.args[0], str):
        return err.args[0]  # str(KeyError) quotes its message
    if isinstance(err, OSError) and err.filename is not None and err.strerror:
        return f"{err.strerror}: {err.filename}"
    return str(err) or type(err).__name__


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    from .errors import cli_words

    name = "" if category is UserWarning else f"{category.__name__}: "
    typer.echo(f"warning: {name}{cli_words(one_line(message))}", err=True)


def _fail_library(err: BaseException) -> NoReturn:
    """The ``error:`` line of a library error in the command line's words; a fit that stopped
    naming several clients gets one line per client after it."""
    from .errors import cli_words, fault_lines

    faults = getattr(err, "faults", None)
    if faults and len(faults) > 1:
        head, *rest = fault_lines(one_line(_describe(err)), faults)
        typer.echo(f"error: {head}", err=True)
        for line in rest:
            typer.echo(line, err=True)
        raise typer.Exit(2)
    fail(cli_words(_describe(err)))


@contextmanager
def _logged_warnings():
    """While a command runs, fedlatent's WARNING log records (a site's refusal, a client left
    out) print as ``warning:`` lines in the command line's words, unless logging is set up."""
    import logging

    logger = logging.getLogger("fedlatent")
    if logger.handlers or logging.getLogger().handlers:
        yield
        return

    class Lines(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            from .errors import cli_words

            typer.echo(f"warning: {cli_words(one_line(record.getMessage()))}", err=True)

    handler = Lines(logging.WARNING)
    logger.addHandler(handler)
    try:
        yield
    finally:
        logger.removeHandler(handler)


@contextmanager
def user_errors():
    """Run a command: warnings as one line each, errors as one ``error:`` line and an exit code.

    ``FEDLATENT_DEBUG=1`` lets exceptions through (with their traceback).
    """
    debug = os.environ.get("FEDLATENT_DEBUG", "") not in ("", "0")
    with warnings.catch_warnings(), _logged_warnings():
        warnings.showwarning = _show_warning
        try:
            yield
        except (typer.Exit, typer.Abort, KeyboardInterrupt):
            raise
        except NoArgsIsHelpError:
            raise
        except UsageError as err:
            if debug:
                raise
            where = err.ctx.command_path if err.ctx is not None else "fedlatent"
            fail(f"{err.format_message()} (see '{where} --help')", code=err.exit_code)
        except ClickException as err:
            fail(err.format_message(), code=err.exit_code)
        except Exception as err:
            if debug:
                raise
            if _is_library_error(err):
                _fail_library(err)
            fail(f"unexpected {type(err).__name__}: {_describe(err)} (rerun with "
                 "FEDLATENT_DEBUG=1 to see the traceback)", code=1)


def _help_rows(cmd, ctx: typer.Context) -> list[tuple[str, list[tuple[str, str]]]]:
    """``[("Arguments", rows), ("Options", rows)]``: every parameter's help record whole
    (typer escapes ``[default: ...]`` for rich: unescaped here; an argument's own help, which
    click leaves out, put back)."""
    sections: dict[str, list[tuple[str, str]]] = {"Arguments": [], "Options": []}
    for param in cmd.get_params(ctx):
        record = param.get_help_record(ctx)
        if record is None:
            continue
        name, text = record[0], record[1].replace("\\[", "[")
        own = getattr(param, "help", None) or ""
        if param.param_type_name == "argument" and own and own not in text:
            text = f"{own}  {text}".strip()
        sections["Arguments" if param.param_type_name == "argument" else "Options"].append(
            (name, text))
    return [(title, rows) for title, rows in sections.items() if rows]


def _write_help_rows(cmd, ctx: typer.Context, formatter) -> None:
    for title, rows in _help_rows(cmd, ctx):
        with formatter.section(title):
            formatter.write_dl(rows)


def _declared_help(cmd, name: str) -> str | None:
    """The help an argument ``name`` of ``cmd`` declares in its callback's signature (typer
    0.20 on click 8.2+ loses it: click's constructor resets the help typer set first)."""
    import inspect
    import typing

    fn = inspect.unwrap(cmd.callback) if cmd.callback is not None else None
    if fn is None:
        return None
    try:
        hint = typing.get_type_hints(fn, include_extras=True).get(name)
    except (NameError, TypeError):
        hint = None
    for meta in getattr(hint, "__metadata__", ()):
        if getattr(meta, "help", None):
            return meta.help
    param = inspect.signature(fn).parameters.get(name)
    return getattr(param.default, "help", None) if param is not None else None


def plain_help(cmd):
    """``cmd`` with help written in full: wrapped to the terminal, never cut mid-word (typer's
    rich tables shorten options and help text to fit), arguments with their help."""
    if getattr(cmd, "rich_markup_mode", None) is None:
        return cmd
    cmd.rich_markup_mode = None
    for param in getattr(cmd, "params", []):
        if param.param_type_name == "argument" and not getattr(param, "help", None):
            param.help = _declared_help(cmd, param.name)
    if not isinstance(cmd, TyperGroup):
        cmd.format_options = lambda ctx, formatter: _write_help_rows(cmd, ctx, formatter)
        cmd.format_arguments = lambda ctx, formatter: None  # click >= 8.5: in the rows above
    return cmd


class CommandGroup(TyperGroup):
    """A command group whose unknown subcommand is one error line listing what there is; its
    help and its commands' help are written in full (:func:`plain_help`)."""

    what, listing = "command", "available"

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        plain_help(self)

    def get_command(self, ctx: typer.Context, name: str):
        cmd = super().get_command(ctx, name)
        return None if cmd is None else plain_help(cmd)

    def format_options(self, ctx: typer.Context, formatter) -> None:
        _write_help_rows(self, ctx, formatter)
        self.format_commands(ctx, formatter)

    def format_commands(self, ctx: typer.Context, formatter) -> None:
        """The commands and their one-line help, in full (click cuts it to the width)."""
        rows = []
        for name in self.list_commands(ctx):
            cmd = self.get_command(ctx, name)
            if cmd is None or cmd.hidden:
                continue
            text = cmd.short_help or (cmd.help or "").strip().split("\n\n")[0]
            rows.append((name, " ".join(text.split())))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)

    def resolve_command(self, ctx: typer.Context, args: list[str]):
        if args and not args[0].startswith("-") and self.get_command(ctx, args[0]) is None:
            names = self.list_commands(ctx)
            close = difflib.get_close_matches(args[0], names, n=1)
            fail(f"unknown {self.what} {args[0]!r}; {self.listing}: {', '.join(names)}"
                 + (f" (did you mean {close[0]!r}?)" if close else ""))
        return super().resolve_command(ctx, args)


class CliGroup(CommandGroup):
    """The root command group: every subcommand runs inside :func:`user_errors`."""

    def list_commands(self, ctx: typer.Context) -> list[str]:
        return sorted(super().list_commands(ctx))

    def invoke(self, ctx: typer.Context):
        with user_errors():
            return super().invoke(ctx)


# ---- progress of long work -------------------------------------------------------------------
@contextmanager
def progress_lines(enabled: bool | None = None):
    """While the block runs, fedlatent's INFO log records (one per step of an experiment or a
    deployment) go to stderr as one timestamped line each; ``enabled`` None: when stderr is not
    a terminal (a terminal shows progress bars instead), or when asked."""
    import logging

    if enabled is None:
        enabled = not sys.stderr.isatty()
    if not enabled:
        yield
        return
    logger = logging.getLogger("fedlatent")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(message)s", "%H:%M:%S"))
    level = logger.level
    logger.addHandler(handler)
    if logger.getEffectiveLevel() > logging.INFO:
        logger.setLevel(logging.INFO)
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


# ---- data ------------------------------------------------------------------------------------
def split_list(value: str | None) -> list[str] | None:
    """``"a, b,c"`` -> ``["a", "b", "c"]``; None or empty -> None."""
    if value is None:
        return None
    items = [v.strip() for v in value.split(",") if v.strip()]
    return items or None


_PARQUET = (".parquet", ".pq")
_CSV = (".csv", ".csv.gz", ".txt", ".tsv")


def read_frame(path: Path) -> pd.DataFrame:
    """The table in a CSV/TSV or Parquet file; exits with one line on anything unreadable
    (missing, a directory, empty, header only, binary or non-UTF-8 text, ragged rows, a corrupt
    Parquet file, no permission, duplicated column names)."""
    import pandas as pd

    path = Path(path)
    if not path.exists():
        fail(f"data file {path} does not exist")
    if path.is_dir():
        fail(f"data file {path} is a directory; give a .csv or .parquet file")
    if not path.is_file():
        fail(f"data file {path} is not a regular file; give a .csv or .parquet file")
    if path.stat().st_size == 0:
        fail(f"data file {path} is empty")
    low = path.name.lower()
    if not low.endswith(_PARQUET + _CSV):
        fail(f"cannot read {path}: expected a .csv, .tsv or .parquet file")
    kind = "a Parquet file" if low.endswith(_PARQUET) else "a CSV file"
    sep = "\t" if low.endswith(".tsv") else ","
    try:
        if low.endswith(_PARQUET):
            df = pd.read_parquet(path)
        else:
            if not low.endswith(".gz"):
                with open(path, "rb") as f:
                    if b"\x00" in f.read(65536):
                        fail(f"cannot read {path} as {kind}: it holds binary data, not text")
            df = pd.read_csv(path, sep=sep)
    except UnicodeDecodeError as err:
        fail(f"cannot read {path} as {kind}: it is not UTF-8 text ({err.encoding} codec: "
             f"{err.reason}); save it as UTF-8")
    except (ValueError, OSError) as err:  # ArrowInvalid, ParserError, EmptyDataError, gzip
        fail(f"cannot read {path} as {kind}: {_describe(err)}")
    if kind == "a CSV file":
        _check_csv_header(path, df, sep)
    if len(df.columns) == 0:
        fail(f"data file {path} has no columns")
    if len(df) == 0:
        fail(f"data file {path} has no rows (columns: {[str(c) for c in df.columns]})")
    return df


def _check_csv_header(path: Path, df: pd.DataFrame, sep: str) -> None:
    """pandas renames a repeated header ``a,a`` to ``a, a.1``: refuse it instead, as a table
    with duplicated column names is refused."""
    import re
    from collections import Counter

    import pandas as pd

    if not any(re.fullmatch(r".+\.\d+", str(c)) for c in df.columns):
        return
    header = pd.read_csv(path, sep=sep, header=None, nrows=1, dtype=str).iloc[0].tolist()
    counts = Counter(str(h) for h in header)
    for name, k in counts.items():
        if k > 1:
            fail(f"column {name!r} appears {k} times in the header of {path}; rename the copies "
                 "so that every column name is unique")


def load_dataset(path: Path, client: str, features: list[str] | str | None = None,
                 target: str | None = None, entity: str | None = None,
                 categorical=None, categorical_columns: str | None = None,
                 weight: str | None = None,
                 formula: str | None = None) -> tuple[pd.DataFrame, FederatedDataset]:
    """The file's table and its federated dataset (DataValidationError names client and column).

    The dataset holds clients sorted by ``str(client id)``, each client's rows in file order;
    :func:`file_order` maps its rows back to the file's (its ``row_index`` is the file's row
    numbers). ``categorical``: as ``FederatedDataset.from_pandas`` (``--categorical``), with
    ``categorical_columns`` the comma-separated columns it encodes; ``weight``: the column of
    frequency weights (``--weight``); ``formula``: the design from a formula (``--formula``).
    """
    df = read_frame(path)
    return df, frame_dataset(df, client, features, target=target, entity=entity,
                             categorical=categorical, categorical_columns=categorical_columns,
                             weight=weight, formula=formula)


def frame_dataset(df: pd.DataFrame, client: str, features: list[str] | str | None = None, *,
                  target: str | None = None, entity: str | None = None, categorical=None,
                  categorical_columns: str | None = None, weight: str | None = None,
                  formula: str | None = None) -> FederatedDataset:
    """The federated dataset of a table (:func:`load_dataset` of a table already read)."""
    from ..data.dataset import FederatedDataset
    from ..data.validation import DataValidationError

    if isinstance(features, str):
        features = split_list(features)
    columns = split_list(categorical_columns)
    if columns is not None and categorical is None:
        fail("--categorical-columns needs --categorical onehot (or onehot-all)")
    if formula is not None and categorical is not None:
        fail("give either --formula or --categorical: a formula codes its categorical "
             "variables itself (C(x), text columns)")
    try:
        return FederatedDataset.from_pandas(df, client=client, features=features,
                                            target=target, entity=entity,
                                            categorical=categorical,
                                            categorical_columns=columns, weight=weight,
                                            formula=formula)
    except DataValidationError as err:  # the library's fix, said as the command line says it
        text = str(err)
        if "categorical='onehot'" in text:
            raise DataValidationError(text.replace("categorical='onehot'",
                                                   "--categorical onehot")) from None
        raise


def file_order(df: pd.DataFrame, client: str) -> np.ndarray:
    """Row ``i`` of the dataset of :func:`load_dataset` is row ``file_order(df, client)[i]`` of
    the file."""
    from ..data.dataset import client_row_order

    return client_row_order(df[client].astype(str).to_numpy())[1]


# ---- all-or-nothing output -------------------------------------------------------------------
def _temp_sibling(path: Path, kind: str) -> Path:
    """A new name next to ``path`` (same directory, so ``os.replace`` is a rename). A file's
    temp name ends with its own name, so pandas infers the same compression from it."""
    import secrets

    while True:
        token = secrets.token_hex(4)
        tmp = (path.parent / f".tmp-{token}-{path.name}" if kind == "file"
               else path.parent / f"{path.name}.tmp-{token}")
        if not os.path.lexists(tmp):
            return tmp


def write_atomic(path: Path, write) -> None:
    """``write(tmp)`` into a temporary file next to ``path``, then rename it to ``path``:
    a failure leaves no file (and an existing ``path`` untouched)."""
    path = Path(path)
    if path.is_dir():
        fail(f"--out {path} is a directory; give a file name")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _temp_sibling(path, "file")
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        if os.path.lexists(tmp):
            os.unlink(tmp)
        raise


def _replace_entry(src: Path, dst: Path) -> None:
    """Move ``src`` onto ``dst``; a directory replaces a directory (the old one is removed)."""
    import shutil

    if dst.is_dir() and not dst.is_symlink():
        old = _temp_sibling(dst, "dir")
        os.replace(dst, old)
        os.replace(src, dst)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(src, dst)


@contextmanager
def staged_dir(out: Path):
    """A directory to write into that becomes ``out`` only when the block succeeds.

    When ``out`` does not exist (or is empty), the block writes into a new sibling
    ``out.tmp-XXXX`` renamed to ``out`` at the end; when it exists, each written entry then
    replaces its namesake in ``out`` (files by rename; other files of ``out`` are kept). On any
    failure the temporary directory is removed: nothing half-written is left.
    """
    import shutil

    out = Path(out)
    if out.exists() and not out.is_dir():
        fail(f"--out {out} is a file; give a directory")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = _temp_sibling(out, "dir")
    tmp.mkdir()
    try:
        yield tmp
        if not out.exists() or not any(out.iterdir()):
            os.replace(tmp, out)  # a rename, also onto an empty directory
        else:
            for entry in sorted(tmp.iterdir()):
                _replace_entry(entry, out / entry.name)
            tmp.rmdir()
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
