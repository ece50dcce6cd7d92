"""``python -m fedlatent.cli ...``: the ``fedlatent`` command without its entry-point script."""

from . import app

app(prog_name="fedlatent")
