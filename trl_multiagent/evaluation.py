"""Evaluate a saved team on held-out prompts: each turn's reward with a 95% confidence interval, the same team with
its agents in other seats (role swap), and one agent alone at the same token budget (best-of-N).

    python -m trl_multiagent.evaluation outputs/length_ratio            # right after the main job
    python -m trl_multiagent.evaluation outputs/length_ratio --greedy   # greedy decoding, one joint answer per turn
    python -m trl_multiagent.evaluation DIR --reward my_task:reward --transition my_task:feedback \\
        --prompts my_task:HELD_OUT --num_turns 2 --max_new_tokens 64

What it does (`evaluate_team`, which the command calls):

* **Loading.** `DIR/agent_{i}/` as `trainer.save_model` writes them: full weights (`config.json` and weights) or PEFT
  adapters (`adapter_config.json`). Adapters on one base (the shared-base LoRA team of the main job) are loaded as the
  trainer builds that team: the base once (`model=base, peft_config=...`), then each agent's adapter into its seat
  (`checkpoint.load_adapter_weights`). Adapters on different bases are loaded one base per agent. Each agent's
  tokenizer comes from its folder (else from the base). An adapter whose recorded base is the embedded model's Hub id
  (`HuggingFaceTB/SmolLM2-135M-Instruct`) loads on the prepared folder (`~/.cache/trl_multiagent/...`,
  `$TRL_MULTIAGENT_CACHE`) when the Hub id is not a folder here; `--base_model` names another base.
* **The rollout.** The training rollout itself: a `MAGRPOTrainer` built with those agents and the task's reward and
  transition, put in eval mode (`trainer.model.eval()`), whose `_generate_and_score_completions` grows one tree per
  held-out prompt; the tree is read from `trainer.last_rollout`. No optimizer step runs and no weight changes. Sampled
  (`eval_do_sample=True`, K = `--num_generations` answers per agent and node, aligned joint answers, every joint answer
  continued: K joint answers at turn 1, K^2 at turn 2, ...) or greedy (`--greedy`: K = 1, one joint answer per turn).
  Early termination is off: every prompt reaches every turn, so each turn has one value per prompt.
* **The statistic.** The unit is a held-out prompt. For each prompt and turn, the mean joint reward of that prompt's
  joint answers at that turn; over the prompts, the mean, the 95% confidence interval of the mean (Student t with
  n - 1 degrees of freedom: mean ± t(0.975, n-1) · s / √n, s the sample standard deviation) and n.
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

Writes `DIR/evaluation.json` (every number, the settings, n and the token counts) and `DIR/evaluation.md` (the table),
or under `--out`, and prints the table. The default task is the main job's: the length-ratio reward, its feedback
transition and `HELD_OUT_PROMPTS` (none of them a training prompt), with the feedback's chat form when the agents'
tokenizer has a chat template (the main job trains with `--prompt_format chat` on the embedded model). The default
task is named as `module:function` strings (`DEFAULT_TASK`), as a user's task is, so that this module imports none of
the demo tooling.

The confidence interval, on hand-computed values (s = 0.2582, t(0.975, 3) = 3.1824, 3.1824 · 0.2582 / 2 = 0.4109):

>>> interval = mean_ci([0.2, 0.4, 0.6, 0.8])
>>> round(interval.mean, 4), round(interval.half_width, 4), interval.n
(0.5, 0.4109, 4)
>>> round(t_quantile(0.975, 1), 3), round(t_quantile(0.975, 9), 4)
(12.706, 2.2622)
"""

from __future__ import annotations

import argparse
import gc
import importlib
import json
import math
import os
import sys
import tempfile
import warnings
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from .checkpoint import PREPARED_MODEL_MARKER, agent_dir, load_adapter_weights, prepared_hub_id


