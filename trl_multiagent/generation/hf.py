"""Generation with transformers `generate`, on the trainer's own (wrapped) model; with
`use_transformers_continuous_batching=True`, with transformers' continuous batching (`generate_batch`) instead, as
GRPOTrainer does."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from functools import partial

import torch
from transformers import GenerationConfig, StopStringCriteria
from trl.models.utils import _unwrap_model_for_generation, add_hooks, disable_gradient_checkpointing, remove_hooks
from trl.trainer.utils import pad

from ..update.prefix import prefill_applies, prefilled_cache
from .base import Generator, gathered_parameters


class TransformersGenerator(Generator):
    """One batched `generate` per agent per turn (or several, of at most `generate_chunk_size` rows), on the policy
    itself, so there are no weights to sync.

    Each distinct prompt is prefilled once for its K rows (`share_prompts`). Under ZeRO-3 only the generating agent's
    weights are gathered, so the peak is one agent, not the team.

    With `use_transformers_continuous_batching=True` each call is one `generate_batch` (transformers' continuous
    batching, paged KV cache), as in GRPOTrainer: each prompt repeated K times, with the engine settings of
    `transformers_continuous_batching_config`. Its own block sharing then shares the prompts' keys and values.
    """

    def __init__(
        self,
        *,
        team,
        wrapped_model: Callable[[], torch.nn.Module],
        accelerator,
        generation_kwargs: dict,
        args,
        zero3: bool,
        share_prompts: bool,
        **common,
    ):
        super().__init__(**common)
        self.team = team
        self.wrapped_model = wrapped_model  # the Trainer re-wraps its model when training starts (DeepSpeed)
        self.accelerator = accelerator
        self.args = args
        self.zero3 = zero3
        self.share_prompts = share_prompts
        self.continuous_batching = continuous_batching_config(args)
        if self.continuous_batching is not None and zero3 and not args.ds3_gather_for_generation:
            raise ValueError(
                "MAGRPOTrainer: use_transformers_continuous_batching=True under DeepSpeed ZeRO-3 needs "
                "ds3_gather_for_generation=True: the continuous-batching engine runs its forwards in a thread of its "
                "own, one per scheduled batch, so the per-layer gathers of ZeRO-3 cannot stay in step across "
                "processes. Set ds3_gather_for_generation=True, or use_transformers_continuous_batching=False."
            )
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
            # Checkpointing off here, and back on with the config's kwargs: TRL 1.15's `_unwrap_model_for_generation`
            # turns it back on without them (1.16 takes `gradient_checkpointing_kwargs`), so it is left nothing to do.
            disable_gradient_checkpointing(self.team, self.args.gradient_checkpointing_kwargs),
            # ZeRO-3: one agent's weights at a time, gathered below
            _unwrap_model_for_generation(wrapped, self.accelerator, gather_deepspeed3_params=False),
            self.team.acting(agent) as acting_model,
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
            completions, generate = [], partial(self._generate, acting_model, agent, team_generate=self.team.generate)
            for call in calls[:real_calls]:
                completions += generate(call, num_generations, generation_config, shared)
            device = self.accelerator.device
            # the padding calls leave the random state alone: what this process samples does not depend on the others
            with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
                for call in calls[real_calls:]:
                    generate(call, num_generations, generation_config, shared)
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

    def _generate(
        self, model, agent, prompt_ids, num_generations, generation_config, shared, team_generate=None
    ) -> list[list[int]]:
        """K completions of each prompt by `model` (the acting agent), through `team_generate` (`AgentTeam.generate`,
        so that a `generate` patched on the team runs; `model.generate` without one)."""
        if self.continuous_batching is not None:
            return self._generate_batch(model, agent, prompt_ids, num_generations, generation_config)
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
        output = (team_generate or model.generate)(
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

    def _generate_batch(self, model, agent, prompt_ids, num_generations, generation_config) -> list[list[int]]:
        """K completions of each prompt from transformers' continuous batching, as GRPOTrainer generates with
        `use_transformers_continuous_batching=True`: one request per row, the rows in the order of the requests."""
        requests = [list(ids) for ids in prompt_ids for _ in range(num_generations)]
        # `generate_batch` leaves the model in eval mode; each module gets its own mode back (dropout in the update)
        modes = [(module, module.training) for module in model.modules()]
        try:
            outputs = model.generate_batch(
                requests,
                generation_config=generation_config,
                continuous_batching_config=self.continuous_batching,
                progress_bar=False,
            )
        finally:
            for module, training in modes:
                module.training = training
        results = list(outputs.values())
        errors = [result.error for result in results if result.error is not None]
        if len(results) != len(requests) or errors:
            raise RuntimeError(
                f"MAGRPOTrainer: transformers' continuous batching (use_transformers_continuous_batching=True) "
                f"returned {len(results) - len(errors)} of the {len(requests)} completions asked of agent {agent}"
                + (f"; first error: {errors[0]}" if errors else "")
                + ". transformers logged the cause above; `transformers_continuous_batching_config` sizes its cache."
            )
        rows = [list(result.generated_tokens) for result in results]
        if generation_config.stop_strings is not None:
            rows = self._cut_at_stop_strings(agent, requests, rows, generation_config.stop_strings)
        return rows

    def _cut_at_stop_strings(self, agent, prompts, rows, stop_strings) -> list[list[int]]:
        """Each row up to the token that completes one of `stop_strings`, as `generate` stops it: transformers'
        `StopStringCriteria` asked after each token, on the left-padded prompts and the tokens so far. Continuous
        batching has no stopping criteria; what it sampled after that token is dropped (it does not change what came
        before)."""
        criteria = StopStringCriteria(self.tokenizers[agent], stop_strings)
        pad_id = self.tokenizers[agent].pad_token_id
        width = max(map(len, rows), default=0)
        prompt = pad([torch.tensor(ids) for ids in prompts], padding_value=pad_id, padding_side="left")
        completion = torch.full((len(rows), width), pad_id, dtype=prompt.dtype)
        for r, row in enumerate(rows):
            completion[r, : len(row)] = torch.tensor(row, dtype=prompt.dtype)
        sequences = torch.cat([prompt, completion], dim=1)
        ends = [len(row) for row in rows]
        for t in range(width):
            stopped = criteria(sequences[:, : prompt.size(1) + t + 1], None)
            for r in stopped.nonzero().flatten().tolist():
                ends[r] = min(ends[r], t + 1)
        return [row[:end] for row, end in zip(rows, ends, strict=True)]

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


def continuous_batching_config(args):
    """The engine settings GRPOTrainer builds for `use_transformers_continuous_batching=True` (None when it is off):
    `transformers_continuous_batching_config`, with `max_memory_percent=0.5` unless set (the transformers default,
    0.9, leaves almost no memory for the update)."""
    if not args.use_transformers_continuous_batching:
        return None
    from transformers.generation import ContinuousBatchingConfig

    kwargs = dict(args.transformers_continuous_batching_config or {})
    kwargs.setdefault("max_memory_percent", 0.5)
    return ContinuousBatchingConfig(**kwargs)
