"""Generation with transformers `generate`, on the trainer's own (wrapped) model."""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import torch
from transformers import GenerationConfig
from trl.models.utils import _unwrap_model_for_generation, add_hooks, remove_hooks
from trl.trainer.utils import pad

from ..update.prefix import prefill_applies, prefilled_cache
from .base import Generator, gathered_parameters


class TransformersGenerator(Generator):
    """One batched `generate` per agent per turn (or several, of at most `generate_chunk_size` rows), on the policy
    itself, so there are no weights to sync.

    Each distinct prompt is prefilled once for its K rows (`share_prompts`). Under ZeRO-3 only the generating agent's
    weights are gathered, so the peak is one agent, not the team.
    """

    def __init__(
        self,
        *,
        wrapped_model: Callable[[], torch.nn.Module],
        accelerator,
        generation_kwargs: dict,
        args,
        zero3: bool,
        share_prompts: bool,
        **common,
    ):
        super().__init__(**common)
        self.wrapped_model = wrapped_model  # the Trainer re-wraps its model when training starts (DeepSpeed)
        self.accelerator = accelerator
        self.args = args
        self.zero3 = zero3
        self.share_prompts = share_prompts
        self.configs = {
            greedy: [
                self._config(tok, eos, generation_kwargs, greedy)
                for tok, eos in zip(self.tokenizers, self.eos_token_ids, strict=True)
            ]
            for greedy in (False, True)
        }

    @staticmethod
    def _config(tokenizer, eos_token_ids: list[int], generation_kwargs: dict, greedy: bool) -> GenerationConfig:
        kwargs = {
            **generation_kwargs,
            "pad_token_id": tokenizer.pad_token_id,
            "bos_token_id": tokenizer.bos_token_id,
            "eos_token_id": eos_token_ids,
        }
        if greedy:
            kwargs.update(do_sample=False, temperature=None, top_p=None, top_k=None, min_p=None)
        return GenerationConfig(**kwargs, disable_compile=True)

    def _sample(self, agent, prompt_ids, num_generations, greedy):
        calls, real_calls = self._calls(agent, prompt_ids, num_generations)
        wrapped = self.wrapped_model()
        with (
            _unwrap_model_for_generation(
                wrapped,
                self.accelerator,
                gather_deepspeed3_params=False,  # one agent at a time, below
                gradient_checkpointing_kwargs=self.args.gradient_checkpointing_kwargs,
            ) as team,
            team.acting(agent) as acting_model,
            self._gathered(acting_model, wrapped),
            torch.no_grad(),
        ):
            generation_config = self.configs[greedy][agent]
            # K rows per prompt: prefill each prompt once. Under ZeRO-3 without gathering, every extra forward would
            # be a collective that processes must agree on, so the plain prefill is kept there.
            shared = (
                self.share_prompts
                and prefill_applies(generation_config, acting_model)
                and not (self.zero3 and not self.args.ds3_gather_for_generation)
            )
            completions = []
            for call in calls[:real_calls]:
                completions += self._generate(acting_model, agent, call, num_generations, generation_config, shared)
            device = self.accelerator.device
            # the padding calls leave the random state alone: what this process samples does not depend on the others
            with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
                for call in calls[real_calls:]:
                    self._generate(acting_model, agent, call, num_generations, generation_config, shared)
        return completions, None

    def _calls(self, agent: int, prompt_ids: list[list[int]], num_generations: int) -> tuple[list, int]:
        """The prompts of each `generate` call, at most `generate_chunk_size` rows (a prompt's K rows together), and
        how many of the calls hold this process's prompts.

        Under ZeRO-3 with several processes, `generate` runs collectives at every decoding step, so every process
        makes as many calls as the busiest one; the extra calls generate from one pad token, and are dropped.
        """
        rows_per_call = self.args.generate_chunk_size or len(prompt_ids) * num_generations
        per_call = max(rows_per_call // num_generations, 1)
        calls = [prompt_ids[i : i + per_call] for i in range(0, len(prompt_ids), per_call)]
        real_calls = len(calls)
        if self.zero3 and self.accelerator.num_processes > 1 and self.args.generate_chunk_size is not None:
            count = torch.tensor([real_calls], device=self.accelerator.device)
            most = int(self.accelerator.reduce(count, reduction="max").item())
            calls += [[[self.tokenizers[agent].pad_token_id]]] * (most - real_calls)
        return calls, real_calls

    def _generate(self, model, agent, prompt_ids, num_generations, generation_config, shared) -> list[list[int]]:
        pad_id = self.tokenizers[agent].pad_token_id
        repeated = [torch.tensor(ids) for ids in prompt_ids for _ in range(num_generations)]
        device = self.accelerator.device
        input_ids = pad(repeated, padding_value=pad_id, padding_side="left").to(device)
        attention_mask = pad([torch.ones_like(t) for t in repeated], padding_value=0, padding_side="left").to(device)
        room = self.args.max_completion_length
        cache = prefilled_cache(model, input_ids, attention_mask, room) if shared else None
        # `generation_kwargs={"stop_strings": [...]}` (a GenerationConfig field) needs the tokenizer at `generate`,
        # which GRPOTrainer does not pass, so there it fails; here it stops a completion after the string.
        stops = generation_config.stop_strings is not None
        output = model.generate(
            input_ids=input_ids,
            attention_mask=attention_mask,
            cache=cache,
            generation_config=generation_config,
            tokenizer=self.tokenizers[agent] if stops else None,
        )
        rows = output[:, input_ids.size(1) :].cpu().tolist()
        if stops and pad_id not in self.eos_token_ids[agent]:  # a row stopped by a string is padded after it
            rows = [row[: max((t + 1 for t, token in enumerate(row) if token != pad_id), default=0)] for row in rows]
        return rows

    @contextlib.contextmanager
    def _gathered(self, agent: torch.nn.Module, wrapped: torch.nn.Module):
        """Under ZeRO-3, gather the full weights of the generating agent only."""
        if not (self.zero3 and self.args.ds3_gather_for_generation):
            yield
            return
        with gathered_parameters(list(agent.parameters()), zero3=True):
            # ZeRO-3's module hooks would release the gathered weights after the first forward (as TRL's own
            # generation context does, they are removed while generating).
            remove_hooks(wrapped)
            try:
                yield
            finally:
                add_hooks(wrapped)