CONFIDENCE = 0.95
CI_METHOD = "Student t, n - 1 degrees of freedom: mean ± t(0.975, n - 1) · s / sqrt(n), over held-out prompts"
# The main job's task, named as a user's task is (`module:attribute`): the core imports none of the demo tooling.
DEFAULT_TASK = {
    "reward": "trl_multiagent.demo.examples:length_ratio_reward",
    "transition": "trl_multiagent.demo.examples:length_feedback",
    "chat_transition": "trl_multiagent.demo.examples:chat_length_feedback",
    "prompts": "trl_multiagent.evaluation:HELD_OUT_PROMPTS",
}
# Held-out prompts for the length-ratio task, in the style of its four training prompts (`demo.examples.PROMPTS`),
# none of them a training prompt.
HELD_OUT_PROMPTS = [
    "Describe a library under the sea:",
    "Invent a new sport and explain its rules:",
    "Write a lullaby for a robot:",
    "Design a garden on the Moon:",
    "Describe a train that travels through time:",
    "Invent a musical instrument and explain how it sounds:",
    "Write a letter from a cat to its owner:",
    "Design a school for young wizards:",
]
# What the embedded model's prepared folder is called under its cache (`demo.models`): the last part of its Hub id.
CACHE_ENV = "TRL_MULTIAGENT_CACHE"
PROG = "python -m trl_multiagent.evaluation"


class EvaluationError(ValueError):
    """A wrong folder, flag or task; the message names the flag or value."""


# ---------------------------------------------------------------------------------------------------------------------
# Statistics


def _betacf(a: float, b: float, x: float) -> float:
    """The continued fraction of the regularized incomplete beta function (modified Lentz)."""
    tiny, qab, qap, qam = 1e-300, a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 300):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < 1e-15:
            break
    return h


