"""Frame mutations shared by the bad-input catalogues (test_input.py, test_catalogue_cli.py)."""


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
