"""The command line prints no traceback on any input-side case of the catalogue (issue 11, "done
when"): every unreadable file and every bad value, given to ``fit``, ``predict`` or ``score``,
ends in one ``error:`` line on stderr, a non-zero exit code, and nothing written.

Model files, client ids, checkpoints and poisoned replies have CLI cases of their own in the
other files of this folder.
"""

import gzip
import os

import numpy as np
import pandas as pd
import pytest
from cases import assert_one_error_line, cell, column
from typer.testing import CliRunner

from fedlatent.cli import app

# the saturation rule (issue 22) off for this module: its federations' clients are smaller than
# the rule allows, and it tests something else (conftest.py)
pytestmark = pytest.mark.usefixtures("saturation_rule_off_module")

runner = CliRunner()


def frame(n: int = 8) -> pd.DataFrame:
    rng = np.random.default_rng(3)
    df = pd.DataFrame({"site": np.repeat(["s0", "s1", "s2"], n)})
    df["a"] = rng.normal(size=len(df))
    df["b"] = rng.normal(size=len(df))
    df["e"] = [f"{s}-{i % 2}" for i, s in enumerate(df["site"])]
    df["y"] = df["a"] - df["b"] + 0.1 * rng.normal(size=len(df))
    return df


def fit(model: str, path, out) -> list[str]:
    extra = {"gmm": ["-k", "2"], "hlcr": ["--target", "y", "--entity", "e", "-k", "2"],
             "lcr": ["--target", "y"], "sec": ["--target", "y"],
             "fedgmm": ["--target", "y"]}[model]
    return ["fit", model, *extra, "--data", str(path), "--client", "site", "--features", "a,b",
            "--out", str(out)]


# ---- files that cannot be read -----------------------------------------------------------------
def _bytes(name, content):
    def make(d):
        (d / name).write_bytes(content)
        return d / name
    return make


def _csv_text(name, text, encoding="utf-8"):
    return _bytes(name, text.encode(encoding))


def _frame_file(name, mutate=lambda df: df):
    def make(d):
        df = mutate(frame())
        path = d / name
        if name.endswith(".parquet"):
            df.to_parquet(path, index=False)
        else:
            df.to_csv(path, index=False)
        return path
    return make


def _directory(d):
    (d / "data.csv").mkdir()
    return d / "data.csv"


def _fifo(d):
    if not hasattr(os, "mkfifo"):
        pytest.skip("no named pipes on this system")
    os.mkfifo(d / "pipe.csv")
    return d / "pipe.csv"


def _gzip_of_nothing(d):
    (d / "data.csv.gz").write_bytes(b"a,b,site\n1,2,s0\n")  # named .gz, not gzip
    return d / "data.csv.gz"


def _gzip_binary(d):
    (d / "data.csv.gz").write_bytes(gzip.compress(np.random.default_rng(5).bytes(3000)))
    return d / "data.csv.gz"


