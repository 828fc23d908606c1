"""The reward conventions of `rewards`: CoMLRL's one-joint-action-per-call rewards, TRL's per-agent rewards and
reward models in a team, and their mix with joint rewards under `reward_weights`; conventions stated with `joint`,
`per_agent` and `per_joint_action`, the inferred ones said once; TRL's `log_extra` columns in the completions table."""

import asyncio

import pandas as pd
import pytest
import torch
from conftest import SEED_PROMPTS
from datasets import Dataset
from transformers import AutoModelForSequenceClassification, LlamaConfig, LlamaForSequenceClassification
from trl.rewards import think_format_reward

from trl_multiagent import MAGRPOConfig, MAGRPOTrainer, joint, per_agent, per_joint_action
from trl_multiagent.demo.testing import make_model, make_tokenizer
from trl_multiagent.rewards import joint as rewards_module
from trl_multiagent.rewards.joint import JointReward, aggregate_agents
from trl_multiagent.rewards.signatures import is_per_agent
from trl_multiagent.rollout.task import TeamTask


CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)


def config(tmp_path, **overrides):
    values = dict(
        output_dir=str(tmp_path / "run"), num_generations=2, per_device_train_batch_size=4, max_new_tokens=6,
        max_steps=1, report_to="none", seed=0, learning_rate=1e-2, save_strategy="no",
    )  # fmt: skip
    return MAGRPOConfig(**{**values, **overrides})


def train(tmp_path, tokenizer, dataset, **kwargs):
    args = kwargs.pop("args", None) or config(tmp_path)
    trainer = MAGRPOTrainer(
        model=[make_model(tokenizer, seed=0), make_model(tokenizer, seed=1)], processing_class=tokenizer,
        train_dataset=dataset, args=args, **kwargs,
    )  # fmt: skip
    trainer.train()
    return trainer, [h for h in trainer.state.log_history if "turn_1/reward_mean" in h][0]


def test_the_convention_rules():
    def joint(completions1, completions2):
        return [0.0] * len(completions1)

    def trl_style(completions, reference_answer, **kwargs):
        return [0.0] * len(completions)

    def by_ids(completion_ids, **kwargs):
        return [0.0] * len(completion_ids)

    def one_list(completions):  # CoMLRL: one positional parameter takes the list of the agents' lists
        return [0.0] * len(completions[0])

    assert [is_per_agent(f) for f in (joint, trl_style, by_ids, one_list, think_format_reward)] == [
        False, True, True, False, True,
    ]  # fmt: skip
    assert is_per_agent("some/reward-model") and is_per_agent(torch.nn.Linear(1, 1))
    assert aggregate_agents("min", [[1.0, 5.0], [3.0, 2.0]]) == [1.0, 2.0]
    assert aggregate_agents("sum", [[1.0, None], [3.0, None]]) == [4.0, None]


def test_a_reward_stated_per_joint_action_gives_the_batched_rewards(tmp_path, tokenizer):
    """A reward that reads `completions1[0]` and `rows[0]` and returns one value, stated `per_joint_action`: called
    once per joint action, it gives the same joint rewards, and so the same update, as the batched function."""
    dataset = Dataset.from_dict({"prompt": SEED_PROMPTS, "target": [3, 5, 7, 9]})
    calls = []

    @per_joint_action
    def one_action(completions1, completions2, rows=None):
        calls.append((len(completions1), len(completions2), len(rows)))
        return [float(abs(len(completions2[0]) - rows[0]["target"]) - len(completions1[0]))]

    def batched_reward(completions1, completions2, rows):
        return [
            float(abs(len(b) - r["target"]) - len(a)) for a, b, r in zip(completions1, completions2, rows, strict=True)
        ]

    per_action, per_action_log = train(tmp_path / "a", tokenizer, dataset, reward_funcs=one_action)
    batched, batched_log = train(tmp_path / "b", tokenizer, dataset, reward_funcs=batched_reward)
    assert per_action.task.joint_reward.one_action_per_call == [True]
    assert batched.task.joint_reward.one_action_per_call == [False]
    # 2 prompts x K=2: one call per joint action (nothing is called when the trainer is built)
    assert set(calls) == {(1, 1, 1)} and len(calls) == 4
    for key in ("turn_1/reward_mean", "turn_1/reward_std", "train_loss"):
        assert per_action_log[key] == pytest.approx(batched_log[key], abs=1e-6)
    for (name, a), (_, b) in zip(per_action.team.state_dict().items(), batched.team.state_dict().items(), strict=True):
        assert torch.equal(a, b), name
    initial = make_model(tokenizer, seed=0).state_dict()
    assert any(not torch.equal(p, initial[n]) for n, p in per_action.team.agent(0).state_dict().items())


