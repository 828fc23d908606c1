"""The interface every generation backend implements, and what all of them share.

A backend samples K completions for each prompt of one agent in one batched call (`Generator.generate`), and pushes
the trainer's weights to its engine after an optimizer step (`Generator.sync_weights`). The rollout only sees
`generate(agent, prompts) -> Generation`.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

from trl.data_utils import is_conversational

from .output import Generation


@dataclass
class Sampling:
    """The sampling settings of GRPOConfig, in one place for both backends."""

    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int | None = 0
    min_p: float | None = None
    repetition_penalty: float = 1.0
    extra: dict = field(default_factory=dict)  # GRPOConfig.generation_kwargs, passed on to the backend as they are

    @classmethod
    def from_config(cls, args) -> Sampling:
        return cls(
            max_tokens=args.max_completion_length,
            temperature=args.temperature,
            top_p=args.top_p,
            top_k=args.top_k,
            min_p=args.min_p,
            repetition_penalty=args.repetition_penalty,
            extra=dict(args.generation_kwargs or {}),
        )

    def vllm_request(self, num_generations: int, greedy: bool) -> dict:
        """The settings as vLLM's `SamplingParams` (and `trl vllm-serve`) name them, for one batched request."""
        return {
            "n": 1 if greedy else num_generations,  # vLLM refuses n > 1 for greedy decoding: the caller repeats it
            "max_tokens": self.max_tokens,
            "temperature": 0.0 if greedy else self.temperature,
            "top_p": 1.0 if greedy else self.top_p,
            "top_k": 0 if greedy or self.top_k is None else self.top_k,
            "min_p": 0.0 if greedy or self.min_p is None else self.min_p,
            "repetition_penalty": self.repetition_penalty,
            "logprobs": 0,  # the sampled token's log-prob, for the importance-sampling correction
        }


