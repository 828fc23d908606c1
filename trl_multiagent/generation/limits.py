"""How long an agent's prompt may be: its context (`max_position_embeddings`, the vLLM engine's
`vllm_max_model_length`) less the completion's tokens, or `MAGRPOConfig.max_prompt_length`."""

from __future__ import annotations


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
