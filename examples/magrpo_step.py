"""MAGRPO, the algorithm in one page: one training step of two cooperating agents, in plain torch and transformers.

A reference to read top to bottom, in the spirit of CleanRL's single-file scripts: no trainer, no `trl_multiagent`.
One step is

1. a rollout tree per prompt: each agent writes K completions at a node, joint action k is the k-th completion of
   every agent ("aligned"), the team gets one joint reward per joint action, and every joint action of turn 1 goes
   on to a child node whose prompts the transition writes from the joint action's answers;
2. returns, bottom-up: ``R = r + discount * mean(R of the child node's joint actions)``, or ``r`` at the last turn;
3. group-relative advantages: each agent's K completions at a node are one group, ``A = (R - mean) / (std + 1e-4)``;
4. per agent, PPO's clipped surrogate on every completion token, summed over the agent's tokens and divided by their
   count; the team's loss is the sum over the agents, and one optimizer step moves both agents.

`MAGRPOTrainer` with the same settings takes the same step: `tests/test_reference_step.py` trains two tiny agents with
it, runs this step on the completions the trainer sampled, and checks the loss and every weight after one SGD step.
The settings are `MAGRPOConfig`'s defaults (GRPOConfig's where TRL has the field), but for the two turns and no
early termination:
``joint_mode="aligned"``, ``discount=1.0``, ``advantage_baseline="mean"``, ``scale_rewards="group"``,
``loss_type="dapo"``, ``epsilon=0.2``, ``beta=0.0`` (no KL term: no reference model), ``num_iterations=1`` (one update
per rollout, so the old policy is the current one), ``temperature=1.0``, ``num_turns=2``,
``early_termination_threshold=None``.

Run it: ``python examples/magrpo_step.py`` (two copies of SmolLM2-135M-Instruct, from the Hub; one prompt's tree,
about 1.5 minutes and 6 GB on one CPU thread: every row's graph lives until the one backward), or ``--model DIR`` for
a model folder of your own.
"""

import argparse
import math
from dataclasses import dataclass, field
from functools import partial

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer


NUM_AGENTS = 2
NUM_GENERATIONS = 4  # K: completions per agent at each node
NUM_TURNS = 2
DISCOUNT = 1.0
EPSILON = 0.2  # PPO's clip range: the ratio is clipped to [1 - EPSILON, 1 + EPSILON]
TEMPERATURE = 1.0
MAX_NEW_TOKENS = 16
LEARNING_RATE = 1e-5


# --------------------------------------------------------------------------------------------------- the task
def joint_reward(answer_0: str, answer_1: str) -> float:
    """The team's reward for one joint action: agent 1's answer should be 2 to 3 times as long as agent 0's."""
    ratio = len(answer_1) / max(len(answer_0), 1)
    return math.exp(-(0.0 if 2 <= ratio <= 3 else min(abs(ratio - 2), abs(ratio - 3))))


def transition(task: str, answers: list[str]) -> list[str]:
    """Each agent's next prompt after a joint action: the task again, and how far the answers were from the goal."""
    ratio = len(answers[1]) / max(len(answers[0]), 1)
    return [
        f"{task}\n\nYour last answer had {len(answer)} characters. The second answer was {ratio:.1f} times as long "
        "as the first; the goal is 2 to 3 times. Please write an improved answer."
        for answer in answers
    ]


# --------------------------------------------------------------------------------------------------- rollout
@dataclass
class Node:
    """One state of the team: a prompt per agent, each agent's K completions, and per joint action k its reward and
    the node it led to (None where the branch ended)."""

    task: str
    prompts: list[str]
    completions: list[list[list[int]]] = field(default_factory=list)  # [agent][k] token ids
    rewards: list[float] = field(default_factory=list)  # [k]
    children: list[int | None] = field(default_factory=list)  # [k]
    returns: list[float] = field(default_factory=list)  # [k]


@torch.no_grad()
def generate(agents, tokenizers, agent: int, prompt: str) -> list[list[int]]:
    """K completions of one prompt, sampled at TEMPERATURE from the whole vocabulary, each cut after its first EOS."""
    tokenizer = tokenizers[agent]
    prompt_ids = torch.tensor([tokenizer(prompt)["input_ids"]])
    out = agents[agent].generate(
        prompt_ids,
        attention_mask=torch.ones_like(prompt_ids),
        do_sample=True,
        temperature=TEMPERATURE,
        top_k=0,
        top_p=1.0,
        max_new_tokens=MAX_NEW_TOKENS,
        num_return_sequences=NUM_GENERATIONS,
        pad_token_id=tokenizer.pad_token_id,
    )
    completions = []
    for row in out[:, prompt_ids.size(1) :].tolist():
        end = row.index(tokenizer.eos_token_id) + 1 if tokenizer.eos_token_id in row else len(row)
        completions.append(row[:end])
    return completions


