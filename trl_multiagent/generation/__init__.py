"""Generation backends behind one interface (`base.Generator`): transformers `generate`, or vLLM (colocated engines,
or one server per agent). `build_generator` picks the one `MAGRPOConfig` asks for."""

from __future__ import annotations

from .base import Generator, Sampling
from .hf import TransformersGenerator


__all__ = ["Generator", "Sampling", "TransformersGenerator", "build_generator"]


def build_generator(trainer) -> Generator:
    """The backend for a `MAGRPOTrainer`, from its config (`use_vllm`, `vllm_mode`) and its team."""
    args = trainer.args
    common = {
        "tokenizers": trainer.tokenizers,
        "eos_token_ids": trainer.agent_eos_token_ids,
        "chat_template_kwargs": trainer.chat_template_kwargs,
        "vocab_sizes": [trainer.team.agent(i).config.get_text_config().vocab_size for i in range(trainer.num_agents)],
    }
    if not args.use_vllm:
        return TransformersGenerator(
            **common,
            wrapped_model=lambda: trainer.model_wrapped,
            accelerator=trainer.accelerator,
            generation_kwargs=trainer.generation_kwargs,
            args=args,
            zero3=trainer._dist.is_zero3,
            share_prompts=trainer.share_prompts,
        )
    vllm_args = {
        **common,
        "team": trainer.team,
        "args": args,
        "accelerator": trainer.accelerator,
        "trainable": trainer.trainable_agents,
        "zero3": trainer._dist.is_zero3,
    }
    if args.vllm_mode == "server":
        from .vllm_server import VLLMServerGenerator

        return VLLMServerGenerator(**vllm_args)
    from .vllm_colocate import VLLMColocateGenerator

    return VLLMColocateGenerator(**vllm_args)