class Generator:
    """Samples completions for one agent at a time; subclasses implement `_sample` (and `sync_weights`)."""

    def __init__(
        self,
        *,
        tokenizers: list,
        eos_token_ids: list[list[int]],
        chat_template_kwargs: dict | None = None,
        vocab_sizes: list[int] | None = None,
        max_prompt_lengths: list[int | None] | None = None,
        chat_templates: list[str | None] | None = None,
        context_lengths: list[int | None] | None = None,
    ):
        self.tokenizers = tokenizers
        self.eos_token_ids = eos_token_ids
        self.chat_template_kwargs = chat_template_kwargs or {}
        self.vocab_sizes = vocab_sizes  # per agent, the size of its embedding: token ids must stay below it
        # per agent, the longest prompt it is given (None: no limit); prompts shortened to fit, so far (each
        # `Generation` carries its own count)
        self.max_prompt_lengths = max_prompt_lengths or [None] * len(tokenizers)
        self.truncated_prompts = 0
        # per agent, the template to render chat prompts with (None: the tokenizer's own); with tools, TRL's training
        # template when the tokenizer's own is not prefix-preserving (`rollout.tools.prepare_tokenizer`)
        self.chat_templates = chat_templates or [None] * len(tokenizers)
        # per agent, the longest sequence its model (or engine) takes: a tool result past it is rolled back, as in TRL
        self.context_lengths = context_lengths or [None] * len(tokenizers)

    def tokenize(self, agent: int, prompts: list, tools: list[list] | None = None) -> list[list[int]]:
        """Token ids of each prompt, shortened to the agent's `max_prompt_length` (`fit_text`, `fit_chat`); a chat
        prompt is rendered with its tools' schemas (`tools`: one list per prompt, or None)."""
        if prompts and is_conversational({"prompt": prompts[0]}):
            tools = tools or [None] * len(prompts)
            ids = [self.fit_chat(agent, messages, t) for messages, t in zip(prompts, tools, strict=True)]
        else:
            ids = [self.fit_text(agent, row) for row in self.tokenizers[agent](text=prompts)["input_ids"]]
        if self.vocab_sizes is not None:
            largest = max((max(row) for row in ids if row), default=-1)
            if largest >= self.vocab_sizes[agent]:
                raise ValueError(
                    f"MAGRPOTrainer: agent {agent}'s tokenizer produced token id {largest}, but the agent's vocabulary "
                    f"has {self.vocab_sizes[agent]} entries: the tokenizer does not belong to this model. Pass one "
                    "tokenizer per agent (`processing_class=[...]`), in the order of the models."
                )
        return ids

    def fit_text(self, agent: int, ids: list[int]) -> list[int]:
        """A text prompt over the limit keeps its last tokens (the newest feedback), and its BOS token."""
        limit, bos = self.max_prompt_lengths[agent], self.tokenizers[agent].bos_token_id
        if limit is None or len(ids) <= limit:
            return list(ids)
        self.truncated_prompts += 1
        keep_bos = bos is not None and ids[0] == bos
        return [bos] * keep_bos + list(ids[len(ids) - limit + keep_bos :])

    def fit_chat(self, agent: int, messages: list[dict], tools: list | None = None) -> list[int]:
        """A chat prompt over the limit drops its oldest messages after the first user turn (the task); cutting
        tokens out of a chat template would break it."""
        limit = self.max_prompt_lengths[agent]
        first_user = next((i for i, m in enumerate(messages) if m.get("role") == "user"), 0)
        messages, dropped = list(messages), False
        while True:
            ids = list(
                self.tokenizers[agent].apply_chat_template(
                    messages,
                    tools=tools or None,  # `or None`, as TRL: some templates render tool boilerplate for []
                    chat_template=self.chat_templates[agent],
                    add_generation_prompt=True,
                    tokenize=True,
                    return_dict=True,
                    **self.chat_template_kwargs,
                )["input_ids"]
            )
            if limit is None or len(ids) <= limit:
                self.truncated_prompts += dropped
                return ids
            if len(messages) <= first_user + 2:  # the task and the newest message are all that is left
                raise ValueError(
                    f"MAGRPOTrainer: agent {agent}'s chat prompt has {len(ids)} tokens with only its first user turn "
                    f"and its newest message left, more than max_prompt_length={limit}. Raise `max_prompt_length`, "
                    "or shorten the messages your transition writes."
                )
            del messages[first_user + 1]
            dropped = True

    def generate(
        self, agent: int, prompts: list, num_generations: int, greedy: bool = False, tools: list[list] | None = None
    ) -> Generation:
        """K completions per prompt, prompt-major, each cut after its first EOS (as GRPOTrainer does); chat prompts
        rendered with `tools` (one list per prompt)."""
        tok = self.tokenizers[agent]
        counted = self.truncated_prompts
        prompt_ids = self.tokenize(agent, prompts, tools) if prompts else []
        completion_ids, sampling_logps = self.generate_more(agent, prompt_ids, greedy, num_generations)
        if not prompts:
            return Generation([], [], [])
        texts = tok.batch_decode(completion_ids, skip_special_tokens=True)
        return Generation(prompt_ids, completion_ids, texts, sampling_logps, self.truncated_prompts - counted)

    def generate_more(
        self, agent: int, token_ids: list[list[int]], greedy: bool = False, num_generations: int = 1
    ) -> tuple[list[list[int]], list[list[float]] | None]:
        """`num_generations` continuations of each token sequence (TRL's post-tool generation uses one), cut after
        their first EOS, and their sampler log-probs when the backend has them."""
        # A process with nothing left to generate still joins the call, so collectives stay in step across processes.
        completions, logps = self._sample(
            agent, token_ids or [[self.tokenizers[agent].pad_token_id]], num_generations, greedy
        )
        if not token_ids:
            return [], None
        eos = set(self.eos_token_ids[agent])
        ends = [next((t + 1 for t, token in enumerate(ids) if token in eos), len(ids)) for ids in completions]
        completion_ids = [list(ids[:end]) for ids, end in zip(completions, ends, strict=True)]
        sampling_logps = None if logps is None else [list(lp[:end]) for lp, end in zip(logps, ends, strict=True)]
        return completion_ids, sampling_logps

    def _sample(
        self, agent: int, prompt_ids: list[list[int]], num_generations: int, greedy: bool
    ) -> tuple[list[list[int]], list[list[float]] | None]:
        """Completion token ids (K per prompt, prompt-major) and, when the backend has them, each sampled token's
        log-prob under the sampling distribution."""
        raise NotImplementedError

    def sync_weights(self, step: int) -> None:
        """Make the engine generate with the trainer's current weights (`step`: the trainer's global step)."""

    def close(self) -> None:
        """Release the engines."""


def gathered_parameters(params: list, zero3: bool):
    """Under ZeRO-3, the full values of `params` inside the block; a no-op otherwise."""
    if not zero3:
        return contextlib.nullcontext()
    import deepspeed

    return deepspeed.zero.GatheredParameters(params)
