"""The task: the user's formatters, joint reward and transition behind the three calls the rollout makes.

"Task" is the user's functions; "environment" is only TRL's (`environment_factory`, whose instances are the worlds of
`environments.worlds`). `TeamTask.first_prompts`, `score` and `next_prompts` are `rollout.run_rollout`'s `agent_prompts`,
`score` and `transition`. The task checks what the user's functions return (naming the function, the turn and the row),
builds each branch's history and times the reward and transition phases. What one rollout's calls keep (the values the
metrics, the completions table and the recorded trees read) is a `TaskRecord`, made for that rollout (`TeamTask.record`)
and handed to each call: nothing of a rollout stays on the task. With TRL's `environment_factory`
(`environments.worlds`), the reward functions and the transition also get ``environments=``: the world each joint
action acted on.
"""

from __future__ import annotations

import contextlib
from collections import defaultdict
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from transformers import TrainerState
from transformers.utils import logging
from trl.data_utils import is_conversational

from ..callables import Transition, check_prompt
from ..rewards.joint import JointReward
from ..timing import PhaseTimes
from .tree import RolloutTree


logger = logging.get_logger(__name__)

PLACEHOLDER_ANSWER = "placeholder answer"
# TRL's prompt for a row without one when an environment owns the task: `reset`'s observation fills it
EMPTY_CHAT = [{"role": "user", "content": ""}]
# Joint actions of the placeholder reward call: more than one, so that a reward returning a list of fixed length
# fails when the trainer is built, not after the first generation.
PLACEHOLDER_JOINT_ACTIONS = 2


@dataclass
class TaskRecord:
    """What the task's calls keep during one rollout, for the trainer to log: made per rollout (`TeamTask.record`),
    handed to `TeamTask.score` and `TeamTask.next_prompts`, and read once the rollout is over.

    The rewards get `trainer_state` (the trainer's state when the rollout began; a fresh `TrainerState` for the
    build-time check, which runs before the trainer exists). What they hand back through TRL's `log_metric(name,
    value)` is in `logged_metrics`, through `log_extra(column, values)` in `extra_columns` (each joint action's value,
    for the completions table; the build-time check's are checked, then dropped).
    """

    reward_names: list[str]  # the joint reward's functions, in the order of the values below
    trainer_state: TrainerState
    times: PhaseTimes = field(default_factory=lambda: PhaseTimes(("reward", "transition")))
    # turn -> per reward function, the values it returned (for `turn_{t}/rewards/{name}/mean`)
    reward_values: dict[int, list[list[float]]] = field(default_factory=dict)
    # (function, agent) -> a per-agent reward's values
    agent_reward_values: defaultdict[tuple[int, int], list[float]] = field(default_factory=lambda: defaultdict(list))
    action_rewards: dict[int, tuple] = field(default_factory=dict)  # joint action id -> each function's joint value
    # `log_extra` column -> {(joint action id, agent or None for every agent): value} (the completions table)
    extra_columns: dict[str, dict[tuple[int, int | None], Any]] = field(default_factory=dict)
    logged_metrics: list[tuple[str, float]] = field(default_factory=list)  # `log_metric`'s (name, value), in order

    def log_metric(self, name: str, value: float) -> None:
        """TRL's `log_metric` reward keyword: `value` joins the step's metrics (`logged_metrics`, which the trainer
        logs after the rollout, averaged with the step's other values of `name`)."""
        self.logged_metrics.append((name, value))

    def log_extra(self, action_ids: list[int] | None, column: str, entries: list[tuple]) -> None:
        """`rewards.joint.JointReward`'s `log_extra` sink: `(index in action_ids, agent or None, value)` entries; None
        `action_ids` (the build-time check) keeps nothing."""
        if action_ids is not None:
            values = self.extra_columns.setdefault(column, {})
            for j, agent, value in entries:
                values[(action_ids[j], agent)] = value