def grow_trees(prompts: list[str], tokenizers, sample) -> list[Node]:
    """Every node of the prompts' trees, turn by turn; a child node always comes after its parent."""
    nodes = [Node(task=prompt, prompts=[prompt] * NUM_AGENTS) for prompt in prompts]
    frontier = list(range(len(nodes)))
    for turn in range(1, NUM_TURNS + 1):
        next_frontier = []
        for n in frontier:
            node = nodes[n]
            node.completions = [sample(i, node.prompts[i]) for i in range(NUM_AGENTS)]
            texts = [
                [tokenizers[i].decode(ids, skip_special_tokens=True) for ids in node.completions[i]]
                for i in range(NUM_AGENTS)
            ]
            answers = [[texts[i][k] for i in range(NUM_AGENTS)] for k in range(NUM_GENERATIONS)]  # joint action k
            node.rewards = [joint_reward(*answer) for answer in answers]
            node.children = [None] * NUM_GENERATIONS
            if turn < NUM_TURNS:  # every joint action goes on: no early termination, no pruning
                for k, answer in enumerate(answers):
                    nodes.append(Node(task=node.task, prompts=transition(node.task, answer)))
                    node.children[k] = len(nodes) - 1
                    next_frontier.append(len(nodes) - 1)
        frontier = next_frontier
    return nodes


# --------------------------------------------------------------------------------------------------- credit
def compute_returns(nodes: list[Node]) -> None:
    """Bottom-up (children come after their parents): a joint action's return is its reward plus the discounted
    mean return of its child node's joint actions."""
    for node in reversed(nodes):
        node.returns = [
            reward + (DISCOUNT * sum(nodes[child].returns) / NUM_GENERATIONS if child is not None else 0.0)
            for reward, child in zip(node.rewards, node.children, strict=True)
        ]


def advantages(node: Node) -> torch.Tensor:
    """The K advantages of one group: the returns centred on their mean and divided by their std (Bessel-corrected,
    as TRL's). In aligned mode completion k of every agent is credited with joint action k's return, so with one
    joint reward both agents' groups at a node hold the same returns, and get the same advantages."""
    returns = torch.tensor(node.returns)
    return (returns - returns.mean()) / (returns.std() + 1e-4)


# --------------------------------------------------------------------------------------------------- loss
def per_token_logps(model, prompt_ids: list[int], completion_ids: list[int]) -> torch.Tensor:
    """log pi(token | everything before it) of each completion token, at the sampling temperature."""
    input_ids = torch.tensor([prompt_ids + completion_ids])
    logits = model(input_ids).logits[0, len(prompt_ids) - 1 : -1] / TEMPERATURE  # position t predicts token t + 1
    return logits.log_softmax(dim=-1).gather(-1, torch.tensor(completion_ids)[:, None]).squeeze(-1)


def agent_loss(model, tokenizer, nodes: list[Node], agent: int) -> torch.Tensor:
    """PPO's clipped surrogate on every token of the agent's completions, over the count of those tokens (TRL's
    "dapo" loss)."""
    total, tokens = torch.zeros(()), 0
    for node in nodes:
        prompt_ids = tokenizer(node.prompts[agent])["input_ids"]
        for completion_ids, advantage in zip(node.completions[agent], advantages(node), strict=True):
            logps = per_token_logps(model, prompt_ids, completion_ids)
            # One update per rollout: the policy that sampled is the one being updated, so the ratio is 1 in value;
            # its gradient is the policy gradient. With several updates per rollout, `old` would come from the
            # sampler and the clip would stop a token's ratio from moving further than EPSILON.
            old = logps.detach()
            ratio = torch.exp(logps - old)
            clipped = ratio.clamp(1 - EPSILON, 1 + EPSILON)
            total = total - torch.min(ratio * advantage, clipped * advantage).sum()
            tokens += len(completion_ids)
    return total / max(tokens, 1)


# --------------------------------------------------------------------------------------------------- one step
def magrpo_step(agents, tokenizers, prompts: list[str], optimizer, sample=None) -> tuple[torch.Tensor, list[Node]]:
    """One MAGRPO step: trees, returns, advantages, each agent's loss, their sum's backward and one optimizer step.

    `sample(agent, prompt)` returns agent `agent`'s K completions (token ids) of `prompt`; by default `generate`
    samples them from the agent (the test replays the trainer's instead). Returns the loss and the trees' nodes."""
    sample = sample or partial(generate, agents, tokenizers)
    nodes = grow_trees(prompts, tokenizers, sample)
    compute_returns(nodes)
    loss = sum(agent_loss(agents[i], tokenizers[i], nodes, i) for i in range(NUM_AGENTS))
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return loss.detach(), nodes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="HuggingFaceTB/SmolLM2-135M-Instruct", help="Hub id or folder")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    # Two agents: two copies of one model (heterogeneous agents work alike, each with its own tokenizer)
    agents = [AutoModelForCausalLM.from_pretrained(args.model) for _ in range(NUM_AGENTS)]
    tokenizers = [AutoTokenizer.from_pretrained(args.model) for _ in range(NUM_AGENTS)]
    parameters = [p for agent in agents for p in agent.parameters()]
    optimizer = torch.optim.SGD(parameters, lr=LEARNING_RATE)
    prompts = ["Describe a city in the clouds:"]  # one tree: 1 + K nodes, 2 * K * (1 + K) completions
    loss, nodes = magrpo_step(agents, tokenizers, prompts, optimizer)
    rewards = [r for node in nodes for r in node.rewards]
    print(f"{len(nodes)} nodes, mean joint reward {sum(rewards) / len(rewards):.3f}, loss {loss.item():.6f}")


if __name__ == "__main__":
    main()