def _betai(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function I_x(a, b)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with `df` degrees of freedom.

    >>> t_cdf(0.0, 5), round(t_cdf(2.5706, 5), 4)
    (0.5, 0.975)
    """
    tail = 0.5 * _betai(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t > 0 else tail


def t_quantile(p: float, df: float) -> float:
    """The `p` quantile of Student's t with `df` degrees of freedom (bisection on `t_cdf`; no scipy needed)."""
    if not 0.0 < p < 1.0 or df <= 0:
        raise ValueError(f"t_quantile: need 0 < p < 1 and df > 0, got p={p}, df={df}.")
    if p < 0.5:
        return -t_quantile(1.0 - p, df)
    low, high = 0.0, 1.0
    while t_cdf(high, df) < p:
        high *= 2.0
    for _ in range(200):
        mid = (low + high) / 2.0
        low, high = (mid, high) if t_cdf(mid, df) < p else (low, mid)
    return (low + high) / 2.0


@dataclass
class Interval:
    """The mean of n values and its confidence interval: `mean ± half_width` = [`low`, `high`]."""

    mean: float
    half_width: float
    low: float
    high: float
    n: int
    sd: float  # the sample standard deviation (n - 1 in the denominator)
    confidence: float = CONFIDENCE


def mean_ci(values: Sequence[float], confidence: float = CONFIDENCE) -> Interval:
    """Mean ± t(1 - (1 - confidence) / 2, n - 1) · s / √n of `values` (NaN values left out).

    With one value the interval is undefined (NaN half-width); with none, the mean is NaN too.

    >>> mean_ci([1.0, 1.0, 1.0])
    Interval(mean=1.0, half_width=0.0, low=1.0, high=1.0, n=3, sd=0.0, confidence=0.95)
    >>> math.isnan(mean_ci([0.7]).half_width)
    True
    """
    values = [float(v) for v in values if not math.isnan(float(v))]
    n = len(values)
    if n == 0:
        return Interval(math.nan, math.nan, math.nan, math.nan, 0, math.nan, confidence)
    mean = sum(values) / n
    if n == 1:
        return Interval(mean, math.nan, math.nan, math.nan, 1, math.nan, confidence)
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    half = t_quantile(1.0 - (1.0 - confidence) / 2.0, n - 1) * sd / math.sqrt(n)
    return Interval(mean, half, mean - half, mean + half, n, sd, confidence)


# ---------------------------------------------------------------------------------------------------------------------
# The saved team and the task


@dataclass
class SavedTeam:
    """What `DIR/agent_{i}/` holds: `kind` is "full" (weights per agent), "shared_lora" (adapters on one base) or
    "lora" (adapters on different bases)."""

    folder: str
    kind: str
    agent_dirs: list[str]
    bases: list[str | None]  # per agent, the base an adapter loads on (None for full weights)

    @property
    def num_agents(self) -> int:
        return len(self.agent_dirs)


def find_team(folder: str, base_model: str | None = None) -> SavedTeam:
    """Read `folder`'s `agent_{i}/` folders (i = 0, 1, ... without gaps) and decide how to load them."""
    if not os.path.isdir(folder):
        raise EvaluationError(
            f"OUTPUT_DIR {folder!r}: no such folder. Give the folder a training run saved its agents in (its "
            "`agent_0/`, `agent_1/`, ...), e.g. after the main job: "
            f"`{PROG} outputs/length_ratio`."
        )
    dirs = []
    while os.path.isdir(agent_dir(folder, len(dirs))):
        dirs.append(agent_dir(folder, len(dirs)))
    found = {os.path.basename(d) for d in dirs}
    others = sorted(n for n in os.listdir(folder) if n.startswith("agent_") and n not in found)
    if not dirs:
        raise EvaluationError(
            f"OUTPUT_DIR {folder!r} has no agent_0/ folder ({'found ' + str(others) if others else 'no agent_* folders'}"
            "): give the folder `trainer.save_model(...)` or the recipe's `--output_dir` wrote the agents into "
            "(or one of its `checkpoint-N/` folders)."
        )
    if others:
        raise EvaluationError(
            f"OUTPUT_DIR {folder!r}: the agent folders must be numbered agent_0 .. agent_(N-1) without gaps; found "
            f"{[os.path.basename(d) for d in dirs]} and also {others}."
        )
    adapters = [os.path.isfile(os.path.join(d, "adapter_config.json")) for d in dirs]
    if not any(adapters):
        for d in dirs:
            if not os.path.isfile(os.path.join(d, "config.json")):
                raise EvaluationError(
                    f"OUTPUT_DIR {folder!r}: {d!r} holds neither config.json nor adapter_config.json."
                )
        return SavedTeam(folder, "full", dirs, [None] * len(dirs))
    if not all(adapters):
        raise EvaluationError(
            f"OUTPUT_DIR {folder!r}: some agents are PEFT adapters and some full models "
            f"({[os.path.basename(d) for d, a in zip(dirs, adapters, strict=True) if a]} are adapters); evaluate a "
            "team saved by one run."
        )
    bases = []
    for d in dirs:
        with open(os.path.join(d, "adapter_config.json")) as file:
            recorded = json.load(file).get("base_model_name_or_path")
        bases.append(resolve_base(base_model or recorded, d))
    return SavedTeam(folder, "shared_lora" if len(set(bases)) == 1 else "lora", dirs, bases)


def resolve_base(base: str | None, adapter: str) -> str:
    """The folder (or Hub id) an adapter's base loads from: `base` when it is a folder here; the embedded model's
    prepared folder when `base` is its Hub id; else `base` as it is (transformers' cache may hold it)."""
    if not base:
        raise EvaluationError(f"{adapter!r}: adapter_config.json names no base model; pass --base_model.")
    if os.path.isdir(os.path.expanduser(base)):
        return os.path.expanduser(base)
    roots = [os.environ.get(CACHE_ENV), os.path.join(os.path.expanduser("~"), ".cache", "trl_multiagent")]
    for root in filter(None, roots):
        candidate = os.path.join(os.path.expanduser(root), base.rsplit("/", 1)[-1])
        if os.path.isfile(os.path.join(candidate, PREPARED_MODEL_MARKER)) and prepared_hub_id(candidate) == base:
            return candidate
    return base


def load_object(spec: str, flag: str) -> Any:
    """`module:attribute` (dots allowed in both) imported, naming `flag` on a bad spec."""
    if not isinstance(spec, str) or spec.count(":") != 1 or not all(spec.split(":")):
        raise EvaluationError(
            f"{flag} {spec!r}: expected `module:attribute` (e.g. `my_task:reward`, with my_task.py importable from "
            "the current folder or installed)."
        )
    module_name, attribute = spec.split(":")
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())  # `python -m` puts the current folder first; a plain interpreter may not
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise EvaluationError(f"{flag} {spec!r}: cannot import module {module_name!r}: {err}") from err
    target = module
    for part in attribute.split("."):
        if not hasattr(target, part):
            raise EvaluationError(f"{flag} {spec!r}: module {module_name!r} has no attribute {attribute!r}.")
        target = getattr(target, part)
    return target


