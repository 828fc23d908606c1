"""`tools=` and `environment_factory=` on real trainers: TRL's tool loop, tool mask and metrics for a team.

The tiny random model never writes a tool call, so its sampler is replaced by a script (the one mock here): a
completion's text depends on its index among the K samples of a prompt, and a continuation after tool results on the
result it reads. Everything else is real: TRL's chat template, `parse_response`, `_get_tool_suffix_ids`, loss.
"""

import asyncio
import math
import re
import time

import pytest
import torch
from conftest import EVENT_LOOPS, assert_same_sgd_step, under_event_loop
from datasets import Dataset
from trl import GRPOConfig, GRPOTrainer

from trl_multiagent import MAGRPOConfig, MAGRPOTrainer
from trl_multiagent.demo.testing import make_model, make_tokenizer, make_tool_tokenizer
from trl_multiagent.generation import TransformersGenerator
from trl_multiagent.rollout.tools import tool_loop


PROMPTS = [[{"role": "user", "content": f"Add {a} and 2."}] for a in (3, 5)]


def add(a: int, b: int) -> int:
    """Add two numbers.

    Args:
        a: The first number.
        b: The second number.
    """
    return a + b


def tool_call(name: str, arguments: str) -> str:
    return f'<tool_call>\n{{"name": "{name}", "arguments": {arguments}}}\n</tool_call><|im_end|>'


def scripted_text(tokenizer, ids, variant: int) -> str:
    """Even samples call `add`, odd ones answer at once; after a tool result, the answer quotes it."""
    text = tokenizer.decode(ids)
    results = re.findall(r"<tool_response>\n(.*?)\n</tool_response>", text)
    if results:
        return f"The sum is {results[-1]}.<|im_end|>"
    if variant % 2 == 0:
        return tool_call("add", f'{{"a": {variant}, "b": 2}}')
    return "No tool needed.<|im_end|>"


def script_ours(monkeypatch, tokenizer, text=scripted_text):
    def _sample(self, agent, prompt_ids, num_generations, greedy):
        out = [text(tokenizer, p, k) for p in prompt_ids for k in range(num_generations)]
        return [tokenizer(t, add_special_tokens=False)["input_ids"] for t in out], None

    monkeypatch.setattr(TransformersGenerator, "_sample", _sample)


def ids_reward(completion_ids, **kwargs):
    return [len(ids) / 10 for ids in completion_ids]


def messages_reward(completions, **kwargs):
    """TRL's completions with tools: the assistant turns and the tool results, as messages."""
    return [len(messages) + len(messages[-1]["content"]) / 10 for messages in completions]


COMMON = dict(
    num_generations=4, per_device_train_batch_size=8, max_completion_length=256, max_steps=1, logging_steps=1,
    report_to="none", seed=7, learning_rate=0.5, optim="sgd", lr_scheduler_type="constant", max_grad_norm=0.0,
    use_cpu=True, bf16=False,
)  # fmt: skip


