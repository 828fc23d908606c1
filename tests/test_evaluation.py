"""`python -m trl_multiagent.evaluation`: the confidence interval, the role swap, best-of-N's token budget, the task (flags,
else the run folder's evaluation_task.json), the errors, and the command end to end on a team trained and saved by
`MAGRPOTrainer`."""

import json
import math
import os
import shutil
import subprocess
import sys

import pytest
import torch
from conftest import SEED_PROMPTS, length_feedback, length_ratio_reward
from datasets import Dataset
from safetensors.torch import load_file, save_file

from trl_multiagent import MAGRPOConfig, MAGRPOTrainer
from trl_multiagent import evaluation as ev
from trl_multiagent.demo.testing import make_model
from trl_multiagent.generation.output import Generation
from trl_multiagent.rollout.tree import run_rollout


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EVAL_PROMPTS = ["Describe a library under the sea:", "Invent a new sport:", "Write a lullaby for a robot:"]
EXAMPLES = "trl_multiagent.demo.examples"  # the main job's task, as its recipe names it in evaluation_task.json


# --- the confidence interval ------------------------------------------------------------------------------------------


def test_mean_ci_on_hand_computed_values():
    # values 0.2 0.4 0.6 0.8: mean 0.5, s^2 = (0.09 + 0.01 + 0.01 + 0.09) / 3, t(0.975, 3) = 3.182446
    interval = ev.mean_ci([0.2, 0.4, 0.6, 0.8])
    s = math.sqrt(0.2 / 3)
    assert interval.n == 4 and interval.mean == pytest.approx(0.5)
    assert interval.sd == pytest.approx(s)
    assert interval.half_width == pytest.approx(3.182446 * s / 2, rel=1e-6)
    assert (interval.low, interval.high) == pytest.approx((0.5 - 3.182446 * s / 2, 0.5 + 3.182446 * s / 2), rel=1e-6)
    # n = 2: t(0.975, 1) = 12.7062; values 1 and 3: s = sqrt(2), half-width 12.7062 * sqrt(2) / sqrt(2)
    assert ev.mean_ci([1.0, 3.0]).half_width == pytest.approx(12.7062, rel=1e-5)
    # NaN (a prompt without that turn) is left out of n
    assert ev.mean_ci([1.0, math.nan, 3.0]).n == 2
    assert math.isnan(ev.mean_ci([0.5]).half_width) and ev.mean_ci([]).n == 0


@pytest.mark.parametrize(
    ("p", "df", "expected"),
    [
        (0.975, 1, 12.7062047),
        (0.975, 3, 3.1824463),
        (0.975, 7, 2.3646243),
        (0.975, 30, 2.0422725),
        (0.025, 9, -2.2621572),
    ],
)
def test_t_quantile_matches_the_tables(p, df, expected):
    assert ev.t_quantile(p, df) == pytest.approx(expected, rel=1e-6)


# --- best-of-N: N chosen for the token budget -------------------------------------------------------------------------


class ScriptedTrainer:
    """Stands in for `MAGRPOTrainer` in `run_team` and `run_best_of_n`: each call grows a real tree (`run_rollout`) of
    K = `k` answers per agent and node, each `length` tokens long. The joint reward is a counter (so that the best
    rollout is known), or with `encoded=True`, 100 * the prompt's number ("p3": 3) + 10 * turn + agent 0's answer index."""

    def __init__(self, num_agents, num_turns, length, k=1, encoded=False):
        self.num_agents, self.num_turns, self.length, self.k, self.encoded = num_agents, num_turns, length, k, encoded
        self.counter = 0

    def rollout(self, rows, num_generations):
        assert num_generations == self.k

        def generate(agent, prompts, environments, samples):
            ids = [[7] * self.length for _ in range(len(prompts) * self.k)]
            return Generation(prompt_ids=[[1]] * len(prompts), completion_ids=ids, completions=["x"] * len(ids))

        def score(turn, tree, actions):
            values = []
            for a in actions:
                action = tree.joint_actions[a]
                self.counter += 1
                if self.encoded:
                    number = int(rows[tree.nodes[action.node].row]["prompt"][1:])
                    values.append(100.0 * number + 10 * turn + action.choice[0])
                else:
                    values.append(float((self.counter * 37) % 11))
            return values

        return run_rollout(
            rows, num_agents=self.num_agents, num_generations=self.k, num_turns=self.num_turns, joint_mode="aligned",
            termination_threshold=None, agent_prompts=lambda row: [row["prompt"]] * self.num_agents,
            generate=generate, score=score,
            transition=lambda turn, tree, actions: [["next"] * self.num_agents] * len(actions),
        )  # fmt: skip