def test_an_unstated_reward_returning_one_value_for_several_is_a_count_error_naming_the_wrapper():
    """The convention is read from the signature, never from a return: one value for two joint actions is an error."""
    from trl_multiagent.rewards.joint import JointReward

    def one_value(completions1, completions2):
        return [0.5]

    reward = JointReward([one_value], None, num_agents=2)
    with pytest.raises(
        ValueError, match=r"returned 1 value for 2 joint actions.*wrap it: per_joint_action\(one_value\)"
    ):
        reward([["a", "b"], ["c", "d"]], 1, {})
    assert reward.one_action_per_call == [False]  # the call changed nothing


def chat_tokenizer():
    tokenizer = make_tokenizer()
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def chat_dataset():
    return Dataset.from_dict(
        {"prompt": [[{"role": "user", "content": p}] for p in SEED_PROMPTS], "reference_answer": ["a", "bb", "c", "d"]}
    )


def test_a_trl_reward_scores_each_agent_and_the_team_gets_their_mean(tmp_path):
    """`f(completions, reference_answer, **kwargs)` as TRL calls it: once per agent, with that agent's prompts and
    chat-formatted completions; mixed with a joint reward under `reward_weights`."""
    tokenizer, calls = chat_tokenizer(), []

    def correctness_reward(completions, reference_answer, prompts, completion_ids, log_metric, **kwargs):
        calls.append((prompts, completions, completion_ids, reference_answer))
        log_metric("correctness/calls", float(len(calls)))  # TRL's keyword: a scalar logged with the step
        return [float(len(c[0]["content"])) for c in completions]

    def joint_reward(completions1, completions2):
        return [1.0] * len(completions1)

    trainer, log = train(
        tmp_path, tokenizer, chat_dataset(), reward_funcs=[correctness_reward, joint_reward, think_format_reward],
        args=config(tmp_path, reward_weights=[0.5, 2.0, 3.0]),
    )  # fmt: skip
    assert log["correctness/calls"] == pytest.approx((1 + 2) / 2)  # the step's two calls, averaged
    agent_means = [log[f"agent_{i}/rewards/correctness_reward/mean"] for i in range(2)]
    assert log["turn_1/rewards/correctness_reward/mean"] == pytest.approx(sum(agent_means) / 2)
    think = log["turn_1/rewards/think_format_reward/mean"]
    assert log["turn_1/reward_mean"] == pytest.approx(0.5 * sum(agent_means) / 2 + 2.0 + 3.0 * think, abs=1e-5)
    assert len(calls) == 2  # one per agent (nothing is called when the trainer is built)
    for prompts, completions, ids, answers in calls:
        assert all(p[0]["role"] == "user" for p in prompts) and len(prompts) == len(completions) == len(ids) == 4
        assert all(len(c) == 1 and c[0]["role"] == "assistant" for c in completions)
        assert all(
            len(tokenizer.decode(i, skip_special_tokens=True)) <= len(c[0]["content"]) + 6
            for i, c in zip(ids, completions, strict=True)
        )
        assert answers[0] == answers[1] != answers[2] == answers[3]  # the two rows' column, K times each
    # each agent saw its own completions: the two calls' texts differ (different models)
    assert calls[0][1] != calls[1][1]

    one_agent, log_1 = train(
        tmp_path / "agent1", tokenizer, chat_dataset(), reward_funcs=[correctness_reward],
        args=config(tmp_path / "agent1", agent_reward_aggregation="1"),
    )  # fmt: skip
    assert log_1["turn_1/reward_mean"] == pytest.approx(log_1["agent_1/rewards/correctness_reward/mean"])
    assert log_1["agent_0/rewards/correctness_reward/mean"] != log_1["agent_1/rewards/correctness_reward/mean"]


