"""The command's name and its one error type: a wrong folder, flag or task, reported as `PROG: error: ...` (exit 2)."""

PROG = "python -m trl_multiagent.evaluation"


class EvaluationError(ValueError):
    """A wrong folder, flag or task; the message names the flag or value."""