def test_each_prompt_and_turn_is_the_mean_over_its_joint_answers():
    # 3 prompts in batches of 2, K = 2, two turns: 2 joint answers per prompt at turn 1 (agent 0's answers 0 and 1),
    # 4 at turn 2 (answers 0, 1, 0, 1): prompt p's values are 100 p + 10.5 and 100 p + 20.5
    trainer = ScriptedTrainer(num_agents=2, num_turns=2, length=3, k=2, encoded=True)
    settings = ev.Settings(num_turns=2, num_generations=2, batch_size=2)
    result = ev.run_team(trainer, "team", [0, 1], ["p0", "p1", "p2"], settings, progress=False)
    assert result.per_prompt == {1: [10.5, 110.5, 210.5], 2: [20.5, 120.5, 220.5]}
    assert result.joint_answers_per_prompt == {1: 2.0, 2: 4.0}
    assert result.turns[2].n == 3 and result.turns[2].mean == pytest.approx(120.5)
    assert result.turns[2].half_width == pytest.approx(ev.t_quantile(0.975, 2) * 100 / math.sqrt(3))
    # tokens: per prompt, 2 agents x (2 + 4) answers of 3 tokens
    assert result.sampled_tokens == 3 * 2 * 6 * 3


@pytest.mark.parametrize(("budget", "expected_n"), [(200, 7), (209, 7), (215, 7), (226, 8), (30, 1), (5, 1)])
def test_best_of_n_matches_the_team_token_budget(budget, expected_n):
    # 3 prompts, 2 agents, 1 turn, 5 tokens per completion: one sample per prompt costs 3 * 2 * 5 = 30 tokens, so the
    # closest N to a budget of 200 tokens is 7 (210 tokens; 6 would be 180)
    trainer = ScriptedTrainer(num_agents=2, num_turns=1, length=5)
    settings = ev.Settings(num_turns=1, batch_size=2, num_generations=2)
    result = ev.run_best_of_n(trainer, [0, 0], ["a", "b", "c"], settings, budget, progress=False)
    assert result.extra["N"] == expected_n
    assert result.sampled_tokens == 30 * expected_n
    # within half a sample's tokens, unless N = 1 (the first sample) already costs more than the budget
    assert abs(result.sampled_tokens - budget) <= max(15, 30 * expected_n - budget)
    assert result.turns[1].n == 3


def test_best_of_n_keeps_the_rollout_with_the_best_final_turn_reward():
    settings = ev.Settings(num_turns=2, batch_size=8)
    # Each chain costs 2 agents * 2 turns = 4 tokens; 2 prompts: a budget of 40 is N = 5.
    trainer = ScriptedTrainer(num_agents=2, num_turns=2, length=1)
    result = ev.run_best_of_n(trainer, [0, 0], ["a", "b"], settings, 40, progress=False)
    assert result.extra["N"] == 5 and result.sampled_tokens == 40
    # Replay the counter: rewards are assigned turn by turn per round; recompute each chain's two rewards.
    chains = recorded_chains(trainer_rounds=result.extra["rounds"], prompts=2, turns=2)
    for prompt in range(2):
        best = max(chains[prompt], key=lambda c: c[1])  # by the final (second) turn's reward
        assert result.per_prompt[2][prompt] == best[1]
        assert result.per_prompt[1][prompt] == best[0]