_RNG = np.random.default_rng(0)
FILE_CASES = [
    ("missing", lambda d: d / "nope.csv", r"^data file .*nope\.csv does not exist$"),
    ("empty", _bytes("data.csv", b""), r"^data file .*data\.csv is empty$"),
    ("blank_lines", _bytes("data.csv", b"\n\n\n"),
     r"^cannot read .*data\.csv as a CSV file: No columns to parse from file$"),
    ("header_only", _csv_text("data.csv", "site,a,b,e,y\n"),
     r"^data file .*data\.csv has no rows \(columns: \['site', 'a', 'b', 'e', 'y'\]\)$"),
    ("header_only_parquet", _frame_file("data.parquet", lambda df: df.iloc[:0]),
     r"^data file .*data\.parquet has no rows"),
    ("corrupt_parquet", _bytes("data.parquet", _RNG.bytes(4000)),
     r"^cannot read .*data\.parquet as a Parquet file: "),
    ("truncated_parquet", lambda d: _truncated_parquet(d),
     r"^cannot read .*data\.parquet as a Parquet file: "),
    ("csv_named_parquet", _csv_text("data.parquet", "site,a,b\ns0,1,2\n"),
     r"^cannot read .*data\.parquet as a Parquet file: "),
    ("binary_csv", _bytes("data.csv", _RNG.bytes(3000) + b"\x00"),
     r"^cannot read .*data\.csv as a CSV file: it holds binary data, not text$"),
    ("binary_in_gzip", _gzip_binary, r"^cannot read .*data\.csv\.gz as a CSV file: "),
    ("not_gzip", _gzip_of_nothing, r"^cannot read .*data\.csv\.gz as a CSV file: Not a gzipped "
     r"file"),
    ("directory", _directory, r"^data file .*data\.csv is a directory; give a \.csv or "
     r"\.parquet file$"),
    ("named_pipe", _fifo, r"^data file .*pipe\.csv is not a regular file"),
    ("wrong_extension", _csv_text("data.xlsx", "site,a,b\ns0,1,2\n"),
     r"^cannot read .*data\.xlsx: expected a \.csv, \.tsv or \.parquet file$"),
    ("ragged_rows", _csv_text("data.csv", "site,a,b,e,y\ns0,1,2,u,1\ns0,1,2,u,3,4,5\n"),
     r"^cannot read .*data\.csv as a CSV file: Error tokenizing data\. C error: Expected 5 "
     r"fields in line 3, saw 7$"),
    ("short_row", _csv_text("data.csv", "site,a,b,e,y\ns0,1,2,u,1\ns0,3\ns1,1,2,v,2\n"),
     r"^client 's0': (column 'b'|target column 'y') has 1 NaN values; drop "),
    ("latin1_text", _csv_text("data.csv", "site,a,b\nsé,1,2\nsé,3,4\n", "latin-1"),
     r"^cannot read .*data\.csv as a CSV file: it is not UTF-8 text \(utf-8 codec: [^)]+\); "
     r"save it as UTF-8$"),
    ("utf16_text", _csv_text("data.csv", "site,a,b\ns0,1,2\n", "utf-16"),
     r"^cannot read .*data\.csv as a CSV file: it holds binary data, not text$"),
    ("duplicated_header", _csv_text("data.csv", "site,a,b,a\ns0,1,2,3\ns1,4,5,6\n"),
     r"^column 'a' appears 2 times in the header of .*data\.csv; rename the copies so that "
     r"every column name is unique$"),
    ("unknown_client_column", _csv_text("data.csv", "where,a,b\ns0,1,2\n"),
     r"^client column 'site' is not in the data; available columns: \['where', 'a', 'b'\]$"),
]


def _truncated_parquet(d):
    path = d / "data.parquet"
    frame().to_parquet(path, index=False)
    path.write_bytes(path.read_bytes()[:-40])
    return path


# ---- values that cannot be fitted -------------------------------------------------------------
VALUE_CASES = [
    ("huge", _frame_file("d.csv", cell("a", 9, 1e308)),
     r"^client 's1': column 'a' has 1 values of magnitude above 1e\+150 \(largest 1e\+308\)"),
    ("complex", _frame_file("d.csv", column("a", lambda df: df["a"] + 1j)),
     r"^client 's0': column 'a' is complex; fedlatent fits real numbers"),
    ("datetime", _frame_file("d.parquet", column("b", lambda df: pd.date_range(
        "2021-01-01", periods=len(df), freq="h"))),
     r"^client 's0': column 'b' holds dates/times \(dtype datetime64"),
    ("date_text", _frame_file("d.csv", cell("b", 17, "2021-01-01 10:00")),
     r"^client 's2': column 'b' holds dates/times \(value '2021-01-01 10:00'\)"),
    ("timedelta", _frame_file("d.parquet", column("a", lambda df: pd.to_timedelta(
        np.arange(len(df)), unit="min"))),
     r"^client 's0': column 'a' holds durations \(dtype timedelta64"),
    ("duplicated_column", _frame_file("d.csv", lambda df: df.assign(z=1.0).rename(
        columns={"z": "b"})), r"^column 'b' appears 2 times in the header of"),
    ("text", _frame_file("d.csv", cell("b", 12, "twelve")),
     r"^client 's1': column 'b' is not numeric \(value 'twelve'\)"),
    ("categorical", _frame_file("d.parquet", column("a", lambda df: pd.Categorical(
        np.where(np.arange(len(df)) < 3, "low", "high")))),
     r"^client 's0': column 'a' is not numeric \(value 'low'\)"),
    ("nan", _frame_file("d.csv", cell("a", 3, np.nan)),
     r"^client 's0': column 'a' has 1 NaN values"),
    ("inf", _frame_file("d.csv", cell("b", 23, -np.inf)),
     r"^client 's2': column 'b' has 1 infinite values"),
    ("missing_client_id", _frame_file("d.csv", cell("site", 5, np.nan)),
     r"^client column 'site' has 1 missing values; every row needs a client id$"),
]

