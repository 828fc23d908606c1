"""An unexpected keyword argument, named with the closest accepted names, or, when it is a name of the CoMLRL face
(`trl_multiagent.comlrl`) given to the TRL face, with the TRL name it means and the import that keeps it.

Both faces' configs and trainers raise Python's `TypeError` for it, as a dataclass or a function would (scripts catch
that type), with a message that says what to write instead.
"""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Callable, Iterable


COMLRL_FACE = "from trl_multiagent.comlrl import MAGRPOConfig, MAGRPOTrainer"


def unexpected_keyword(
    owner: str, name: str, accepted: Iterable[str], origin: Callable[[str], str], docs: str, other_face: bool
) -> str:
    """The message for keyword `name` given to `owner` (`"MAGRPOConfig.__init__()"`), which takes `accepted`.
    `origin(candidate)` says whose name a close candidate is ("TRL's"); `docs` names the page that lists them all;
    `other_face`: `owner` is the TRL face, so a CoMLRL name gets its TRL equivalent and the CoMLRL face's import."""
    if other_face:
        equivalent = comlrl_equivalent(owner.split(".")[0], name)
        if equivalent is not None:
            return (
                f"{owner} got an unexpected keyword argument {name!r}: it is CoMLRL's name; TRL's is {equivalent}. To "
                f"keep CoMLRL's names and defaults, import its face instead: `{COMLRL_FACE}` (docs/from_comlrl.md)."
            )
    close = difflib.get_close_matches(name, list(accepted), n=3, cutoff=0.6)
    hint = "Closest names: " + ", ".join(f"{c!r} ({origin(c)})" for c in close) if close else "No name is close"
    return f"{owner} got an unexpected keyword argument {name!r}. {hint}. Every {docs}."


def comlrl_equivalent(owner: str, name: str) -> str | None:
    """What CoMLRL's `name` (given to the TRL face's `owner`) is in TRL's terms, or None when it is not CoMLRL's. The
    CoMLRL face's table is imported only for a refused name: the TRL face holds none of its names."""
    from .comlrl.names import trl_equivalent

    return trl_equivalent(owner, name)


class KnownKeywords:
    """A config dataclass whose unexpected keyword arguments are named (`unexpected_keyword`) before the dataclass
    `__init__` runs. A base class, so that `inspect.signature(Config)` stays the dataclass `__init__`'s."""

    # A refused CoMLRL name points to the CoMLRL face; that face's config (a subclass) turns it off.
    points_to_comlrl_face = True

    def __new__(cls, *args, **kwargs):
        accepted = cls.__dataclass_fields__  # fields and `InitVar`s: every keyword the dataclass `__init__` takes
        for name in kwargs:
            if name not in accepted:
                owner, docs = f"{cls.__name__}.__init__()", "field: docs/configuration.md"
                message = unexpected_keyword(
                    owner, name, accepted, config_origin(cls), docs, cls.points_to_comlrl_face
                )
                raise TypeError(message)
        return super().__new__(cls)


def config_origin(cls) -> Callable[[str], str]:
    """Whose name a config field is: TRL's (`GRPOConfig`, `TrainingArguments`), else `cls`'s."""
    from trl import GRPOConfig

    return lambda name: "TRL's" if name in GRPOConfig.__dataclass_fields__ else f"{cls.__name__}'s"


def unexpected_trainer_keyword(cls, name: str) -> str:
    """The message for keyword `name` given to trainer class `cls`: its closest arguments (GRPOTrainer's or the
    team's), or, given to the TRL face, CoMLRL's name with TRL's equivalent."""
    from trl import GRPOTrainer

    accepted = [p for p in inspect.signature(cls.__init__).parameters if p not in ("self", "unexpected")]
    trl_names = inspect.signature(GRPOTrainer.__init__).parameters

    def origin(candidate: str) -> str:
        return "TRL's" if candidate in trl_names else f"{cls.__name__}'s"

    docs = "argument: docs/configuration.md"
    return unexpected_keyword(
        f"{cls.__name__}.__init__()", name, accepted, origin, docs, getattr(cls, "points_to_comlrl_face", True)
    )