def load_callable(spec: str | Callable, flag: str) -> Callable:
    if callable(spec):
        return spec
    found = load_object(spec, flag)
    if not callable(found):
        raise EvaluationError(f"{flag} {spec!r} is a {type(found).__name__}, not a function.")
    return found


def load_prompts(spec: str | Sequence, flag: str = "--prompts") -> list:
    """Prompts from a list, a `module:attribute` list, or a `.jsonl` file (each line a string, or an object with a
    'prompt': text or chat messages)."""
    if not isinstance(spec, str):
        prompts = list(spec)
    elif spec.endswith(".jsonl"):
        if not os.path.isfile(spec):
            raise EvaluationError(f"{flag} {spec!r}: no such file.")
        prompts = []
        with open(spec) as file:
            for number, line in enumerate(file, 1):
                if line.strip():
                    try:
                        item = json.loads(line)
                    except json.JSONDecodeError as err:
                        raise EvaluationError(f"{flag} {spec!r}, line {number}: not JSON ({err}).") from err
                    if isinstance(item, dict) and "prompt" not in item:
                        raise EvaluationError(f"{flag} {spec!r}, line {number}: an object without a 'prompt' key.")
                    prompts.append(item["prompt"] if isinstance(item, dict) else item)
    else:
        found = load_object(spec, flag)
        if isinstance(found, str) or not isinstance(found, Sequence):
            raise EvaluationError(f"{flag} {spec!r} is a {type(found).__name__}, not a list of prompts.")
        prompts = list(found)
    if not prompts:
        raise EvaluationError(f"{flag} {spec!r}: no prompts.")
    for prompt in prompts:
        if not (isinstance(prompt, str) or (isinstance(prompt, list) and all(isinstance(m, dict) for m in prompt))):
            raise EvaluationError(
                f"{flag} {spec!r}: each prompt must be a string or a list of chat messages, got {prompt!r:.80}."
            )
    return prompts


def joint_reward_arity(func: Callable) -> int | None:
    """How many agents a joint reward scores (its positional lists of completions), or None when any count works (a
    TRL per-agent reward `f(completions, **kwargs)`, one list of lists, `*args`)."""
    import inspect

    try:
        parameters = list(inspect.signature(func).parameters.values())
    except (TypeError, ValueError):
        return None
    kinds = inspect.Parameter
    if any(p.kind == kinds.VAR_POSITIONAL for p in parameters):
        return None
    if any(p.kind == kinds.VAR_KEYWORD for p in parameters) and any(
        p.name in ("completions", "completion_ids") for p in parameters
    ):
        return None
    positional = [
        p
        for p in parameters
        if p.kind in (kinds.POSITIONAL_ONLY, kinds.POSITIONAL_OR_KEYWORD) and p.default is p.empty
    ]
    return None if len(positional) == 1 else len(positional)


# ---------------------------------------------------------------------------------------------------------------------
# Runs


@dataclass
class Settings:
    num_turns: int = 2
    greedy: bool = False
    num_generations: int = 4
    max_new_tokens: int = 24
    temperature: float = 1.0
    seed: int = 0
    batch_size: int = 4  # held-out prompts per rollout
    prompt_format: str = "auto"  # "auto" (chat when the tokenizer has a chat template), "chat" or "plain"
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