TARGET_CASES = [
    ("target_huge", _frame_file("d.csv", cell("y", 9, 1e300)),
     r"^client 's1': target 'y' has 1 values of magnitude above 1e\+150"),
    ("target_complex", _frame_file("d.csv", column("y", lambda df: df["y"] * 1j)),
     r"^client 's0': target column 'y' is complex"),
    ("target_datetime", _frame_file("d.parquet", column("y", lambda df: pd.date_range(
        "2021-01-01", periods=len(df)))), r"^client 's0': target column 'y' holds dates/times"),
    ("target_text", _frame_file("d.csv", cell("y", 1, "n/a!")),
     r"^client 's0': target column 'y' is not numeric \(value 'n/a!'\)"),
    ("target_nan", _frame_file("d.csv", cell("y", 20, np.nan)),
     r"^client 's2': target column 'y' has 1 NaN values"),
]


def _fit_cases():
    for name, make, match in FILE_CASES + VALUE_CASES:
        # the GMM takes NaN (issue 25; tests/cli/test_cli_missing.py): hlcr still refuses it
        for model in ("hlcr",) if name in ("nan", "short_row") else ("gmm", "hlcr"):
            if name == "short_row":  # NaN in b and y is no longer the data layer's refusal
                match = r"^client 's0': entity column 'e' has 1 missing values; every event"
            yield pytest.param(model, make, match, id=f"fit-{model}-{name}")
    for i, (name, make, match) in enumerate(TARGET_CASES):
        # sec and fedgmm call load_dataset(data, client, features, target) as lcr does
        models = ("lcr", "hlcr", "sec", "fedgmm") if i == 0 else ("lcr", "hlcr")
        if name == "target_nan":  # lcr and hlcr leave those rows out (issue 25)
            models = ("sec", "fedgmm")
        for model in models:
            yield pytest.param(model, make, match, id=f"fit-{model}-{name}")


@pytest.mark.parametrize("model, make, match", list(_fit_cases()))
def test_fit_prints_one_error_line(model, make, match, tmp_path):
    path = make(tmp_path)
    out = tmp_path / "out"
    res = runner.invoke(app, fit(model, path, out))
    assert_one_error_line(res, match=match)
    assert not out.exists()


def test_permission_denied_is_one_line(tmp_path, monkeypatch):
    path = _frame_file("d.csv")(tmp_path)
    os.chmod(path, 0)
    if os.access(path, os.R_OK):  # root reads anything: let the reader say what the OS would
        def denied(*args, **kwargs):
            raise PermissionError(13, "Permission denied", str(path))

        monkeypatch.setattr(pd, "read_csv", denied)
    res = runner.invoke(app, fit("gmm", path, tmp_path / "out"))
    assert_one_error_line(
        res, match=r"^cannot read .*d\.csv as a CSV file: Permission denied: .*d\.csv$")
    assert not (tmp_path / "out").exists()


# ---- predict and score -------------------------------------------------------------------------
@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    d = tmp_path_factory.mktemp("catalogue")
    good = d / "good.csv"
    frame().to_csv(good, index=False)
    for model in ("gmm", "lcr"):
        res = runner.invoke(app, [*fit(model, good, d / model), "--max-rounds", "3"])
        assert res.exit_code == 0, res.output
    return d