class TeamTask:
    """The formatters, the joint reward and the transition of one team, as the rollout calls them.

    Args:
        joint_reward: the team's reward functions (`rewards.joint.JointReward`).
        transition: the user's transition (`callables.Transition`), or None with one turn.
        formatters: one callable per agent mapping a dataset row to its prompt, or None (the row's `prompt`).
        tokenizers: one per agent: chat prompts need a chat template, and `completion_ids` of the placeholder call.
        worlds: the team's environments (`environments.worlds.Worlds`), or None.
    """

    def __init__(
        self,
        joint_reward: JointReward,
        transition: Transition | None,
        formatters: list | None,
        tokenizers: list,
        worlds=None,
    ):
        self.joint_reward, self.transition, self.formatters = joint_reward, transition, formatters
        self.worlds = worlds  # `environments.worlds.Worlds`, or None
        self.tokenizers = tokenizers
        self.num_agents = len(tokenizers)

    def record(self, num_turns: int, trainer_state: TrainerState | None = None) -> TaskRecord:
        """A new record for one rollout of `num_turns` turns, whose rewards get `trainer_state`."""
        return TaskRecord(
            reward_names=list(self.joint_reward.names),
            trainer_state=trainer_state if trainer_state is not None else TrainerState(),
            reward_values={t: [[] for _ in self.joint_reward.names] for t in range(1, num_turns + 1)},
        )

    # ------------------------------------------------------------------ the rollout's three calls

    def first_prompts(self, row: dict) -> list:
        """Each agent's first prompt: the row's `prompt`, or its formatter's result, checked. With an environment, as
        in TRL, the prompt may be blank or absent (an empty user message): `reset` writes the task into it."""
        if self.formatters is None:
            prompt = row.get("prompt", EMPTY_CHAT) if self.worlds is not None else row["prompt"]
            where = f"The dataset row {_short_row(row)}'s 'prompt'"
            check_prompt(where, prompt, conversational=True, blank_ok=self.worlds is not None)
            prompts, source = [prompt] * self.num_agents, f"the dataset row {_short_row(row)}"
        else:
            prompts = [f(row) for f in self.formatters]
            for i, prompt in enumerate(prompts):
                check_prompt(f"formatters[{i}] (agent {i}) on the row {_short_row(row)}: its result", prompt, True)
            source = f"its formatter on the row {_short_row(row)}"
        self._check_chat_templates(prompts, source)
        return prompts

    def score(
        self, record: TaskRecord, rows: list[dict], turn: int, tree: RolloutTree, action_ids: list[int]
    ) -> list[float]:
        """The joint reward of each joint action of `action_ids` (one call of each reward function per turn); what
        the rewards return and log is kept in the rollout's `record`."""
        with record.times.phase("reward"):
            actions = [tree.joint_actions[a] for a in action_ids]
            nodes = [tree.nodes[a.node] for a in actions]
            answers = [tree.answers(a) for a in action_ids]
            completions = [[answer[i] for answer in answers] for i in range(self.num_agents)]
            ids = [
                [node.completion_ids[i][a.choice[i]] for a, node in zip(actions, nodes, strict=True)]
                for i in range(self.num_agents)
            ]
            worlds = [a.environment for a in actions]
            prompts = [tree.action_prompts(a) for a in action_ids]
            keywords = self.reward_keywords(record, [rows[node.row] for node in nodes], prompts, worlds)
            keywords["log_extra"] = partial(record.log_extra, action_ids)
            messages = None
            if nodes and nodes[0].messages:  # the agents had tools: TRL's rewards get their messages
                messages = [
                    [n.messages[i][a.choice[i]] for a, n in zip(actions, nodes, strict=True)]
                    for i in range(self.num_agents)
                ]
            rewards, per_func, per_agent = self.joint_reward(completions, turn, keywords, ids, messages)
            warn_unscored(per_func, rows, nodes, prompts, answers, turn)
            if self.joint_reward.normalize_then_sum:  # what credit learns from; `reward` stays on the user's scale
                normalized = self.joint_reward.normalized_sum(per_func, [a.node for a in actions])
                for action, value in zip(actions, normalized, strict=True):
                    action.normalized_reward = value
            own = self.joint_reward.own_rewards(per_func, per_agent, turn)
        if own is not None:  # for `team_reward_weight` below 1
            for a, agents_own in zip(action_ids, own, strict=True):
                tree.joint_actions[a].own_rewards = agents_own
        for f, values in enumerate(per_func):
            record.reward_values[turn][f].extend(v for v in values if v is not None)
        for f, agents in per_agent.items():
            for i, values in enumerate(agents):
                record.agent_reward_values[(f, i)].extend(v for v in values if v is not None)
        for a, values in zip(action_ids, zip(*per_func, strict=True), strict=True):
            record.action_rewards[a] = values
        return rewards

    def next_prompts(
        self, record: TaskRecord, rows: list[dict], turn: int, tree: RolloutTree, action_ids: list[int]
    ) -> list[list]:
        """The transition of every branch that goes on (async transitions run concurrently), timed in `record`."""
        with record.times.phase("transition"):
            calls = []
            for action_id in action_ids:
                row = rows[tree.nodes[tree.joint_actions[action_id].node].row]
                prompt_history, response_history = tree.history(action_id)
                action = tree.joint_actions[action_id]
                history = branch_history(prompt_history, response_history, action.reward, row)
                if self.worlds is not None:  # the branch's world, once per agent (as the other per-agent arguments)
                    history["environments"] = [action.environment] * self.num_agents
                calls.append((row.get("prompt"), tree.answers(action_id), history))
            prompts = self._transitions(calls, turn)
        return prompts

    # ------------------------------------------------------------------ before training

    def check_functions(self, row: dict, prompts: list, num_turns: int) -> None:
        """Call the reward and the transition once with placeholder answers (the row's first `prompts`), before any
        generation. With an environment, the placeholder joint actions act on the pool's first instance, reset with
        the row (`Worlds.check`); it goes back to the pool afterwards."""
        count = PLACEHOLDER_JOINT_ACTIONS
        answers = [[PLACEHOLDER_ANSWER] * count for _ in range(self.num_agents)]
        ids = [[t.encode(PLACEHOLDER_ANSWER, add_special_tokens=False)] * count for t in self.tokenizers]
        worlds = self.worlds.check(row, prompts, count, num_turns) if self.worlds is not None else [None] * count
        try:
            keywords = self.reward_keywords(self.record(num_turns), [row] * count, [prompts] * count, worlds)
            with _placeholder_call(f"the joint reward {self.joint_reward.names} ({count} joint actions)"):
                self.joint_reward(answers, 1, keywords, ids)
            if self.transition is not None and num_turns > 1:
                branch = [a[0] for a in answers]  # the first joint action goes on to turn 2
                history = branch_history([[p] for p in prompts], [[a] for a in branch], 0.0, row)
                if self.worlds is not None:
                    history["environments"] = [worlds[0]] * self.num_agents
                with _placeholder_call(f"external_transition {self.transition.name!r} (one branch, after turn 1)"):
                    self._transitions([(row.get("prompt"), branch, history)], 1)
        finally:
            if self.worlds is not None:
                self.worlds.release()

    # ------------------------------------------------------------------ helpers

    def reward_keywords(
        self, record: TaskRecord, rows: list[dict], prompts: list[list], worlds: list | None = None
    ) -> dict[str, Any]:
        """The values of the keywords a joint reward may take (`rewards.joint.REWARD_KEYWORDS`, but `turn`, which the reward
        adds per call) and of the dataset columns; `log_metric` and `log_extra` write into `record`."""
        keywords = {
            "prompts": [[p[i] for p in prompts] for i in range(self.num_agents)],
            "trainer_state": record.trainer_state,
            "rows": rows,
            "log_metric": record.log_metric,
            "log_extra": partial(record.log_extra, None),  # `score` keeps the values of its joint actions
        }
        if self.worlds is not None:
            keywords["environments"] = worlds
        for key in rows[0]:
            if key != "prompt":  # no column shadows a keyword: `arguments.datasets.check_column_names` refuses it
                keywords[key] = [row.get(key) for row in rows]
        return keywords

    def _transitions(self, calls: list[tuple], turn: int) -> list[list]:
        """The next prompts of each branch: the transition's for `calls` (`(prompt, agent_completions, history)`),
        each checked against its agent."""
        prompts = self.transition.many(calls, turn)
        for branch in prompts:
            self._check_chat_templates(branch, f"external_transition {self.transition.name!r} after turn {turn}")
        return prompts

    def _check_chat_templates(self, prompts: list, source: str) -> None:
        """Chat messages go only to an agent whose tokenizer has a chat template: transformers would fail at the
        first generation, naming no agent."""
        for i, prompt in enumerate(prompts):
            tokenizer = self.tokenizers[i]
            if is_conversational({"prompt": prompt}) and getattr(tokenizer, "chat_template", None) is None:
                name = getattr(tokenizer, "name_or_path", "")
                raise ValueError(
                    f"MAGRPOTrainer: agent {i}'s prompt from {source} is a list of chat messages, but agent {i}'s "
                    f"tokenizer{f' ({name!r})' if name else ''} has no chat template (`tokenizer.chat_template` is "
                    "None) to turn them into tokens. Give the agents plain-text prompts "
                    "(the recipes' `--prompt_format plain`), or a tokenizer with a chat template (an instruct "
                    "model's, or set `tokenizer.chat_template`)."
                )


