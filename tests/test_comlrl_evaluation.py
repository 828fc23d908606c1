"""CoMLRL 1.4.3's evaluation in its face: `evaluate(num_eval_samples=...)`, its `eval/turn_{t}/...` keys and values,
what `eval_logger`/`eval_aggregator` receive, and how the evaluation is logged (comlrl/evaluation.py)."""

import pytest
from datasets import Dataset
from transformers.integrations.integration_utils import rewrite_logs

from trl_multiagent.comlrl import MAGRPOConfig, MAGRPOTrainer
from trl_multiagent.demo.testing import make_model


ROWS = [{"prompt": "count to three", "id": 0}, {"prompt": "name a colour", "id": 1}, {"prompt": "say hi", "id": 2}]


def score(first: str, second: str) -> float:
    """Differs between answers (the tiny models' answers all have max_new_tokens tokens)."""
    return float(sum(map(ord, first + second)) % 7)


def joint_score(completions1, completions2):
    return [score(a, b) for a, b in zip(completions1, completions2, strict=True)]


def feedback(prompt, agent_completions, num_agents, prompt_history_per_agent, response_history_per_agent):
    return [f"{prompt} (you said {len(answer)} characters)" for answer in agent_completions]


def build(tmp_path, tokenizer, calls, eval_dataset=ROWS, **overrides):
    def eval_logger(**kwargs):
        calls.append(kwargs)
        return [{"turn_lengths": [len(answer) for answer in path]} for path in kwargs["agent_completions_turns"][1]]

    def eval_aggregator(metrics, num_turns):
        calls.append({"aggregated": metrics, "num_turns": num_turns})
        return {f"turn_{t + 1}/agent_1_length": sum(m["turn_lengths"][t] for m in metrics) for t in range(num_turns)}

    values = dict(
        output_dir=str(tmp_path / "run"), num_turns=2, num_generations=2, max_new_tokens=4, num_train_epochs=1,
        logging_steps=1, eval_interval=0, eval_num_samples=1, eval_batch_size=2, report_to="none", seed=0,
    )  # fmt: skip
    values.update(overrides)
    return MAGRPOTrainer(
        agents=[make_model(tokenizer, seed=0), make_model(tokenizer, seed=1)], tokenizer=tokenizer,
        reward_func=joint_score, reward_processor=lambda r: 2.0 * r + 1.0, external_transition=feedback,
        eval_dataset=eval_dataset, eval_logger=eval_logger, eval_aggregator=eval_aggregator,
        args=MAGRPOConfig(**values),
    )  # fmt: skip


def test_evaluate_returns_comlrl_keys_and_values_from_one_path_per_row(tmp_path, tokenizer):
    calls = []
    # CoMLRL's default early_termination_threshold (-0.2) with rewards >= 1 would end every training branch after
    # turn 1; CoMLRL's evaluation runs every turn all the same.
    trainer = build(tmp_path, tokenizer, calls)
    mode = trainer.model.training
    metrics = trainer.evaluate(num_eval_samples=3)
    assert trainer.model.training is mode  # more than eval_num_samples=1: the argument wins

    logged, aggregated = calls
    completions = logged["agent_completions_turns"]  # [agent][row][turn]
    assert len(completions) == 2 and [len(rows) for rows in completions] == [3, 3]
    assert all(len(path) == 2 and all(isinstance(a, str) for a in path) for rows in completions for path in rows)
    assert logged["batch_items"] == ROWS and logged["prompts"] == [row["prompt"] for row in ROWS]
    assert aggregated["num_turns"] == 2 and len(aggregated["aggregated"]) == 3

    rewards = [[2.0 * score(completions[0][r][t], completions[1][r][t]) + 1.0 for t in range(2)] for r in range(3)]
    lengths = [sum(len(completions[1][r][t]) for r in range(3)) for t in range(2)]
    assert metrics == pytest.approx(
        {
            "eval/turn_1/agent_1_length": lengths[0],
            "eval/turn_2/agent_1_length": lengths[1],
            "eval/turn_1/reward_mean": sum(r[0] for r in rewards) / 3,
            "eval/turn_2/reward_mean": sum(r[1] for r in rewards) / 3,
            "eval/turn_1/expected_return": sum(r[0] + r[1] for r in rewards) / 3,  # undiscounted, as CoMLRL
            "eval/turn_2/expected_return": sum(r[1] for r in rewards) / 3,
        }
    )
    # the last batch (eval_batch_size=2: rows 0-1, then row 2): turn 2's prompts came from the transition, fed the
    # answers of turn 1's path
    turn_2 = trainer.last_rollout.nodes[-1]
    assert turn_2.turn == 2 and turn_2.prompts == [
        f"say hi (you said {len(completions[agent][2][0])} characters)" for agent in range(2)
    ]

    # logged once, under the Trainer's evaluation prefix, nothing else: wandb's callback writes CoMLRL's keys
    entry = trainer.state.log_history[-1]
    values = {k: v for k, v in entry.items() if k not in ("epoch", "step")}
    assert rewrite_logs(values) == metrics
    assert sum("eval_turn_1/reward_mean" in h for h in trainer.state.log_history) == 1


