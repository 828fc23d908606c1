"""The seed task (length-ratio example) trained by CoMLRL's `MAGRPOTrainer` and by ours, side by side.

Both trainers run in ONE invocation, each in its own fresh subprocess (sequentially, so they do not compete for the
CPU and so that peak memory is measured separately), on the same model folder (identical weights), with the same
settings: 2 agents, K=4 generations, 2 turns, aligned joint answers, early termination OFF (both build the full tree:
4 joint answers in turn 1 and 4*4=16 in turn 2 per prompt), the same max_new_tokens, prompts, epochs, learning rate,
sampling (temperature 1.0, top_p 1.0, no top-k) and dtype. The seed's joint reward `length_ratio_reward` and transition
`length_feedback` are used on both sides.

Reported per trainer:

- wall s: seconds spent in `trainer.train()` (model loading and trainer construction are excluded and shown apart);
- joint answers: the joint answers the reward scored during training (counted by wrapping the reward), also split
  into turn 1 / turn 2, which checks that both trainers built the same tree;
- joint answers/s = joint answers / wall s;
- generated tokens (counted by wrapping each agent's `generate`: new tokens up to and including the first EOS) and
  generated tokens/s = generated tokens / wall s;
- peak RSS MB: peak resident memory of the subprocess over its resident memory after the imports
  (`resource.getrusage`), i.e. weights + optimizer state + activations + rollout data; on CUDA also the peak of
  `torch.cuda.max_memory_allocated`;
- a phase breakdown (generate / reward + transition / update / other) and our trainer's own logged timings.

`ours_vllm` is ours with `use_vllm=True` (colocated vLLM engines, one per agent): its generate phase is the time
inside the generation backend plus the weight syncs into the engines, and the report adds its ratios to `ours`. It
needs vLLM in the interpreter that runs the script, and a head size of at least 32 (vLLM's CPU attention): `tiny` and
`smollm2` have it, `--smoke` does not.

Install CoMLRL (PyPI `comlrl` 1.4.3) beside this package. Its metadata asks for `openai` and `wandb`; it never
imports `openai`, but imports `wandb` at module import. A virtual environment that sees the system packages keeps the
system site-packages (torch, transformers, trl) unchanged:

    python -m venv --system-site-packages ~/.venvs/comlrl
    ~/.venvs/comlrl/bin/python -m pip install --no-deps comlrl==1.4.3
    ~/.venvs/comlrl/bin/python -m pip install wandb        # imported by comlrl at import time; nothing is logged

Then run the benchmark with the system interpreter and point `--comlrl_python` (or the environment variable
COMLRL_PYTHON) at the one that has CoMLRL (or run the whole script with that one). The figures in the README
(section "Benchmarks: vs CoMLRL") and in benchmarks/vs_comlrl.md come from:

    OMP_NUM_THREADS=1 python benchmarks/bench_vs_comlrl.py --model tiny --repeats 3 \
        --comlrl_python ~/.venvs/comlrl/bin/python
    python benchmarks/bench_vs_comlrl.py --model smollm2 --threads 2 --comlrl_python ~/.venvs/comlrl/bin/python
    python benchmarks/bench_vs_comlrl.py --model smollm2 --threads 1 --comlrl_python ~/.venvs/comlrl/bin/python

Other uses:

    python benchmarks/bench_vs_comlrl.py --model /path/to/save_pretrained/folder --prompts 4 --max_new_tokens 64
    python benchmarks/bench_vs_comlrl.py --model smollm2 --device cuda      # on a GPU machine
    python benchmarks/bench_vs_comlrl.py --smoke                            # hidden-32 model, 1 prompt, 4 tokens

    # ours with transformers `generate` and ours with vLLM, side by side (in the vLLM environment, see README)
    .venv-vllm/bin/python benchmarks/bench_vs_comlrl.py --model smollm2 --trainers ours,ours_vllm --threads 2
    python benchmarks/bench_vs_comlrl.py --model tiny --trainers ours --ours_micro_batches 6   # diagnostic, see below

`--model tiny` is a random hidden-256, 4-layer Llama (tests/tiny.py, 400-token vocabulary), written to a temporary
folder with `save_pretrained`; defaults 6 prompts, 48 new tokens, 1 torch thread. `--model smollm2` is
SmolLM2-135M-Instruct, prepared offline by `trl_multiagent.models.prepare_default_model()`; defaults 2 prompts, 32 new
tokens, one torch thread per CPU. Both trainers load their agents from the same folder. Without CoMLRL the script still
runs ours and prints a note that CoMLRL was skipped and how to install it.

The machine may be shared: `--repeats N` runs each trainer N times, interleaved, and reports each one's fastest run;
the load average before and after is printed. Both workers import the same libraries (torch, transformers, datasets,
TRL, accelerate, DeepSpeed when installed) before taking the memory baseline, so import costs are not counted as
memory on either side. `--ours_micro_batches M` is a diagnostic that is not part of the comparison: it splits our
update into M micro-batches (gradient accumulation; same rollout, one optimizer step).

How the settings map (read from comlrl/trainers/reinforce/magrpo.py, 1.4.3):

- CoMLRL trains one prompt per step (its dataloader has batch_size=1). It grows each tree node by node: per prompt,
  1 + K generate calls per agent with K sequences each, one reward call per joint answer, and an update from a
  per-agent buffer of tree nodes. Its `rollout_buffer_size` and `train_batch_size` are set here to all the tree nodes
  of the epoch ((1 + K) * prompts), so its update runs once per epoch over all rows (as a batch, one optimizer step per
  turn, since it groups a buffer by turn); its default (2 nodes) would take more optimizer steps.
- Ours: per_device_train_batch_size = prompts * K (all prompts in one step), one batched `generate` per agent per turn
  over all live tree nodes, one reward call per turn, `gradient_checkpointing=False` (CoMLRL does not checkpoint),
  `bf16=False`, beta=0 (no reference model; CoMLRL's reference KL is off by default).
- Early termination off: `early_termination_threshold=None` on both sides (CoMLRL's config field of the same name).

The losses differ by design (CoMLRL: sequence log-prob times a normalised return-minus-mean advantage, one forward per
sequence; ours: TRL's GRPO loss over batched rows); this benchmark compares throughput on the same rollout tree, not
learning curves.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import shutil
import subprocess
import sys
import tempfile
import time


HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
TRAINERS = ("comlrl", "ours", "ours_vllm")
COMLRL_VERSION = "1.4.3"
INSTALL_HINT = (
    "python -m venv --system-site-packages ~/.venvs/comlrl && "
    f"~/.venvs/comlrl/bin/python -m pip install --no-deps comlrl=={COMLRL_VERSION} && "
    "~/.venvs/comlrl/bin/python -m pip install wandb; then pass --comlrl_python ~/.venvs/comlrl/bin/python"
)

# The seed's prompts, reward and transition (recipes/seed_task.py imports nothing from trl_multiagent, so the CoMLRL
# subprocess can use it too).
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "recipes"))
from seed_task import PROMPTS, length_feedback, length_ratio_reward  # noqa: E402


FEEDBACK_MARKER = "\n\nYour last answer had "  # only turn-2 prompts (written by length_feedback) contain it

# Model presets: (hidden, layers) for the random tiny Llama; None for a folder.
PRESETS = {
    "smoke": {"hidden": 32, "layers": 2, "prompts": 1, "max_new_tokens": 4, "threads": 1},
    "tiny": {"hidden": 256, "layers": 4, "prompts": 6, "max_new_tokens": 48, "threads": 1},
    "smollm2": {"prompts": 2, "max_new_tokens": 32, "threads": None},
    "path": {"prompts": 2, "max_new_tokens": 32, "threads": None},
}


# ---------------------------------------------------------------------- worker side (one trainer, one process)


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
    them. Importing them in both processes first keeps import costs out of "peak memory" on both sides.
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


def run_worker(trainer_name: str, spec: dict) -> dict:
    import numpy as np
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if trainer_name == "comlrl":
        os.environ.setdefault("WANDB_MODE", "disabled")
        import comlrl
        from comlrl.trainers.reinforce import MAGRPOConfig as CoMAGRPOConfig
        from comlrl.trainers.reinforce import MAGRPOTrainer as CoMAGRPOTrainer

        version = comlrl.__version__
    else:
        from transformers import TrainerCallback

        import trl_multiagent
        import trl_multiagent.generation.hf
        from trl_multiagent import MAGRPOConfig, MAGRPOTrainer

        version = getattr(trl_multiagent, "__version__", None)
        if version is None:
            from importlib.metadata import version as _version

            version = _version("trl_multiagent")

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

    setup_start = time.perf_counter()
    dtype = getattr(torch, spec["dtype"])
    tokenizer = AutoTokenizer.from_pretrained(spec["model_path"])
    if tokenizer.pad_token is None:  # both trainers do the same; done here so that the EOS set below is final
        tokenizer.pad_token = tokenizer.eos_token
    agents = [AutoModelForCausalLM.from_pretrained(spec["model_path"], dtype=dtype) for _ in range(spec["num_agents"])]
    for agent in agents:
        counters.wrap_generate(agent, eos_token_ids(tokenizer, agent))
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(spec["prompts"])]
    dataset = Dataset.from_dict({"prompt": prompts})
    k, p = spec["num_generations"], spec["prompts"]
    tree_nodes = (1 + k) * p  # per epoch, per agent: one root per prompt and one child per turn-1 joint answer

    if trainer_name == "comlrl":
        config = CoMAGRPOConfig(
            num_train_epochs=spec["epochs"],
            agent_learning_rate=spec["learning_rate"],
            logging_steps=1,
            num_agents=spec["num_agents"],
            agent_devices=device,
            num_generations=k,
            max_new_tokens=spec["max_new_tokens"],
            temperature=spec["temperature"],
            top_p=spec["top_p"],
            top_k=0,  # no top-k (CoMLRL's default is 50; ours, TRL's, is 0)
            num_turns=spec["num_turns"],
            discount=1.0,
            joint_mode="aligned",
            early_termination_threshold=None,  # full tree
            eval_interval=0,
            rollout_buffer_size=tree_nodes,
            train_batch_size=tree_nodes,
        )
        trainer = CoMAGRPOTrainer(
            agents=agents,
            num_agents=spec["num_agents"],
            tokenizer=tokenizer,
            train_dataset=dataset,
            reward_func=counters.reward(),
            external_transition=counters.transition(),
            args=config,
        )
        trainer.verbose = False  # no tqdm bar
        counters.timed_method(trainer, "_update_from_samples", "update_s")
        for optimizer in trainer.optimizers:
            original_step = optimizer.step

            def step(*args, _original=original_step, **kwargs):
                counters.optimizer_steps += 1
                return _original(*args, **kwargs)

            optimizer.step = step
        settings = {
            "rollout_buffer_size": config.rollout_buffer_size,
            "train_batch_size": config.train_batch_size,
            "temperature": config.temperature,
            "top_p": config.top_p,
            "top_k": config.top_k,
        }
    else:

        class OptimizerTimer(TrainerCallback):
            def on_pre_optimizer_step(self, args, state, control, **kwargs):
                counters.sync()
                self.start = time.perf_counter()

            def on_optimizer_step(self, args, state, control, **kwargs):
                counters.sync()
                counters.update_s += time.perf_counter() - self.start
                counters.optimizer_steps += 1

        output_dir = tempfile.mkdtemp(prefix="bench_vs_comlrl_ours_")
        # The task: the tree's shape, lengths, sampling, learning rate, prompts and epochs, the same on both sides.
        task = dict(
            num_turns=spec["num_turns"],
            num_generations=k,
            max_new_tokens=spec["max_new_tokens"],
            early_termination_threshold=None,  # full tree
            joint_mode="aligned",
            discount=1.0,
            num_train_epochs=spec["epochs"],
            learning_rate=spec["learning_rate"],
            temperature=spec["temperature"],
            top_p=spec["top_p"],
            top_k=0,
            bf16=False,
            use_cpu=device == "cpu",
            seed=seed,
            report_to="none",
            save_strategy="no",
            disable_tqdm=True,
            use_vllm=trainer_name == "ours_vllm",
        )
        if spec.get("defaults"):  # `--defaults`: MAGRPOConfig's defaults for everything else, as a new user has them
            tuned = {}
        else:
            tuned = dict(
                # all prompts in one step; `--ours_micro_batches M` (a diagnostic, not the comparison's setting)
                # splits that step's update into M micro-batches with gradient accumulation, one optimizer step
                per_device_train_batch_size=p * k // spec.get("ours_micro_batches", 1),
                gradient_accumulation_steps=spec.get("ours_micro_batches", 1),
                gradient_checkpointing=False,
                logging_steps=1,
            )
        config = MAGRPOConfig(output_dir=output_dir, **task, **tuned)
        trainer = MAGRPOTrainer(
            agents=agents,
            tokenizer=tokenizer,
            reward_func=counters.reward(),
            external_transition=counters.transition(),
            train_dataset=dataset,
            args=config,
            callbacks=[OptimizerTimer()],
        )
        # Ours prefills each prompt once just before `generate` (share_prompts): that is generation time too.
        counters.timed_method(trl_multiagent.generation.hf, "prefilled_cache", "generate_s")
        counters.timed_method(trainer, "training_step", "step_s")
        counters.timed_method(trainer, "_prepare_inputs", "rollout_s")
        if config.use_vllm:  # the agents' own `generate` is not called: time the backend, and its weight syncs
            counters.wrap_generator(trainer.generator)
        settings = {
            "share_prompts": config.share_prompts,
            "per_device_train_batch_size": config.per_device_train_batch_size,
            "gradient_accumulation_steps": config.gradient_accumulation_steps,
            "steps_per_generation": config.steps_per_generation,
            "update_chunk_size": config.update_chunk_size or config.per_device_train_batch_size,
            "gradient_checkpointing": config.gradient_checkpointing,
            "logging_steps": config.logging_steps,
            "temperature": config.temperature,
            "top_p": config.top_p,
            "top_k": config.top_k,
            "beta": config.beta,
            "loss_type": config.loss_type,
            "use_vllm": config.use_vllm,
        }
    counters.sync()
    setup_s = time.perf_counter() - setup_start
    built_mb = current_rss_mb()

    counters.reset()  # ours calls the reward once with placeholders when it is built; only training counts
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
        "peak_rss_mb": rss_mb() - baseline_mb,
        "baseline_rss_mb": baseline_mb,
        "built_rss_mb": None if built_mb is None else built_mb - baseline_mb,
        "settings": settings,
    }
    if device.startswith("cuda"):
        result["peak_gpu_mb"] = torch.cuda.max_memory_allocated() / 2**20
    if trainer_name == "comlrl":
        # fwd + bwd + optimizer steps, all inside `_update_from_samples`
        result["update_s"] = counters.update_s
    else:
        history = trainer.state.log_history
        keys = sorted({key for entry in history for key in entry if key.startswith("timing/")}) + ["step_time"]
        logged = {key: sum(entry[key] for entry in history if key in entry) for key in keys}
        rollout_phases = ("sync", "generate", "reward", "transition", "logps")
        for name in rollout_phases:
            logged.setdefault(f"timing/{name}_s", 0.0)
        result["logged"] = logged
        result["optimizer_s"] = counters.update_s
        # timed around every training step (the log covers only the logged steps when logging_steps > 1)
        result["loss_fwd_bwd_s"] = counters.step_s - counters.rollout_s
        result["step_s"] = counters.step_s
        result["update_s"] = result["loss_fwd_bwd_s"] + counters.update_s
        shutil.rmtree(config.output_dir, ignore_errors=True)
    return result


# ---------------------------------------------------------------------- driver side


def build_tiny_model(folder: str, hidden: int, layers: int) -> str:
    sys.path.insert(0, os.path.join(REPO, "tests"))
    from tiny import make_model, make_tokenizer

    tokenizer = make_tokenizer()
    model = make_model(tokenizer, seed=0, hidden=hidden, layers=layers)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def resolve_model(cli, workdir: str) -> tuple[str, str]:
    """(model folder, description)."""
    if cli.smoke or cli.model == "tiny":
        preset = PRESETS["smoke" if cli.smoke else "tiny"]
        folder = build_tiny_model(os.path.join(workdir, "model"), preset["hidden"], preset["layers"])
        return (
            folder,
            f"random Llama, hidden {preset['hidden']}, {preset['layers']} layers, 400-token vocab (tests/tiny.py)",
        )
    if cli.model == "smollm2":
        sys.path.insert(0, REPO)
        from trl_multiagent.models import prepare_default_model

        return prepare_default_model(), "SmolLM2-135M-Instruct (trl_multiagent.models)"
    if not os.path.isdir(cli.model):
        raise SystemExit(f"bench_vs_comlrl: --model must be tiny, smollm2 or a local folder; {cli.model!r} is none.")
    return cli.model, cli.model


def comlrl_available(python: str) -> tuple[bool, str]:
    out = subprocess.run(
        [python, "-c", "import comlrl, comlrl.trainers.reinforce as r; r.MAGRPOTrainer; print(comlrl.__version__)"],
        check=False, capture_output=True, text=True, env={**os.environ, "WANDB_MODE": "disabled"},
    )  # fmt: skip
    if out.returncode != 0:
        lines = (out.stderr or out.stdout).strip().splitlines()
        return False, lines[-1] if lines else f"exit status {out.returncode}"
    return True, out.stdout.strip()


def run_in_subprocess(trainer: str, spec: dict, python: str, script: str = __file__) -> dict:
    """Run `script --worker trainer --spec ...` with `python` and return the dict its last `RESULT ` line holds."""
    env = {**os.environ, "OMP_NUM_THREADS": str(spec["threads"]), "TOKENIZERS_PARALLELISM": "false"}
    env["WANDB_MODE"] = "disabled"
    env["PYTHONPATH"] = os.pathsep.join([REPO, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    command = [python, os.path.abspath(script), "--worker", trainer, "--spec", json.dumps(spec)]
    out = subprocess.run(command, check=False, capture_output=True, text=True, env=env)
    results = [line[len("RESULT ") :] for line in out.stdout.splitlines() if line.startswith("RESULT ")]
    if out.returncode != 0 or not results:
        raise SystemExit(
            f"{os.path.basename(script)}: the {trainer} run (seed {spec.get('seed')}) failed (exit status "
            f"{out.returncode}):\n{out.stdout[-3000:]}\n{out.stderr[-6000:]}"
        )
    return json.loads(results[-1])


def source_revision() -> str:
    """The commit of this checkout, with '+dirty' when trl_multiagent/ has uncommitted changes (or 'unknown')."""
    try:
        commit = subprocess.run(
            ["git", "-C", REPO, "rev-parse", "--short", "HEAD"], check=True, capture_output=True, text=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", REPO, "status", "--porcelain", "--", "trl_multiagent"], check=True, capture_output=True,
            text=True,
        ).stdout.strip()  # fmt: skip
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return commit + ("+dirty" if dirty else "")


def library_versions() -> str:
    from importlib.metadata import PackageNotFoundError, version

    out = [f"python {sys.version.split()[0]}"]
    for name in ("torch", "transformers", "trl", "accelerate"):
        try:
            out.append(f"{name} {version(name)}")
        except PackageNotFoundError:
            pass
    return ", ".join(out)


def load_average() -> str:
    try:
        return ", ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "n/a"


def fmt(value, digits=2):
    if value is None:
        return "-"
    if isinstance(value, int):
        return f"{value:,}"
    return f"{value:,.{digits}f}"


def print_report(spec: dict, results: dict, model_desc: str, skipped_note: str | None) -> None:
    print()
    print("Settings (equal on both sides):")
    print(f"  model: {model_desc} [{spec['model_path']}], dtype {spec['dtype']}, device {spec['device']}, "
          f"torch threads {spec['threads']}")  # fmt: skip
    print(f"  agents {spec['num_agents']}, K (num_generations) {spec['num_generations']}, turns {spec['num_turns']}, "
          f"joint_mode aligned, early termination off, prompts {spec['prompts']}, epochs {spec['epochs']}, "
          f"max_new_tokens {spec['max_new_tokens']}, learning rate {spec['learning_rate']}, "
          f"temperature {spec['temperature']}, top_p {spec['top_p']}, top_k off, seed {spec['seed']}")  # fmt: skip
    for name, r in results.items():
        print(f"  {name} {r['version']}: " + ", ".join(f"{k}={v}" for k, v in r["settings"].items()))
    print(f"  trl_multiagent source: {spec.get('revision', 'unknown')}; {spec.get('versions', '')}")
    print(
        f"  expected joint answers per prompt per epoch: K + K*K = {spec['num_generations'] + spec['num_generations'] ** 2}"
    )
    if spec.get("defaults"):
        print("  ours runs with MAGRPOConfig's defaults, except the fields that define the task (--defaults)")
    if spec.get("ours_micro_batches", 1) != 1:
        print(f"  DIAGNOSTIC: ours runs its update in {spec['ours_micro_batches']} micro-batches (gradient "
              "accumulation), not the comparison's single batch")  # fmt: skip
    if skipped_note:
        print(f"NOTE: {skipped_note}")

    gpu = any("peak_gpu_mb" in r for r in results.values())
    columns = ["trainer", "wall s", "joint answers", "joint answers/s", "gen tokens", "gen tokens/s", "peak RSS MB"]
    columns += ["peak GPU MB"] if gpu else []
    print()
    print("| " + " | ".join(columns) + " |")
    print("|" + "|".join("---" for _ in columns) + "|")
    for name, r in results.items():
        row = [name, fmt(r["wall_s"]), fmt(r["joint_answers"]), fmt(r["joint_answers"] / r["wall_s"]),
               fmt(r["generated_tokens"]), fmt(r["generated_tokens"] / r["wall_s"], 1), fmt(r["peak_rss_mb"], 0)]  # fmt: skip
        row += [fmt(r.get("peak_gpu_mb"), 0)] if gpu else []
        print("| " + " | ".join(row) + " |")
    for num, den in (("ours", "comlrl"), ("ours_vllm", "comlrl"), ("ours_vllm", "ours")):
        if num not in results or den not in results:
            continue
        o, c = results[num], results[den]
        ratio = [f"{num}/{den}", fmt(o["wall_s"] / c["wall_s"]) + "x", "",
                 fmt((o["joint_answers"] / o["wall_s"]) / (c["joint_answers"] / c["wall_s"])) + "x", "",
                 fmt((o["generated_tokens"] / o["wall_s"]) / (c["generated_tokens"] / c["wall_s"])) + "x",
                 fmt(o["peak_rss_mb"] / max(c["peak_rss_mb"], 1e-9)) + "x"]  # fmt: skip
        if gpu:
            ratio += [fmt(o.get("peak_gpu_mb", 0) / max(c.get("peak_gpu_mb", 0), 1e-9)) + "x"]
        print("| " + " | ".join(ratio) + " |")

    print()
    print("Tree check (counted during training):")
    print("| trainer | turn-1 joint answers | turn-2 joint answers | reward calls | transitions | generate calls "
          "| sequences generated | optimizer steps |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    for name, r in results.items():
        turns = r["joint_answers_turn"]
        print(f"| {name} | {turns.get('1', turns.get(1, 0))} | {turns.get('2', turns.get(2, 0))} | {r['reward_calls']} "
              f"| {r['transitions']} | {r['generate_calls']} | {r['generated_sequences']} | {r['optimizer_steps']} |")  # fmt: skip

    print()
    print("Where the time goes (seconds; generate = inside the agents' generate calls, and ours' prompt prefill just "
          "before them, update = forward + backward + optimizer step, other = the rest of train()):")  # fmt: skip
    print("| trainer | generate | reward + transition | update | other | setup (load + build, not in wall) "
          "| RSS after build MB |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    for name, r in results.items():
        other = r["wall_s"] - r["generate_s"] - r["reward_s"] - r["transition_s"] - r["update_s"]
        print(f"| {name} | {fmt(r['generate_s'])} | {fmt(r['reward_s'] + r['transition_s'], 3)} | {fmt(r['update_s'])} "
              f"| {fmt(other)} | {fmt(r['setup_s'])} | {fmt(r.get('built_rss_mb'), 0)} |")  # fmt: skip
    if "ours" in results and "ours_vllm" in results:
        o, v = results["ours"], results["ours_vllm"]
        print()
        print(f"Generate phase, weight syncs included: ours {o['generate_s']:.2f} s, ours_vllm {v['generate_s']:.2f} s "
              f"(of which syncs {v['sync_s']:.2f} s): vLLM is {o['generate_s'] / v['generate_s']:.2f}x faster; "
              f"whole train(): {o['wall_s'] / v['wall_s']:.2f}x.")  # fmt: skip
    for name in ("ours", "ours_vllm"):
        if name not in results:
            continue
        o = results[name]
        logged = o["logged"]
        print()
        print(f"{name}, from trainer.state.log_history (summed over the logged steps): "
              + ", ".join(f"{k} {v:.3f}" for k, v in logged.items())
              + f"; timed around every step: loss fwd+bwd = training_step - rollout = {o['loss_fwd_bwd_s']:.3f}, "
              + f"optimizer step {o['optimizer_s']:.3f}, outside the steps {o['wall_s'] - o['step_s'] - o['optimizer_s']:.3f}")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny", help="tiny, smollm2, or a local save_pretrained folder")
    parser.add_argument("--smoke", action="store_true", help="hidden-32 model, 1 prompt, 4 new tokens (for tests)")
    parser.add_argument("--device", default="cpu", help="cpu or cuda (cuda:N)")
    parser.add_argument("--prompts", type=int, default=None, help="number of prompts (default: per model)")
    parser.add_argument("--max_new_tokens", type=int, default=None, help="default: per model")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--learning_rate", type=float, default=1e-5)
    parser.add_argument("--num_generations", type=int, default=4)
    parser.add_argument("--num_turns", type=int, default=2)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--threads", type=int, default=None, help="torch threads per run (default 1 for tiny models)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--repeats", type=int, default=1, help="runs per trainer (interleaved); the fastest is reported"
    )
    parser.add_argument("--trainers", default="comlrl,ours", help="comma-separated subset of comlrl,ours")
    parser.add_argument("--comlrl_python", default=os.environ.get("COMLRL_PYTHON", sys.executable),
                        help="interpreter that has comlrl installed (default: $COMLRL_PYTHON, else this one)")  # fmt: skip
    parser.add_argument("--ours_micro_batches", type=int, default=1,
                        help="diagnostic: split our update into this many micro-batches (gradient accumulation; the "
                        "rollout and the single optimizer step are unchanged). The comparison's setting is 1.")  # fmt: skip
    parser.add_argument("--defaults", action="store_true",
                        help="ours with MAGRPOConfig's defaults, except the fields that define the task")  # fmt: skip
    parser.add_argument("--json", help="also write the results to this file")
    parser.add_argument("--worker", choices=TRAINERS, help=argparse.SUPPRESS)
    parser.add_argument("--spec", help=argparse.SUPPRESS)
    cli = parser.parse_args()

    if cli.worker:
        print("RESULT " + json.dumps(run_worker(cli.worker, json.loads(cli.spec))), flush=True)
        return

    preset = PRESETS["smoke" if cli.smoke else cli.model if cli.model in PRESETS else "path"]
    trainers = [t.strip() for t in cli.trainers.split(",") if t.strip()]
    if any(t not in TRAINERS for t in trainers):
        raise SystemExit(f"bench_vs_comlrl: --trainers takes a subset of {TRAINERS}, got {cli.trainers!r}.")
    skipped_note = None
    if "comlrl" in trainers:
        ok, detail = comlrl_available(cli.comlrl_python)
        if not ok:
            trainers.remove("comlrl")
            skipped_note = (
                f"CoMLRL skipped: it is not importable with {cli.comlrl_python} ({detail}). Install it with: "
                f"{INSTALL_HINT}"
            )
            print(f"NOTE: {skipped_note}", flush=True)

    workdir = tempfile.mkdtemp(prefix="bench_vs_comlrl_")
    try:
        model_path, model_desc = resolve_model(cli, workdir)
        threads = cli.threads or preset["threads"] or os.cpu_count() or 1
        rows = (cli.prompts or preset["prompts"]) * cli.num_generations
        if rows % cli.ours_micro_batches:
            raise SystemExit(f"bench_vs_comlrl: prompts * K ({rows}) must be a multiple of --ours_micro_batches.")
        spec = {
            "model_path": model_path,
            "device": cli.device,
            "dtype": cli.dtype,
            "threads": threads,
            "seed": cli.seed,
            "num_agents": 2,
            "num_generations": cli.num_generations,
            "num_turns": cli.num_turns,
            "prompts": cli.prompts or preset["prompts"],
            "max_new_tokens": cli.max_new_tokens or preset["max_new_tokens"],
            "epochs": cli.epochs,
            "learning_rate": cli.learning_rate,
            "ours_micro_batches": cli.ours_micro_batches,
            "defaults": cli.defaults,
            "revision": source_revision(),
            "versions": library_versions(),
            "temperature": 1.0,
            "top_p": 1.0,
        }
        runs = {trainer: [] for trainer in trainers}
        load_before = load_average()
        for repeat in range(cli.repeats):
            for trainer in trainers:  # interleaved, so that a burst of load from elsewhere hits both sides alike
                python = cli.comlrl_python if trainer == "comlrl" else sys.executable
                print(f"running {trainer} ({python}), run {repeat + 1}/{cli.repeats} ...", flush=True)
                r = run_in_subprocess(trainer, spec, python)
                runs[trainer].append(r)
                print(f"  {trainer}: {r['wall_s']:.2f} s, {r['joint_answers']} joint answers, "
                      f"{r['generated_tokens']} generated tokens", flush=True)  # fmt: skip
        # With repeats, each trainer's fastest run is reported (the one least disturbed by other load on the machine).
        results = {trainer: min(trainer_runs, key=lambda r: r["wall_s"]) for trainer, trainer_runs in runs.items()}
        print_report(spec, results, model_desc, skipped_note)
        load_after = load_average()
        print()
        print("Wall seconds of every run: " + "; ".join(
            f"{t} " + ", ".join(f"{r['wall_s']:.2f}" for r in rs) for t, rs in runs.items()
        ) + (" (fastest reported)" if cli.repeats > 1 else ""))  # fmt: skip
        print(f"Load average (1, 5, 15 min) before: {load_before}, after: {load_after}; CPUs: {os.cpu_count()}")
        if cli.json:
            with open(cli.json, "w") as f:
                json.dump({"spec": spec, "results": results, "runs": runs, "skipped": skipped_note,
                           "load_before": load_before, "load_after": load_after}, f, indent=2)  # fmt: skip
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