PREDICT_CASES = [
    ("text", _frame_file("d.csv", cell("a", 9, "oops")),
     r"^client 's1': column 'a' is not numeric \(value 'oops'\)"),
    ("missing_feature", _frame_file("d.csv", lambda df: df.drop(columns=["a"])),
     r"^feature column 'a' is not in the data"),
    ("missing_client_column", _frame_file("d.csv", lambda df: df.drop(columns=["site"])),
     r"^client column 'site' is not in the data"),
    ("datetime", _frame_file("d.parquet", column("a", lambda df: pd.date_range(
        "2020-01-01", periods=len(df)))), r"^client 's0': column 'a' holds dates/times"),
    ("huge", _frame_file("d.csv", cell("b", 2, 1e200)),
     r"^client 's0': column 'b' has 1 values of magnitude above 1e\+150"),
    ("complex", _frame_file("d.csv", column("b", lambda df: df["b"] + 2j)),
     r"^client 's0': column 'b' is complex"),
    ("nan", _frame_file("d.csv", cell("b", 2, np.nan)), r"^client 's0': column 'b' has 1 NaN"),
    ("empty", _bytes("d.csv", b""), r"^data file .*d\.csv is empty$"),
    ("header_only", _csv_text("d.csv", "site,a,b,e,y\n"), r"^data file .*d\.csv has no rows"),
    ("corrupt_parquet", _bytes("d.parquet", _RNG.bytes(500)),
     r"^cannot read .*d\.parquet as a Parquet file"),
    ("binary_csv", _bytes("d.csv", b"\x00\x01" * 100), r"^cannot read .*d\.csv as a CSV file: "
     r"it holds binary data, not text$"),
]


def _predict_cases():
    for name, make, match in PREDICT_CASES:
        for command, model in (("predict", "gmm"), ("score", "gmm"), ("predict", "lcr"),
                               ("score", "lcr")):
            if name == "nan" and model == "gmm":  # the GMM takes NaN (issue 25)
                continue
            yield pytest.param(command, model, make, match, id=f"{name}-{command}-{model}")


@pytest.mark.parametrize("command, model, make, match", list(_predict_cases()))
def test_predict_and_score_print_one_error_line(saved, command, model, make, match, tmp_path):
    path = make(tmp_path)
    out = tmp_path / "results" / "out.csv"
    res = runner.invoke(app, [command, "--model", str(saved / model), "--data", str(path),
                              "--out", str(out)])
    assert_one_error_line(res, match=match)
    assert not out.parent.exists()


# ---- errors of the run -------------------------------------------------------------------------
def _raiser(exc):
    def fit(self, *args, **kwargs):
        raise exc
    return fit


def _fedlatent_error():
    # an exception class defined in a fedlatent module, deriving from none of the usual kinds
    cls = type("NewKindOfError", (Exception,), {"__module__": "fedlatent.engine.newthing"})
    return cls("client 'c3': something new went wrong")


@pytest.mark.parametrize("make_exc, match", [
    (lambda: __import__("fedlatent.engine.rounds.loop", fromlist=["x"]).FederatedFitError(
        "round 3: client 's1' sent statistics that overflow"),
     r"^round 3: client 's1' sent statistics that overflow$"),
    (lambda: FloatingPointError("overflow encountered in multiply"),
     r"^overflow encountered in multiply$"),
    (lambda: __import__("zipfile").BadZipFile("File is not a zip file"),
     r"^File is not a zip file$"),
    (_fedlatent_error, r"^client 'c3': something new went wrong$"),
], ids=["FederatedFitError", "FloatingPointError", "BadZipFile", "any fedlatent error"])
def test_an_error_of_the_run_is_one_line_and_writes_nothing(make_exc, match, tmp_path,
                                                            monkeypatch):
    from fedlatent.models.gmm import FederatedGaussianMixture

    monkeypatch.setattr(FederatedGaussianMixture, "fit", _raiser(make_exc()))
    path = _frame_file("d.csv")(tmp_path)
    res = runner.invoke(app, fit("gmm", path, tmp_path / "out"))
    assert res.exit_code == 2
    assert_one_error_line(res, match=match)
    assert not (tmp_path / "out").exists()


def test_a_real_process_prints_one_line_and_no_traceback(tmp_path):
    """The case that once printed a FederatedFitError traceback (HLCR, values near 1e308), run
    as a user runs it: a separate process, its real stderr."""
    import subprocess
    import sys

    path = _frame_file("d.csv", cell("a", 9, 1e308))(tmp_path)
    proc = subprocess.run(
        [sys.executable, "-c", "from fedlatent.cli import main; main()",
         *fit("hlcr", path, tmp_path / "out")],
        capture_output=True, text=True, timeout=120, env={**os.environ, "FEDLATENT_DEBUG": ""})
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr + proc.stdout
    assert proc.stderr.splitlines() == [
        "error: client 's1': column 'a' has 1 values of magnitude above 1e+150 (largest 1e+308); "
        "the models sum squares of values, which overflow float64 beyond that: rescale the column "
        "(divide it by a power of ten) or transform it (e.g. log)"]
    assert not (tmp_path / "out").exists()
