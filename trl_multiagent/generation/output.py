"""What a generation backend returns for one agent's batch (`Generation`): the rollout reads it, every backend and
the tool loop (`rollout.tools`) write it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Generation:
    """What `generate` returns for one agent: per prompt its ids, then K completions per prompt, prompt-major, and
    optionally each completion token's log-prob under the distribution it was sampled from."""

    prompt_ids: list[list[int]]
    completion_ids: list[list[int]]
    completions: list[str]
    sampling_logps: list[list[float]] | None = None
    truncated_prompts: int = 0  # prompts shortened to `max_prompt_length` in this call
    # With tools (`rollout.tools`), per completion: TRL's tool mask, the tool calls made and those that failed
    tool_masks: list[list[int]] | None = None
    tool_calls: list[int] | None = None
    tool_failures: list[int] | None = None
    messages: list[list[dict]] | None = None  # with tools, as TRL's reward functions get them (`rollout.tools`)
