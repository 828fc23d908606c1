"""An unexpected keyword argument, named with the closest accepted names, or, when it is a name of another face given
to the TRL face, with the TRL name it means and the import that keeps it.

Both faces' configs and trainers raise Python's `TypeError` for it, as a dataclass or a function would (scripts catch
that type), with a message that says what to write instead.

Another face's names are its own table (`FaceNames`), registered here (`register_face_names`) by the package's
`__init__`, above every face: this module, below both faces, holds none of their names and imports none of them.
"""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Callable, Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class FaceNames:
    """Another face's names that the TRL face's config and trainer refuse, each with what it is in TRL's terms."""

    face: str  # whose names they are, as a message says it
    import_line: str  # the import of that face's config and trainer
    docs: str  # the page that maps its names to TRL's
    config: dict[str, str]  # a config field of that face -> TRL's equivalent, as a message says it
    trainer: dict[str, str]  # a trainer argument of that face -> TRL's equivalent

    def equivalent(self, owner: str, name: str) -> str | None:
        """TRL's equivalent of `name` given to `owner` ("MAGRPOConfig" or "MAGRPOTrainer"), or None when `name` is
        not this face's there."""
        return (self.config if owner.endswith("Config") else self.trainer).get(name)


# Each registered face's table, as a function that loads it: called only to word a refused name, so that a face (and
# what it imports) loads only then
FACE_NAMES: list[Callable[[], FaceNames]] = []


def register_face_names(load: Callable[[], FaceNames]) -> None:
    """Register another face's names: `load()` returns its `FaceNames`, read when the TRL face refuses a name."""
    FACE_NAMES.append(load)


def unexpected_keyword(
    owner: str, name: str, accepted: Iterable[str], origin: Callable[[str], str], docs: str, other_faces: bool
) -> str:
    """The message for keyword `name` given to `owner` (`"MAGRPOConfig.__init__()"`), which takes `accepted`.
    `origin(candidate)` says whose name a close candidate is ("TRL's"); `docs` names the page that lists them all;
    `other_faces`: `owner` is the TRL face, so another face's name gets its TRL equivalent and that face's import."""
    for load in FACE_NAMES if other_faces else ():
        names = load()
        equivalent = names.equivalent(owner.split(".")[0], name)
        if equivalent is not None:
            return (
                f"{owner} got an unexpected keyword argument {name!r}: it is {names.face}'s name; TRL's is "
                f"{equivalent}. To keep {names.face}'s names and defaults, import its face instead: "
                f"`{names.import_line}` ({names.docs})."
            )
    close = difflib.get_close_matches(name, list(accepted), n=3, cutoff=0.6)
    hint = "Closest names: " + ", ".join(f"{c!r} ({origin(c)})" for c in close) if close else "No name is close"
    return f"{owner} got an unexpected keyword argument {name!r}. {hint}. Every {docs}."


class KnownKeywords:
    """A config dataclass whose unexpected keyword arguments are named (`unexpected_keyword`) before the dataclass
    `__init__` runs. A base class, so that `inspect.signature(Config)` stays the dataclass `__init__`'s."""

    # A refused name of another face points to that face (`FACE_NAMES`); a face's own config (a subclass) turns it off.
    names_other_faces = True

    def __new__(cls, *args, **kwargs):
        accepted = cls.__dataclass_fields__  # fields and `InitVar`s: every keyword the dataclass `__init__` takes
        for name in kwargs:
            if name not in accepted:
                owner, docs = f"{cls.__name__}.__init__()", "field: docs/configuration.md"
                message = unexpected_keyword(owner, name, accepted, config_origin(cls), docs, cls.names_other_faces)
                raise TypeError(message)
        return super().__new__(cls)


def config_origin(cls) -> Callable[[str], str]:
    """Whose name a config field is: TRL's (`GRPOConfig`, `TrainingArguments`), else `cls`'s."""
    from trl import GRPOConfig

    return lambda name: "TRL's" if name in GRPOConfig.__dataclass_fields__ else f"{cls.__name__}'s"


def unexpected_trainer_keyword(cls, name: str) -> str:
    """The message for keyword `name` given to trainer class `cls`: its closest arguments (GRPOTrainer's or the
    team's), or, given to the TRL face, another face's name with TRL's equivalent."""
    from trl import GRPOTrainer

    accepted = [p for p in inspect.signature(cls.__init__).parameters if p not in ("self", "unexpected")]
    trl_names = inspect.signature(GRPOTrainer.__init__).parameters

    def origin(candidate: str) -> str:
        return "TRL's" if candidate in trl_names else f"{cls.__name__}'s"

    docs = "argument: docs/configuration.md"
    return unexpected_keyword(
        f"{cls.__name__}.__init__()", name, accepted, origin, docs, getattr(cls, "names_other_faces", True)
    )