def _tokenizer_for(team: SavedTeam, agent: int):
    from transformers import AutoTokenizer

    folder = team.agent_dirs[agent]
    has_own = any(os.path.isfile(os.path.join(folder, name)) for name in ("tokenizer.json", "tokenizer_config.json"))
    source = folder if has_own or team.kind == "full" else team.bases[agent]
    return AutoTokenizer.from_pretrained(source)


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

    from .config import MAGRPOConfig
    from .trainer import MAGRPOTrainer

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
    tokenizers = [_tokenizer_for(team, s) for s in seats]
    kwargs = dict(
        tokenizer=tokenizers,
        reward_func=reward,
        external_transition=transition if settings.num_turns > 1 else None,
        train_dataset=Dataset.from_dict({"prompt": prompts}),
        args=args,
    )
    if team.kind == "full":
        trainer = MAGRPOTrainer(agents=[team.agent_dirs[s] for s in seats], **kwargs)
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
            trainer = MAGRPOTrainer(agents=[team.bases[s] for s in seats], peft_config=configs, **kwargs)
        built = trainer.team
        for seat, agent in enumerate(seats):
            name = built.adapter_names[seat] if built.is_shared_base else "default"
            load_adapter_weights(built.agent(seat), team.agent_dirs[agent], name)
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
        inputs = [{"prompt": p} for p in batch for _ in range(k)]  # as the sampler repeats each prompt K times
        with torch.no_grad(), warnings.catch_warnings():
            # K = 1 (greedy, or best-of-N's chains): the advantages' std over one answer warns; nothing uses them here
            warnings.filterwarnings("ignore", message="std\\(\\): degrees of freedom", category=UserWarning)
            trainer._generate_and_score_completions(inputs)
        found = tree_rewards(trainer.last_rollout, len(batch))
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
    chosen so that the sampled tokens match `budget` (see the module docstring); the best by final-turn reward."""
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


def _task(reward, transition, prompts, prompt_format: str, tokenizer) -> tuple:
    """The callables and prompts of the run, the default task's chat form chosen by `prompt_format`."""
    chat = prompt_format == "chat" or (prompt_format == "auto" and getattr(tokenizer, "chat_template", None))
    default_reward = reward is None
    reward = load_callable(DEFAULT_TASK["reward"] if reward is None else reward, "--reward")
    if transition is None and default_reward:
        transition = DEFAULT_TASK["chat_transition" if chat else "transition"]
    transition = load_callable(transition, "--transition") if transition is not None else None
    prompts = load_prompts(DEFAULT_TASK["prompts"] if prompts is None else prompts)
    if chat:
        prompts = [[{"role": "user", "content": p}] if isinstance(p, str) else p for p in prompts]
    return reward, transition, prompts, bool(chat)


def _spec_name(value, default: str) -> str:
    if value is None:
        return default
    return value if isinstance(value, str) else getattr(value, "__qualname__", repr(value))


