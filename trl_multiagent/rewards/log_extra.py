"""TRL's `log_extra(column, values)` reward keyword for a team: the values one call of a reward function logs, one per
joint action of the call (or per completion, for a per-agent reward), as entries of a completions-table column."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ..callables import short_repr


# The completions table's own columns (TRL's `log` and `metrics.completion_logs`): `log_extra` may not replace one.
TABLE_COLUMNS = ("step", "prompt", "completion", "advantage", "agent", "turn", "tool_calls")


def bound_log_extra(
    sink: Callable, reward_names: Sequence[str], name: str, actions: list[int], turn: int, agent: int | None = None
) -> Callable[[str, list], None]:
    """`log_extra(column, values)` for one call of the reward function `name`: its values, one per joint action of
    the call (`actions`, indices in the turn's call), go to `sink(column, [(action, agent, value), ...])`; `agent` for
    a per-agent reward (its values are that agent's completions'). A column may not be one the table has already
    (its own, or a reward function's: `reward_names`).

    >>> logged = []
    >>> log_extra = bound_log_extra(lambda column, entries: logged.append((column, entries)), ["r"], "r", [0, 1], 1)
    >>> log_extra("passed", [True, False])
    >>> logged
    [('passed', [(0, None, True), (1, None, False)])]
    """

    def log_extra(column: str, values) -> None:
        where = f"Reward function {name!r} (turn {turn}): log_extra({column!r}, ...)"
        if not isinstance(column, str) or column in (*TABLE_COLUMNS, *reward_names):
            raise ValueError(
                f"{where} names a column of the completions table itself ({[*TABLE_COLUMNS, *reward_names]}) or is "
                "not a string; give the column another name."
            )
        if isinstance(values, (str, bytes)) or not hasattr(values, "__len__") or len(values) != len(actions):
            raise ValueError(
                f"{where} got {short_repr(values, 80)}; it takes a list of {len(actions)} values, one per "
                f"{'completion' if agent is not None else 'joint action'} of this call, as in TRL."
            )
        sink(column, [(j, agent, v) for j, v in zip(actions, list(values), strict=True)])

    return log_extra
