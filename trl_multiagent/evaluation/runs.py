"""The runs: a `MAGRPOTrainer` built with the saved agents in given seats (eval mode), its own rollout over held-out
prompts, the team run, the untrained team, the role swap and best-of-N with one agent at the team's sampled tokens,
and `evaluate_team`, which runs them all (the package docstring says what each run does)."""

from __future__ import annotations

import gc
import math
import os
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field

from ..checkpoint import load_adapter_weights
from .errors import EvaluationError
from .saved_team import SavedTeam, find_team, resolve_base, tokenizer_for
from .statistics import CI_METHOD, CONFIDENCE, Interval, mean_ci
from .task import (
    PROMPT_FORMATS,
    TASK_FILE,
    TaskSpec,
    check_task,
    joint_reward_arity,
    load_task,
    resolve_task,
    spec_name,
)


@dataclass
class Settings:
    num_turns: int = 2
    greedy: bool = False
    num_generations: int = 4
    max_new_tokens: int = 24
    temperature: float = 1.0
    seed: int = 0
    batch_size: int = 4  # held-out prompts per rollout
    # "auto" (chat when the tokenizer has a chat template), "chat" or "plain"; None: the task file's, else "auto"
    prompt_format: str | None = None
    untrained: bool = True
    role_swap: bool = True
    best_of_n: bool = True
    single_agent: int = 0
    max_best_of: int = 256


@dataclass
class RunResult:
    """One run: which agent sits in each seat, each turn's interval over prompts and the per-prompt values."""

    name: str
    seats: list[int]
    turns: dict[int, Interval]
    per_prompt: dict[int, list[float]]
    sampled_tokens: int
    joint_answers_per_prompt: dict[int, float]
    extra: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        return {
            "name": self.name,
            "seats": self.seats,
            "sampled_tokens": self.sampled_tokens,
            "joint_answers_per_prompt": {str(t): v for t, v in self.joint_answers_per_prompt.items()},
            "turns": {str(t): asdict(i) for t, i in self.turns.items()},
            "per_prompt": {str(t): v for t, v in self.per_prompt.items()},
            **self.extra,
        }


def build_trainer(
    team: SavedTeam,
    seats: Sequence[int],
    reward: Callable,
    transition: Callable | None,
    prompts: list,
    settings: Settings,
    output_dir: str,
    k: int,
    sample: bool,
):
    """A `MAGRPOTrainer` whose seat i is played by saved agent `seats[i]`, in eval mode, for rollouts of K = `k`."""
    from datasets import Dataset

    from ..config import MAGRPOConfig
    from ..trainer import MAGRPOTrainer

    n = len(seats)
    args = MAGRPOConfig(
        output_dir=output_dir,
        num_agents=n,
        num_turns=settings.num_turns,
        num_generations=2,  # training's group size: unused, no step runs
        per_device_train_batch_size=2,
        num_generations_eval=k,
        per_device_eval_batch_size=k,
        eval_do_sample=sample,
        temperature=settings.temperature,
        max_completion_length=settings.max_new_tokens,
        early_termination_threshold=None,  # every prompt reaches every turn
        beta=0.0,  # no reference log-probs: nothing is trained
        max_steps=1,
        report_to="none",
        logging_strategy="no",
        save_strategy="no",
        seed=settings.seed,
        disable_tqdm=True,
    )
    tokenizers = [tokenizer_for(team, s) for s in seats]
    kwargs = dict(
        processing_class=tokenizers,
        reward_funcs=reward,
        external_transition=transition if settings.num_turns > 1 else None,
        train_dataset=Dataset.from_dict({"prompt": prompts}),
        args=args,
    )
    if team.kind == "full":
        trainer = MAGRPOTrainer(model=[team.agent_dirs[s] for s in seats], **kwargs)
    else:
        from peft import PeftConfig

        configs = []
        for s in seats:
            config = PeftConfig.from_pretrained(team.agent_dirs[s])
            config.inference_mode = False
            config.base_model_name_or_path = team.bases[s]
            configs.append(config)
        if team.kind == "shared_lora":  # the base once, one adapter per seat: the trainer's shared-base team
            trainer = MAGRPOTrainer(model=team.bases[0], num_agents=n, peft_config=configs, **kwargs)
        else:  # one base per agent, each with its adapter
            trainer = MAGRPOTrainer(model=[team.bases[s] for s in seats], peft_config=configs, **kwargs)
        built = trainer.team
        for seat, agent in enumerate(seats):
            load_adapter_weights(built.agent(seat), team.agent_dirs[agent], built.adapter_name(seat))
    trainer.model.eval()
    return trainer