def evaluate_team(
    folder: str,
    *,
    reward: str | Callable | None = None,
    transition: str | Callable | None = None,
    prompts: str | Sequence | None = None,
    base_model: str | None = None,
    progress: bool = True,
    **settings,
) -> dict:
    """Evaluate the team saved in `folder` (see the module docstring); returns what `evaluation.json` holds.

    `reward`, `transition`, `prompts`: callables / a list, or `module:attribute` strings (prompts also a `.jsonl`
    path); None for the main job's task. `settings`: the fields of `Settings` (num_turns, greedy, num_generations,
    max_new_tokens, temperature, seed, batch_size, prompt_format, role_swap, best_of_n, single_agent, max_best_of).
    """
    settings = Settings(**settings)
    if settings.num_turns < 1:
        raise EvaluationError(f"--num_turns must be >= 1, got {settings.num_turns}.")
    if settings.num_generations < 1:
        raise EvaluationError(f"--num_generations must be >= 1, got {settings.num_generations}.")
    if settings.prompt_format not in ("auto", "chat", "plain"):
        raise EvaluationError(f"--prompt_format must be auto, chat or plain, got {settings.prompt_format!r}.")
    team = find_team(folder, base_model)
    n = team.num_agents
    if settings.best_of_n and not 0 <= settings.single_agent < n:
        raise EvaluationError(f"--single_agent {settings.single_agent}: the team in {folder!r} has agents 0..{n - 1}.")
    tokenizer = _tokenizer_for(team, 0)
    reward_fn, transition_fn, prompt_list, chat = _task(reward, transition, prompts, settings.prompt_format, tokenizer)
    arity = joint_reward_arity(reward_fn)
    if arity is not None and arity != n:
        raise EvaluationError(
            f"--reward {_spec_name(reward, DEFAULT_TASK['reward'])}: the reward scores {arity} agents (it takes "
            f"{arity} lists of completions), but {folder!r} holds {n} agent folders "
            f"({', '.join(os.path.basename(d) for d in team.agent_dirs)}). Give the folder of a {arity}-agent team, "
            f"or a --reward (and --transition) for {n} agents."
        )
    if settings.num_turns > 1 and transition_fn is None:
        raise EvaluationError(
            f"--num_turns {settings.num_turns} needs --transition (module:function) to write the next turn's prompts."
        )
    result = {
        "folder": os.path.abspath(folder),
        "team": {"num_agents": n, "kind": team.kind, "agents": team.agent_dirs, "bases": team.bases},
        "task": {
            "reward": _spec_name(reward, DEFAULT_TASK["reward"]),
            "transition": None
            if settings.num_turns == 1
            else _spec_name(transition, DEFAULT_TASK["chat_transition" if chat else "transition"]),
            "prompts": _spec_name(prompts, DEFAULT_TASK["prompts"]),
            "num_prompts": len(prompt_list),
            "chat_prompts": chat,
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
        plans = [("team", list(range(n)))]
        if settings.role_swap and n > 1:
            plans.append(("role_swap", [(i + 1) % n for i in range(n)]))
        for name, seats in plans:
            trainer = build_trainer(
                team, seats, reward_fn, transition_fn, prompt_list, settings, scratch, k, not settings.greedy
            )
            result["runs"][name] = run_team(trainer, name, seats, prompt_list, settings, progress).to_json()
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


# ---------------------------------------------------------------------------------------------------------------------
# Report

RUN_TITLES = {"team": "team", "role_swap": "role swap", "best_of_n": "best-of-N, one agent"}
COLUMNS = ["run", "seats", "turn", "mean reward", "± 95% CI", "95% CI", "n", "sampled tokens", "joint answers/prompt"]


def _number(value: float, digits: int = 3) -> str:
    return "n/a" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.{digits}f}"


def markdown_table(result: dict) -> str:
    """The table `evaluation.md` holds and the command prints: one row per run and turn."""
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for name, run in result["runs"].items():
        title = RUN_TITLES.get(name, name)
        if name == "best_of_n":
            title = f"best-of-{run['N']}, agent {run['single_agent']} alone"
        for turn, interval in run["turns"].items():
            ci = f"[{_number(interval['low'])}, {_number(interval['high'])}]"
            cells = [
                title,
                " ".join(str(s) for s in run["seats"]),
                turn,
                _number(interval["mean"]),
                _number(interval["half_width"]),
                ci,
                str(interval["n"]),
                str(run["sampled_tokens"]),
                f"{run['joint_answers_per_prompt'][turn]:g}",
            ]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def report_text(result: dict) -> str:
    """The table and what it rests on: the folder, the task, the interval, and best-of-N's N and token counts."""
    s, task = result["settings"], result["task"]
    decoding = "greedy" if s["greedy"] else f"sampled, K={s['num_generations']} answers per agent and node"
    lines = [
        f"# Evaluation of {result['folder']}",
        "",
        f"{result['team']['num_agents']} agents ({result['team']['kind']}); task: reward `{task['reward']}`, "
        + (f"transition `{task['transition']}`, " if task["transition"] else "")
        + f"{task['num_prompts']} held-out prompts (`{task['prompts']}`); "
        f"{s['num_turns']} turn(s), {decoding}, {s['max_new_tokens']} new tokens, temperature {s['temperature']}, "
        f"seed {s['seed']}.",
        "",
        markdown_table(result),
        "",
        f"Unit: a held-out prompt (per prompt and turn, the mean joint reward of its joint answers at that turn). "
        f"Interval: {CI_METHOD}. Seats: the agent in each seat (role swap: seat i played by agent (i + 1) mod N).",
    ]
    best = result["runs"].get("best_of_n")
    if best is not None:
        lines.append(
            f"Best-of-N: agent {best['single_agent']} in every seat, N = {best['N']} independent rollouts per prompt, "
            f"the best by final-turn reward; sampled tokens {best['sampled_tokens']} (team: "
            f"{best['team_sampled_tokens']}; one sample per prompt costs about {_number(best['tokens_per_sample'], 0)})."
        )
    return "\n".join(lines) + "\n"


def _strict(value):
    """NaN (an interval over fewer than 2 prompts) and infinities as JSON null, so that any JSON reader takes the file."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _strict(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_strict(v) for v in value]
    return value


def write_report(result: dict, out: str) -> tuple[str, str]:
    """Write `out/evaluation.json` (NaN as null) and `out/evaluation.md`; returns their paths."""
    os.makedirs(out, exist_ok=True)
    json_path, md_path = os.path.join(out, "evaluation.json"), os.path.join(out, "evaluation.md")
    with open(json_path, "w") as file:
        json.dump(_strict(result), file, indent=2, allow_nan=False)
        file.write("\n")
    with open(md_path, "w") as file:
        file.write(report_text(result))
    return json_path, md_path


# ---------------------------------------------------------------------------------------------------------------------
# Command


def _bool(text: str) -> bool:
    if text.lower() in ("true", "yes", "1", "on"):
        return True
    if text.lower() in ("false", "no", "0", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def make_parser() -> argparse.ArgumentParser:
    defaults = Settings()
    parser = argparse.ArgumentParser(
        prog=PROG,
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        allow_abbrev=False,  # `--num_turn 3` is an error, not `--num_turns 3`
    )
    parser.add_argument("output_dir", metavar="OUTPUT_DIR", help="the folder holding agent_0/, agent_1/, ...")
    task = parser.add_argument_group("task (default: the main job's length-ratio task)")
    task.add_argument("--reward", default=None, help=f"module:function (default {DEFAULT_TASK['reward']})")
    task.add_argument(
        "--transition",
        default=None,
        help="module:function writing the next turn's prompts (default: the length feedback, with the default reward)",
    )
    task.add_argument(
        "--prompts",
        default=None,
        help=f"module:attribute (a list) or a .jsonl file of held-out prompts (default {DEFAULT_TASK['prompts']})",
    )
    task.add_argument(
        "--prompt_format",
        default=defaults.prompt_format,
        choices=["auto", "chat", "plain"],
        help="chat: text prompts become one user message; auto: chat when the tokenizer has a chat template",
    )
    task.add_argument("--base_model", default=None, help="the base of adapter agents, instead of the recorded one")
    run = parser.add_argument_group("rollout")
    run.add_argument("--num_turns", type=int, default=defaults.num_turns)
    run.add_argument("--greedy", action="store_true", help="greedy decoding, one joint answer per turn (K = 1)")
    run.add_argument("--num_generations", type=int, default=defaults.num_generations, help="K when sampling")
    run.add_argument("--max_new_tokens", type=int, default=defaults.max_new_tokens)
    run.add_argument("--temperature", type=float, default=defaults.temperature)
    run.add_argument("--seed", type=int, default=defaults.seed)
    run.add_argument("--batch_size", type=int, default=defaults.batch_size, help="held-out prompts per rollout")
    base = parser.add_argument_group("baselines")
    base.add_argument("--role_swap", type=_bool, default=True, help="also run with seat i played by agent (i+1) mod N")
    base.add_argument(
        "--best_of_n", type=_bool, default=True, help="also run one agent alone at the same token budget"
    )
    base.add_argument("--single_agent", type=int, default=defaults.single_agent, help="the agent of best-of-N")
    base.add_argument("--max_best_of", type=int, default=defaults.max_best_of, help="the largest N")
    parser.add_argument("--out", default=None, help="where evaluation.json and evaluation.md go (default OUTPUT_DIR)")
    parser.add_argument("--no_progress", action="store_true", help="no progress bars")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = make_parser()
    args = parser.parse_args(argv)
    settings = {
        name: getattr(args, name)
        for name in (
            "num_turns", "greedy", "num_generations", "max_new_tokens", "temperature", "seed", "batch_size",
            "prompt_format", "role_swap", "best_of_n", "single_agent", "max_best_of",
        )
    }  # fmt: skip
    try:
        result = evaluate_team(
            args.output_dir,
            reward=args.reward,
            transition=args.transition,
            prompts=args.prompts,
            base_model=args.base_model,
            progress=not args.no_progress,
            **settings,
        )
    except EvaluationError as err:
        parser.exit(2, f"{PROG}: error: {err}\n")
    json_path, md_path = write_report(result, args.out or args.output_dir)
    # The console report (sys.stdout: the package's lint allows print only in its scripts)
    sys.stdout.write(report_text(result) + f"\nWrote {json_path} and {md_path}\n")
    return 0


if __name__ == "__main__":
    if "OMP_NUM_THREADS" not in os.environ:  # as the recipe: one thread unless told (docs/getting-started.md)
        import torch

        torch.set_num_threads(1)
    sys.exit(main())
