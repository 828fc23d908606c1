"""One run of CoMLRL's `MAGRPOTrainer` (1.4.3) on the seed task, for `bench_vs_comlrl.py`, in a process of its own.

    python benchmarks/comlrl_worker.py --worker comlrl --spec JSON     # as bench_vs_comlrl.py launches it

Its `rollout_buffer_size` and `train_batch_size` are all the tree nodes of the epoch, so that it updates once per
epoch over all rows (docs/benchmark_vs_comlrl.md, "How the settings map").
"""

from __future__ import annotations

import os

from worker_common import prepare, train_measured, worker_main


def run(trainer_name: str, spec: dict) -> dict:
    os.environ.setdefault("WANDB_MODE", "disabled")
    import comlrl
    from comlrl.trainers.reinforce import MAGRPOConfig as CoMAGRPOConfig
    from comlrl.trainers.reinforce import MAGRPOTrainer as CoMAGRPOTrainer

    setup = prepare(spec)
    counters = setup.counters
    k, p = spec["num_generations"], spec["prompts"]
    tree_nodes = (1 + k) * p  # per epoch, per agent: one root per prompt and one child per turn-1 joint answer
    config = CoMAGRPOConfig(
        num_train_epochs=spec["epochs"],
        agent_learning_rate=spec["learning_rate"],
        logging_steps=1,
        num_agents=spec["num_agents"],
        agent_devices=spec["device"],
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
        agents=setup.agents,
        num_agents=spec["num_agents"],
        tokenizer=setup.tokenizer,
        train_dataset=setup.dataset,
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
    result = train_measured(setup, trainer, trainer_name, comlrl.__version__, settings)
    result["update_s"] = counters.update_s  # fwd + bwd + optimizer steps, all inside `_update_from_samples`
    return result


if __name__ == "__main__":
    worker_main(run, ("comlrl",), __doc__.splitlines()[0])