def test_a_reward_model_scores_each_agent_as_trl_scores_it(tmp_path, tokenizer):
    """A sequence-classification reward model given by its folder: loaded as GRPOTrainer loads it, each agent's
    prompt + completion scored; the logged per-agent means equal the model's own scores of the logged completions."""
    rm_dir = tmp_path / "tiny-rm"
    torch.manual_seed(3)
    rm = LlamaForSequenceClassification(
        LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                    num_attention_heads=4, num_key_value_heads=2, num_labels=1, pad_token_id=tokenizer.pad_token_id)
    )  # fmt: skip
    rm.save_pretrained(rm_dir)
    tokenizer.save_pretrained(rm_dir)
    trainer, log = train(
        tmp_path, tokenizer, Dataset.from_dict({"prompt": SEED_PROMPTS}), reward_funcs=[str(rm_dir)],
        args=config(tmp_path, log_completions=True, num_completions_to_print=2),
    )  # fmt: skip
    assert trainer.task.joint_reward.names == ["tiny-rm"]
    reloaded = AutoModelForSequenceClassification.from_pretrained(rm_dir).eval()
    logs = trainer._logs
    for i in range(2):
        rows = [j for j, agent in enumerate(logs["extra"]["agent"]) if agent == i]
        texts = [logs["prompt"][j] + logs["completion"][j] for j in rows]
        inputs = tokenizer(texts, return_tensors="pt", padding=True, padding_side="right", add_special_tokens=False)
        with torch.no_grad():
            scores = reloaded(**inputs).logits[:, 0]
        assert log[f"agent_{i}/rewards/tiny-rm/mean"] == pytest.approx(scores.mean().item(), abs=1e-4)
    assert log["turn_1/rewards/tiny-rm/mean"] == pytest.approx(
        (log["agent_0/rewards/tiny-rm/mean"] + log["agent_1/rewards/tiny-rm/mean"]) / 2, abs=1e-5
    )


def joint_actions(logs, num_generations=2):
    """The completions table's rows as (agent 0's row, agent 1's row) per joint action (aligned: the table lists each
    node's K completions of agent 0, then agent 1's)."""
    rows, k = len(logs["prompt"]), num_generations
    return [(start + j, start + k + j) for start in range(0, rows, 2 * k) for j in range(k)]


