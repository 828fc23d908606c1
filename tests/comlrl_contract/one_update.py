"""CoMLRL 1.4.3's own update of each agent, on given completions and returns (run by
tests/test_comlrl_objective.py's slow test, under a Python with CoMLRL installed).

    PY one_update.py RUN_DIR

RUN_DIR holds `agent_0/`, `agent_1/`, ... (the agents before the update, with the tokenizer), and `update.json`:
`{"config": {CoMLRL MAGRPOConfig keywords}, "nodes": [{"turn": t, "prompt": [ids per agent], "completions":
[[ids per completion] per agent], "returns": [[K floats] per agent]}, ...]}`. CoMLRL's `MAGRPOTrainer` is built with
the agents (its own `AdamW` per agent), each agent's nodes go through its `_update_from_samples` as `NodeSample`s
(one batch: `train_batch_size` is the node count), and each agent's parameters afterwards are saved to
`RUN_DIR/after_{i}.pt`, with its gradient at the step (captured by an optimizer pre-step hook) to `grads_{i}.pt`.
"""

import json
import sys
from pathlib import Path

import torch
from comlrl.trainers.reinforce.magrpo import MAGRPOConfig, MAGRPOTrainer, NodeSample
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast


def main(run_dir: Path) -> None:
    spec = json.loads((run_dir / "update.json").read_text())
    num_agents = len(spec["nodes"][0]["prompt"])
    agents = [AutoModelForCausalLM.from_pretrained(run_dir / f"agent_{i}") for i in range(num_agents)]
    tokenizer = PreTrainedTokenizerFast.from_pretrained(run_dir / "agent_0")
    trainer = MAGRPOTrainer(
        agents=agents,
        tokenizer=tokenizer,
        reward_func=lambda *completions: [0.0] * len(completions[0]),
        external_transition=lambda **kwargs: ["unused"] * num_agents,
        args=MAGRPOConfig(**spec["config"], train_batch_size=len(spec["nodes"])),
    )
    for i in range(num_agents):
        grads = {}

        def keep_gradient(optimizer, args, kwargs, i=i, grads=grads):
            grads.update({n: p.grad.detach().clone() for n, p in trainer.agents[i].named_parameters()})

        trainer.optimizers[i].register_step_pre_hook(keep_gradient)
        samples = [
            NodeSample(
                agent_idx=i,
                turn_idx=node["turn"],
                completions_data=trainer._pack_completions_for_buffer(
                    {
                        "prompt_input_ids": torch.tensor([node["prompt"][i]]),
                        "completion_input_ids": [torch.tensor(ids) for ids in node["completions"][i]],
                    }
                ),
                returns=node["returns"][i],
                node_mean_reward=0.0,
                node_mean_return=0.0,
                node_env_step=0,
            )
            for node in spec["nodes"]
        ]
        trainer._update_from_samples(i, samples)
        torch.save(dict(trainer.agents[i].named_parameters()), run_dir / f"after_{i}.pt")
        torch.save(grads, run_dir / f"grads_{i}.pt")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
