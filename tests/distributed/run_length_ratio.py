"""Worker for the multi-process tests: trains the length-ratio task on tiny agents and dumps the final weights.

Launched by tests/test_distributed.py under torchrun with 2 processes (gloo on CPU), or with 1 process as reference.
"""

import argparse
import atexit
import contextlib
import faulthandler
import gc
import json
import math
import os
import signal
import time
import zlib

import torch


# DeepSpeed's communication functions take `group=GroupMember.WORLD` as a default, evaluated at import: imported after
# the world group is made (transformers and accelerate import DeepSpeed while preparing a run, with or without ZeRO),
# the default keeps that group and its gloo threads alive after `trainer.end()` destroyed it, into the interpreter's
# finalisation, where they can abort a finished run. Imported first, the default is None (the current world group).
with contextlib.suppress(ImportError):
    import deepspeed  # noqa: F401  (its import sets PYTORCH_NVML_BASED_CUDA_CHECK: before the environment check below)

from accelerate.utils import gather_object  # noqa: E402
from datasets import Dataset
from transformers import TrainerCallback

from trl_multiagent import MAGRPOConfig, MAGRPOTrainer, checkpoint
from trl_multiagent.demo.examples import PROMPTS, length_feedback, length_ratio_reward
from trl_multiagent.demo.testing import make_model, make_tokenizer, with_trained_adapter
from trl_multiagent.devices import reuse_freed_memory
from trl_multiagent.rollout import Generation


def eight_characters(completions, **kwargs):
    """One agent's reward, in TRL's convention: answers of about 8 characters."""
    return [math.exp(-abs(len(c) - 8) / 4) for c in completions]


class StopAt(TrainerCallback):
    def __init__(self, step):
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        control.should_training_stop = state.global_step >= self.step


class PerPromptSeeds:
    """Mixed into a trainer: samples each prompt's completions from a generator seeded by (agent, prompt) alone.

    Sampling then does not depend on which process holds a prompt or what else is in its batch, so a 2-process run
    and a 1-process run see the same completions and must reach the same weights (run_actor_critic.py mixes it into
    the actor-critics).
    """

    def _generate_for_agent(self, agent, prompts, num_generations, environments=None):
        if not prompts:
            return super()._generate_for_agent(agent, prompts, num_generations, environments)
        parts = []
        for prompt in prompts:
            torch.manual_seed(zlib.crc32(f"{agent}|{prompt}".encode()))
            parts.append(super()._generate_for_agent(agent, [prompt], num_generations))
        return Generation(
            *(sum((getattr(p, f) for p in parts), []) for f in ("prompt_ids", "completion_ids", "completions")),
            truncated_prompts=sum(p.truncated_prompts for p in parts),
        )


class PerPromptSeededTrainer(PerPromptSeeds, MAGRPOTrainer):
    pass


class OwnTrees(TrainerCallback):
    """Each rank's own tree of every step (row, node turns, agent 0's texts), written to own_trees_rank{r}.json, for
    the test that the recorded files hold every rank's rows once."""

    def __init__(self, trainer, output_dir, rank):
        self.trainer, self.path, self.steps = trainer, os.path.join(output_dir, f"own_trees_rank{rank}.json"), {}

    def on_step_end(self, args, state, control, **kwargs):
        tree = self.trainer.last_rollout
        rows = sorted({node.row for node in tree.nodes})
        self.steps[state.global_step] = [
            [
                row,
                [n.turn for n in tree.nodes if n.row == row],
                [t for n in tree.nodes if n.row == row for t in n.completions[0]],
            ]
            for row in rows
        ]
        with open(self.path, "w") as f:
            json.dump(self.steps, f)


# Moments inside one checkpoint write: between the two agents' folders, after the agents before the optimizer, and
# after every file but before the completion marker.
KILL_POINTS = ("between_agents", "before_optimizer", "before_marker")


def kill_while_saving(trainer, step, point):
    """SIGKILL this process at `point` of the checkpoint of `step`, leaving that checkpoint as a kill would."""

    def killing(original):
        def wrapper(*args, **kwargs):
            if trainer.state.global_step == step:
                os.kill(os.getpid(), signal.SIGKILL)
            return original(*args, **kwargs)

        return wrapper

    if point == "between_agents":
        agent = trainer.team.agent(1)
        agent.save_pretrained = killing(agent.save_pretrained)
    elif point == "before_optimizer":
        trainer._save_optimizer_and_scheduler = killing(trainer._save_optimizer_and_scheduler)
    else:
        checkpoint.mark_complete = killing(checkpoint.mark_complete)


