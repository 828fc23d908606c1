"""Tools inside an agent's turn: TRL's `tools=` contract and tool-calling loop, for each agent of a team.

As in GRPOTrainer: tools are plain functions (sync or ``async``) with type hints and Google-style docstrings; the
prompt is rendered with their schemas; each completion is parsed with TRL's `parse_response`; the calls it makes run,
their results are appended as tool messages (the tokens of TRL's `_get_tool_suffix_ids`, with no re-tokenisation of
what came before) and the agent continues from there, one sample per completion, up to
`max_tool_calling_iterations` rounds (None: until no completion calls a tool, TRL's default). A tool that raises, or a
call of an unknown tool, gives ``{"error": ...}`` to the agent and counts as a failure. A round whose results would
pass `max_completion_length` (or the model's context) is rolled back and the completion ends as it was. The tool
result tokens get 0 in the completion's tool mask, so that the loss mask is ``completion_mask * tool_mask``.

A team adds: `tools=` is one list for every agent, or one list per agent; an environment's methods
(`environments.worlds`) are added per agent, bound to the world of the joint action the completion belongs to.

The loop (`tool_loop`) takes its model work as functions, so it is tested without a model.
"""

from __future__ import annotations

import types
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

from trl import GRPOTrainer
from trl.chat_template_utils import (
    add_response_schema,
    get_training_chat_template,
    is_chat_template_prefix_preserving,
    parse_response,
    supports_tool_calling,
)

from ..environments.calls import call_tools, check_timeout
from ..environments.faults import EnvironmentLost
from ..generation.output import Generation
from ..trl_release import require_newest_trl
from .tree import local_sync


def tools_per_agent(tools, num_agents: int) -> list[list[Callable]]:
    """`tools=` as one list per agent: one list of functions serves every agent; a list of lists gives each its own.

    >>> def search(query: str) -> str: ...
    >>> def run_code(code: str) -> str: ...
    >>> [[f.__name__ for f in agent] for agent in tools_per_agent([search], 2)]
    [['search'], ['search']]
    >>> [[f.__name__ for f in agent] for agent in tools_per_agent([[search], [run_code]], 2)]
    [['search'], ['run_code']]
    """
    if tools is None:
        return [[] for _ in range(num_agents)]
    if not isinstance(tools, (list, tuple)):
        raise TypeError(f"MAGRPOTrainer: `tools` must be a list of functions, or one list per agent; got {tools!r}.")
    nested = [isinstance(t, (list, tuple)) for t in tools]
    if tools and all(nested):
        if len(tools) != num_agents:
            raise ValueError(
                f"MAGRPOTrainer: `tools` holds {len(tools)} lists for {num_agents} agents; pass one list per agent, or "
                "one list of functions for every agent."
            )
        per_agent = [list(t) for t in tools]
    elif any(nested):
        raise TypeError(
            "MAGRPOTrainer: `tools` mixes functions and lists; pass one list of functions for every agent, or one "
            f"list per agent (for example `tools=[[search], [run_code]]`). Got {tools!r}."
        )
    else:
        per_agent = [list(tools) for _ in range(num_agents)]
    for agent, agent_tools in enumerate(per_agent):
        for tool in agent_tools:
            if not callable(tool) or not hasattr(tool, "__name__"):
                raise TypeError(f"MAGRPOTrainer: tools of agent {agent}: {tool!r} is not a function.")
    return per_agent