def test_evaluate_takes_eval_num_samples_and_evaluates_at_least_one_row(tmp_path, tokenizer):
    calls = []
    trainer = build(tmp_path, tokenizer, calls, num_turns=1)
    assert len(trainer.eval_dataset) == 3  # kept whole: evaluate(num_eval_samples=...) may take more rows
    assert set(trainer.evaluate()) == {
        "eval/turn_1/agent_1_length", "eval/turn_1/reward_mean", "eval/turn_1/expected_return"
    }  # fmt: skip
    assert len(calls[0]["batch_items"]) == 1  # eval_num_samples=1
    trainer.evaluate(num_eval_samples=0)
    assert calls[2]["batch_items"] == ROWS[:1]  # CoMLRL evaluates one row at 0
    trainer.evaluate(num_eval_samples=10)
    assert calls[4]["batch_items"] == ROWS  # the rows there are
    with pytest.raises(TypeError, match="MAGRPOTrainer.evaluate: num_eval_samples must be an integer, got 'all'"):
        trainer.evaluate(num_eval_samples="all")
    with pytest.raises(ValueError, match=r"MAGRPOTrainer.evaluate: ignore_keys=\['loss'\]"):
        trainer.evaluate(ignore_keys=["loss"])

    none = build(tmp_path, tokenizer, [], eval_dataset=None)
    assert none.evaluate(num_eval_samples=2) == {} and none.state.log_history == []


def test_scheduled_evaluation_logs_comlrl_metrics_only(tmp_path, tokenizer):
    """`eval_interval` evaluates before training and every interval: each evaluation line holds CoMLRL's metrics
    alone (no TRL `eval_loss`, runtime or rollout keys), and training goes on in train mode."""
    calls = []
    # logging every 2 steps: at step 1 the evaluation runs while that step's training values wait to be logged
    trainer = build(
        tmp_path, tokenizer, calls, num_turns=1, eval_interval=2, eval_num_samples=2, logging_steps=2,
        early_termination_threshold=None,
    )  # fmt: skip
    trainer.train_dataset = Dataset.from_list([{"prompt": p} for p in ("a b", "c d", "e f", "g h")])
    trainer.train()
    evaluations = [h for h in trainer.state.log_history if "eval_turn_1/reward_mean" in h]
    # before training (eval_on_start), then every 2 prompts: a step takes two (rollout_buffer_size=2 one-node trees)
    assert trainer.state.global_step == 2 and [h["step"] for h in evaluations] == [0, 1, 2]
    for h in evaluations:
        assert set(h) == {
            "eval_turn_1/reward_mean", "eval_turn_1/expected_return", "eval_turn_1/agent_1_length", "epoch", "step"
        }  # fmt: skip
    assert [len(c["batch_items"]) for c in calls if "batch_items" in c] == [2, 2, 2]
    training = [h for h in trainer.state.log_history if "turn_1/reward_mean" in h]
    assert [h["step"] for h in training] == [2] and training[0]["reward"] == pytest.approx(
        training[0]["turn_1/reward_mean"]
    )  # steps 1 and 2's values, logged as training's