def test_each_stated_convention_gives_the_trainer_its_values(tmp_path, tokenizer, caplog):
    """Each wrapper overrides what the signature would say: `joint` on a TRL-looking `(completions, **kwargs)` gets
    the agents' lists; `per_agent` on a one-parameter function scores each agent (mean over agents); an async
    `per_joint_action` returning a bare number is called once per joint action. No inference is announced."""
    calls = []

    @joint
    def difference(completions, **kwargs):  # unwrapped: TRL's per-agent convention; here one list per agent
        calls.append(("difference", len(completions[0])))
        return [float(len(a) - len(b)) for a, b in zip(*completions, strict=True)]

    @per_agent
    def length(completions):  # unwrapped: joint, one list of the agents' lists
        return [float(len(c)) for c in completions]

    @per_joint_action
    async def first_length(completions1, completions2):
        await asyncio.sleep(0)
        calls.append(("first_length", len(completions1)))
        return float(len(completions1[0]))  # one value, not in a list

    rewards_module.logger.warning_once.cache_clear()
    with caplog.at_level("WARNING"):
        trainer, log = train(
            tmp_path, tokenizer, Dataset.from_dict({"prompt": SEED_PROMPTS}),
            reward_funcs=[difference, length, first_length],
            args=config(tmp_path, reward_weights=[1.0, 2.0, 3.0], log_completions=True),
        )  # fmt: skip
    assert "is read as" not in caplog.text  # stated: nothing inferred
    assert trainer.task.joint_reward.names == ["difference", "length", "first_length"]
    assert trainer.task.joint_reward.per_agent == [False, True, False]
    # 4 joint actions: one call of the joint function, 4 of the per-joint-action one (none when the trainer is built)
    assert [c for c in calls if c[0] == "difference"] == [("difference", 4)]
    assert [c for c in calls if c[0] == "first_length"] == [("first_length", 1)] * 4
    logs, totals = trainer._logs, []
    for a, b in joint_actions(logs):
        x, y = logs["completion"][a], logs["completion"][b]
        expected = {"difference": len(x) - len(y), "length": (len(x) + len(y)) / 2, "first_length": len(x)}
        for name, value in expected.items():
            assert logs["rewards"][name][a] == logs["rewards"][name][b] == pytest.approx(value), name
        totals.append(expected["difference"] + 2 * expected["length"] + 3 * expected["first_length"])
    assert len(totals) == 4 and log["turn_1/reward_mean"] == pytest.approx(sum(totals) / 4)


def test_wrappers_keep_the_name_and_refuse_a_reward_model():
    async def scored(completions1, completions2):
        return [1.0] * len(completions1)

    wrapped = joint(scored)
    assert wrapped.__name__ == "scored" and asyncio.iscoroutinefunction(wrapped)
    assert JointReward([wrapped], None, num_agents=2)([["a", "b"], ["c", "d"]], 1, {})[0] == [1.0, 1.0]
    with pytest.raises(TypeError, match=r"per_agent\(...\) takes a reward function; got str .*always per-agent"):
        per_agent("some/reward-model")


def test_a_wrong_count_is_an_error_naming_the_function_the_turn_and_the_counts():
    """`joint` makes `[0.5]` for 2 joint actions an error; 3 values for 4 fail with or without it; one value for 2
    is an error too (a convention is never read from a return); stated per joint action, a reward that then fails is
    told why it is called so."""

    def half(completions1, completions2):
        return [0.5]

    def three(completions1, completions2):
        return [0.0] * 3

    two, four = [["a", "b"], ["c", "d"]], [["a"] * 4, ["b"] * 4]
    with pytest.raises(ValueError, match=r"'half' \(turn 2\) returned 1 value for 2 joint actions; it must return"):
        JointReward([joint(half)], None, num_agents=2)(two, 2, {})
    for func in (three, joint(three)):
        with pytest.raises(ValueError, match=r"'three' \(turn 1\) returned 3 values for 4 joint actions"):
            JointReward([func], None, num_agents=2)(four, 1, {})

    def shrinking(completions1, completions2):
        return [0.0] * (len(completions1) - 1)

    with pytest.raises(ValueError, match=r"'shrinking' \(turn 1\) returned 1 value for 2 joint actions; it must"):
        JointReward([shrinking], None, num_agents=2)(two, 1, {})  # one value for two: a count error
    with pytest.raises(ValueError, match=r"per_joint_action\(shrinking\) states\) returned 0 values for 1 joint"):
        JointReward([per_joint_action(shrinking)], None, num_agents=2)(two, 1, {})


