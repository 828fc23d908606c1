"""Evaluate a saved team on held-out prompts: each turn's reward with a 95% confidence interval, the team before
training (untrained), the same team with its agents in other seats (role swap), and one agent alone at the same token
budget (best-of-N).

    python -m trl_multiagent.evaluation outputs/length_ratio            # right after the main job (its task file)
    python -m trl_multiagent.evaluation outputs/length_ratio --greedy   # greedy decoding, one joint answer per turn
    python -m trl_multiagent.evaluation DIR --reward my_task:reward --transition my_task:feedback \\
        --prompts my_task:HELD_OUT --num_turns 2 --max_new_tokens 64

What it does (`evaluate_team`, which the command calls):

* **Loading.** `DIR/agent_{i}/` as `trainer.save_model` writes them: full weights (`config.json` and weights) or PEFT
  adapters (`adapter_config.json`). Adapters on one base (the shared-base LoRA team of the main job) are loaded as the
  trainer builds that team: the base once (`model=base, peft_config=...`), then each agent's adapter into its seat
  (`checkpoint.load_adapter_weights`). Adapters on different bases are loaded one base per agent. Each agent's
  tokenizer comes from its folder (else from the base). As `trl_multiagent.load_team` loads them (the same
  `find_team`): an adapter whose recorded base folder is missing here and is the embedded model's prepared copy
  loads on the copy prepared here (`embedded_model.prepare_again`); one whose base is a Hub id the Hub cannot serve
  (`HF_HUB_OFFLINE`, no connection) loads on that id's prepared copy (`~/.cache/trl_multiagent/...`,
  `$TRL_MULTIAGENT_CACHE`), said at WARNING as the dequantised copy it is, or stops naming the id;
  `--base_model` names another base.
* **The rollout.** The training rollout itself: a `MAGRPOTrainer` built with those agents and the task's reward and
  transition, put in eval mode (`trainer.model.eval()`), whose public `trainer.rollout(rows, K)` grows one tree per
  held-out prompt. No log-prob pass, optimizer step or weight change runs. Sampled
  (`eval_do_sample=True`, K = `--num_generations` answers per agent and node, aligned joint answers, every joint answer
  continued: K joint answers at turn 1, K^2 at turn 2, ...) or greedy (`--greedy`: K = 1, one joint answer per turn).
  Early termination is off: every prompt reaches every turn, so each turn has one value per prompt.
* **The statistic.** The unit is a held-out prompt. For each prompt and turn, the mean joint reward of that prompt's
  joint answers at that turn; over the prompts, the mean, the 95% confidence interval of the mean (Student t with
  n - 1 degrees of freedom: mean ± t(0.975, n-1) · s / √n, s the sample standard deviation) and n.
* **Untrained** (`--untrained`, on by default). The same run with the team before training: for adapters, their base
  without the adapters in every seat; for full weights, the models training started from, one per agent, as the task
  file's `initial_models` (or `--initial_models`) records them. Without them a full-weight team gets no untrained
  row, and the report says why.
* **Role swap** (`--role_swap`, on by default). The same run with the agents in other seats: seat i is played by agent
  (i + 1) mod N, a rotation by one; for two agents, the swap (agent 1 answers first, agent 0 second). Everything else
  (prompts, seed, settings) is equal. A team whose agents learned their roles scores lower swapped.
* **Best-of-N with one agent** (`--best_of_n`, on by default). Agent `--single_agent` (0 by default) plays every seat.
  For each prompt it samples N independent rollouts (each a chain of `--num_turns` turns with one joint answer per
  turn, the transition between turns as in the team run), and the rollout with the highest **final-turn** reward is
  kept (the first one on ties); its reward at each turn is that prompt's value for that turn. With one turn this is
  plain best-of-N over N joint answers. N is chosen so that this run samples as many tokens (every agent, every turn,
  summed over the prompts, counted from the trees' `completion_ids`) as the team run did on the same prompts: rounds
  of samples are added (the first of one sample per prompt measures the tokens one sample costs) until one more sample
  per prompt would move the total further from the team's than it is; the two totals then differ by at most about one
  sample's worth. The report states N and both token counts. N is the same for every prompt. The selection uses the
  reward, as best-of-N does: an oracle baseline, which the team has to beat without one.
* **The task** (`task`). The reward, the transition, the held-out prompts and their format come from the flags, and
  what the flags leave out from `DIR/evaluation_task.json`, which the training script writes next to its agents
  (`write_task_file`). Every argument that needs no import (the folder, the flags, each `module:attribute`'s form, a
  `.jsonl` prompts file) is checked before the first import (`task.check_task`): importing a module runs its
  top-level code. The main job (`recipes/length_ratio.py`) writes its own there: the length-ratio reward, its
  feedback transition (the chat form, as it trains with chat prompts) and the held-out prompts of
  `trl_multiagent.demo.examples.HELD_OUT_PROMPTS` (none of them a training prompt). Without a reward or prompts from
  either, the command stops (exit 2) and names both ways. The package names no task of its own.

Writes `DIR/evaluation.json` (every number, the settings, n and the token counts) and `DIR/evaluation.md` (the table),
or under `--out`, and prints the table.

The modules, one job each: `statistics` (the t quantile and `mean_ci`: plain functions), `saved_team` (the agent
folders, their bases and tokenizers), `task` (the task from flags or the task file), `runs` (the trainer, the
rollouts, role swap, best-of-N, `evaluate_team`), `report` (the table, `evaluation.json` and `evaluation.md`), `cli`
(the flags; `__main__` runs it), `errors` (`EvaluationError`).
"""

from ..prepared_models import CACHE_ENV  # public here: the cache `resolve_base` searches for a prepared base
from .cli import main, make_parser
from .errors import PROG, EvaluationError
from .report import markdown_table, report_text, write_report
from .runs import (
    PromptTrees,
    RunResult,
    Settings,
    build_trainer,
    evaluate_team,
    rollout,
    run_best_of_n,
    run_team,
    untrained_team,
)
from .saved_team import SavedTeam, find_team, resolve_base, tokenizer_for
from .statistics import CI_METHOD, CONFIDENCE, Interval, mean_ci, t_cdf, t_quantile
from .task import (
    TASK_FILE,
    TaskSpec,
    check_task,
    joint_reward_arity,
    load_callable,
    load_object,
    load_prompts,
    load_task,
    parse_spec,
    read_task_file,
    resolve_task,
    write_task_file,
)


__all__ = [
    "CACHE_ENV",
    "CI_METHOD",
    "CONFIDENCE",
    "PROG",
    "TASK_FILE",
    "EvaluationError",
    "Interval",
    "PromptTrees",
    "RunResult",
    "SavedTeam",
    "Settings",
    "TaskSpec",
    "build_trainer",
    "check_task",
    "evaluate_team",
    "find_team",
    "joint_reward_arity",
    "load_callable",
    "load_object",
    "load_prompts",
    "load_task",
    "main",
    "make_parser",
    "markdown_table",
    "mean_ci",
    "parse_spec",
    "read_task_file",
    "report_text",
    "resolve_base",
    "resolve_task",
    "rollout",
    "run_best_of_n",
    "run_team",
    "t_cdf",
    "t_quantile",
    "tokenizer_for",
    "untrained_team",
    "write_report",
    "write_task_file",
]
