"""What the two vLLM backends share: colocated engines (`vllm_colocate`) and one server per agent (`vllm_server`).

Both sample with GRPOConfig's settings (`Sampling`), stop each agent at its own EOS tokens, repeat a greedy sample K
times (vLLM refuses `n > 1` without sampling), and sync weights on the same rule: only after the weights changed,
and after the first sync only the trainable agents.
"""

from __future__ import annotations

from .base import Generator, Sampling


class VLLMGenerator(Generator):
    """A `Generator` on vLLM; subclasses implement `_sample` and `_push(agents, first)`."""

    def __init__(self, *, team, args, accelerator, trainable: list[int], zero3: bool, **common):
        super().__init__(**common)
        self.team, self.args, self.accelerator = team, args, accelerator
        self.trainable, self.zero3 = set(trainable), zero3
        self.sampling = Sampling.from_config(args)
        self._synced_step = None  # nothing pushed yet

    def _request(self, agent: int, num_generations: int, greedy: bool) -> tuple[dict, dict]:
        """vLLM's sampling settings for one batched call, and the extra ones: the agent's stop tokens, then
        `generation_kwargs` (which win, as in TRL)."""
        extra = {"stop_token_ids": list(self.eos_token_ids[agent]), **self.sampling.extra}
        return self.sampling.vllm_request(num_generations, greedy), extra

    @staticmethod
    def _repeat_greedy(rows: list | None, num_generations: int, greedy: bool) -> list | None:
        """A greedy call samples each prompt once; the rollout expects K rows per prompt."""
        if rows is None or not greedy:
            return rows
        return [row for row in rows for _ in range(num_generations)]

    def sync_weights(self, step: int) -> None:
        if step == self._synced_step:
            return
        first = self._synced_step is None
        self._push(set(range(self.team.num_agents)) if first else self.trainable, first)
        self._synced_step = step

    def _push(self, agents: set[int], first: bool) -> None:
        """Send these agents' current weights to their engines (`first`: the first sync of this run)."""
        raise NotImplementedError