def prepare_tokenizer(tokenizer, agent: int) -> str | None:
    """TRL's start-up for a tokenizer whose agent calls tools: the template must render tool calls
    (`supports_tool_calling`), a response parser is attached for known templates (`add_response_schema`), and a
    template that is not prefix-preserving is replaced for training (`get_training_chat_template`). Returns the chat
    template to render with (None: the tokenizer's own)."""
    if not supports_tool_calling(tokenizer):
        raise ValueError(
            f"MAGRPOTrainer: agent {agent}'s chat template does not support tool calling (TRL: \"The provided chat "
            "template does not support tool calling. The template must be able to render a full tool-calling "
            'conversation (user -> assistant with tool_calls -> tool)."). Give that agent a tokenizer whose template '
            "renders tools. For the embedded SmolLM2-135M-Instruct, whose template has none, TRL's Qwen2.5 template "
            "uses the same <|im_start|>/<|im_end|> tokens: `from trl.chat_template_utils import "
            "qwen2_5_chat_template; tokenizer.chat_template = qwen2_5_chat_template`, then hand that tokenizer to "
            "the trainer: `MAGRPOTrainer(..., processing_class=tokenizer)` (one per agent: a list)."
        )
    if getattr(tokenizer, "response_template", None) is None and getattr(tokenizer, "response_schema", None) is None:
        add_response_schema(tokenizer)
    return None if is_chat_template_prefix_preserving(tokenizer) else get_training_chat_template(tokenizer)


@dataclass
class ToolResults:
    """Per completion: its ids with every tool round, TRL's tool mask, sampler log-probs, calls and failures, and the
    messages it amounts to (TRL's completion: the parsed assistant turns and the tool results between them)."""

    completion_ids: list[list[int]]
    tool_masks: list[list[int]]
    sampling_logps: list[list[float]] | None
    calls: list[int]
    failures: list[int]
    messages: list[list[dict]]


def tool_loop(
    prompt_ids: Sequence[list[int]],
    completion_ids: Sequence[list[int]],
    sampling_logps: Sequence[list[float]] | None,
    tools: Sequence[dict[str, Callable]],
    *,
    parse: Callable[[int, list[int], list[int]], dict],
    suffix_ids: Callable[[list[dict]], list[int]],
    generate_more: Callable[[list[list[int]]], tuple[list[list[int]], list[list[float]] | None]],
    max_iterations: int | None,
    max_completion_length: int,
    max_model_length: int | None = None,
    any_left: Callable[[bool, BaseException | None], bool] | None = None,
    ran: Callable[[int, list[dict], list[dict]], None] | None = None,
    timeout: float | None = None,
    lost: Callable[[int, dict, BaseException], BaseException | None] | None = None,
) -> ToolResults:
    """TRL's tool-calling loop over one agent's completions.

    Args:
        prompt_ids, completion_ids, sampling_logps: per completion, as generated (log-probs only from vLLM).
        tools: per completion, the functions it may call by name.
        parse: ``parse(completion, ids, prefix)``, TRL's `parse_response` of `ids` after the tokens `prefix`.
        suffix_ids: the tokens that append tool messages to an assistant turn (TRL's `_get_tool_suffix_ids`).
        generate_more: one continuation per token sequence (and its log-probs), cut after the first EOS. Called in
            every round on every process, with no sequence where this one has none.
        max_iterations: rounds of tool calls at most (None: no limit, TRL's default).
        any_left: ``any_left(has_calls, error)``: whether any process still has tool calls (distributed: every
            process runs the same rounds), raising on every process if any failed (`error`: this one's, or None).
            By default this process alone (`rollout.tree.local_sync`).
        ran: ``ran(completion, tool_calls, tool_messages)`` after each completion's calls ran, rolled back or not (an
            environment records the calls made on its world).
        timeout: seconds one call may run (`MAGRPOConfig.tool_call_timeout`; None: no limit).
        lost: ``lost(completion, call, error)``: the exception to raise for a call's `error` (an environment's world
            that is gone, `environments.faults`), or None for TRL's rule. After such a call this process makes no other
            call; it still joins the round's generation (with nothing to continue) and reports the error through
            `any_left`, so that every process stops at the same point.
    """
    any_left = any_left or local_sync
    completion_ids = [list(ids) for ids in completion_ids]
    masks = [[1] * len(ids) for ids in completion_ids]
    logps = None if sampling_logps is None else [list(lp) for lp in sampling_logps]
    calls, failures = [0] * len(completion_ids), [0] * len(completion_ids)
    messages = [[parse(c, ids, list(prompt_ids[c]))] for c, ids in enumerate(completion_ids)]
    pending = [(c, turns[0]["tool_calls"]) for c, turns in enumerate(messages) if turns[0].get("tool_calls")]
    rounds, error = 0, None
    while any_left(bool(pending), error) and (max_iterations is None or rounds < max_iterations):
        ready = []  # (completion, tool tokens, prompt + completion + tool tokens)
        for c, tool_calls in pending:
            try:
                results, failed = call_tools(tool_calls, tools[c], timeout, lost and partial(lost, c))
            except EnvironmentLost as err:  # no other call; `any_left` stops every process at the next check
                error, ready = err, []
                break
            if ran is not None:
                ran(c, tool_calls, results)
            calls[c], failures[c] = calls[c] + len(tool_calls), failures[c] + failed
            suffix = suffix_ids(results)
            ids = list(prompt_ids[c]) + completion_ids[c] + suffix
            too_long = len(ids) - len(prompt_ids[c]) > max_completion_length
            if too_long or (max_model_length is not None and len(ids) >= max_model_length):
                continue  # rolled back, as in TRL: the completion ends as it was
            messages[c] += results
            ready.append((c, suffix, ids))
        more, more_logps = generate_more([ids for _, _, ids in ready])
        pending = []
        for j, (c, suffix, ids) in enumerate(ready):
            room = max_completion_length - (len(ids) - len(prompt_ids[c]))
            new = more[j][:room]
            masks[c] += [0] * len(suffix) + [1] * len(new)
            if logps is not None:
                logps[c] += [0.0] * len(suffix) + list(more_logps[j][:room])  # placeholders on tool tokens, as TRL
            completion_ids[c] = ids[len(prompt_ids[c]) :] + new
            if new:  # nothing when the budget was spent on the tool results
                messages[c].append(parse(c, new, ids))
                if messages[c][-1].get("tool_calls"):
                    pending.append((c, messages[c][-1]["tool_calls"]))
        rounds += 1
    return ToolResults(completion_ids, masks, logps, calls, failures, messages)


