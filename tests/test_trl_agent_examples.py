"""TRL 1.16's documented agent examples (docs/source/grpo_trainer.md, "Agent Training"), run as a TRL user would with
only the class names swapped (`GRPOConfig` -> `MAGRPOConfig`, `GRPOTrainer` -> `MAGRPOTrainer`) and `num_agents=2`.

The model id is a local tiny model with TRL's Qwen2.5 template (no hub here) and `max_steps` is 2 (not 1000); the
environments, tools, datasets and rewards are TRL's own text. The tiny random model rarely writes a valid tool call:
these check that the scripts run and that their parts (reset, tools, get_reward, routing) reach the team.
"""

import random
import threading

import pytest
import torch
from datasets import Dataset

from trl_multiagent import MAGRPOConfig, MAGRPOTrainer, joint
from trl_multiagent.demo.testing import make_model, make_tool_tokenizer


@pytest.fixture(scope="module")
def model_id(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny-tool-model")
    tokenizer = make_tool_tokenizer()
    make_model(tokenizer, seed=0, max_positions=4096).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


def small(tmp_path, **kwargs):
    # The docs' GRPOConfig(max_steps=1000, ...) at the size of a test; everything else left at its default.
    return MAGRPOConfig(
        output_dir=str(tmp_path), max_steps=2, max_completion_length=24, logging_steps=1, report_to="none", **kwargs
    )


class IncrementEnv:
    # Reserved methods
    def reset(self, **kwargs) -> str | None:  # required; called at the start of each rollout
        self.counter = 0
        self.target = random.randint(1, 6)  # self-sample the task
        return f"Increment the counter by {self.target}."  # returned string becomes the prompt

    def get_reward(self) -> float:  # optional: the environment scores itself from its own state
        return float(self.counter == self.target)

    # Public methods (exposed as tools)
    def increment(self, step: int) -> int:
        """
        Increment the internal counter.

        Args:
            step: Value to add to the counter.

        Returns:
            The updated counter value.
        """
        self.counter += step
        return self.counter


def test_the_environment_example_without_a_dataset(model_id, tmp_path):
    trainer = MAGRPOTrainer(
        model=model_id,
        num_agents=2,
        args=small(tmp_path, chat_template_kwargs={"enable_thinking": False}),
        environment_factory=IncrementEnv,
    )
    trainer.train()
    logs = [log for log in trainer.state.log_history if "reward" in log]
    assert len(logs) == 2 and "turn_1/rewards/IncrementEnv/mean" in logs[0]
    assert "tools/call_frequency" in logs[0] and "turn_1/agent_1/tools/failure_frequency" in logs[0]


def test_the_environment_example_with_a_dataset_and_a_reward_func(model_id, tmp_path):
    dataset = Dataset.from_dict(
        {
            "prompt": [[{"role": "user", "content": f"Increment the counter to {i}."}] for i in range(1, 7)],
            "target": list(range(1, 7)),
        }
    )
    seen_targets = []

    class IncrementEnv:
        def reset(self, target, **kwargs) -> None:  # the row's `target` column arrives as a keyword argument
            self.counter = 0
            self.target = target
            seen_targets.append(target)

        def get_reward(self) -> float:
            return float(self.counter == self.target)

        def increment(self, step: int) -> int:
            """Increment the internal counter.

            Args:
                step: Value to add to the counter.
            """
            self.counter += step
            return self.counter

    def format_reward(completions, **kwargs):  # trainer-owned: scores the completion text
        return [float(len(c[0]["content"]) > 0) for c in completions]

    trainer = MAGRPOTrainer(
        model=model_id,
        num_agents=2,
        args=small(tmp_path),
        train_dataset=dataset,
        reward_funcs=format_reward,
        environment_factory=IncrementEnv,
    )
    trainer.train()
    assert set(seen_targets) <= set(range(1, 7)) and len(seen_targets) >= 2
    log = trainer.state.log_history[0]
    assert "turn_1/rewards/format_reward/mean" in log and "turn_1/rewards/IncrementEnv/mean" in log


def test_trls_environment_reward_reaches_the_joint_reward_under_reward_weights(model_id, tmp_path):
    """TRL's OpenEnv scripts score with `def reward_func(environments, **kwargs)`: no completions, each joint action's
    world. Its values are the team's reward column, under its weight."""

    class ScoredEnv:
        def reset(self, target, **kwargs) -> None:
            self.reward = float(target)  # the world's own score, as an OpenEnv client's last step result

        def increment(self, step: int) -> int:
            """Increment the internal counter.

            Args:
                step: Value to add to the counter.
            """
            return step

    def reward_score(environments, **kwargs):
        return [env.reward for env in environments]

    dataset = Dataset.from_dict({"prompt": [[{"role": "user", "content": "Count."}]] * 4, "target": [3, 3, 5, 5]})
    trainer = MAGRPOTrainer(
        model=model_id, num_agents=2, train_dataset=dataset, reward_funcs=reward_score,
        environment_factory=ScoredEnv,
        args=small(tmp_path, num_generations=2, per_device_train_batch_size=8, shuffle_dataset=False,
                   reward_weights=[0.5]),
    )  # fmt: skip
    trainer.train()
    log = trainer.state.log_history[0]
    assert log["turn_1/rewards/reward_score/mean"] == pytest.approx(4.0)  # rows 3, 3, 5, 5: 2 joint actions each
    assert log["reward"] == pytest.approx(0.5 * 4.0)


def test_an_environments_reward_gets_weight_1_after_reward_weights_as_in_trl(model_id, tmp_path):
    """TRL: `reward_weights` covers `reward_funcs`, and each `get_reward` column gets weight 1 after them."""

    class TargetEnv:
        def reset(self, target, **kwargs) -> None:
            self.target = float(target)

        def get_reward(self) -> float:
            return self.target

        def increment(self, step: int) -> int:
            """Increment the internal counter.

            Args:
                step: Value to add to the counter.
            """
            return step

    def one(environments, **kwargs):
        return [1.0] * len(environments)

    dataset = Dataset.from_dict({"prompt": [[{"role": "user", "content": "Count."}]] * 4, "target": [3, 3, 5, 5]})

    def build(weights, name):
        return MAGRPOTrainer(
            model=model_id, num_agents=2, train_dataset=dataset, reward_funcs=[joint(one)],
            environment_factory=TargetEnv,
            args=small(tmp_path / name, num_generations=2, per_device_train_batch_size=8, shuffle_dataset=False,
                       reward_weights=weights),
        )  # fmt: skip

    trainer = build([0.5], "trl")
    assert trainer.args.reward_weights == [0.5] and trainer.reward_weights.tolist() == [0.5, 1.0]
    trainer.train()
    log = trainer.state.log_history[0]
    assert log["turn_1/rewards/TargetEnv/mean"] == pytest.approx(4.0)
    assert log["reward"] == pytest.approx(0.5 * 1.0 + 1.0 * 4.0)
    assert build([0.5, 2.0], "both").reward_weights.tolist() == [0.5, 2.0]  # one weight more sets the column's
    with pytest.raises(ValueError, match=r"reward_weights has 3 weights.*\['one'\].*\['TargetEnv'\].*Give 1.*or 2"):
        build([0.5, 2.0, 1.0], "three")


class ConnectedEnv:
    """Holds a connection (a lock here), as an OpenEnv client does: it cannot be copied, and it must be closed."""

    made: list = []

    def __init__(self):
        self.connection, self.closes, self.resets = threading.Lock(), 0, 0
        ConnectedEnv.made.append(self)

    def reset(self, **kwargs) -> str:
        self.counter, self.resets = 0, self.resets + 1
        return "Increment the counter."

    def increment(self, step: int) -> int:
        """Increment the internal counter.

        Args:
            step: Value to add to the counter.
        """
        self.counter += step
        return self.counter

    def close(self) -> None:
        self.closes += 1


def test_environments_are_pooled_checked_on_their_own_worlds_and_closed_once(model_id, tmp_path):
    ConnectedEnv.made = []
    seen, fail_at = [], [None]

    def reward_func(environments, **kwargs):
        seen.append([id(env) for env in environments])
        if len(seen) == fail_at[0]:
            raise RuntimeError("the judge is down")
        return [float(env.counter) for env in environments]

    def build(name, **kwargs):
        return MAGRPOTrainer(
            model=model_id, num_agents=2, environment_factory=ConnectedEnv, reward_funcs=reward_func,
            args=small(tmp_path / name, num_generations=2, per_device_train_batch_size=4, **kwargs),
        )  # fmt: skip

    trainer = build("ends")
    # building calls no reward and resets no world (the functions are checked from their signatures); one instance is
    # constructed to read its tools and seeds the pool, as GRPOTrainer's probe (TRL's test_train_with_multiple_environments)
    assert seen == [] and len(ConnectedEnv.made) == 1 and [e.resets for e in ConnectedEnv.made] == [0]
    trainer.train()
    # 2 rows x 2 joint actions per step: 4 distinct worlds, made once and reset in each of the 2 steps
    assert [len(set(ids)) for ids in seen] == [4, 4] and set(seen[0]) == set(seen[1])
    assert len(ConnectedEnv.made) == 4 and [e.closes for e in ConnectedEnv.made] == [1] * 4
    assert [e.resets for e in ConnectedEnv.made] == [2, 2, 2, 2]  # the probe among them
    trainer.evaluate(Dataset.from_dict({"prompt": [[{"role": "user", "content": "Count."}]] * 2}))  # on its own
    assert len(ConnectedEnv.made) == 8 and [e.closes for e in ConnectedEnv.made] == [1] * 8  # its 4 new ones too
    ConnectedEnv.made, seen[:], fail_at[0] = [], [], 1
    failing = build("fails")
    with pytest.raises(RuntimeError, match="the judge is down"):
        failing.train()  # the first step's reward fails
    assert len(ConnectedEnv.made) == 4 and [e.closes for e in ConnectedEnv.made] == [1] * 4
    # the opt-in check before training: its 2 joint actions act on one probe, reset with the row, which the pool keeps
    ConnectedEnv.made, seen[:], fail_at[0] = [], [], None
    checked = build("checked", check_functions_before_training=True)
    assert len(seen) == 1 and len(set(seen[0])) == 1 and len(ConnectedEnv.made) == 1
    assert [e.resets for e in ConnectedEnv.made] == [1] and checked._environment_pool == {None: ConnectedEnv.made}
    ConnectedEnv.made, seen[:], fail_at[0] = [], [], 1
    with pytest.raises(RuntimeError, match="the judge is down"):
        build("check fails", check_functions_before_training=True)  # the check's call fails: the probe closes
    assert len(ConnectedEnv.made) == 1 and [e.closes for e in ConnectedEnv.made] == [1]


class Routed:
    """Reads a column in `reset`, routed by the `environment` column: what `remove_unused_columns=True` strips in TRL."""

    seen: list = []

    def reset(self, target, **kwargs) -> None:
        self.target = float(target)
        Routed.seen.append(target)

    def get_reward(self) -> float:
        return self.target

    def increment(self, step: int) -> int:
        """Increment the internal counter.

        Args:
            step: Value to add to the counter.
        """
        return step


def test_columns_survive_remove_unused_columns_and_a_partial_last_batch_evaluates(model_id, tmp_path, caplog):
    def rows(targets):
        return Dataset.from_dict(
            {"prompt": [[{"role": "user", "content": "Count."}]] * len(targets), "target": targets,
             "environment": ["counter"] * len(targets)}
        )  # fmt: skip

    Routed.seen = []
    trainer = MAGRPOTrainer(
        model=model_id, num_agents=2, train_dataset=rows([1, 2, 3, 4]), eval_dataset=rows([10, 20, 30]),
        environment_factory={"counter": Routed},
        # eval: 2 rows per batch, so 3 rows end in a batch of 1 (TRL #6129); TRL's remove_unused_columns would drop
        # 'target' and 'environment'
        args=small(tmp_path, num_generations=2, per_device_train_batch_size=4, remove_unused_columns=True,
                   per_device_eval_batch_size=4, num_generations_eval=2, shuffle_dataset=False),
    )  # fmt: skip
    with caplog.at_level("WARNING"):
        trainer.train()
    assert "remove_unused_columns=True is ignored" in caplog.text
    log = trainer.state.log_history[0]
    assert log["turn_1/rewards/Routed/mean"] == pytest.approx(1.5)  # rows 1 and 2, from their 'target'
    Routed.seen = []
    metrics = trainer.evaluate()
    assert sorted(set(Routed.seen)) == [10, 20, 30] and metrics["eval_turn_1/rewards/Routed/mean"] > 0


class CodingEnv:
    def reset(self, **kwargs) -> str:
        n = random.randint(1, 20)
        return f"Compute the {n}th Fibonacci number."

    def run_code(self, code: str) -> str:  # exposed as a tool only for "coding" examples
        """Run the given Python code and return its stdout.

        Args:
            code: The Python source to execute.

        Returns:
            The captured standard output.
        """
        ...


class GameEnv:
    def reset(self, **kwargs) -> str:
        return "Reach the goal tile."

    def move(self, action: str) -> str:  # exposed as a tool only for "game" examples
        """Apply an action to the game and return the new observation.

        Args:
            action: One of "up", "down", "left", "right".

        Returns:
            The observation after the move.
        """
        ...


def test_the_multiple_environments_example(model_id, tmp_path):
    seen = []

    def reward_func(completions, environments, **kwargs):
        seen.extend(type(env).__name__ for env in environments)
        return [0.5 if isinstance(env, CodingEnv) else 0.0 for env in environments]

    dataset = Dataset.from_dict({"environment": ["coding", "game"] * 500})
    trainer = MAGRPOTrainer(
        model=model_id,
        num_agents=2,
        # in the dataset's order, so that two steps see both environments
        args=small(tmp_path, chat_template_kwargs={"enable_thinking": False}, shuffle_dataset=False),
        train_dataset=dataset,
        reward_funcs=reward_func,
        environment_factory={"coding": CodingEnv, "game": GameEnv},
    )
    trainer.train()
    assert {"CodingEnv", "GameEnv"} <= set(seen)


def multiply(a: int, b: int) -> int:
    """
    Multiplies two integers.

    Args:
        a: The first integer.
        b: The second integer.

    Returns:
        The product of the two integers.
    """
    return a * b


async def async_add(a: int, b: int) -> int:
    """
    Asynchronously adds two integers.

    Args:
        a: The first integer.
        b: The second integer.

    Returns:
        The sum of the two integers.
    """
    return a + b


def test_the_tools_example(model_id, tmp_path):
    dataset = Dataset.from_dict({"prompt": [[{"role": "user", "content": "What is 3 times 4, plus 5?"}]] * 8})

    def reward(completions, **kwargs):
        return [float("17" in c[0]["content"]) for c in completions]

    trainer = MAGRPOTrainer(
        tools=[multiply, async_add], model=model_id, num_agents=2, args=small(tmp_path), train_dataset=dataset,
        reward_funcs=reward,
    )  # fmt: skip
    trainer.train()
    assert "tools/call_frequency" in trainer.state.log_history[0]


def test_a_seeded_run_with_an_environment_repeats_exactly(model_id, tmp_path):
    """Same seed, same run: the order in which agents act on the worlds, and the worlds' own randomness (IncrementEnv
    draws its target with `random`, which the Trainer seeds), are fixed."""

    def run(name):
        trainer = MAGRPOTrainer(
            model=model_id, num_agents=2, environment_factory=IncrementEnv, tools=[multiply],
            args=small(tmp_path / name, seed=3, chat_template_kwargs={"enable_thinking": False}),
        )  # fmt: skip
        trainer.train()
        weights = {k: v.clone() for k, v in trainer.team.state_dict().items()}
        return [{k: v for k, v in log.items() if "timing" not in k and "throughput" not in k and k != "step_time"}
                for log in trainer.state.log_history if "reward" in log], weights  # fmt: skip

    (first, first_weights), (second, second_weights) = run("a"), run("b")
    assert first == second and len(first) == 2
    for name, value in first_weights.items():
        assert torch.equal(value, second_weights[name]), name
