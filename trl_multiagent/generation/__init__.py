"""Generation backends behind one interface (`base.Generator`): transformers `generate`, or vLLM (colocated engines,
or one server per agent). `build_generator` (`factory`) picks the one `MAGRPOConfig` asks for; `Generation`
(`output`) is what each returns."""

from .base import Generator, Sampling
from .factory import build_generator
from .hf import TransformersGenerator
from .output import Generation


__all__ = ["Generation", "Generator", "Sampling", "TransformersGenerator", "build_generator"]
