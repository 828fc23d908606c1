"""Worker for the actor-critics' multi-process test: one step of the CoMLRL face's IAC or MAAC (two tiny agents, their
critic models, two turns, K=1) on four prompts, then each rank's actor and critic weights and its critics' AdamW
moments dumped. Launched by tests/test_distributed.py under torchrun with 2 processes (2 prompts each), or with 1
process (the 4 prompts) as the reference; completions are seeded per prompt (`PerPromptSeeds`), so both see the same.
"""

import argparse
import contextlib
import json
import os

import torch


with contextlib.suppress(ImportError):  # first, as in run_length_ratio.py: DeepSpeed's defaults and the world group
    import deepspeed  # noqa: F401

from run_length_ratio import PerPromptSeeds, StopAt  # noqa: E402  (this folder: the worker scripts run from it)

from trl_multiagent.comlrl import IACConfig, IACTrainer, MAACConfig, MAACTrainer  # noqa: E402
from trl_multiagent.demo.testing import make_model, make_tokenizer  # noqa: E402


PROMPTS = ["count to three", "name a colour", "say hi", "list two fruits"]
ALGORITHMS = {"iac": (IACConfig, IACTrainer, 2), "maac": (MAACConfig, MAACTrainer, 1)}  # config, trainer, critics


def score(completions1, completions2):
    return [float(sum(map(ord, a + b)) % 7) for a, b in zip(completions1, completions2, strict=True)]


def transition(prompt, agent_completions, **_):
    return [f"{prompt}, after {completion[:6]!r}" for completion in agent_completions]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--output_dir", required=True)
    parser.add_argument("--algorithm", choices=sorted(ALGORITHMS), default="iac")
    parser.add_argument("--critic_type", choices=["v", "q"], default="v")
    parser.add_argument("--prompts_per_process", type=int, required=True)
    parser.add_argument("--epochs", type=int, default=1, help="one step each")
    parser.add_argument("--save", action="store_true", help="a checkpoint at every step")
    parser.add_argument("--stop_at", type=int, default=None, help="stop after this step (its checkpoint written)")
    parser.add_argument("--resume", default=None, help="a checkpoint to resume from")
    cli = parser.parse_args()
    config_cls, trainer_cls, critics = ALGORITHMS[cli.algorithm]
    tokenizer = make_tokenizer()
    args = config_cls(
        output_dir=cli.output_dir, num_turns=2, max_new_tokens=3, num_train_epochs=cli.epochs, eval_interval=0,
        early_termination_threshold=None, report_to="none", save_strategy="steps" if cli.save else "no", save_steps=1,
        seed=0, discount=0.5,
        agent_learning_rate=1e-3, critic_learning_rate=1e-2, critic_type=cli.critic_type,
        rollout_buffer_size=2 * cli.prompts_per_process,  # tree nodes: two per prompt (two turns, K=1)
    )  # fmt: skip
    trainer = type("Seeded", (PerPromptSeeds, trainer_cls), {})(
        agents=[make_model(tokenizer, seed=0), make_model(tokenizer, seed=1)],
        critics=[make_model(tokenizer, seed=2 + i) for i in range(critics)],
        tokenizer=tokenizer, reward_func=score, external_transition=transition,
        train_dataset=[{"prompt": p} for p in PROMPTS], args=args,
        callbacks=[StopAt(cli.stop_at)] if cli.stop_at else None,
    )  # fmt: skip
    trainer.train(resume_from_checkpoint=cli.resume)
    rank = trainer.accelerator.process_index
    weights = {
        f"agent{i}.{n}": p.detach().clone() for i, a in enumerate(trainer.agents) for n, p in a.named_parameters()
    }
    for c, critic in enumerate(trainer.critics):
        weights.update({f"critic{c}.{n}": p.detach().clone() for n, p in critic.named_parameters()})
    for c, optimizer in enumerate(trainer.critic_optimizers):
        for i, state in optimizer.state_dict()["state"].items():
            weights[f"critic{c}.adam.{i}"] = torch.cat([state["exp_avg"].flatten(), state["exp_avg_sq"].flatten()])
    torch.save(weights, os.path.join(cli.output_dir, f"weights_rank{rank}.pt"))
    if trainer.accelerator.is_main_process:
        info = {"num_processes": trainer.accelerator.num_processes, "log_history": trainer.state.log_history}
        with open(os.path.join(cli.output_dir, "info.json"), "w") as f:
            json.dump(info, f)
    trainer.end()


if __name__ == "__main__":
    main()
