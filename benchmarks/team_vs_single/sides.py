"""The sides, each trained through public API on a task of `tasks`, to the same budget of generated tokens, and each
evaluated on the held-out rows with one protocol per side.

| task | side | trainer | agents x turns | answer scored |
|---|---|---|---|---|
| writing | `single` | `trl.GRPOTrainer` | 1 x 1, 2T tokens | both parts, split at `###` |
| writing | `team` | `MAGRPOTrainer` | 2 x 1, T tokens each | agent 0's part 1, agent 1's part 2 |
| arithmetic | `single` | `trl.GRPOTrainer` | 1 x 1 | the answer |
| arithmetic | `revise` | `MAGRPOTrainer` | 1 x 2 | each turn's answer (the second is final) |
| arithmetic | `team` | `MAGRPOTrainer` | 2 x 2 | both agents' answers each turn (the second turn's are final) |

Every side: the embedded model (or `model_path`), one LoRA adapter per agent (r=16, alpha 32, all linear layers; the
team's two adapters share one frozen base), K=4 answers per prompt, 2 prompts per step, the task's temperature, top_p 1.0,
no top-k, TRL's default loss (`dapo`, beta 0), a constant learning rate, and training stops after the first step at
which the run's generated tokens reach the budget. Our trainer's multi-turn sides continue only each node's best
joint answer to turn 2 (`branching="best"`, AT-GRPO's tree), with early termination off
(`early_termination_threshold=None`), so that every prompt gets its second turn, as in evaluation. The best joint answer
is picked by the reward, which knows the sum: in training the second turn mostly follows a right first answer, while
evaluation continues every sampled first answer. Their final-turn training rewards are therefore not comparable with
the single agent's; the held-out scores are.
"""

from __future__ import annotations

import functools
import os
import random
import tempfile
import time

from transformers import TrainerCallback

from trl_multiagent.config import ACTIVATION_CHECKPOINTING

from .generation import generate_texts, load_agent, token_count
from .tasks import (
    Task,
    arithmetic_check_prompts,
    arithmetic_correct,
    arithmetic_prompt,
    arithmetic_revise_prompt,
    split_parts,
    writing_part_prompt,
    writing_reward,
    writing_single_prompt,
)


SIDES = {"writing": ("single", "team"), "arithmetic": ("single", "revise", "team")}
TRAINERS = {
    "single": "trl.GRPOTrainer",
    "revise": "trl_multiagent.MAGRPOTrainer",
    "team": "trl_multiagent.MAGRPOTrainer",
}
# What each side is, for the report; the team features that may make a difference are named.
SIDE_NOTES = {
    ("writing", "single"): "trl.GRPOTrainer, one LoRA adapter, both parts in one completion of 2T tokens split at ###",
    ("writing", "team"): "MAGRPOTrainer, 2 agents with one LoRA adapter each on one shared frozen base, one part "
    "each, T tokens per agent",
    ("arithmetic", "single"): "trl.GRPOTrainer, one LoRA adapter, one turn",
    ("arithmetic", "revise"): "MAGRPOTrainer, one agent (one LoRA adapter), answer then revise over 2 turns, "
    "best-only branching",
    ("arithmetic", "team"): "MAGRPOTrainer, 2 agents with one LoRA adapter each on one shared frozen base, answer "
    "then check over 2 turns, best-only branching",
}
NUM_GENERATIONS = 4
PROMPTS_PER_STEP = 2
LORA = {"r": 16, "lora_alpha": 32, "target_modules": "all-linear"}


def agents_and_turns(task: str, side: str) -> tuple[int, int]:
    return {("writing", "single"): (1, 1), ("writing", "team"): (2, 1), ("arithmetic", "single"): (1, 1),
            ("arithmetic", "revise"): (1, 2), ("arithmetic", "team"): (2, 2)}[(task, side)]  # fmt: skip


def completion_tokens(task: str, side: str, tokens_per_part: int) -> int:
    """What one completion may write: the writing task's single agent writes both parts, so twice a part's."""
    return 2 * tokens_per_part if (task, side) == ("writing", "single") else tokens_per_part