@dataclass
class PromptTrees:
    """Per prompt, per turn, the joint rewards of its joint answers; and the sampled tokens per prompt."""

    rewards: list[dict[int, list[float]]]
    tokens: list[int]


def tree_rewards(tree, num_rows: int) -> PromptTrees:
    """Per row of a rollout batch, each turn's joint rewards, and the tokens its nodes sampled (every agent)."""
    rewards: list[dict[int, list[float]]] = [{} for _ in range(num_rows)]
    tokens = [0] * num_rows
    for node in tree.nodes:
        tokens[node.row] += sum(len(ids) for agent in node.completion_ids for ids in agent)
        turn = rewards[node.row].setdefault(node.turn, [])
        turn.extend(tree.joint_actions[a].reward for a in node.joint_actions)
    return PromptTrees(rewards, tokens)


def rollout(trainer, prompts: list, k: int, batch_size: int, progress=None) -> PromptTrees:
    """The trainer's own rollout (eval mode) over `prompts`, `batch_size` prompts at a time: each prompt's tree."""
    import torch

    rewards, tokens = [], []
    for start in range(0, len(prompts), batch_size):
        batch = prompts[start : start + batch_size]
        with torch.no_grad():
            tree = trainer.rollout([{"prompt": p} for p in batch], k)
        found = tree_rewards(tree, len(batch))
        rewards += found.rewards
        tokens += found.tokens
        if progress is not None:
            progress.update(len(batch))
    return PromptTrees(rewards, tokens)


def _progress(total: int | None, desc: str, enabled: bool, unit: str = "prompt"):
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit=unit, disable=not enabled, file=sys.stderr)


def run_team(trainer, name, seats, prompts, settings: Settings, progress: bool) -> RunResult:
    k = 1 if settings.greedy else settings.num_generations
    with _progress(len(prompts), f"{name} (seats {seats})", progress) as bar:
        found = rollout(trainer, prompts, k, settings.batch_size, bar)
    per_prompt = {
        t: [sum(r[t]) / len(r[t]) if r.get(t) else math.nan for r in found.rewards]
        for t in range(1, settings.num_turns + 1)
    }
    answers = {t: sum(len(r.get(t, [])) for r in found.rewards) / len(prompts) for t in per_prompt}
    return RunResult(
        name, list(seats), {t: mean_ci(v) for t, v in per_prompt.items()}, per_prompt, sum(found.tokens), answers
    )