def sigkill_during(trainer, phase, output_dir):
    """SIGKILL this process in the middle of the first step's generation (turn 2) or update (its first loss), after
    writing the time and its pid (the test measures how long the other rank outlives it)."""

    def die():
        with open(os.path.join(output_dir, "killed.json"), "w") as f:
            json.dump({"time": time.time(), "pid": os.getpid()}, f)
        os.kill(os.getpid(), signal.SIGKILL)

    if phase == "generate":
        generate = trainer._generate_for_agent

        def killed_generate(agent, prompts, num_generations, environments=None):
            if any("Your last answer had" in str(p) for p in prompts):  # a turn-2 prompt
                die()
            return generate(agent, prompts, num_generations, environments)

        trainer._generate_for_agent = killed_generate
    else:
        compute_loss = trainer.compute_loss

        def killed_loss(*args, **kwargs):
            die()
            return compute_loss(*args, **kwargs)

        trainer.compute_loss = killed_loss


def gathered(module, trainer):
    """Full parameters under ZeRO-3 (partitioned otherwise); a no-op elsewhere."""
    if trainer.is_deepspeed_enabled and trainer.accelerator.state.deepspeed_plugin.zero_stage == 3:
        import deepspeed

        return deepspeed.zero.GatheredParameters(list(module.parameters()))
    return contextlib.nullcontext()


def gloo_state_for_deepspeed():
    """What a launcher sets up for DeepSpeed, here on a CPU: the gloo process group, made before the config (which
    then uses it: `use_configured_state`). transformers builds the state for `deepspeed=` without a backend, and on a
    CPU accelerate then counts one process while DeepSpeed counts all of them. `ACCELERATE_USE_DEEPSPEED` is set only
    while the state is built, as transformers sets it."""
    from accelerate import PartialState

    os.environ["ACCELERATE_USE_DEEPSPEED"] = "true"
    try:
        PartialState(backend="gloo")
    finally:
        del os.environ["ACCELERATE_USE_DEEPSPEED"]


def groups_state():
    return "held" if torch.distributed.is_initialized() else "released"


def gloo_threads():
    """The gloo threads still running (a group destroyed in torch's registry but still referenced keeps its threads
    into the interpreter's finalisation)."""
    names = []
    for thread in os.listdir("/proc/self/task"):
        with contextlib.suppress(OSError), open(f"/proc/self/task/{thread}/comm") as comm:
            names.append(comm.read().strip())
    return sorted(name for name in names if "gloo" in name)


