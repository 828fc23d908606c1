"""What the two workers of `bench_vs_comlrl.py` share: counting and timing from outside the trainer, and the setup and
measured `train()` that are the same for both.

Each worker script runs one trainer in a fresh process: `python <worker>.py --worker NAME --spec JSON` prints one
`RESULT <json>` line, which `bench_vs_comlrl.run_in_subprocess` reads.
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import time
from dataclasses import dataclass

from trl_multiagent.demo.examples import PROMPTS, length_feedback, length_ratio_reward


FEEDBACK_MARKER = "\n\nYour last answer had "  # only turn-2 prompts (written by length_feedback) contain it


def rss_mb() -> float:
    """Peak resident memory of this process so far, in MB."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def current_rss_mb() -> float | None:
    """Resident memory now, in MB (Linux); None where /proc is missing."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def import_common_modules() -> None:
    """Import, in both workers, the libraries either trainer may pull in lazily, before the memory baseline.

    Our trainer builds on TRL and accelerate, which import DeepSpeed when it is installed; CoMLRL imports none of
    them. Importing them in both processes first keeps import costs out of "peak memory" on both sides. Both workers
    have imported `trl_multiagent` too, through this module's seed task (`trl_multiagent.demo.examples`).
    """
    import importlib.util

    import accelerate  # noqa: F401
    import trl  # noqa: F401
    from trl import GRPOTrainer  # noqa: F401

    if importlib.util.find_spec("deepspeed") is not None:
        import deepspeed  # noqa: F401


class Counters:
    """What each trainer did, counted from outside: reward, transition and generate calls."""

    def __init__(self, device: str):
        self.device = device
        self.reset()

    def reset(self):
        self.joint_answers = {1: 0, 2: 0}
        self.reward_calls = 0
        self.reward_s = 0.0
        self.transitions = 0
        self.transition_s = 0.0
        self.generate_calls = 0
        self.generated_sequences = 0
        self.generated_tokens = 0
        self.generate_s = 0.0
        self.sync_s = 0.0  # weight syncs into vLLM engines
        self.update_s = 0.0
        self.optimizer_steps = 0
        self.step_s = 0.0  # ours: training_step (rollout + forward/backward), whatever logging_steps is
        self.rollout_s = 0.0  # ours: _prepare_inputs (the rollout, when a step generates)

    def sync(self):
        if self.device.startswith("cuda"):
            import torch

            torch.cuda.synchronize()

    def reward(self):
        counters = self

        # `prompts` is keyword-only: CoMLRL then still passes the completions positionally (one list per agent) and
        # `prompts=` as a keyword, as ours does. It tells the turn (turn-2 prompts carry the feedback).
        def length_ratio_reward_counted(completions1, completions2, *, prompts=None):
            start = time.perf_counter()
            first_agent_prompts = prompts[0] if prompts and isinstance(prompts[0], list) else prompts
            for j in range(len(completions1)):
                text = first_agent_prompts[min(j, len(first_agent_prompts) - 1)] if first_agent_prompts else ""
                counters.joint_answers[2 if FEEDBACK_MARKER in str(text) else 1] += 1
            counters.reward_calls += 1
            out = length_ratio_reward(completions1, completions2)
            counters.reward_s += time.perf_counter() - start
            return out

        length_ratio_reward_counted.__name__ = "length_ratio_reward"
        return length_ratio_reward_counted

    def transition(self):
        counters = self

        def length_feedback_counted(prompt, agent_completions, num_agents, **history):
            start = time.perf_counter()
            counters.transitions += 1
            out = length_feedback(prompt, agent_completions, num_agents, **history)
            counters.transition_s += time.perf_counter() - start
            return out

        length_feedback_counted.__name__ = "length_feedback"
        return length_feedback_counted

    def wrap_generate(self, model, eos_ids: set[int]):
        """Count new tokens (up to and including the first EOS) and time every `generate` call of this model."""
        import torch

        counters = self
        original = model.generate
        eos = torch.tensor(sorted(eos_ids))

        def generate(*args, **kwargs):
            input_ids = kwargs.get("input_ids", args[0] if args else None)
            counters.sync()
            start = time.perf_counter()
            out = original(*args, **kwargs)
            counters.sync()
            counters.generate_s += time.perf_counter() - start
            sequences = out.sequences if hasattr(out, "sequences") else out
            new = sequences[:, input_ids.shape[1] :].cpu()
            is_eos = torch.isin(new, eos)
            lengths = torch.where(is_eos.any(1), is_eos.int().argmax(1) + 1, new.shape[1])
            counters.generate_calls += 1
            counters.generated_sequences += new.shape[0]
            counters.generated_tokens += int(lengths.sum())
            return out

        model.generate = generate

    def wrap_generator(self, generator):
        """Count and time a vLLM generation backend's calls; its weight syncs count as generation time."""
        counters = self
        original = generator.generate

        def generate(agent, prompts, num_generations, greedy=False):
            start = time.perf_counter()
            out = original(agent, prompts, num_generations, greedy)
            counters.generate_s += time.perf_counter() - start
            counters.generate_calls += 1
            counters.generated_sequences += len(out.completion_ids)
            counters.generated_tokens += sum(len(ids) for ids in out.completion_ids)
            return out

        generator.generate = generate
        self.timed_method(generator, "sync_weights", "sync_s")

    def timed_method(self, obj, name: str, field: str):
        counters = self
        original = getattr(obj, name)

        def timed(*args, **kwargs):
            counters.sync()
            start = time.perf_counter()
            out = original(*args, **kwargs)
            counters.sync()
            setattr(counters, field, getattr(counters, field) + time.perf_counter() - start)
            return out

        setattr(obj, name, timed)


