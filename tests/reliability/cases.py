"""Helpers shared by the reliability tests: frame mutations for the bad-input catalogues, and
the check that a CLI user error is one `error: ...` line with exit code 2."""

import re


def cell(col, row, value):
    """Write ``value`` into ``df.loc[row, col]`` (column made object dtype unless a float)."""
    def mutate(df):
        if not isinstance(value, float):
            df[col] = df[col].astype(object)
        df.loc[row, col] = value
        return df
    return mutate


def column(col, make):
    """Set column ``col`` to ``make(df)``."""
    def mutate(df):
        df[col] = make(df)
        return df
    return mutate


def assert_one_error_line(res, *fragments, match=None):
    """``res`` (a CliRunner result) is a user error: exit code 2, no traceback, one stderr line
    ``error: ...`` holding every fragment, and matching the regex ``match`` after ``error: ``."""
    assert res.exit_code == 2, (res.exit_code, res.output)
    assert "Traceback" not in res.output
    lines = res.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), res.stderr
    for f in fragments:
        assert f in lines[0], lines[0]
    if match is not None:
        assert re.search(match, lines[0][len("error: "):]), lines[0]
