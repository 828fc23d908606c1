"""The environments' lifecycle in a trainer: every instance made that defines `close()` is closed once, when `train`
ends or fails, or after an `evaluate` called on its own (TRL never closes them); and every dataset column is kept, since
`reset(**row)` and the routing `environment` column read them.

`MAGRPOTrainer`'s `train` and `evaluate` call `close_environments`, its `_remove_unused_columns` `keep_every_column`.
Closing on a failed build is `environments.worlds.closes_worlds_on_error`, on `__init__`.
"""

from __future__ import annotations

from transformers.utils import logging


logger = logging.get_logger(__name__)


def close_environments(task) -> None:
    """Every environment instance the team's `task` made that defines `close()`, closed once."""
    if task.worlds is not None:
        task.worlds.close()


def keep_every_column(args) -> None:
    """Every column stays, whatever `remove_unused_columns` says (said once when it is True): a team's formatters,
    rewards, transition and environments (`reset(**row)`, the `environment` routing column) may read any of them.
    GRPOTrainer keeps only 'prompt' and the images when it is True, which drops the `environment` column TRL itself
    routes by."""
    if args.remove_unused_columns:
        logger.warning_once(
            "MAGRPOConfig: remove_unused_columns=True is ignored: every dataset column reaches the formatters, the "
            "rewards, the transition and the environments' reset (TRL would drop all but 'prompt', the "
            "'environment' column included). Leave it False, GRPOConfig's default, to silence this."
        )