class TokenBudget(TrainerCallback):
    """Counts the tokens a run generates (every completion the reward scores, `generation.token_count`) and stops
    training after the first step at which they reach `limit`. Also keeps, per reward call, the tokens so far, the
    turn and the mean reward: the run's learning curve. Counting starts at `on_train_begin` (our trainer's check of
    the reward with placeholders, when it is built, is not counted)."""

    def __init__(self, tokenizer, limit: int, cap: int):
        self.tokenizer, self.limit, self.cap = tokenizer, limit, cap
        self.spent, self.curve, self.started, self.start_time = 0, [], False, None

    def on_train_begin(self, args, state, control, **kwargs):
        self.started, self.start_time = True, time.perf_counter()

    def record(self, texts: list[str], rewards: list[float], turn: int) -> list[float]:
        if self.started:
            self.spent += sum(token_count(self.tokenizer, t, self.cap) for t in texts)
            self.curve.append({"tokens": self.spent, "turn": turn, "reward": sum(rewards) / len(rewards),
                               "t": round(time.perf_counter() - self.start_time, 2)})  # fmt: skip
        return rewards

    def on_step_end(self, args, state, control, **kwargs):
        if self.spent >= self.limit:
            control.should_training_stop = True


def user_message(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def training_rows(task: Task, side: str) -> list[dict]:
    """The dataset rows: the prompt each side's (first) agent sees, as one chat user message, and the task's
    columns, which the rewards and transitions read by name."""
    if task.name == "writing":
        prompt = writing_single_prompt if side == "single" else lambda row: writing_part_prompt(row, 0)
        return [{**row, "prompt": user_message(prompt(row))} for row in task.train_rows]
    return [{**row, "prompt": user_message(arithmetic_prompt(row["question"]))} for row in task.train_rows]


def build_trainer(task: Task, side: str, *, model_path: str, seed: int, learning_rate: float, budget: TokenBudget,
                  output_dir: str, tokenizer):  # fmt: skip
    """The side's trainer, built as a user builds it (public API, TRL's argument names)."""
    from datasets import Dataset
    from peft import LoraConfig

    rows = training_rows(task, side)
    random.Random(seed).shuffle(rows)
    dataset = Dataset.from_list(rows)
    max_tokens = completion_tokens(task.name, side, task.tokens_per_part)
    common = dict(
        output_dir=output_dir, learning_rate=learning_rate, lr_scheduler_type="constant", warmup_steps=0,
        per_device_train_batch_size=PROMPTS_PER_STEP * NUM_GENERATIONS, num_generations=NUM_GENERATIONS,
        max_completion_length=max_tokens, temperature=task.temperature, top_p=1.0, top_k=0, max_steps=10**6,
        logging_steps=1, save_strategy="no", report_to="none", disable_tqdm=True, seed=seed, bf16=False,
        use_cpu=True, **{ACTIVATION_CHECKPOINTING: False},  # TRL turns it on; on a CPU it only costs time
    )  # fmt: skip
    lora = LoraConfig(**LORA, task_type="CAUSAL_LM")
    if side == "single":
        from trl import GRPOConfig, GRPOTrainer

        reward = single_reward(task.name, budget)
        return GRPOTrainer(model=model_path, processing_class=tokenizer, reward_funcs=reward, train_dataset=dataset,
                           args=GRPOConfig(**common), peft_config=lora, callbacks=[budget])  # fmt: skip

    from trl_multiagent import MAGRPOConfig, MAGRPOTrainer

    num_agents, num_turns = agents_and_turns(task.name, side)
    config = MAGRPOConfig(**common, num_agents=num_agents, num_turns=num_turns, early_termination_threshold=None,
                          branching="best" if num_turns > 1 else "all", joint_mode="aligned")  # fmt: skip
    extra = {}
    if task.name == "writing":
        extra["formatters"] = writing_formatters()
    else:
        extra["external_transition"] = revise_transition if side == "revise" else check_transition
    return MAGRPOTrainer(model=model_path, processing_class=tokenizer, reward_funcs=multi_reward(task.name, side, budget),
                         train_dataset=dataset, args=config, peft_config=lora, callbacks=[budget], **extra)  # fmt: skip


# ---------------------------------------------------------------------- rewards and transitions, per side


def single_reward(task: str, budget: TokenBudget):
    """TRL's convention: `f(completions, **columns)`; a conversational completion is one assistant message."""

    def text(completion) -> str:
        return completion[0]["content"] if isinstance(completion, list) else completion

    if task == "writing":

        def writing_both_parts(completions, keyword, **kwargs):
            texts = [text(c) for c in completions]
            rewards = [writing_reward(*split_parts(t), k) for t, k in zip(texts, keyword, strict=True)]
            return budget.record(texts, rewards, turn=1)

        return writing_both_parts

    def arithmetic_answer(completions, answer, **kwargs):
        texts = [text(c) for c in completions]
        return budget.record(texts, [arithmetic_correct(t, a) for t, a in zip(texts, answer, strict=True)], turn=1)

    return arithmetic_answer


def multi_reward(task: str, side: str, budget: TokenBudget):
    """Our trainer's joint convention: one list of completions per agent, `joint` stated."""
    from trl_multiagent import joint

    if task == "writing":

        @joint
        def writing_parts(parts_1, parts_2, keyword):
            rewards = [writing_reward(a, b, k) for a, b, k in zip(parts_1, parts_2, keyword, strict=True)]
            return budget.record(parts_1 + parts_2, rewards, turn=1)

        return writing_parts
    if side == "revise":

        @joint
        def arithmetic_answer(answers, answer, turn):
            return budget.record(answers, [arithmetic_correct(t, a) for t, a in zip(answers, answer, strict=True)],
                                 turn=turn)  # fmt: skip

        return arithmetic_answer

    @joint
    def arithmetic_both_answers(answers_0, answers_1, answer, turn):
        rewards = [(arithmetic_correct(x, a) + arithmetic_correct(y, a)) / 2
                   for x, y, a in zip(answers_0, answers_1, answer, strict=True)]  # fmt: skip
        return budget.record(answers_0 + answers_1, rewards, turn=turn)

    return arithmetic_both_answers


def writing_part_message(row: dict, part: int) -> list[dict]:
    return user_message(writing_part_prompt(row, part))


def writing_formatters() -> list:
    """The writing team's first prompts: agent i is asked for part i + 1."""
    return [functools.partial(writing_part_message, part=i) for i in range(2)]


def revise_transition(prompt, agent_completions, num_agents, question):
    return [user_message(arithmetic_revise_prompt(question, agent_completions[0]))]


def check_transition(prompt, agent_completions, num_agents, question):
    return [user_message(text) for text in arithmetic_check_prompts(question, agent_completions)]


# ---------------------------------------------------------------------- evaluation (the same protocol before/after)


def evaluate(task: Task, side: str, agents: list, tokenizer, *, samples: int, seed: int) -> dict:
    """Each held-out row answered `samples` times by the side's protocol (sampled at the training temperature), with
    `agents[i]` in seat i. Returns per-row values: `final` (the mean reward of the final turn's answers) and, for two
    turns, `turn_1`; the team's arithmetic adds `checker` (agent 1's final answer alone) and `answerer_turn_1`."""
    rows = task.held_out_rows
    size = completion_tokens(task.name, side, task.tokens_per_part)

    def gen(model, texts, salt, per_text=samples):
        return generate_texts(model, tokenizer, texts, samples=per_text, max_new_tokens=size,
                              temperature=task.temperature, seed=seed * 1000 + salt)  # fmt: skip

    def per_row(values):  # a list of per-sample lists -> one mean per row
        return [sum(v) / len(v) for v in values]

    if task.name == "writing" and side == "single":
        answers = gen(agents[0], [writing_single_prompt(r) for r in rows], 0)
        return {"final": per_row([[writing_reward(*split_parts(a), r["keyword"]) for a in texts]
                                  for r, texts in zip(rows, answers, strict=True)])}  # fmt: skip
    if task.name == "writing":
        parts = [gen(agents[i], [writing_part_prompt(r, i) for r in rows], i) for i in range(2)]
        return {"final": per_row([[writing_reward(a, b, r["keyword"]) for a, b in zip(p1, p2, strict=True)]
                                  for r, p1, p2 in zip(rows, *parts, strict=True)])}  # fmt: skip

    questions = [r["question"] for r in rows]
    first = [gen(agents[i], [arithmetic_prompt(q) for q in questions], i) for i in range(len(agents))]
    score = lambda answers: [[arithmetic_correct(t, r["answer"]) for t in texts]  # noqa: E731
                             for r, texts in zip(rows, answers, strict=True)]  # fmt: skip
    if side == "single":
        return {"final": per_row(score(first[0]))}
    if side == "revise":
        flat = [arithmetic_revise_prompt(q, a) for q, texts in zip(questions, first[0], strict=True) for a in texts]
        second = gen(agents[0], flat, 10, per_text=1)  # one second answer continues each first one
        second = [[t[0] for t in second[i * samples : (i + 1) * samples]] for i in range(len(rows))]
        return {"turn_1": per_row(score(first[0])), "final": per_row(score(second))}
    # the team: sample j of agent 0 and sample j of agent 1 form joint answer j
    prompts = [arithmetic_check_prompts(q, [a, b]) for q, t0, t1 in zip(questions, *first, strict=True)
               for a, b in zip(t0, t1, strict=True)]  # fmt: skip
    second = [gen(agents[i], [p[i] for p in prompts], 10 + i, per_text=1) for i in range(2)]
    second = [[[t[0] for t in s[k * samples : (k + 1) * samples]] for k in range(len(rows))] for s in second]
    team = lambda answers_0, answers_1: [[(x + y) / 2 for x, y in zip(a, b, strict=True)]  # noqa: E731
                                         for a, b in zip(score(answers_0), score(answers_1), strict=True)]  # fmt: skip
    return {"turn_1": per_row(team(*first)), "final": per_row(team(*second)),
            "answerer_turn_1": per_row(score(first[0])), "checker": per_row(score(second[1]))}  # fmt: skip


def run_part(task: Task, side: str, *, model_path: str, seed: int, learning_rate: float, token_budget: int,
             eval_samples: int, evaluate_held_out: bool = True) -> dict:  # fmt: skip
    """Evaluate the untrained model by the side's protocol, train the side to the token budget, evaluate again.
    `evaluate_held_out=False` (the learning-rate tries) skips both evaluations."""
    import torch
    from transformers import AutoTokenizer, set_seed

    tokenizer = AutoTokenizer.from_pretrained(model_path)
    num_agents, _ = agents_and_turns(task.name, side)
    result = {"task": task.name, "side": side, "trainer": TRAINERS[side], "seed": seed, "learning_rate": learning_rate,
              "token_budget": token_budget, "eval_samples": eval_samples, "torch_threads": torch.get_num_threads(),
              "load_average_before": os.getloadavg()}  # fmt: skip
    if evaluate_held_out:
        start = time.perf_counter()
        base = load_agent(model_path)
        result["before"] = evaluate(task, side, [base] * num_agents, tokenizer, samples=eval_samples, seed=seed)
        result["eval_before_s"] = time.perf_counter() - start
        del base

    set_seed(seed)
    budget = TokenBudget(tokenizer, token_budget, completion_tokens(task.name, side, task.tokens_per_part))
    with tempfile.TemporaryDirectory(prefix=f"team_vs_single_{task.name}_{side}_") as folder:
        trainer = build_trainer(task, side, model_path=model_path, seed=seed, learning_rate=learning_rate,
                                budget=budget, output_dir=folder, tokenizer=tokenizer)  # fmt: skip
        start, cpu_start = time.perf_counter(), time.process_time()
        trainer.train()
        result["train_s"] = time.perf_counter() - start
        # the CPU seconds the run used: on a shared machine, wall-clock seconds grow with the load, these do not
        result["train_cpu_s"] = time.process_time() - cpu_start
        result["steps"] = trainer.state.global_step
        result["generated_tokens"] = budget.spent
        result["curve"] = budget.curve
        result["load_average_after_train"] = os.getloadavg()
        if evaluate_held_out:
            trainer.save_model(folder)
            del trainer
            # GRPOTrainer, and our trainer with one agent, save into the folder itself; a team writes agent_{i}/
            adapters = [folder] if num_agents == 1 else [os.path.join(folder, f"agent_{i}") for i in range(num_agents)]
            start = time.perf_counter()
            agents = [load_agent(model_path, adapter) for adapter in adapters]
            result["after"] = evaluate(task, side, agents, tokenizer, samples=eval_samples, seed=seed)
            result["eval_after_s"] = time.perf_counter() - start
    result["load_average_after"] = os.getloadavg()
    return result