def recorded_chains(trainer_rounds, prompts, turns):
    """The chains the ScriptedTrainer scored, in its counter's order: per round, turn 1 of every row, then turn 2."""
    counter, chains = 0, [[] for _ in range(prompts)]
    for round_ in trainer_rounds:
        k = round_["samples_per_prompt"]
        rows = prompts * k
        rewards = [[None] * turns for _ in range(rows)]
        for turn in range(turns):
            for row in range(rows):
                counter += 1
                rewards[row][turn] = float((counter * 37) % 11)
        for row in range(rows):
            chains[row // k].append(rewards[row])
    return chains


# --- loading a team, the role swap ------------------------------------------------------------------------------------


def save_full_team(folder, tokenizer, seeds):
    for i, seed in enumerate(seeds):
        make_model(tokenizer, seed=seed).save_pretrained(os.path.join(folder, f"agent_{i}"))
        tokenizer.save_pretrained(os.path.join(folder, f"agent_{i}"))


def train_lora_team(folder, base_dir, tokenizer, tmp_path):
    """Two adapters on one base, trained one step by MAGRPOTrainer and saved with `save_model`; agent 1's adapter is
    then pushed far from agent 0's, so that the two agents answer differently."""
    from peft import LoraConfig

    args = MAGRPOConfig(
        output_dir=str(tmp_path / "lora_run"), num_turns=2, num_generations=2, per_device_train_batch_size=2,
        max_new_tokens=8, max_steps=1, learning_rate=1e-2, report_to="none", seed=0, save_strategy="no",
    )  # fmt: skip
    trainer = MAGRPOTrainer(
        model=base_dir, num_agents=2, processing_class=tokenizer, peft_config=LoraConfig(r=4, target_modules="all-linear"),
        reward_funcs=length_ratio_reward, external_transition=length_feedback,
        train_dataset=Dataset.from_dict({"prompt": SEED_PROMPTS}), args=args,
    )  # fmt: skip
    trainer.train()
    trainer.save_model(str(folder))
    path = os.path.join(folder, "agent_1", "adapter_model.safetensors")
    weights = load_file(path)
    generator = torch.Generator().manual_seed(1)
    save_file({k: v + torch.randn(v.shape, generator=generator) * 2.0 for k, v in weights.items()}, path)


def swapped_copy(folder, target):
    """The same team with its two agent folders exchanged: agent_0 <-> agent_1."""
    shutil.copytree(os.path.join(folder, "agent_1"), os.path.join(target, "agent_0"))
    shutil.copytree(os.path.join(folder, "agent_0"), os.path.join(target, "agent_1"))


@pytest.mark.parametrize("kind", ["full", "shared_lora"])
def test_role_swap_equals_the_team_with_its_agents_reversed(tmp_path, tokenizer, tiny_model_dir, kind):
    team_dir, reversed_dir = tmp_path / "team", tmp_path / "reversed"
    if kind == "full":
        save_full_team(team_dir, tokenizer, seeds=[0, 1])
    else:
        train_lora_team(team_dir, tiny_model_dir, tokenizer, tmp_path)
    swapped_copy(team_dir, reversed_dir)
    assert ev.find_team(str(team_dir)).kind == kind
    settings = dict(num_turns=2, num_generations=2, max_new_tokens=8, best_of_n=False, untrained=False, progress=False)
    settings["greedy"] = kind == "shared_lora"  # one decoding each: sampling (same seed) and greedy
    task = dict(reward=length_ratio_reward, transition=length_feedback, prompts=EVAL_PROMPTS)
    ours = ev.evaluate_team(str(team_dir), **task, **settings)
    theirs = ev.evaluate_team(str(reversed_dir), role_swap=False, **task, **settings)
    swap, reversed_team = ours["runs"]["role_swap"], theirs["runs"]["team"]
    assert swap["seats"] == [1, 0] and reversed_team["seats"] == [0, 1]
    assert swap["per_prompt"] == reversed_team["per_prompt"]
    assert swap["sampled_tokens"] == reversed_team["sampled_tokens"]
    # and the swap changed something: the two agents really answer differently
    assert ours["runs"]["team"]["per_prompt"] != swap["per_prompt"]


def test_rotation_by_one_for_three_agents(tmp_path, tokenizer):
    save_full_team(tmp_path / "three", tokenizer, seeds=[0, 1, 2])

    def three_way(completions1, completions2, completions3):
        return [
            float(len(a) + 2 * len(b) + 3 * len(c))
            for a, b, c in zip(completions1, completions2, completions3, strict=True)
        ]

    result = ev.evaluate_team(
        str(tmp_path / "three"), reward=three_way, prompts=EVAL_PROMPTS[:2], num_turns=1, greedy=True,
        max_new_tokens=4, best_of_n=False, progress=False,
    )  # fmt: skip
    assert result["runs"]["role_swap"]["seats"] == [1, 2, 0]


def seat_weighted(completions1, completions2):
    """A reward that tells texts and seats apart: the character codes of the first answer plus twice the second's."""
    return [float(sum(map(ord, a)) + 2 * sum(map(ord, b))) for a, b in zip(completions1, completions2, strict=True)]


def test_the_untrained_row_runs_the_initial_models_a_full_weight_team_records(tmp_path, tokenizer):
    """The task file's initial_models, here the team's own two models in reversed order: the untrained row must then
    give exactly the role swap's values (same models, same seats, same seed), and differ from the team's."""
    save_full_team(tmp_path / "team", tokenizer, seeds=[0, 1])
    initial = [str(tmp_path / "initial" / name) for name in ("was_agent_1", "was_agent_0")]
    shutil.copytree(tmp_path / "team" / "agent_1", initial[0])
    shutil.copytree(tmp_path / "team" / "agent_0", initial[1])
    task_file = ev.write_task_file(
        tmp_path / "team", reward="conftest:length_ratio_reward", prompts=f"{EXAMPLES}:HELD_OUT_PROMPTS",
        initial_models=initial,
    )  # fmt: skip
    result = ev.evaluate_team(
        str(tmp_path / "team"), reward=seat_weighted, prompts=EVAL_PROMPTS, num_turns=1, num_generations=2,
        max_new_tokens=8, best_of_n=False, progress=False,
    )  # fmt: skip
    untrained, swap, team = (result["runs"][name] for name in ("untrained", "role_swap", "team"))
    assert list(result["runs"]) == ["team", "untrained", "role_swap"]
    assert untrained["models"] == initial and untrained["seats"] == [0, 1]
    assert untrained["untrained"] == f"the models training started from ({task_file}'s initial_models)"
    assert untrained["per_prompt"] == swap["per_prompt"] != team["per_prompt"]
    assert untrained["turns"]["1"]["n"] == len(EVAL_PROMPTS) and untrained["turns"]["1"]["half_width"] > 0
    text = ev.report_text(result)
    mean = untrained["turns"]["1"]
    assert f"| untrained: initial models | 0 1 | 1 | {mean['mean']:.3f} | {mean['half_width']:.3f} |" in text
    assert f"Untrained: the models training started from ({task_file}'s initial_models)" in text
    # without initial_models, no row, and the report says why
    os.remove(task_file)
    result = ev.evaluate_team(
        str(tmp_path / "team"), reward=length_ratio_reward, prompts=EVAL_PROMPTS[:2], num_turns=1, greedy=True,
        max_new_tokens=2, best_of_n=False, role_swap=False, progress=False,
    )  # fmt: skip
    assert list(result["runs"]) == ["team"]
    assert "Untrained: no untrained row: the agents are full weights and no initial_models" in ev.report_text(result)


def test_the_untrained_row_of_adapters_is_their_base_alone(tmp_path, tokenizer, tiny_model_dir):
    """Adapters saved before any step (LoRA's B is zero): the base alone answers exactly as the team does."""
    from peft import LoraConfig

    args = MAGRPOConfig(
        output_dir=str(tmp_path / "run"), num_generations=2, per_device_train_batch_size=2, max_new_tokens=4,
        report_to="none", save_strategy="no",
    )  # fmt: skip
    trainer = MAGRPOTrainer(
        model=tiny_model_dir, num_agents=2, processing_class=tokenizer, peft_config=LoraConfig(r=4, target_modules="all-linear"),
        reward_funcs=length_ratio_reward, train_dataset=Dataset.from_dict({"prompt": SEED_PROMPTS}), args=args,
    )  # fmt: skip
    trainer.save_model(str(tmp_path / "out"))
    result = ev.evaluate_team(
        str(tmp_path / "out"), reward=length_ratio_reward, prompts=EVAL_PROMPTS, num_turns=1, num_generations=2,
        max_new_tokens=6, best_of_n=False, role_swap=False, progress=False,
    )  # fmt: skip
    untrained, team = result["runs"]["untrained"], result["runs"]["team"]
    assert untrained["models"] == [tiny_model_dir, tiny_model_dir] and result["team"]["kind"] == "shared_lora"
    assert untrained["untrained"] == "the adapters' base without the adapters"
    assert untrained["per_prompt"] == team["per_prompt"] and untrained["sampled_tokens"] == team["sampled_tokens"]
    assert "| untrained: base, no adapters | 0 1 | 1 |" in ev.report_text(result)


# --- errors name the flag or value ------------------------------------------------------------------------------------


def run_main(args, capsys):
    with pytest.raises(SystemExit) as exit_info:
        ev.main([*args, "--no_progress"])
    return exit_info.value.code, capsys.readouterr().err


def test_errors_name_the_flag_or_value(tmp_path, tokenizer, capsys):
    code, err = run_main([str(tmp_path / "nowhere")], capsys)
    assert code == 2 and "OUTPUT_DIR" in err and "nowhere" in err and "no such folder" in err
    (tmp_path / "empty").mkdir()
    code, err = run_main([str(tmp_path / "empty")], capsys)
    assert code == 2 and "no agent_0/ folder" in err and "no agent_* folders" in err
    three = tmp_path / "three"
    for i in range(3):
        (three / f"agent_{i}").mkdir(parents=True)
        (three / f"agent_{i}" / "config.json").write_text("{}")
        tokenizer.save_pretrained(three / f"agent_{i}")
    # no task: neither flags nor the run folder's evaluation_task.json; the error names both ways
    code, err = run_main([str(three)], capsys)
    assert code == 2 and "--reward and --prompts not given" in err and "evaluation_task.json" in err, err
    code, err = run_main([str(three), "--reward", "json:loads"], capsys)
    assert code == 2 and "(--prompts not given" in err and "evaluation_task.json" in err, err
    # three agents, but the task file's reward (the main job's) scores two
    ev.write_task_file(
        three, reward=f"{EXAMPLES}:length_ratio_reward", transition=f"{EXAMPLES}:length_feedback",
        prompts=f"{EXAMPLES}:HELD_OUT_PROMPTS",
    )  # fmt: skip
    code, err = run_main([str(three)], capsys)
    assert code == 2 and "--reward" in err and "scores 2 agents" in err and "3 agent folders" in err
    for spec, says in [
        ("no_colon", "expected `module:attribute`"),
        ("no_such_module_xyz:f", "cannot import module 'no_such_module_xyz'"),
        ("json:no_such_function", "has no attribute 'no_such_function'"),
        ("json:__doc__", "not a function"),
    ]:
        code, err = run_main([str(three), "--reward", spec], capsys)
        assert code == 2 and f"--reward {spec!r}" in err and says in err, err
    code, err = run_main([str(three), "--prompts", str(tmp_path / "missing.jsonl")], capsys)
    assert code == 2 and "--prompts" in err and "no such file" in err
    with pytest.raises(SystemExit):  # argparse, allow_abbrev=False: a shortened flag is refused
        ev.main([str(three), "--num_turn", "1"])
    assert "unrecognized arguments: --num_turn" in capsys.readouterr().err


def test_every_argument_is_checked_before_a_task_module_is_imported(tmp_path, tokenizer, capsys, monkeypatch):
    """`--reward module:function` imports the module, which runs its top-level code (a training script without a
    __main__ guard would train). Here that code writes a file: each wrong argument must stop the command first."""
    team = tmp_path / "team"
    for i in range(2):
        (team / f"agent_{i}").mkdir(parents=True)
        (team / f"agent_{i}" / "config.json").write_text("{}")
        tokenizer.save_pretrained(team / f"agent_{i}")
    code_dir, imported = tmp_path / "code", tmp_path / "imported.txt"
    code_dir.mkdir()
    (code_dir / "runs_when_imported.py").write_text(
        f"open({str(imported)!r}, 'w').write('top-level code ran')\n\n"
        "def three_agent_reward(completions1, completions2, completions3):\n    return [0.0] * len(completions1)\n"
    )
    monkeypatch.syspath_prepend(str(code_dir))
    reward = ["--reward", "runs_when_imported:three_agent_reward"]
    (tmp_path / "a_file").write_text("")
    prompts = tmp_path / "held_out.jsonl"
    prompts.write_text('"a prompt"\n')
    for args, says in [
        (
            ["--prompts", str(tmp_path / "missing.jsonl")],
            f"--prompts {str(tmp_path / 'missing.jsonl')!r}: no such file",
        ),
        (["--prompts", "no_colon"], "--prompts 'no_colon': expected `module:attribute`"),
        (["--prompts", str(prompts), "--transition", "no_colon"], "--transition 'no_colon': expected"),
        (["--prompts", str(prompts), "--num_turns", "2"], "--num_turns 2 needs --transition"),
        (["--prompts", str(prompts), "--num_turns", "1", "--initial_models", "a", "b", "c"], "3 initial models"),
        (["--prompts", str(prompts), "--out", str(tmp_path / "a_file")], "is a file"),
        (["--prompts", str(prompts), "--single_agent", "5"], "--single_agent 5"),
    ]:
        code, err = run_main([str(team), *reward, *args], capsys)
        assert code == 2 and says in err, (args, err)
        assert not imported.exists(), args
    # the control: with every argument right, the module is imported (and its reward then refused: 3 agents, 2 seats)
    code, err = run_main([str(team), *reward, "--prompts", str(prompts), "--num_turns", "1"], capsys)
    assert code == 2 and "scores 3 agents" in err and imported.read_text() == "top-level code ran"


def test_the_task_comes_from_the_flags_else_the_run_folders_file(tmp_path):
    path = ev.write_task_file(tmp_path, reward="m:reward", prompts="held_out.jsonl", prompt_format="chat")
    assert path == str(tmp_path / "evaluation_task.json")
    task = ev.resolve_task(str(tmp_path))  # a relative .jsonl is read from the run folder
    assert (task.reward, task.transition, task.prompts) == ("m:reward", None, str(tmp_path / "held_out.jsonl"))
    assert task.prompt_format == "chat" and task.file == path and task.label("reward") == f"{path} 'reward'"
    # each flag given wins over the file's key; the others still come from the file
    task = ev.resolve_task(str(tmp_path), reward="x:r", transition="x:t", prompt_format="plain")
    assert (task.reward, task.transition, task.prompts, task.prompt_format) == (
        "x:r", "x:t", str(tmp_path / "held_out.jsonl"), "plain"
    )  # fmt: skip
    assert task.label("reward") == "--reward" and task.label("prompts") == f"{path} 'prompts'"
    # flags alone, no file: prompt_format "auto"
    other = tmp_path / "other"
    other.mkdir()
    task = ev.resolve_task(str(other), reward="x:r", prompts="x:p")
    assert task.file is None and task.prompt_format == "auto"
    # a bad file, and a bad spec in it, are named
    (other / "evaluation_task.json").write_text('{"reward": "json:__doc__", "prompt": "x:p"}')
    with pytest.raises(ev.EvaluationError, match=r"unknown keys \['prompt'\]"):
        ev.resolve_task(str(other))
    (other / "evaluation_task.json").write_text('{"reward": "json:__doc__", "prompts": ["a"]}')
    with pytest.raises(ev.EvaluationError, match="'prompts' must be a string"):
        ev.resolve_task(str(other))
    ev.write_task_file(other, reward="json:__doc__", prompts=f"{EXAMPLES}:HELD_OUT_PROMPTS")
    with pytest.raises(ev.EvaluationError, match="evaluation_task.json 'reward' 'json:__doc__' is a str"):
        ev.load_task(ev.resolve_task(str(other)), tokenizer=None)
    with pytest.raises(ValueError, match="reward must be a `module:attribute` string"):
        ev.write_task_file(other, reward=len, prompts="x:p")


# --- end to end: a trained, saved team through the command ------------------------------------------------------------


@pytest.mark.slow  # a run of its own, kept out of the default suite for time (docs/tests.md, "The default suite")
def test_the_command_on_a_trained_saved_team(tmp_path, tokenizer, tiny_model_dir):
    team_dir = tmp_path / "out"
    train_lora_team(team_dir, tiny_model_dir, tokenizer, tmp_path)
    # the reward and transition from the run folder's task file, as the recipe writes it; --prompts wins over its own
    task_file = ev.write_task_file(
        team_dir, reward=f"{EXAMPLES}:length_ratio_reward", transition=f"{EXAMPLES}:length_feedback",
        prompts=f"{EXAMPLES}:HELD_OUT_PROMPTS",
    )  # fmt: skip
    prompts = tmp_path / "held_out.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in EVAL_PROMPTS))
    command = [
        sys.executable, "-m", "trl_multiagent.evaluation", str(team_dir), "--prompts", str(prompts),
        "--max_new_tokens", "8", "--num_turns", "2", "--num_generations", "2",
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads((team_dir / "evaluation.json").read_text())
    assert result["team"]["kind"] == "shared_lora" and result["task"]["num_prompts"] == len(EVAL_PROMPTS)
    assert result["task"]["task_file"] == task_file and result["task"]["prompts"] == str(prompts)
    assert result["task"]["transition"] == f"{EXAMPLES}:length_feedback"
    assert list(result["runs"]) == ["team", "untrained", "role_swap", "best_of_n"]
    # untrained: the base alone in both seats; training (and agent 1's pushed adapter) changed the answers
    untrained = result["runs"]["untrained"]
    assert untrained["models"] == [tiny_model_dir, tiny_model_dir]
    assert untrained["per_prompt"] != result["runs"]["team"]["per_prompt"]
    for run in result["runs"].values():
        assert set(run["turns"]) == {"1", "2"}
        for turn, interval in run["turns"].items():
            values = run["per_prompt"][turn]
            assert interval["n"] == len(EVAL_PROMPTS) == len(values)
            check = ev.mean_ci(values)
            assert interval["mean"] == pytest.approx(sum(values) / len(values))
            assert interval["half_width"] == pytest.approx(check.half_width)
            assert interval["low"] == pytest.approx(interval["mean"] - interval["half_width"])
    # K = 2, every joint answer continued: 2 joint answers per prompt at turn 1, 4 at turn 2
    assert result["runs"]["team"]["joint_answers_per_prompt"] == {"1": 2.0, "2": 4.0}
    best = result["runs"]["best_of_n"]
    assert best["team_sampled_tokens"] == result["runs"]["team"]["sampled_tokens"]
    assert abs(best["sampled_tokens"] - best["team_sampled_tokens"]) <= best["tokens_per_sample"]
    assert best["N"] == sum(r["samples_per_prompt"] for r in best["rounds"])
    table = (team_dir / "evaluation.md").read_text()
    assert "| run | seats | turn | mean reward | ± 95% CI | 95% CI | n |" in table
    team_turn_2 = result["runs"]["team"]["turns"]["2"]
    assert f"| team | 0 1 | 2 | {team_turn_2['mean']:.3f} | {team_turn_2['half_width']:.3f} |" in table
    assert f"| best-of-{best['N']}, agent 0 alone | 0 0 | 1 |" in table
    assert "| role swap | 1 0 | 1 |" in table
    untrained_turn_1 = untrained["turns"]["1"]
    assert f"| untrained: base, no adapters | 0 1 | 1 | {untrained_turn_1['mean']:.3f} |" in table
    assert f"| team | 0 1 | 2 | {team_turn_2['mean']:.3f} |" in done.stdout  # the table is printed too


def test_an_adapters_hub_base_resolves_to_its_prepared_folder_when_the_hub_is_out_of_reach(tmp_path, monkeypatch):
    """`resolve_base` loads a Hub id from the Hub where it answers, and where it cannot (here HF_HUB_OFFLINE) from the
    folder `prepare_default_model` prepares for it (in `$TRL_MULTIAGENT_CACHE` here, named by the id's last part,
    complete once its marker names the id): `prepared_models.resolve_model_id`, as the trainer resolves it."""
    from huggingface_hub import HfApi, constants

    from trl_multiagent.demo.models import HUB_ID, MARKER, default_model_dir

    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # the default cache, also searched, holds nothing
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub_cache"))  # nor does the Hub's cache
    monkeypatch.setenv(ev.CACHE_ENV, str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    prepared = default_model_dir()
    prepared.mkdir()
    with pytest.raises(ev.EvaluationError, match="HF_HUB_OFFLINE is set"):  # no marker yet: an incomplete folder
        ev.resolve_base(HUB_ID, "agent_0")
    (prepared / MARKER).write_text(json.dumps({"hub_id": HUB_ID}))
    assert ev.resolve_base(HUB_ID, "agent_0") == str(prepared) == str(tmp_path / "SmolLM2-135M-Instruct")
    with pytest.raises(ev.EvaluationError, match="someone/SmolLM2-135M-Instruct"):  # not that id's copy
        ev.resolve_base("someone/SmolLM2-135M-Instruct", "agent_0")
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(HfApi, "model_info", lambda self, repo_id, **kwargs: None)  # the Hub answers
    assert ev.resolve_base(HUB_ID, "agent_0") == HUB_ID


@pytest.mark.slow
def test_the_command_on_the_embedded_model(tmp_path):
    """The main job's path: a shared-base LoRA team on the embedded SmolLM2-135M-Instruct, saved as the recipe saves
    it (its adapters record, as PEFT writes, the prepared folder as their base), evaluated on the task file the recipe
    writes. Untrained (zero
    LoRA updates), small settings: about a minute on 2 CPU cores."""
    from peft import LoraConfig

    from trl_multiagent.demo.examples import HELD_OUT_PROMPTS, PROMPTS, as_user_message, chat_length_feedback
    from trl_multiagent.demo.models import default_model_dir, is_prepared

    if not is_prepared(default_model_dir()):
        pytest.skip("the embedded model is not prepared (python -m trl_multiagent.models)")
    args = MAGRPOConfig(
        output_dir=str(tmp_path / "run"), num_turns=2, num_generations=2, per_device_train_batch_size=2,
        max_new_tokens=8, report_to="none", save_strategy="no",
    )  # fmt: skip
    trainer = MAGRPOTrainer(
        model=str(default_model_dir()), num_agents=2, peft_config=LoraConfig(r=4, target_modules="all-linear"),
        reward_funcs=length_ratio_reward, external_transition=chat_length_feedback,
        train_dataset=Dataset.from_dict({"prompt": [as_user_message(p) for p in PROMPTS]}), args=args,
    )  # fmt: skip
    trainer.save_model(str(tmp_path / "out"))
    ev.write_task_file(  # as recipes/length_ratio.py writes it
        tmp_path / "out", reward=f"{EXAMPLES}:length_ratio_reward", transition=f"{EXAMPLES}:chat_length_feedback",
        prompts=f"{EXAMPLES}:HELD_OUT_PROMPTS", prompt_format="chat",
    )  # fmt: skip
    assert json.loads((tmp_path / "out" / "agent_0" / "adapter_config.json").read_text())[
        "base_model_name_or_path"
    ] == str(default_model_dir())
    command = [
        sys.executable, "-m", "trl_multiagent.evaluation", str(tmp_path / "out"), "--num_generations", "2",
        "--max_new_tokens", "8", "--batch_size", "8", "--no_progress",
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads((tmp_path / "out" / "evaluation.json").read_text())
    assert result["team"]["kind"] == "shared_lora" and result["team"]["bases"][0] == str(default_model_dir())
    assert result["task"]["chat_prompts"] and result["task"]["transition"].endswith(":chat_length_feedback")
    assert result["task"]["num_prompts"] == len(HELD_OUT_PROMPTS) == result["runs"]["team"]["turns"]["2"]["n"]
    # untrained adapters are equal: the swapped team is the same team
    assert result["runs"]["role_swap"]["per_prompt"] == result["runs"]["team"]["per_prompt"]