class ToolCalling:
    """Each agent's tools (`tools=` and its environment's methods) and TRL's loop for its completions.

    Args:
        tools: `tools=` as given (one list for every agent, or one per agent), or None.
        worlds: the team's environments (`environments.worlds.Worlds`), or None.
        tokenizers: one per agent; prepared for tool calling in place (`prepare_tokenizer`).
        max_iterations: `max_tool_calling_iterations` (None: no limit).
        max_completion_length: the budget of a completion, tool results included (as in TRL).
        chat_template_kwargs: GRPOConfig's, for rendering tool results.
        timeout: `MAGRPOConfig.tool_call_timeout`, seconds one tool call may run (None: no limit).
    """

    def __init__(
        self,
        tools,
        worlds,
        tokenizers: list,
        *,
        max_iterations: int | None,
        max_completion_length: int,
        chat_template_kwargs: dict | None = None,
        timeout: float | None = None,
    ):
        check_timeout(timeout)
        self.timeout = timeout
        self.tools = tools_per_agent(tools, len(tokenizers))
        self.worlds = worlds
        self.tokenizers = tokenizers
        self.max_iterations = max_iterations
        self.max_completion_length = max_completion_length
        world_names = worlds.agent_names.values() if worlds is not None else []
        self.has_tools = [
            bool(self.tools[i]) or any(names[i] for names in world_names) for i in range(len(tokenizers))
        ]
        if any(self.has_tools):
            require_newest_trl(
                "tool calling (tools= or environment_factory=)",
                "its parse_response types each tool call's arguments with the tool's JSON schema",
            )
        self.chat_templates = [
            prepare_tokenizer(tok, i) if self.has_tools[i] else None for i, tok in enumerate(tokenizers)
        ]
        self.chat_template_kwargs = chat_template_kwargs or {}

    def all_tools(self) -> list[Callable]:
        """Every tool of every agent, each once: the functions, and each environment class's tool methods (GRPOTrainer's
        `tools`, the union of its environments' tools)."""
        tools = [tool for agent in self.tools for tool in agent]
        if self.worlds is not None:
            for cls, per_agent in self.worlds.agent_names.items():
                tools += [getattr(cls, name) for names in per_agent for name in names]
        return list(dict.fromkeys(tools))

    def environment_tools(self) -> dict[Any, list[Callable]]:
        """GRPOTrainer's `_env_tools`: per environment (its routing key; None for a single factory), the tools a
        completion acting on it may call: `tools=`, then the environment's methods bound to its probe (the pool's
        first instance). For a team, those of every agent, each once, in agent order (`agent_tools` gives each agent
        its share)."""
        return {
            name: list(dict.fromkeys(t for agent in range(len(self.tools)) for t in self.agent_tools(agent, pool[0])))
            for name, pool in self.worlds.pool.instances.items()
        }

    def agent_tools(self, agent: int, world: Any) -> list[Callable]:
        """What agent `agent` may call in a completion acting on `world` (None: no environment)."""
        from_world = self.worlds.tools(world, agent) if world is not None else []
        return self.tools[agent] + from_world

    def prompt_tools(self, agent: int, num_prompts: int, worlds: list | None, k: int) -> list[list[Callable]]:
        """The tools each prompt is rendered with (the K completions of a prompt act on worlds of one class)."""
        return [self.agent_tools(agent, worlds[j * k] if worlds else None) for j in range(num_prompts)]

    def run(
        self,
        agent: int,
        generation: Generation,
        worlds: list | None,
        generator,
        greedy: bool = False,
        any_left: Callable[[bool, BaseException | None], bool] | None = None,
    ) -> Generation:
        """The generation after TRL's tool loop: completions extended with tool rounds, their tool masks, counts.
        `generator` (`generation.base.Generator`) samples the continuations and knows each agent's context."""
        count = len(generation.completion_ids)
        if not self.has_tools[agent]:  # this agent calls nothing: every token is the model's
            generation.tool_masks = [[1] * len(ids) for ids in generation.completion_ids]
            generation.tool_calls, generation.tool_failures = [0] * count, [0] * count
            return generation
        k = count // max(len(generation.prompt_ids), 1)
        per_completion = [self.agent_tools(agent, worlds[c] if worlds else None) for c in range(count)]
        prompt_ids = [generation.prompt_ids[c // k] for c in range(count)] if count else []
        tokenizer = self.tokenizers[agent]

        def parse(c: int, ids: list[int], prefix: list[int]) -> dict:
            return parse_response(tokenizer, ids, prefix=prefix, tools=per_completion[c] or None)

        results = tool_loop(
            prompt_ids,
            generation.completion_ids,
            generation.sampling_logps,
            [{tool.__name__: tool for tool in tools} for tools in per_completion],
            parse=parse,
            suffix_ids=lambda messages: self.suffix_ids(agent, messages),
            generate_more=lambda ids: generator.generate_more(agent, ids, greedy),
            max_iterations=self.max_iterations,
            max_completion_length=self.max_completion_length,
            max_model_length=generator.context_lengths[agent],
            any_left=any_left,
            ran=(lambda c, calls, results: self.worlds.record(worlds[c], agent, calls, results)) if worlds else None,
            timeout=self.timeout,
            lost=(lambda c, call, error: self.worlds.lost(worlds[c], agent, call, error)) if worlds else None,
        )
        texts = tokenizer.batch_decode(results.completion_ids, skip_special_tokens=True)
        return Generation(
            generation.prompt_ids,
            results.completion_ids,
            texts,
            results.sampling_logps,
            generation.truncated_prompts,
            tool_masks=results.tool_masks,
            tool_calls=results.calls,
            tool_failures=results.failures,
            messages=results.messages,
        )

    def suffix_ids(self, agent: int, messages: list[dict]) -> list[int]:
        """The tokens that append `messages` (tool results) to an assistant turn: TRL's own
        `GRPOTrainer._get_tool_suffix_ids`, given this agent's tokenizer and template (a private TRL method, under
        contract in tests/test_private_api_contract.py)."""
        tokenizer = self.tokenizers[agent]
        owner = types.SimpleNamespace(
            processing_class=tokenizer,
            _tokenizer=tokenizer,
            chat_template=self.chat_templates[agent],
            chat_template_kwargs=self.chat_template_kwargs,
            _is_vlm=False,
        )
        return GRPOTrainer._get_tool_suffix_ids(owner, messages)
