"""`build_generator`: the generation backend `MAGRPOConfig` asks for (`use_vllm`, `vllm_mode`), for a team."""

from __future__ import annotations

from collections.abc import Callable

from .base import Generator
from .hf import TransformersGenerator
from .limits import context_length, max_prompt_length


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
            team=team,
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
