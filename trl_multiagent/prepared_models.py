"""Model folders prepared on this machine for a Hub id (the embedded model, `demo.models`): where they are cached, and
the marker file that records their Hub id. One place for what the demo writes and the core reads back: a saved adapter
names the Hub id as its base instead of this machine's folder (`checkpoint`), and evaluation finds the folder again from
the Hub id (`evaluation.saved_team`).

A prepared folder is ``<cache root>/<the Hub id's last part>``; its marker, written last, makes it complete.

>>> str(prepared_dir("HuggingFaceTB/SmolLM2-135M-Instruct", "/cache"))
'/cache/SmolLM2-135M-Instruct'
>>> prepared_hub_id("/nowhere/SmolLM2-135M-Instruct") is None
True
"""

from __future__ import annotations

import json
import os
from pathlib import Path


CACHE_ENV = "TRL_MULTIAGENT_CACHE"  # replaces `DEFAULT_CACHE`
DEFAULT_CACHE = Path("~") / ".cache" / "trl_multiagent"
# Written last into a prepared folder: its Hub id (`hub_id`) and how it was made.
PREPARED_MODEL_MARKER = ".trl_multiagent_complete.json"


def cache_root(cache_dir: str | os.PathLike | None = None) -> Path:
    """`cache_dir`, else `$TRL_MULTIAGENT_CACHE`, else `~/.cache/trl_multiagent`."""
    if cache_dir is None:
        cache_dir = os.environ.get(CACHE_ENV) or DEFAULT_CACHE
    return Path(cache_dir).expanduser()


def prepared_dir(hub_id: str, root: str | os.PathLike) -> Path:
    """Where `hub_id`'s prepared folder lives under the cache `root` (whether or not it exists yet)."""
    return Path(root).expanduser() / hub_id.rsplit("/", 1)[-1]


def prepared_hub_id(path: str | os.PathLike | None) -> str | None:
    """The Hub id a prepared model folder records in its `PREPARED_MODEL_MARKER` (None for any other folder)."""
    marker = os.path.join(path, PREPARED_MODEL_MARKER) if path else None
    if marker is None or not os.path.isfile(marker):
        return None
    with open(marker) as file:
        return json.load(file).get("hub_id")


def find_prepared(hub_id: str) -> str | None:
    """`hub_id`'s complete prepared folder under `$TRL_MULTIAGENT_CACHE` or `~/.cache/trl_multiagent` (both are
    searched: the model may have been prepared before the variable was set), or None."""
    for root in filter(None, [os.environ.get(CACHE_ENV), DEFAULT_CACHE]):
        candidate = prepared_dir(hub_id, root)
        if prepared_hub_id(candidate) == hub_id:
            return str(candidate)
    return None