def test_a_convention_read_from_a_signature_is_said_once_with_how_to_state_it(caplog):
    def correctness(completions, **kwargs):
        return [1.0] * len(completions)

    def together(completions):
        return [1.0] * len(completions[0])

    rewards_module.logger.warning_once.cache_clear()
    with caplog.at_level("WARNING"):
        JointReward([correctness, together, think_format_reward], None, num_agents=2)
        JointReward([correctness, together], None, num_agents=2)  # a second trainer: not said again
    assert caplog.text.count("Reward function 'correctness' names `completions`") == 1
    assert "read as TRL's per-agent convention" in caplog.text and "per_agent(correctness)" in caplog.text
    assert caplog.text.count("Reward function 'together' takes one positional parameter") == 1
    assert "joint(together)" in caplog.text
    assert "think_format_reward" not in caplog.text  # TRL's own rewards are per-agent
    caplog.clear()
    rewards_module.logger.warning_once.cache_clear()
    with caplog.at_level("WARNING"):
        JointReward([per_agent(correctness), joint(together)], None, num_agents=2)
    assert caplog.text == ""


def test_log_extra_columns_join_the_completions_table(tmp_path, tokenizer):
    """TRL's `log_extra(column, values)`: a joint reward's value per joint action goes to both agents' rows, a
    per-agent reward's to its agent's row, a per-joint-action reward's one value to its joint action; the columns are
    in the table the trainer logs (and writes to `completions/`)."""

    def pair(completions1, completions2, log_extra):
        log_extra("answers", [f"{a}|{b}" for a, b in zip(completions1, completions2, strict=True)])
        return [0.0] * len(completions1)

    def characters(completions, log_extra, **kwargs):
        log_extra("length", [len(c) for c in completions])
        return [0.0] * len(completions)

    @per_joint_action
    def first_word(completions1, completions2, log_extra):
        log_extra("word", [completions1[0].split(" ")[0]])
        return 0.0

    trainer, _ = train(
        tmp_path, tokenizer, Dataset.from_dict({"prompt": SEED_PROMPTS}), reward_funcs=[pair, characters, first_word],
        args=config(tmp_path, log_completions=True, logging_steps=1),
    )  # fmt: skip
    logs = trainer._logs
    extra = logs["extra"]
    assert list(extra) == ["agent", "turn", "answers", "length", "word"]
    assert all(len(column) == len(logs["completion"]) == 8 for column in extra.values())
    for a, b in joint_actions(logs):
        x, y = logs["completion"][a], logs["completion"][b]
        assert extra["answers"][a] == extra["answers"][b] == f"{x}|{y}"
        assert (extra["length"][a], extra["length"][b]) == (len(x), len(y))
        assert extra["word"][a] == extra["word"][b] == x.split(" ")[0]
    written = pd.read_parquet(tmp_path / "run" / "completions" / "completions_00001.parquet")
    assert list(written["answers"]) == list(extra["answers"])


def test_an_off_by_one_reward_gets_a_count_error_when_the_trainer_is_built(tmp_path, tokenizer, caplog):
    """`completions1[1:]` returns 1 value for 2 joint actions: a count error when the trainer is built (with the opt-in
    placeholder call), with no WARNING that re-reads it as another convention."""

    def off_by_one(completions1, completions2):
        return [float(len(a)) for a in completions1[1:]]

    rewards_module.logger.warning_once.cache_clear()
    with caplog.at_level("WARNING"), pytest.raises(ValueError) as raised:
        MAGRPOTrainer(
            model=[make_model(tokenizer, seed=0), make_model(tokenizer, seed=1)], processing_class=tokenizer,
            train_dataset=Dataset.from_dict({"prompt": SEED_PROMPTS}), reward_funcs=off_by_one,
            args=config(tmp_path, check_functions_before_training=True),
        )  # fmt: skip
    message = str(raised.value)
    assert message.startswith(
        "Reward function 'off_by_one' (turn 1) returned 1 value for 2 joint actions; it must return one per joint"
    )
    assert message.endswith("If it scores one joint action per call, wrap it: per_joint_action(off_by_one).")
    assert caplog.text == ""


class Board:
    """A stand-in for one joint action's world: what a reward reads from `environments`."""

    def __init__(self, reward: float):
        self.reward = reward


