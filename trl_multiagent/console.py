"""The console line of a logged step: the dozen values a user reads, not the sixty a step logs.

transformers prints every logged value (`ProgressCallback`, or `PrinterCallback` with `disable_tqdm=True`). A team's
step logs about sixty (per turn, per agent, timing and page faults), which bury the few a user watches. The printers are
swapped for subclasses that print `console_logs(logs)`; trackers, `log_history` and `trainer_state.json` still get
every value.

>>> logs = {"loss": 0.1, "reward": 0.5, "turn_1/reward_mean": 0.4, "timing/generate_s": 3.0, "epoch": 1.0}
>>> console_logs(logs)
{'loss': 0.1, 'reward': 0.5, 'turn_1/reward_mean': 0.4, 'epoch': 1.0}
>>> console_logs({"train_runtime": 12.0, "train_loss": 0.1})  # the end-of-training summary is printed whole
{'train_runtime': 12.0, 'train_loss': 0.1}
"""

from __future__ import annotations

import re

from transformers.trainer_callback import PrinterCallback, ProgressCallback


# In this order; `turn_{t}/reward_mean`, `rewards/{name}/mean` and `eval_` variants match as patterns.
CONSOLE_KEYS = (
    "loss",
    "grad_norm",
    "learning_rate",
    "reward",
    "reward_std",
    r"turn_\d+/reward_mean",
    r"rewards/[^/]+/mean",  # TRL's per-function mean
    "frac_reward_zero_std",
    "kl",
    "entropy",
    "completions/mean_length",
    "completions/clipped_ratio",
    "tools/call_frequency",
    "tools/failure_frequency",
    "epoch",
)
CONSOLE_KEY = re.compile(rf"^(eval_)?({'|'.join(CONSOLE_KEYS)})$")
STEP_KEY = re.compile(r"^(eval_)?(loss|reward)$")  # a step's log, as opposed to the end-of-training summary


def console_logs(logs: dict) -> dict:
    """The values of `logs` that the console line shows: a step's dozen, or a summary's every value."""
    if not any(STEP_KEY.match(key) for key in logs):
        return dict(logs)
    return {key: value for key, value in logs.items() if CONSOLE_KEY.match(key)}


class ShortProgressCallback(ProgressCallback):
    """transformers' progress bar, whose log line shows `console_logs`."""

    def on_log(self, args, state, control, logs=None, **kwargs):
        return super().on_log(args, state, control, logs=console_logs(logs or {}), **kwargs)


class ShortPrinterCallback(PrinterCallback):
    """transformers' printer (`disable_tqdm=True`), printing `console_logs`."""

    def on_log(self, args, state, control, logs=None, **kwargs):
        return super().on_log(args, state, control, logs=console_logs(logs or {}), **kwargs)


def attach_callbacks(trainer, callbacks: list) -> None:
    """Add the package's and CoMLRL's callbacks to a built Trainer, and swap its printer for the short one (a
    notebook's progress display, or a printer the user replaced, is left alone)."""
    for callback in callbacks:
        trainer.add_callback(callback)
    for stock, short in ((ProgressCallback, ShortProgressCallback), (PrinterCallback, ShortPrinterCallback)):
        found = trainer.callback_handler.callbacks
        if any(type(callback) is stock for callback in found):
            trainer.callback_handler.callbacks = [c for c in found if type(c) is not stock]
            trainer.add_callback(short)
