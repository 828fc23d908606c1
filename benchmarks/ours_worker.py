"""One run of our `MAGRPOTrainer` on the seed task, for `bench_vs_comlrl.py`, in a process of its own.

    python benchmarks/ours_worker.py --worker ours --spec JSON         # as bench_vs_comlrl.py launches it
    python benchmarks/ours_worker.py --worker ours_vllm --spec JSON    # the same with colocated vLLM engines

Its generate phase includes the prompt prefill just before `generate` and, with vLLM, the weight syncs into the
engines; its update is timed around every training step and optimizer step (docs/benchmark_vs_comlrl.md).
"""

from __future__ import annotations

import shutil
import tempfile
import time

from transformers import TrainerCallback
from worker_common import Counters, prepare, train_measured, worker_main

import trl_multiagent
import trl_multiagent.generation.hf
from trl_multiagent import MAGRPOConfig, MAGRPOTrainer


class OptimizerTimer(TrainerCallback):
    """Times each optimizer step (the part of the update outside `training_step`) and counts them."""

    def __init__(self, counters: Counters):
        self.counters = counters

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        self.counters.sync()
        self.start = time.perf_counter()

    def on_optimizer_step(self, args, state, control, **kwargs):
        self.counters.sync()
        self.counters.update_s += time.perf_counter() - self.start
        self.counters.optimizer_steps += 1


def run(trainer_name: str, spec: dict) -> dict:
    setup = prepare(spec)
    counters = setup.counters
    k, p = spec["num_generations"], spec["prompts"]
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
        use_cpu=spec["device"] == "cpu",
        seed=spec["seed"],
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
        model=setup.agents,
        processing_class=setup.tokenizer,
        reward_funcs=counters.reward(),
        external_transition=counters.transition(),
        train_dataset=setup.dataset,
        args=config,
        callbacks=[OptimizerTimer(counters)],
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
    result = train_measured(setup, trainer, trainer_name, trl_multiagent.__version__, settings)

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


if __name__ == "__main__":
    worker_main(run, ("ours", "ours_vllm"), __doc__.splitlines()[0])
