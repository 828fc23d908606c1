"""The embedded default model, SmolLM2-135M-Instruct prepared offline from a PyPI wheel (`trl_multiagent.embedded_model`,
where the preparation lives, as the core prepares it again for a saved team whose base is missing): its public names,
and the command that prints its folder.

    python -m trl_multiagent.models            # prints the folder, preparing it on the first call
    python -m trl_multiagent.models --check    # also greedy-completes "The capital of France is"

The copy is not the Hub model's weights: its Q4_1 GGUF is dequantised to float32. Needs the `demo` extra:
`pip install -e ".[demo]"` (the `gguf` package).
"""

from __future__ import annotations

import argparse
import sys

from ..embedded_model import (
    GGUF_NAME,
    GGUF_SHA256,
    HUB_ID,
    MARKER,
    MODEL_NAME,
    DefaultModelError,
    default_model_dir,
    is_prepared,
    prepare_default_model,
)
from ..prepared_models import CACHE_ENV


__all__ = [
    "CACHE_ENV",
    "GGUF_NAME",
    "GGUF_SHA256",
    "HUB_ID",
    "MARKER",
    "MODEL_NAME",
    "DefaultModelError",
    "default_model_dir",
    "is_prepared",
    "main",
    "prepare_default_model",
]


def _check(path: str, prompt: str = "The capital of France is") -> str:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path)
    inputs = tokenizer(prompt, return_tensors="pt")
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=8, do_sample=False)
    return tokenizer.decode(out[0], skip_special_tokens=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m trl_multiagent.models",
        description=f"Prepare the embedded default model ({MODEL_NAME}) offline and print its folder.",
    )
    parser.add_argument(
        "--cache_dir", default=None, help=f"Cache folder (default: ${CACHE_ENV}, else ~/.cache/trl_multiagent)."
    )
    parser.add_argument("--check", action="store_true", help='Greedy-complete "The capital of France is" with it.')
    parser.add_argument("--quiet", action="store_true", help="No progress bar.")
    args = parser.parse_args(argv)
    try:
        path = prepare_default_model(args.cache_dir, progress=not args.quiet)
    except DefaultModelError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    if args.check:
        print(_check(path), file=sys.stderr)
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