def run_best_of_n(trainer, seats, prompts, settings: Settings, budget: int, progress: bool) -> RunResult:
    """One agent in every seat: N independent sampled rollouts per prompt (chains of one joint answer per turn), N
    chosen so that the sampled tokens match `budget` (see the package docstring); the best by final-turn reward."""
    chains: list[list[dict[int, list[float]]]] = [[] for _ in prompts]
    used, samples, rounds = 0, 0, []
    rows_per_batch = max(1, settings.batch_size * max(1, settings.num_generations))
    with _progress(None, f"best-of-N (agent {seats[0]} in every seat)", progress, unit="rollout") as bar:
        while samples < settings.max_best_of:
            if samples == 0:
                k = 1  # the first round measures what one sample per prompt costs
            else:
                per_sample = used / samples
                remaining = budget - used
                if remaining <= per_sample / 2:
                    break  # one more sample per prompt would end further from the budget than now
                k = max(1, math.floor(remaining / per_sample))
                k = min(k, settings.max_best_of - samples)
            rows = [p for p in prompts for _ in range(k)]  # each row: an independent chain of K = 1
            found = rollout(trainer, rows, 1, rows_per_batch)
            for index, chain in enumerate(found.rewards):
                chains[index // k].append(chain)
            used += sum(found.tokens)
            samples += k
            rounds.append({"samples_per_prompt": k, "sampled_tokens": sum(found.tokens)})
            bar.update(len(rows))
            bar.set_postfix_str(f"N={samples}, tokens {used}/{budget}")
    last = settings.num_turns
    per_prompt: dict[int, list[float]] = {t: [] for t in range(1, last + 1)}
    for prompt_chains in chains:
        final = [c[last][0] if c.get(last) else -math.inf for c in prompt_chains]
        best = prompt_chains[max(range(len(final)), key=lambda j: (final[j], -j))]
        for t in per_prompt:
            per_prompt[t].append(best[t][0] if best.get(t) else math.nan)
    extra = {
        "single_agent": seats[0],
        "N": samples,
        "team_sampled_tokens": budget,
        "tokens_per_sample": used / samples if samples else math.nan,
        "rounds": rounds,
        "selection": "per prompt, the rollout with the highest final-turn reward among N (first on ties)",
    }
    answers = {t: float(samples) for t in per_prompt}
    return RunResult(
        "best_of_n", list(seats), {t: mean_ci(v) for t, v in per_prompt.items()}, per_prompt, used, answers, extra
    )


UNTRAINED_FROM_BASE = "the adapters' base without the adapters"
UNTRAINED_FROM_TASK = "the models training started from ({}'s initial_models)"


def untrained_team(team: SavedTeam, task: TaskSpec) -> tuple[SavedTeam | None, str]:
    """The team before training, and what it is: for adapters, their base alone in each seat; for full weights, the
    task's `initial_models` (one per agent). None and the reason when a full-weight team's task records none."""
    if team.kind != "full":
        return SavedTeam(team.folder, "full", list(team.bases), [None] * team.num_agents), UNTRAINED_FROM_BASE
    models = task.initial_models
    if models is None:
        return None, (
            f"no untrained row: the agents are full weights and no initial_models are recorded (give "
            f"--initial_models, one per agent, or write_task_file(..., initial_models=[...]) in {TASK_FILE})"
        )
    if len(models) != team.num_agents:
        raise EvaluationError(
            f"{task.label('initial_models')}: {len(models)} initial models {models} for the {team.num_agents} agents "
            f"in {team.folder!r}; give one per agent."
        )
    dirs = [resolve_base(m, task.label("initial_models")) for m in models]
    return SavedTeam(team.folder, "full", dirs, [None] * team.num_agents), UNTRAINED_FROM_TASK.format(
        task.file or "--initial_models"
    )


def evaluate_team(
    folder: str,
    *,
    reward: str | Callable | None = None,
    transition: str | Callable | None = None,
    prompts: str | Sequence | None = None,
    base_model: str | None = None,
    initial_models: Sequence[str] | None = None,
    progress: bool = True,
    **settings,
) -> dict:
    """Evaluate the team saved in `folder` (see the package docstring); returns what `evaluation.json` holds.

    `reward`, `transition`, `prompts`: callables / a list, or `module:attribute` strings (prompts also a `.jsonl`
    path); each one None takes its part from `folder/evaluation_task.json` (see `task`), as does `initial_models`
    (the untrained row of a full-weight team). Every argument is checked before the first `module:attribute` is
    imported. `settings`: the fields of `Settings` (num_turns, greedy, num_generations, max_new_tokens, temperature,
    seed, batch_size, prompt_format, untrained, role_swap, best_of_n, single_agent, max_best_of).
    """
    settings = Settings(**settings)
    if settings.num_turns < 1:
        raise EvaluationError(f"--num_turns must be >= 1, got {settings.num_turns}.")
    if settings.num_generations < 1:
        raise EvaluationError(f"--num_generations must be >= 1, got {settings.num_generations}.")
    if settings.prompt_format not in (None, *PROMPT_FORMATS):
        raise EvaluationError(f"--prompt_format must be auto, chat or plain, got {settings.prompt_format!r}.")
    team = find_team(folder, base_model)
    n = team.num_agents
    if settings.best_of_n and not 0 <= settings.single_agent < n:
        raise EvaluationError(f"--single_agent {settings.single_agent}: the team in {folder!r} has agents 0..{n - 1}.")
    task = resolve_task(folder, reward, transition, prompts, settings.prompt_format, initial_models)
    settings.prompt_format = task.prompt_format
    check_task(task, folder, settings.num_turns)
    untrained, untrained_from = untrained_team(team, task) if settings.untrained else (None, "")
    tokenizer = tokenizer_for(team, 0)
    reward_fn, transition_fn, prompt_list, chat = load_task(task, tokenizer)  # the first import of the task's code
    arity = joint_reward_arity(reward_fn)
    if arity is not None and arity != n:
        raise EvaluationError(
            f"{task.label('reward')} {spec_name(task.reward)}: the reward scores {arity} agents (it takes "
            f"{arity} lists of completions), but {folder!r} holds {n} agent folders "
            f"({', '.join(os.path.basename(d) for d in team.agent_dirs)}). Give the folder of a {arity}-agent team, "
            f"or a --reward (and --transition) for {n} agents."
        )
    result = {
        "folder": os.path.abspath(folder),
        "team": {"num_agents": n, "kind": team.kind, "agents": team.agent_dirs, "bases": team.bases},
        "task": {
            "reward": spec_name(task.reward),
            "transition": None if settings.num_turns == 1 else spec_name(task.transition),
            "prompts": spec_name(task.prompts),
            "num_prompts": len(prompt_list),
            "chat_prompts": chat,
            "task_file": task.file,
            "initial_models": task.initial_models,
        },
        "settings": {
            **asdict(settings),
            "decoding": "greedy" if settings.greedy else "sampled",
            "joint_answers": "aligned; every joint answer continued; early termination off",
            "confidence": CONFIDENCE,
            "interval": CI_METHOD,
            "unit": "held-out prompt: per prompt and turn, the mean joint reward of its joint answers at that turn",
            "role_swap_seats": "seat i played by agent (i + 1) mod N (two agents: swapped)",
        },
        "runs": {},
    }
    k = 1 if settings.greedy else settings.num_generations
    with tempfile.TemporaryDirectory(prefix="trl_multiagent_eval_") as scratch:
        plans = [("team", team, list(range(n)))]
        if untrained is not None:
            plans.append(("untrained", untrained, list(range(n))))
        elif settings.untrained:
            result["untrained_skipped"] = untrained_from
        if settings.role_swap and n > 1:
            plans.append(("role_swap", team, [(i + 1) % n for i in range(n)]))
        for name, agents, seats in plans:
            trainer = build_trainer(
                agents, seats, reward_fn, transition_fn, prompt_list, settings, scratch, k, not settings.greedy
            )
            result["runs"][name] = run_team(trainer, name, seats, prompt_list, settings, progress).to_json()
            if name == "untrained":
                result["runs"][name].update(models=agents.agent_dirs, untrained=untrained_from)
            del trainer
            gc.collect()  # one team in memory at a time
        if settings.best_of_n:
            seats = [settings.single_agent] * n
            trainer = build_trainer(team, seats, reward_fn, transition_fn, prompt_list, settings, scratch, 1, True)
            budget = result["runs"]["team"]["sampled_tokens"]
            result["runs"]["best_of_n"] = run_best_of_n(
                trainer, seats, prompt_list, settings, budget, progress
            ).to_json()
            del trainer
    return result