def eos_token_ids(tokenizer, model) -> set[int]:
    eos = model.generation_config.eos_token_id
    ids = set([] if eos is None else [eos] if isinstance(eos, int) else eos)
    if tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    return ids


@dataclass
class Setup:
    """The run as both workers start it: memory baseline, seeds, tokenizer, counted agents, dataset."""

    spec: dict
    counters: Counters
    tokenizer: object
    agents: list
    dataset: object
    baseline_mb: float
    start: float  # when loading the model began: setup time counts from here


def prepare(spec: dict) -> Setup:
    """After the worker's own imports: the common imports, the memory baseline, then the agents and the dataset."""
    import numpy as np
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if spec.get("reuse_freed_memory"):  # the opt-in allocator setting, before the run allocates anything large
        from trl_multiagent.devices import reuse_freed_memory

        reuse_freed_memory()
    import_common_modules()
    torch.set_num_threads(spec["threads"])
    baseline_mb = rss_mb()
    device = spec["device"]
    counters = Counters(device)
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()

    seed = spec["seed"]
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)

    start = time.perf_counter()
    dtype = getattr(torch, spec["dtype"])
    tokenizer = AutoTokenizer.from_pretrained(spec["model_path"])
    if tokenizer.pad_token is None:  # both trainers do the same; done here so that the EOS set below is final
        tokenizer.pad_token = tokenizer.eos_token
    agents = [AutoModelForCausalLM.from_pretrained(spec["model_path"], dtype=dtype) for _ in range(spec["num_agents"])]
    for agent in agents:
        counters.wrap_generate(agent, eos_token_ids(tokenizer, agent))
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(spec["prompts"])]
    dataset = Dataset.from_dict({"prompt": prompts})
    return Setup(spec, counters, tokenizer, agents, dataset, baseline_mb, start)


def train_measured(setup: Setup, trainer, trainer_name: str, version: str, settings: dict) -> dict:
    """Run `trainer.train()` and return what both workers report; each adds its own update timings."""
    import torch

    counters = setup.counters
    counters.sync()
    setup_s = time.perf_counter() - setup.start
    built_mb = current_rss_mb()

    counters.reset()  # only training counts (a build with check_functions_before_training=True calls the reward)
    start = time.perf_counter()
    trainer.train()
    counters.sync()
    wall_s = time.perf_counter() - start

    result = {
        "trainer": trainer_name,
        "version": version,
        "setup_s": setup_s,
        "wall_s": wall_s,
        "joint_answers": sum(counters.joint_answers.values()),
        "joint_answers_turn": dict(counters.joint_answers),
        "reward_calls": counters.reward_calls,
        "transitions": counters.transitions,
        "generate_calls": counters.generate_calls,
        "generated_sequences": counters.generated_sequences,
        "generated_tokens": counters.generated_tokens,
        "generate_s": counters.generate_s + counters.sync_s,
        "sync_s": counters.sync_s,
        "reward_s": counters.reward_s,
        "transition_s": counters.transition_s,
        "optimizer_steps": counters.optimizer_steps,
        "peak_rss_mb": rss_mb() - setup.baseline_mb,
        "baseline_rss_mb": setup.baseline_mb,
        "built_rss_mb": None if built_mb is None else built_mb - setup.baseline_mb,
        "settings": settings,
    }
    if setup.spec["device"].startswith("cuda"):
        result["peak_gpu_mb"] = torch.cuda.max_memory_allocated() / 2**20
    return result


def worker_main(run, trainers: tuple[str, ...], description: str) -> None:
    """The command line of a worker script: `--worker NAME --spec JSON`, answered by one `RESULT <json>` line."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--worker", choices=trainers, required=True, help="the trainer to run")
    parser.add_argument("--spec", required=True, help="the run's settings, as JSON (written by bench_vs_comlrl.py)")
    cli = parser.parse_args()
    print("RESULT " + json.dumps(run(cli.worker, json.loads(cli.spec))), flush=True)
