"""Generation backends behind one interface (`base.Generator`): transformers `generate`, or vLLM (colocated engines,
or one server per agent). `build_generator` picks the one `MAGRPOConfig` asks for."""

from __future__ import annotations

from collections.abc import Callable

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
    limit = context_length(args, model_config)
    return max(limit - args.max_completion_length, 1) if limit is not None else None


def context_length(args, model_config) -> int | None:
    """The longest sequence an agent takes: its `max_position_embeddings`, and the vLLM engine's
    `vllm_max_model_length`, whichever is shorter (None: no known limit)."""
    context = getattr(model_config, "max_position_embeddings", None)
    limits = [limit for limit in (context, args.vllm_max_model_length if args.use_vllm else None) if limit is not None]
    return min(limits) if limits else None


def build_generator(
    args,
    team,
    tokenizers: list,
    eos_token_ids: list[list[int]],
    accelerator,
    *,
    trainable: list[int],
    chat_template_kwargs: dict | None,
    generation_kwargs: dict,
    share_prompts: bool,
    wrapped_model: Callable,
    chat_templates: list[str | None] | None = None,
) -> Generator:
    """The backend `args` asks for (`use_vllm`, `vllm_mode`), for `team`. `wrapped_model` returns the trainer's
    prepared model (DDP/DeepSpeed wraps it after the generator is built); `trainable` lists the agents whose weights
    change, which the vLLM engines sync; `chat_templates` (per agent, or None) replace the tokenizers' own for
    rendering chat prompts (tools: `rollout.tools.prepare_tokenizer`)."""
    configs = [team.agent(i).config.get_text_config() for i in range(team.num_agents)]
    zero3 = getattr(accelerator.state.deepspeed_plugin, "zero_stage", None) == 3
    common = {
        "tokenizers": tokenizers,
        "eos_token_ids": eos_token_ids,
        "chat_template_kwargs": chat_template_kwargs,
        "vocab_sizes": [config.vocab_size for config in configs],
        "max_prompt_lengths": [max_prompt_length(args, config) for config in configs],
        "chat_templates": chat_templates,
        "context_lengths": [context_length(args, config) for config in configs],
    }
    if not args.use_vllm:
        return TransformersGenerator(
            **common,
            wrapped_model=wrapped_model,
            accelerator=accelerator,
            generation_kwargs=generation_kwargs,
            args=args,
            zero3=zero3,
            share_prompts=share_prompts,
        )
    vllm_args = {
        **common,
        "team": team,
        "args": args,
        "accelerator": accelerator,
        "trainable": trainable,
        "zero3": zero3,
    }
    if args.vllm_mode == "server":
        from .vllm_server import VLLMServerGenerator

        return VLLMServerGenerator(**vllm_args)
    from .vllm_colocate import VLLMColocateGenerator

    return VLLMColocateGenerator(**vllm_args)
