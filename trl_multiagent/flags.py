"""`FlagParser`: TRL's `TrlParser` for a script's flags, where a misspelled flag gets one line, not a traceback.

`HfArgumentParser` raises `ValueError: Some specified arguments are not used by the HfArgumentParser: [...]` for a
flag it does not know; under `accelerate launch` that is a double traceback with no hint. `FlagParser` ends the
script with one line on stderr that names the closest flags (as `MAGRPOConfig` does for a misspelled keyword), and
exit status 2, argparse's for a usage error.

>>> from trl_multiagent import MAGRPOConfig
>>> parser = FlagParser([MAGRPOConfig], prog="train.py")
>>> parser.unknown_flags_line(["--num_generatoins", "2"], [])
'train.py: unknown flag --num_generatoins (did you mean --num_generations or --num_generations_eval?)'
"""

from __future__ import annotations

import difflib
import sys

from trl import TrlParser


class FlagParser(TrlParser):
    """`TrlParser` whose unknown flags (on the command line or as `--config` YAML keys) end the script with one line
    naming the closest known flags. Everything else is TrlParser's: dataclasses, `--config`, `set_defaults_with_config`.
    """

    def parse_args_and_config(
        self, args=None, return_remaining_strings=False, fail_with_unknown_args=True, separate_remaining_strings=False
    ):
        if return_remaining_strings:  # the caller handles what is left: TrlParser's behaviour
            return super().parse_args_and_config(args, True, fail_with_unknown_args, separate_remaining_strings)
        *parsed, config_left, args_left = super().parse_args_and_config(
            args, return_remaining_strings=True, separate_remaining_strings=True
        )
        config_left = config_left if fail_with_unknown_args else []
        if config_left or args_left:
            sys.stderr.write(self.unknown_flags_line(args_left, config_left) + "\n")
            sys.exit(2)
        return tuple(parsed)

    def known_flags(self) -> list[str]:
        """Every `--flag`, once: HfArgumentParser also accepts each with dashes (`--num-generations`)."""
        options = (option for action in self._actions for option in action.option_strings if option.startswith("--"))
        return list(dict.fromkeys("--" + option[2:].replace("-", "_") for option in options))

    def closest(self, flag: str) -> str:
        """` (did you mean --a or --b?)` for the closest known flags, or nothing when none is close."""
        close = difflib.get_close_matches("--" + flag[2:].replace("-", "_"), self.known_flags(), n=2, cutoff=0.6)
        return f" (did you mean {' or '.join(close)}?)" if close else ""

    def unknown_flags_line(self, args_left: list[str], config_left: list[str]) -> str:
        """The one line for what the parser did not use: unknown flags, `--config` keys, or values no flag takes."""
        flags = [arg.split("=", 1)[0] for arg in args_left if arg.startswith("-")]
        parts = [f"{flag}{self.closest(flag)}" for flag in flags]
        keys = [arg.removeprefix("--") for arg in config_left[::2]]  # TrlParser leaves `--key`, `value` pairs
        parts += [f"{key!r} in the --config file{self.closest('--' + key)}" for key in keys]
        if not parts:
            return f"{self.prog}: unexpected value(s) {' '.join(args_left)}: no flag takes them"
        return f"{self.prog}: unknown flag{'s' if len(parts) > 1 else ''} {', '.join(parts)}"
