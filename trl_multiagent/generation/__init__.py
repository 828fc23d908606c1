"""Generation backends behind one interface (`base.Generator`): transformers `generate`, or vLLM (colocated engines,
or one server per agent). `build_generator` picks the one `MAGRPOConfig` asks for."""

from __future__ import annotations

from .base import Generator, Sampling
from .hf import TransformersGenerator


__all__ = ["Generator", "Sampling", "TransformersGenerator", "build_generator"]


def max_prompt_length(args, model_config) -> int | None:
    """`MAGRPOConfig.max_prompt_length`, or by default what the agent's context (and the vLLM engine's
    `vllm_max_model_length`) leaves for the prompt once `max_completion_length` tokens are added."""
    context = getattr(model_config, "max_position_embeddings", None)
    if args.max_prompt_length is not None:
        if context is not None and args.max_prompt_length + args.max_completion_length > context:
            raise ValueError(
                f"MAGRPOConfig: max_prompt_length={args.max_prompt_length} plus max_completion_length="
                f"{args.max_completion_length} exceeds a {model_config.model_type} agent's max_position_embeddings="
                f"{context}: its prompts would run past the positions it was trained on. Lower max_prompt_length."
            )
        return args.max_prompt_length
    limits = [limit for limit in (context, args.vllm_max_model_length if args.use_vllm else None) if limit is not None]
    return max(min(limits) - args.max_completion_length, 1) if limits else None


def build_generator(trainer) -> Generator:
    """The backend for a `MAGRPOTrainer`, from its config (`use_vllm`, `vllm_mode`) and its team."""
    args = trainer.args
    configs = [trainer.team.agent(i).config.get_text_config() for i in range(trainer.num_agents)]
    common = {
        "tokenizers": trainer.tokenizers,
        "eos_token_ids": trainer.agent_eos_token_ids,
        "chat_template_kwargs": trainer.chat_template_kwargs,
        "vocab_sizes": [config.vocab_size for config in configs],
        "max_prompt_lengths": [max_prompt_length(args, config) for config in configs],
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