def main():
    # The tests give a launch 600 s: a rank still running after 540 prints every thread's stack and exits, so that a
    # hang fails its test saying where each rank stood (CI saw one hang once, after the run's last save).
    faulthandler.dump_traceback_later(540, exit=True)
    parser = argparse.ArgumentParser()
    parser.add_argument("--output_dir", required=True)
    parser.add_argument("--per_device_train_batch_size", type=int, default=4)
    parser.add_argument("--max_steps", type=int, default=2)
    parser.add_argument("--save_steps", type=int, default=500)
    parser.add_argument("--resume", default=None)
    parser.add_argument("--deepspeed", default=None)
    parser.add_argument("--fail_on_rank", type=int, default=-1)
    parser.add_argument("--fail_in", choices=["transition", "generate"], default="transition",
                        help="with --fail_on_rank: where that rank raises (generate: at turn 2)")  # fmt: skip
    parser.add_argument("--sigkill_in", choices=["generate", "update"], default=None,
                        help="with --fail_on_rank: that rank SIGKILLs itself in the first step's turn-2 generate, or "
                        "in its first loss (as the out-of-memory killer would)")  # fmt: skip
    parser.add_argument("--ddp_timeout", type=int, default=1800)
    parser.add_argument("--save_on_each_node", action="store_true")
    parser.add_argument("--per_prompt_seed", action="store_true")
    parser.add_argument("--beta", type=float, default=0.0)
    parser.add_argument("--use_vllm", action="store_true", help="generate with colocated vLLM engines")
    parser.add_argument("--shared_lora", action="store_true", help="one base model with a LoRA adapter per agent")
    parser.add_argument("--one_agent", action="store_true", help="a team of one, rewarded for 8-character answers")
    parser.add_argument(
        "--trained_adapter", action="store_true", help="with --one_agent: a PEFT model with a trained adapter"
    )
    parser.add_argument("--shuffle", action="store_true", help="shuffle the prompts every epoch")
    parser.add_argument("--save_total_limit", type=int, default=None)
    parser.add_argument(
        "--kill_at", type=int, default=None, help="SIGKILL this process while saving this step's checkpoint"
    )
    parser.add_argument("--kill_point", choices=KILL_POINTS, default="before_marker")
    parser.add_argument("--update_chunk_size", type=int, default=None, help="rows per agent in one forward/backward")
    parser.add_argument("--generate_chunk_size", type=int, default=None, help="rows per generate call")
    parser.add_argument("--stop_at", type=int, default=None, help="interrupt training after this step")
    parser.add_argument("--agent_learning_rates", type=float, nargs="+", default=None, help="one rate per agent")
    parser.add_argument("--log_rollout_trees", action="store_true", help="record the trees; each rank notes its own")
    cli = parser.parse_args()

    reuse_freed_memory()  # as the recipes do on a CPU (the trainer leaves the allocator alone)
    tokenizer = make_tokenizer()
    if cli.deepspeed:
        gloo_state_for_deepspeed()
    environment = dict(os.environ)
    args = MAGRPOConfig(
        output_dir=cli.output_dir, num_turns=1 if cli.one_agent else 2, early_termination_threshold=0.55, num_generations=2,
        per_device_train_batch_size=cli.per_device_train_batch_size, max_new_tokens=6, max_steps=cli.max_steps,
        learning_rate=0.5, optim="sgd", lr_scheduler_type="constant", max_grad_norm=0.0, logging_steps=1,
        report_to="none", seed=0, save_steps=cli.save_steps, shuffle_dataset=cli.shuffle, save_total_limit=cli.save_total_limit, disable_tqdm=True,
        deepspeed=cli.deepspeed, beta=cli.beta, ddp_timeout=cli.ddp_timeout, save_on_each_node=cli.save_on_each_node, use_vllm=cli.use_vllm, update_chunk_size=cli.update_chunk_size,
        generate_chunk_size=cli.generate_chunk_size, agent_learning_rates=cli.agent_learning_rates,
        gradient_checkpointing=True,  # TRL's GPU default: the runs check the update under activation checkpointing
        log_rollout_trees=cli.log_rollout_trees,
        accelerator_config={"use_configured_state": True} if cli.deepspeed else None,
    )  # fmt: skip
    # Building a config changes no environment variable.
    assert dict(os.environ) == environment, set(os.environ.items()) ^ set(environment.items())
    rank = int(os.environ.get("RANK", "0"))
    os.makedirs(cli.output_dir, exist_ok=True)
    with open(os.path.join(cli.output_dir, f"pid_rank{rank}"), "w") as f:
        f.write(str(os.getpid()))

    # Runs after `main` returned, which ends with `trainer.end()`: the process groups must be released by then, and
    # their gloo threads gone once garbage is collected (tests/test_distributed.py). The trainer, as every transformers
    # Trainer, lives in reference cycles (its callbacks, accelerate's hooks) that hold DDP's reducer and so its group
    # until a collection; the interpreter's finalisation collects them before it tears modules down. What must not
    # remain is a group held by what is never collected: a module global or a function's default.
    def report_groups_at_exit():
        # A gloo worker thread frees a finished collective's tensors holding its group's lock, and needs the GIL for it;
        # a collection that frees the group holds the GIL and waits for that lock: a deadlock (torch 2.13: rank 0 of a
        # DDP run hung here, in CI and on the development machine under load, right after the last gather). The pause
        # lets those threads finish first.
        time.sleep(0.5)
        gc.collect()
        print(f"rank {rank}: process groups at exit: {groups_state()}, gloo threads {gloo_threads()}", flush=True)

    atexit.register(report_groups_at_exit)

    def feedback(prompt, agent_completions, num_agents, **history):
        if rank == cli.fail_on_rank and cli.fail_in == "transition" and cli.sigkill_in is None:
            raise RuntimeError(f"transition failure on rank {rank}")
        return length_feedback(prompt, agent_completions, num_agents, **history)

    trainer_class = PerPromptSeededTrainer if cli.per_prompt_seed else MAGRPOTrainer
    # vLLM's CPU attention needs a head size of at least 32.
    size = {"hidden": 64, "heads": 2} if cli.use_vllm else {}
    if cli.shared_lora:  # one base, one LoRA adapter per agent
        from peft import LoraConfig

        team = {"model": make_model(tokenizer, seed=0, **size), "num_agents": 2,
                "peft_config": LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "o_proj"])}  # fmt: skip
    elif cli.one_agent:  # GRPOTrainer's case: `trainer.model` is the agent itself, not the team
        agent = make_model(tokenizer, seed=0, **size)
        team = {"model": with_trained_adapter(agent) if cli.trained_adapter else agent}
    else:
        team = {"model": [make_model(tokenizer, seed=i, **size) for i in range(2)]}
    trainer = trainer_class(
        **team,
        processing_class=tokenizer,
        reward_funcs=eight_characters if cli.one_agent else length_ratio_reward,
        external_transition=None if cli.one_agent else feedback,
        train_dataset=Dataset.from_dict({"prompt": PROMPTS * 2}), args=args,
        callbacks=[StopAt(cli.stop_at)] if cli.stop_at else None,
    )  # fmt: skip
    if cli.log_rollout_trees:
        trainer.add_callback(OwnTrees(trainer, cli.output_dir, rank))
    state = trainer.accelerator.state
    # Records, at each generate call, how many parameter elements of the generating agent (when it starts and when it
    # ends) and of the other agents are materialised on this rank (ZeRO-3 keeps partitioned parameters as empty
    # tensors).
    visible = []
    for i, agent in enumerate(trainer.team.agents):
        others = [a for j, a in enumerate(trainer.team.agents) if j != i]

        def recording_generate(*a, _agent=agent, _others=others, _generate=agent.generate, **k):
            own = sum(p.numel() for p in _agent.parameters())
            rest = sum(p.numel() for o in _others for p in o.parameters())
            out = _generate(*a, **k)
            visible.append([own, rest, sum(p.numel() for p in _agent.parameters())])
            return out

        agent.generate = recording_generate
    if rank == cli.fail_on_rank and cli.fail_in == "generate":
        generate = trainer._generate_for_agent

        def failing_generate(agent, prompts, num_generations, environments=None):
            if any("Your last answer had" in str(p) for p in prompts):  # a turn-2 prompt
                raise RuntimeError(f"generate failure on rank {rank}")
            return generate(agent, prompts, num_generations, environments)

        trainer._generate_for_agent = failing_generate
    if rank == cli.fail_on_rank and cli.sigkill_in:
        sigkill_during(trainer, cli.sigkill_in, cli.output_dir)
    if cli.kill_at is not None:
        kill_while_saving(trainer, cli.kill_at, cli.kill_point)
    trainer.train(resume_from_checkpoint=True if cli.resume == "latest" else cli.resume)
    trainer.save_model(os.path.join(cli.output_dir, "final"))
    weights = {}
    for i, agent in enumerate(trainer.team.agents):
        with gathered(agent, trainer):
            for name, p in agent.named_parameters():
                weights[f"{i}.{name}"] = p.detach().cpu().clone()
    torch.save(weights, os.path.join(cli.output_dir, f"weights_rank{trainer.accelerator.process_index}.pt"))
    group_lrs = gather_object([[g["lr"] for g in trainer.optimizer.param_groups]])  # every rank's optimizer
    if trainer.accelerator.is_main_process:
        info = {"num_processes": state.num_processes, "distributed_type": str(state.distributed_type),
                "log_history": trainer.state.log_history, "visible_while_generating": visible,
                "group_lrs": group_lrs}  # fmt: skip
        with open(os.path.join(cli.output_dir, "info.json"), "w") as f:
            json.dump(info, f)
    # Trainer's own release of the trackers and process groups, at the very end: without it, a gloo thread left to the
    # interpreter's finalisation can abort a finished run ("terminate called without an active exception").
    trainer.end()


if __name__ == "__main__":
    main()