def test_one_agent_with_tools_equals_grpo_trainer(tmp_path, monkeypatch):
    tokenizer = make_tool_tokenizer()
    data = Dataset.from_dict({"prompt": PROMPTS})

    def trl_single_turn(self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        # TRL's rows are the prompts repeated K times, prompt-major, and one sample each: the same order as ours
        k = num_generations if num_generations > 1 else None
        texts = [scripted_text(tokenizer, p, i % k if k else 0) for i, p in enumerate(prompt_ids)]
        return [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts], None

    monkeypatch.setattr(GRPOTrainer, "_generate_single_turn", trl_single_turn)
    stock_model = make_model(tokenizer, max_positions=2048, seed=3)
    before = {k: v.clone() for k, v in stock_model.state_dict().items()}
    stock = GRPOTrainer(
        model=stock_model, reward_funcs=[ids_reward, messages_reward], train_dataset=data, processing_class=tokenizer,
        tools=[add],
        args=GRPOConfig(output_dir=str(tmp_path / "stock"), **COMMON),
    )  # fmt: skip
    stock.train()

    script_ours(monkeypatch, tokenizer)
    ours_model = make_model(tokenizer, max_positions=2048, seed=3)
    ours = MAGRPOTrainer(
        model=[ours_model], processing_class=tokenizer, reward_funcs=[ids_reward, messages_reward], train_dataset=data,
        tools=[add],
        args=MAGRPOConfig(output_dir=str(tmp_path / "ours"), **COMMON),
    )  # fmt: skip
    ours.train()

    stock_log, ours_log = stock.state.log_history[0], ours.state.log_history[0]
    for key in ("reward", "loss", "tools/call_frequency", "tools/failure_frequency", "completions/mean_length"):
        assert ours_log[key] == pytest.approx(stock_log[key], abs=1e-6), key
    for name in ("ids_reward", "messages_reward"):
        assert ours_log[f"turn_1/rewards/{name}/mean"] == pytest.approx(stock_log[f"rewards/{name}/mean"], abs=1e-6)
    assert ours_log["tools/call_frequency"] == 0.5  # half the samples called `add`, once
    assert_same_sgd_step(before, stock_model, ours_model)


def test_tool_tokens_get_no_loss_terms(tmp_path, monkeypatch):
    tokenizer = make_tool_tokenizer()
    script_ours(monkeypatch, tokenizer)
    trainer = MAGRPOTrainer(
        model=[make_model(tokenizer, max_positions=2048, seed=s) for s in (1, 2)], processing_class=tokenizer,
        reward_funcs=lambda c0, c1: [float(len(a) - len(b)) for a, b in zip(c0, c1, strict=True)],
        train_dataset=Dataset.from_dict({"prompt": PROMPTS}), tools=[[add], []],
        args=MAGRPOConfig(output_dir=str(tmp_path), **COMMON),
    )  # fmt: skip
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1  # set by the Trainer's loop, which this test does not run
    batches = trainer._generate_and_score_completions([{"prompt": p} for p in PROMPTS for _ in range(4)])["agents"]
    acting, silent = batches
    suffix = tokenizer.decode(acting["completion_ids"][0][acting["tool_mask"][0] == 0])
    assert suffix.startswith("\n<|im_start|>user\n<tool_response>\n2\n</tool_response><|im_end|>")  # add(0, 2)
    assert (acting["tool_mask"] == 0).any(dim=1).tolist() == [k % 2 == 0 for _ in PROMPTS for k in range(4)]
    # agent 1 has no tools: no tool result in its completions, and no token of them masked
    assert "<tool_response>" not in "".join(tokenizer.batch_decode(silent["completion_ids"]))
    assert "tool_mask" not in silent or bool(silent["tool_mask"].all())

    def loss(batch):
        with trainer.team.acting(0):
            return trainer._compute_loss(trainer.team, batch)

    acting["advantages"] = torch.linspace(-1.0, 1.0, acting["advantages"].numel())
    removed = {k: v for k, v in acting.items() if k != "tool_mask"}
    removed["completion_mask"] = acting["completion_mask"] * acting["tool_mask"]
    counted = {k: v for k, v in acting.items() if k != "tool_mask"}
    torch.testing.assert_close(loss(acting), loss(removed))
    assert not torch.allclose(loss(acting), loss(counted))  # the tool tokens would change it


class Notebook:
    """Two agents, one shared notebook: agent 0 writes, agent 1 reads."""

    agent_tools = [["write", "explode"], ["read"]]

    def reset(self, **row):
        self.notes, self.secret = [], row["secret"]

    def write(self, note: str) -> str:
        """Write a note in the shared notebook.

        Args:
            note: The text to write.
        """
        self.notes.append(note)
        return "written"

    def read(self) -> str:
        """Read the shared notebook."""
        return " | ".join(self.notes) or "(empty)"

    def explode(self) -> str:
        """A tool that always fails."""
        raise RuntimeError("boom")

    def get_reward(self) -> float:
        return float(self.secret in self.notes)


def notebook_script(tokenizer, ids, variant):
    text = tokenizer.decode(ids)
    if text.endswith("</tool_response><|im_end|>\n<|im_start|>assistant\n"):  # after its tool results
        return "Done.<|im_end|>"
    if '"name": "write"' in text:  # agent 0: its prompt lists `write`
        if variant == 3:
            return tool_call("explode", "{}")
        return tool_call("write", f'{{"note": "{"alpha" if variant < 2 else "beta"}"}}')
    return tool_call("read", "{}")


def test_a_team_acts_on_a_shared_world_and_learns_from_its_reward(tmp_path, monkeypatch):
    tokenizer = make_tool_tokenizer()
    script_ours(monkeypatch, tokenizer, notebook_script)
    seen = []

    def heard(c0, c1, environments):  # agent 1's answer after reading the notebook agent 0 wrote in
        seen.extend(" | ".join(w.notes) for w in environments)
        return [0.0] * len(c0)

    trainer = MAGRPOTrainer(
        model=[make_model(tokenizer, max_positions=2048, seed=s) for s in (1, 2)], processing_class=tokenizer,
        reward_funcs=heard, environment_factory=Notebook,
        train_dataset=Dataset.from_dict({"prompt": PROMPTS, "secret": ["alpha", "beta"]}),
        args=MAGRPOConfig(output_dir=str(tmp_path), reward_weights=[1.0, 2.0], log_completions=True, **COMMON),
    )  # fmt: skip
    before = [p.detach().clone() for p in trainer.team.agent(0).parameters()]
    trainer.train()
    log = trainer.state.log_history[0]
    assert seen[-8:] == ["alpha", "alpha", "beta", ""] * 2
    # agent 1 read what agent 0 wrote in the same joint action: the tool result is in its completion
    logs = trainer._logs
    readers = [c for c, agent in zip(logs["completion"], logs["extra"]["agent"], strict=True) if agent == 1]
    assert "<tool_response>\nalpha\n</tool_response>" in readers[0].replace("<|im_start|>user", "")
    assert list(trainer._logs["extra"]["tool_calls"])[:4] == [1, 1, 1, 1]
    # Notebook's reward (weight 2): the secret written for row 0 in samples 0-1, row 1 in sample 2
    assert log["turn_1/rewards/Notebook/mean"] == pytest.approx(3 / 8)
    assert log["reward"] == pytest.approx(2 * 3 / 8)
    assert log["turn_1/agent_0/tools/call_frequency"] == 1.0 and log["turn_1/agent_1/tools/call_frequency"] == 1.0
    assert log["turn_1/agent_0/tools/failure_frequency"] == 0.25  # `explode` in sample 3
    assert log["tools/failure_frequency"] == pytest.approx(2 / 16)
    # training went on through the failing tool: a finite loss, and agent 0's weights moved
    assert math.isfinite(log["loss"])
    assert any(not torch.equal(a, b) for a, b in zip(before, trainer.team.agent(0).parameters(), strict=True))


class OpenNotebook(Notebook):
    agent_tools = None  # TRL's rule: every public method is every agent's tool


def test_env_tools_and_the_pool_mean_what_grpo_trainers_do(tmp_path):
    """`_env_tools` and `_environment_pool`, as TRL's tests read them: for one agent, GRPOTrainer's (tools=, then the
    probe's methods bound to it; the probe alone in the pool); for a team, every agent's tools, each once."""
    tokenizer = make_tool_tokenizer()
    data = Dataset.from_dict({"prompt": PROMPTS, "secret": ["alpha", "beta"]})
    common = dict(reward_funcs=ids_reward, train_dataset=data, processing_class=tokenizer, tools=[add])
    model = make_model(tokenizer, max_positions=2048)
    stock = GRPOTrainer(
        model=model, args=GRPOConfig(output_dir=str(tmp_path / "stock"), **COMMON), environment_factory=OpenNotebook,
        **common,
    )  # fmt: skip
    one = MAGRPOTrainer(
        model=[model], args=MAGRPOConfig(output_dir=str(tmp_path / "one"), **COMMON), environment_factory=OpenNotebook,
        **common,
    )  # fmt: skip
    team = MAGRPOTrainer(
        model=[model, model], args=MAGRPOConfig(output_dir=str(tmp_path / "two"), **COMMON),
        environment_factory=Notebook, **common,
    )  # fmt: skip

    def named(trainer):
        return {name: [tool.__name__ for tool in tools] for name, tools in trainer._env_tools.items()}

    assert named(one) == named(stock) == {None: ["add", "explode", "read", "write"]}
    # a team: agent 0's (add, write, explode), then what agent 1 adds (read)
    assert named(team) == {None: ["add", "write", "explode", "read"]}
    for trainer in (stock, one, team):
        (probe,) = trainer._environment_pool[None]  # the probe alone after building
        assert type(probe).__name__.endswith("Notebook") and trainer._env_tools[None][0] is add
        assert all(tool.__self__ is probe for tool in trainer._env_tools[None][1:])


def test_a_chat_template_without_tools_gets_trls_message_and_the_fix(tmp_path):
    tokenizer = make_tokenizer()
    tokenizer.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    with pytest.raises(ValueError, match=r"does not support tool calling.*qwen2_5_chat_template"):
        MAGRPOTrainer(
            model=[make_model(tokenizer)] * 2, processing_class=tokenizer, reward_funcs=lambda a, b: [0.0] * len(a),
            train_dataset=Dataset.from_dict({"prompt": PROMPTS}), tools=[add],
            args=MAGRPOConfig(output_dir=str(tmp_path), **COMMON),
        )  # fmt: skip


def test_a_tool_result_past_the_length_limit_is_rolled_back():
    def parse(c, ids, prefix):
        return (
            {"tool_calls": [{"type": "function", "function": {"name": "f", "arguments": {}}}]} if ids[0] == 5 else {}
        )

    loop = dict(parse=parse, suffix_ids=lambda messages: [7] * 4, max_iterations=None)
    more = lambda ids: ([[9, 9, 9]] * len(ids), None)  # noqa: E731
    fits = tool_loop([[1]], [[5, 5]], None, [{"f": lambda: 1}], generate_more=more, max_completion_length=9, **loop)
    assert fits.completion_ids == [[5, 5, 7, 7, 7, 7, 9, 9, 9]] and fits.tool_masks == [[1, 1, 0, 0, 0, 0, 1, 1, 1]]
    cut = tool_loop([[1]], [[5, 5]], None, [{"f": lambda: 1}], generate_more=more, max_completion_length=7, **loop)
    assert cut.completion_ids == [[5, 5, 7, 7, 7, 7, 9]]  # the continuation is cut to the budget, as in TRL
    over = tool_loop([[1]], [[5, 5]], None, [{"f": lambda: 1}], generate_more=more, max_completion_length=5, **loop)
    assert over.completion_ids == [[5, 5]] and over.tool_masks == [[1, 1]] and over.calls == [1]
    ctx = tool_loop([[1]], [[5, 5]], None, [{"f": lambda: 1}], generate_more=more, max_completion_length=9,
                    max_model_length=7, **loop)  # fmt: skip
    assert ctx.completion_ids == [[5, 5]]  # past the model's context: rolled back too


def test_every_process_runs_the_same_rounds_of_generation():
    """A process whose completions call no more tools still joins each round another process runs (with nothing to
    continue), so collectives inside generation stay in step."""
    calls = []

    def more(ids):
        calls.append(len(ids))
        return [[9]] * len(ids), None

    rounds_elsewhere = iter([True, True, False])  # another process runs two rounds
    results = tool_loop(
        [[1]], [[2]], None, [{}], parse=lambda c, ids, prefix: {}, suffix_ids=lambda m: [], generate_more=more,
        max_iterations=None, max_completion_length=8, any_left=lambda local, error: local or next(rounds_elsewhere),
    )  # fmt: skip
    assert calls == [0, 0] and results.completion_ids == [[2]]


def test_stop_strings_end_a_completion_on_the_transformers_backend(tmp_path):
    """`generation_kwargs={"stop_strings": [...]}` (a tool call's closing tag, say) stops generation after the string:
    the tokenizer reaches `generate`, and the padding after a stopped row is dropped."""
    tokenizer = make_tokenizer()
    data = Dataset.from_dict({"prompt": ["Describe a city in the clouds:"]})

    def greedy_completion(**config):
        trainer = MAGRPOTrainer(
            model=[make_model(tokenizer, seed=s) for s in (5, 6)], processing_class=tokenizer, reward_funcs=lambda a, b: [0.0] * len(a),
            train_dataset=data, args=MAGRPOConfig(output_dir=str(tmp_path), **{**COMMON, "max_completion_length": 12}, **config),
        )  # fmt: skip
        generation = trainer.generator.generate(0, list(data["prompt"]), 1, greedy=True)
        return generation.prompt_ids[0], generation.completion_ids[0]

    prompt, free = greedy_completion()
    stop = tokenizer.decode(free[4:6])  # a string the model writes in the middle of its completion
    # transformers stops at the first new token after which the text (prompt included) ends with the string
    expected = next(free[:n] for n in range(1, len(free) + 1) if tokenizer.decode(prompt + free[:n]).endswith(stop))
    assert len(expected) < len(free)
    assert greedy_completion(generation_kwargs={"stop_strings": [stop]})[1] == expected


async def async_add(a: int, b: int) -> int:
    """TRL's documented async tool.

    Args:
        a: The first integer.
        b: The second integer.
    """
    await asyncio.sleep(0)
    return a + b


def call_async_add_once() -> tuple[list[list[int]], list[list[int]]]:
    """TRL's tool loop over one completion that calls `async_add(a=40, b=2)`: what the continuation was asked for (the
    tool result's tokens: here the result itself), and the completion's ids."""
    call = {"type": "function", "function": {"name": "async_add", "arguments": {"a": 40, "b": 2}}}
    asked = []

    def more(ids):
        asked.extend(ids)
        return [[9]] * len(ids), None

    results = tool_loop(
        [[1]], [[5]], None, [{"async_add": async_add}], parse=lambda c, ids, prefix: {"tool_calls": [call]} if ids == [5] else {},
        suffix_ids=lambda messages: [int(m["content"]) for m in messages], generate_more=more, max_iterations=1,
        max_completion_length=8,
    )  # fmt: skip
    return asked, results.completion_ids


@pytest.mark.parametrize("loop", EVENT_LOOPS)
def test_an_async_tools_result_reaches_the_agents_next_prompt(loop):
    asked, completion_ids = under_event_loop(loop, call_async_add_once)
    assert asked == [[1, 5, 42]]  # prompt, the call, async_add(40, 2)'s result: the continuation's prompt
    assert completion_ids == [[5, 42, 9]]


def test_a_tool_call_past_the_timeout_fails_and_the_agent_reads_why():
    cancelled = []

    def slow_sync(seconds: float) -> str:
        """Sleep, then answer.

        Args:
            seconds: How long.
        """
        time.sleep(seconds)
        return "done"

    async def slow_async(seconds: float) -> str:
        """Sleep, then answer.

        Args:
            seconds: How long.
        """
        try:
            await asyncio.sleep(seconds)
        except asyncio.CancelledError:
            cancelled.append(seconds)
            raise
        return "done"

    def call(name, seconds):
        return {"type": "function", "function": {"name": name, "arguments": {"seconds": seconds}}}

    calls = [call("slow_sync", 5), call("slow_async", 5), call("slow_sync", 0), call("slow_async", 0)]
    read = []  # the tool messages appended to the agent's completion, as its next prompt continues from them
    start = time.monotonic()
    results = tool_loop(
        [[1]], [[5]], None, [{"slow_sync": slow_sync, "slow_async": slow_async}],
        parse=lambda c, ids, prefix: {"tool_calls": calls} if ids == [5] else {},
        suffix_ids=lambda messages: read.extend(m["content"] for m in messages) or [7], max_iterations=1,
        generate_more=lambda ids: ([[9]] * len(ids), None), max_completion_length=8, timeout=0.2,
    )  # fmt: skip
    assert time.monotonic() - start < 3  # neither 5-second call was waited for
    assert read == [
        "{'error': 'Tool slow_sync timed out after 0.2 s.'}",
        "{'error': 'Tool slow_async timed out after 0.2 s.'}",
        "done",
        "done",
    ]
    assert results.calls == [4] and results.failures == [2] and cancelled == [5]  # the async one was cancelled
    assert results.completion_ids == [[5, 7, 9]]


def test_the_configs_tool_call_timeout_reaches_the_agents(tmp_path, monkeypatch):
    tokenizer = make_tool_tokenizer()
    script_ours(monkeypatch, tokenizer)

    def add(a: int, b: int) -> int:  # the scripted calls' tool, too slow
        """Add two numbers.

        Args:
            a: The first number.
            b: The second number.
        """
        time.sleep(3)
        return a + b

    trainer = MAGRPOTrainer(
        model=[make_model(tokenizer, max_positions=2048, seed=s) for s in (1, 2)], processing_class=tokenizer,
        reward_funcs=lambda c0, c1: [0.0] * len(c0), train_dataset=Dataset.from_dict({"prompt": PROMPTS}),
        tools=[[add], []], args=MAGRPOConfig(output_dir=str(tmp_path), tool_call_timeout=0.1, **COMMON),
    )  # fmt: skip
    trainer.model.train()
    trainer._generate_and_score_completions([{"prompt": p} for p in PROMPTS for _ in range(4)])
    answers = [text for node in trainer.last_rollout.nodes for text in node.completions[0]]
    assert answers[0].endswith("The sum is {'error': 'Tool add timed out after 0.1 s.'}.")  # what it read
    node = trainer.last_rollout.nodes[0]
    assert node.tool_calls[0] == [1, 0, 1, 0] and node.tool_failures[0] == [1, 0, 1, 0]
    with pytest.raises(ValueError, match=r"tool_call_timeout must be a positive number of seconds.*got 0"):
        MAGRPOTrainer(
            model=[make_model(tokenizer, seed=1)], processing_class=tokenizer, reward_funcs=lambda c: [0.0] * len(c),
            train_dataset=Dataset.from_dict({"prompt": PROMPTS}), tools=[add],
            args=MAGRPOConfig(output_dir=str(tmp_path), tool_call_timeout=0, **COMMON),
        )  # fmt: skip


def char_by_char(tokenizer, text: str) -> list[int]:
    """Ids that are not the tokenizer's own encoding of `text`: one token per character, `<|im_end|>` kept whole. Re-
    tokenising their decoded text would give other ids (TRL #5144's tool mask longer than the completion)."""
    ids = []
    for i, part in enumerate(text.split("<|im_end|>")):
        ids += [tokenizer.convert_tokens_to_ids("<|im_end|>")] if i else []
        ids += [tid for ch in part for tid in tokenizer(ch, add_special_tokens=False)["input_ids"]]
    return ids


def test_the_tool_mask_matches_sampled_ids_that_re_tokenising_would_change(tmp_path, monkeypatch):
    tokenizer = make_tool_tokenizer()

    def _sample(self, agent, prompt_ids, num_generations, greedy):
        texts = [scripted_text(tokenizer, p, k) for p in prompt_ids for k in range(num_generations)]
        return [char_by_char(tokenizer, t) for t in texts], None

    monkeypatch.setattr(TransformersGenerator, "_sample", _sample)
    trainer = MAGRPOTrainer(
        model=[make_model(tokenizer, max_positions=2048, seed=s) for s in (1, 2)], processing_class=tokenizer,
        reward_funcs=lambda c0, c1: [0.0] * len(c0), train_dataset=Dataset.from_dict({"prompt": PROMPTS}),
        tools=[[add], []], args=MAGRPOConfig(output_dir=str(tmp_path), **COMMON),
    )  # fmt: skip
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1
    batch = trainer._generate_and_score_completions([{"prompt": p} for p in PROMPTS for _ in range(4)])["agents"][0]
    call, answer = (
        char_by_char(tokenizer, tool_call("add", '{"a": 0, "b": 2}')),
        char_by_char(tokenizer, "The sum is 2.<|im_end|>"),
    )
    assert tokenizer(tokenizer.decode(call), add_special_tokens=False)["input_ids"] != call  # re-tokenising changes it
    ids, mask = trainer.last_rollout.nodes[0].completion_ids[0][0], trainer.last_rollout.nodes[0].tool_masks[0][0]
    suffix = len(ids) - len(call) - len(answer)  # the tool result's tokens, between the two sampled parts
    assert ids[: len(call)] == call and ids[len(call) + suffix :] == answer and suffix > 0  # kept as sampled
    assert mask == [1] * len(call) + [0] * suffix + [1] * len(answer)
    assert batch["tool_mask"].shape == batch["completion_ids"].shape
    assert (batch["tool_mask"][0] == 0).sum() == suffix
