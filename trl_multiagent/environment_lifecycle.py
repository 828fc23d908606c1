"""The environments' lifecycle in a trainer: every instance made that defines `close()` is closed once, when `train`
ends or fails, or after an `evaluate` called on its own (TRL never closes them); and every dataset column is kept, since
`reset(**row)` and the routing `environment` column read them.

`EnvironmentLifecycle` is mixed into `MAGRPOTrainer` before `GRPOTrainer`; it overrides `evaluate` and
`_remove_unused_columns`, and gives the trainer's `train` `_close_environments`. Closing on a failed build is
`environments.worlds.closes_worlds_on_error`, on `__init__`.
"""

from __future__ import annotations

from transformers.utils import logging


logger = logging.get_logger(__name__)


class EnvironmentLifecycle:
    def evaluate(self, *args, **kwargs):
        """Trainer's `evaluate`; called on its own (not from `train`, which closes them when it ends), the environment
        instances it made are closed after it, or when it fails."""
        try:
            return super().evaluate(*args, **kwargs)
        finally:
            if not self.is_in_train:
                self._close_environments()

    def _close_environments(self) -> None:
        """Every environment instance made that defines `close()`, closed once."""
        if self.task.worlds is not None:
            self.task.worlds.close()

    def _remove_unused_columns(self, dataset, description=None):
        """Every column stays, whatever `remove_unused_columns` says: a team's formatters, rewards, transition and
        environments (`reset(**row)`, the `environment` routing column) may read any of them. GRPOTrainer keeps only
        'prompt' and the images when it is True, which drops the `environment` column TRL itself routes by."""
        if self.args.remove_unused_columns:
            logger.warning_once(
                "MAGRPOConfig: remove_unused_columns=True is ignored: every dataset column reaches the formatters, the "
                "rewards, the transition and the environments' reset (TRL would drop all but 'prompt', the "
                "'environment' column included). Leave it False, GRPOConfig's default, to silence this."
            )
        return dataset