def test_every_trl_reward_signature_maps_onto_the_team(caplog):
    """docs/agents.md's table, one row each: which call a signature gets, and its values in the weighted sum."""
    worlds = [Board(1.0), Board(5.0)]
    answers = [["ab", "c"], ["d", "efg"]]  # [agent][joint action]

    def reward_score(environments, **kwargs):  # TRL's OpenEnv scripts: no completions, each joint action's world
        return [env.reward for env in environments]

    def everything(**kwargs):  # by keywords, no completions: joint, like the one above
        return [float(len(kwargs["prompts"])) for _ in kwargs["environments"]]

    def with_worlds(completions, environments, **kwargs):  # TRL's per-agent, reading each completion's world
        return [len(c) + env.reward for c, env in zip(completions, environments, strict=True)]

    def lengths(completions, **kwargs):  # TRL's per-agent
        return [float(len(c)) for c in completions]

    def pair(c0, c1, environments):  # a joint reward: one list per agent, the worlds by name
        return [len(a + b) * env.reward for a, b, env in zip(c0, c1, environments, strict=True)]

    def together(completions):  # one positional parameter: the agents' lists in one list (CoMLRL)
        return [float(a == b) for a, b in zip(*completions, strict=True)]

    funcs = [reward_score, everything, with_worlds, lengths, pair, together]
    rewards_module.logger.warning_once.cache_clear()
    with caplog.at_level("WARNING"):
        reward = JointReward(funcs, [2.0, 1.0, 1.0, 0.5, 0.1, 3.0], num_agents=2)
    assert reward.by_keywords == [True, True, False, False, False, False]
    assert reward.per_agent == [False, False, True, True, False, False]
    assert reward.one_list == [False] * 5 + [True]
    prompts = [["p0", "p0"], ["p1", "p1"]]
    total, per_func, by_agent = reward(answers, 1, {"environments": worlds, "prompts": prompts})
    assert per_func == [[1.0, 5.0], [2.0, 2.0], [2.5, 7.0], [1.5, 2.0], [3.0, 20.0], [0.0, 0.0]]
    assert by_agent[2] == [[3.0, 6.0], [2.0, 8.0]]  # with_worlds: [agent][joint action], each on its world
    assert total == pytest.approx([2 * 1 + 2 + 2.5 + 0.5 * 1.5 + 0.1 * 3, 2 * 5 + 2 + 7 + 0.5 * 2 + 0.1 * 20])
    for name in ("reward_score", "everything"):  # the inferred mapping, said once each, with how to state it
        assert caplog.text.count(f"Reward function '{name}'") == 1 and f"joint({name})" in caplog.text
    assert "names no completions" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING"):
        stated = JointReward([joint(reward_score)], None, num_agents=2)
    assert caplog.text == "" and stated([["a"], ["b"]], 1, {"environments": [Board(4.0)]})[0] == [4.0]


def test_an_environment_reward_called_per_joint_action_gets_its_own_world():
    @per_joint_action
    def one(environments, **kwargs):  # CoMLRL's one joint action per call: the worlds are cut like the rows
        (env,) = environments
        return env.reward

    worlds = [Board(2.0), Board(3.0)]
    total, _, _ = JointReward([one], None, num_agents=2)([["a", "b"], ["c", "d"]], 1, {"environments": worlds})
    assert total == [2.0, 3.0]


def test_the_task_gives_a_value_for_every_reward_keyword():
    """`rewards.joint.REWARD_KEYWORDS` is the one list: the rollout's task gives each keyword a value (`turn` is the
    reward's own, per call), and the dataset's columns beside them."""
    reward = JointReward([lambda completions_0, completions_1: [0.0]], None, num_agents=2)
    task = TeamTask(reward, None, None, tokenizers=[None, None], worlds=object())
    keywords = task.reward_keywords([{"prompt": "p", "level": 3}], [["p0", "p1"]], worlds=["world"])
    assert set(keywords) == {*rewards_module.REWARD_KEYWORDS, "level"} - {"turn"}
    assert keywords["environments"] == ["world"] and keywords["level"] == [3]