def branch_history(prompt_history: list, response_history: list, reward: float, row: dict) -> dict[str, Any]:
    """The transition's history keywords for one branch, and the row's columns (`Transition.HISTORY`)."""
    columns = {k: v for k, v in row.items() if k not in (*Transition.REQUIRED, *Transition.HISTORY)}
    return {
        "prompt_history_per_agent": prompt_history,
        "response_history_per_agent": response_history,
        "reward": reward,
        **columns,
    }


@contextlib.contextmanager
def _placeholder_call(function: str):
    """Say where an error of the placeholder call comes from: raised while the trainer is built, it would look like
    a fault of the trainer's own set-up. The user's exception type is kept."""
    try:
        yield
    except Exception as err:
        note = (
            f"MAGRPOTrainer: this came from the check that calls {function} once when the trainer is built, before "
            f"any generation: on the first training row, with the placeholder answer {PLACEHOLDER_ANSWER!r} from every "
            "agent. Make it handle any text an agent may write, or skip this check with "
            "MAGRPOConfig(check_functions_before_training=False)."
        )
        if hasattr(err, "add_note"):  # Python 3.11+
            err.add_note(note)
        else:
            logger.error(note)
        raise


def warn_unscored(per_func: list, rows: list[dict], nodes: list, prompts: list, answers: list, turn: int) -> None:
    """TRL's warning when every reward function returned None for a joint answer (its reward counts as 0 here)."""
    unscored = [j for j in range(len(answers)) if per_func and all(values[j] is None for values in per_func)]
    if unscored:
        j = unscored[0]
        logger.warning(
            f"All reward functions returned None for the following kwargs:\n{{'row': {_short_row(rows[nodes[j].row])}, "
            f"'turn': {turn}, 'prompts': {prompts[j]!r}, 'completions': {answers[j]!r}}}\nPlease ensure that at "
            f"least one reward function returns a valid reward. ({len(unscored)} joint answer(s) of turn {turn}; "
            "MAGRPOTrainer gives each a joint reward of 0.)"
        )


def _short_row(row: dict, limit: int = 120) -> str:
    text = repr(row)
    return text if len(text) <= limit else text[:limit] + "...}"
