"""A team's learned critics, model side: a critic model (a causal LM's backbone and a `ValueHead`), the values it gives
a rollout tree's joint actions, the TD advantages it hands the actors' loss, and its own update (AdamW at its own
learning rate, no gradient clipping), as CoMLRL 1.4.3's IAC and MAAC (docs/critics.md).

The trainer calls `TeamCritic.step` where it would take the group's advantages (`credit.assign`); the tree comes in
as data, as in `credit`."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import nn

from .targets import TD, tree_td, value_loss
from .value_head import ValueHead, last_hidden


class CriticModel(nn.Module):
    """A critic: a causal LM (`model`) and a `ValueHead` (`value_head`) on its last layer's hidden state at the last
    token of each sequence given (`value_head.last_hidden`); the attributes are named as CoMLRL's
    `CausalLMWithValueHead`'s, which its users read (``trainer.critics[0].value_head``)."""

    def __init__(self, model: nn.Module, head_hidden_dim: int | None = None) -> None:
        super().__init__()
        self.model = model
        self.value_head = ValueHead(model.config.hidden_size, head_hidden_dim)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """``(batch,)`` values, each read at its row's last attended token."""
        return self.value_head(last_hidden(self.model, input_ids, attention_mask))

    def reads(self, vocabulary: int) -> bool:
        """Whether its embeddings have `vocabulary` rows or more (IAC's critic reads its agent's token ids)."""
        return self.model.get_input_embeddings().num_embeddings >= vocabulary


@dataclass
class CriticSettings:
    """What the critics are and how they learn (the CoMLRL face's config fields, translated at its edge)."""

    centralized: bool  # MAAC: one critic over the joint prompt (and the joint action); IAC: one per agent
    critic_type: str  # "v": V(h), from the history; "q": Q(h, a), from the history and the answer
    discount: float
    normalize: bool  # advantages standardised per agent and turn, as CoMLRL normalises them
    value_loss_coef: float
    learning_rate: float
    batch_size: int  # samples of an agent per critic step (CoMLRL's `train_batch_size`)
    # IAC's value head on each actor's backbone (CoMLRL's `use_separate_critic=False`): no critic model or optimizer
    # of its own; its value loss, clipped at `value_clip_range`, joins the actor's (`shared_value_loss`)
    shared: bool = False
    value_clip_range: float | None = None


class CriticStep(NamedTuple):
    """What `TeamCritic.step` gives: the actors' advantages ``(nodes, agents, K)``, the joint actions' rollout-time
    values (``(agents, A)`` or ``(A,)``) and their TD (`targets.TD`)."""

    advantages: torch.Tensor
    values: torch.Tensor
    td: TD | None  # None for a tree without joint actions


class TeamCritic:
    """The critics of a team: IAC's one per agent, or MAAC's one centralized critic, each with its own AdamW.

    - `values(tree)`: each joint action's rollout-time value, ``(agents, A)`` (IAC) or ``(A,)`` (MAAC), with the
      inputs they were read from;
    - `step(tree, train)`: the TD advantages (`targets.tree_td`) as ``(nodes, agents, K)``, the layout of
      `credit.assign`'s, with the values and TD they came from (`CriticStep`); in training, then the critics' update
      on the TD targets (`update`).
    """

    def __init__(
        self,
        critics: Sequence[CriticModel],
        settings: CriticSettings,
        num_agents: int,
        joint_tokenizer=None,
        device: torch.device | str = "cpu",
    ) -> None:
        expected = 1 if settings.centralized else num_agents
        if len(critics) != expected:
            raise ValueError(f"TeamCritic: {expected} critic(s) expected, got {len(critics)}.")
        if settings.centralized and joint_tokenizer is None:
            raise ValueError("TeamCritic: a centralized critic reads the joint prompt as text: it needs a tokenizer.")
        self.critics = [critic.to(device) for critic in critics]
        self.settings, self.num_agents = settings, num_agents
        self.joint_tokenizer, self.device = joint_tokenizer, device
        # torch's AdamW at its defaults but the rate, on every parameter, as CoMLRL builds the critics' optimizers; a
        # head on an actor's backbone is stepped by the actors' optimizer instead
        self.optimizers = (
            []
            if settings.shared
            else [torch.optim.AdamW(c.parameters(), lr=settings.learning_rate) for c in self.critics]
        )

    # ---------------------------------------------------------------- inputs and values
    def inputs(self, tree) -> list[list[list[int]]]:
        """Per critic, the token ids its value of each joint action is read from: IAC's critic i, agent i's prompt
        (V) or prompt and completion (Q); MAAC's, the joint prompt (V) or it and the joint action (Q), as text in
        CoMLRL's layout (`joint_text`) tokenised with the first agent's tokenizer."""
        q = self.settings.critic_type == "q"
        if self.settings.centralized:
            texts = [
                joint_text(tree.action_prompts(a), tree.answers(a) if q else None)
                for a in range(len(tree.joint_actions))
            ]
            return [[self.joint_tokenizer(text, truncation=True)["input_ids"] for text in texts]]
        per_agent = []
        for agent in range(self.num_agents):
            rows = []
            for action in tree.joint_actions:
                node, k = tree.nodes[action.node], action.choice[agent]
                ids = list(node.prompt_ids[agent][k])
                rows.append(ids + list(node.completion_ids[agent][k]) if q else ids)
            per_agent.append(rows)
        return per_agent

    def _values(self, critic: CriticModel, rows: Sequence[Sequence[int]]) -> torch.Tensor:
        """The critic's values of `rows`, right-padded in one batch."""
        length = max(len(r) for r in rows)
        ids = torch.zeros(len(rows), length, dtype=torch.long, device=self.device)
        mask = torch.zeros_like(ids)
        for i, row in enumerate(rows):
            ids[i, : len(row)] = torch.tensor(row, dtype=torch.long)
            mask[i, : len(row)] = 1
        return critic(ids, mask).float()

    @torch.no_grad()
    def values(self, tree) -> tuple[torch.Tensor, list]:
        """The rollout-time values of the tree's joint actions: ``(agents, A)`` (IAC) or ``(A,)`` (MAAC)."""
        inputs = self.inputs(tree)
        values = torch.stack([self._values(c, rows) for c, rows in zip(self.critics, inputs, strict=True)])
        return (values[0] if self.settings.centralized else values).cpu(), inputs

    # ---------------------------------------------------------------- advantages and the update
    def step(
        self,
        tree,
        train: bool,
        log: Callable[[dict], None] | None = None,
        gather: Callable[[list], list] | None = None,
    ) -> CriticStep:
        """The actors' advantages ``(nodes, agents, K)``: the TD advantages of the tree's joint actions on the
        rollout-time values, returned with those values and the TD; in training, separate critics then learn from the
        TD targets (`update`); heads on the actors' backbones learn with the actors (`shared_value_loss`).

        `gather` (accelerate's `gather_object`, with several processes, each with a tree of its own): every process's
        samples, in process order. The advantages are then standardised over all of them, and every process's critics
        take the same steps on all of them, so that the critics stay equal and the run equals one process on the
        same rows."""
        if not tree.joint_actions:
            return CriticStep(torch.zeros(0, self.num_agents, 0), torch.zeros(0), None)
        gather = gather or (lambda items: items)
        values, inputs = self.values(tree)
        turns = [tree.nodes[a.node].turn for a in tree.joint_actions]
        td = tree_td(tree, values, self.settings.discount, self.settings.normalize, gather=gather)
        if train:  # heads on the actors learn with them, and their loss is logged there (`shared_value_loss`)
            everyone = gather([(inputs, td.targets, turns, values)])
            metrics = {"critic/value_mean": float(torch.cat([v.flatten() for *_, v in everyone]).mean())}
            if not self.settings.shared:
                losses = self.update(
                    [[row for rank_inputs, *_ in everyone for row in rank_inputs[c]] for c in range(len(inputs))],
                    torch.cat([targets for _, targets, *_ in everyone], dim=-1),
                    [turn for _, _, rank_turns, _ in everyone for turn in rank_turns],
                    batch_size=self.settings.batch_size * len(everyone),
                )
                metrics["critic/value_loss"] = sum(losses) / len(losses)
            if log is not None:
                log(metrics)
        return CriticStep(completion_table(tree, td.advantages, self.num_agents), values, td)

    def update(
        self, inputs: list, targets: torch.Tensor, turns: Sequence[int], batch_size: int | None = None
    ) -> list[float]:
        """CoMLRL's critic steps: for each agent in order, its samples of each turn, `batch_size` at a time (the
        settings' by default; every process's share of them with several processes), each a step of the critic (IAC:
        the agent's; MAAC: the one critic, once per agent) on ``value_loss_coef * mean((target - value)^2)``, with no
        gradient clipping. Returns each step's loss."""
        batch_size = batch_size or self.settings.batch_size
        losses = []
        for agent in range(self.num_agents):
            index = 0 if self.settings.centralized else agent
            critic, optimizer, rows = self.critics[index], self.optimizers[index], inputs[index]
            agent_targets = targets if targets.dim() == 1 else targets[agent]
            for turn in sorted(set(turns)):
                samples = [a for a, t in enumerate(turns) if t == turn]
                for start in range(0, len(samples), batch_size):
                    batch = samples[start : start + batch_size]
                    predicted = self._values(critic, [rows[a] for a in batch])
                    target = agent_targets[batch].to(predicted.device)
                    loss = value_loss(predicted, target, self.settings.value_loss_coef)
                    optimizer.zero_grad()
                    loss.backward()
                    optimizer.step()
                    losses.append(float(loss.detach()))
        return losses

    def shared_value_loss(
        self,
        agent: int,
        rows: Sequence[Sequence[int]],
        targets: torch.Tensor,
        old_values: torch.Tensor,
        weights: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """IAC's value loss of a head on agent `agent`'s backbone over `rows` (each the token ids its value is read
        from, as `inputs` gives them): ``value_loss_coef`` times the mean squared error against the TD `targets` (or
        the errors' sum weighted by `weights`: rows of a chunk, each weighted by its share of the micro-batch), each
        error clipped around its rollout-time value (`old_values`) at `value_clip_range`, as CoMLRL's; with gradients
        into the head and the backbone, for the actor's optimizer."""
        predicted = self._values(self.critics[agent], rows)
        return value_loss(
            predicted,
            targets.to(predicted.device, predicted.dtype),
            self.settings.value_loss_coef,
            old_values=old_values.to(predicted.device, predicted.dtype),
            value_clip_range=self.settings.value_clip_range,
            weights=weights,
        )

    def shared_heads(self) -> list[nn.Module]:
        """The value heads on the actors' backbones (none with separate critics), for the actors' optimizer."""
        return [c.value_head for c in self.critics] if self.settings.shared else []

    # ---------------------------------------------------------------- saving
    def weights(self) -> list[dict]:
        """Each critic's `state_dict` (backbone and value head); a head on an actor's backbone, its head's alone (the
        backbone is saved as the agent)."""
        return [(c.value_head if self.settings.shared else c).state_dict() for c in self.critics]

    def load_weights(self, saved: Sequence[dict]) -> None:
        for critic, state in zip(self.critics, saved, strict=True):
            (critic.value_head if self.settings.shared else critic).load_state_dict(state)

    def optimizer_states(self) -> list[dict]:
        """Each critic's AdamW `state_dict` (its moments and step count)."""
        return [o.state_dict() for o in self.optimizers]

    def load_optimizer_states(self, saved: Sequence[dict]) -> None:
        for optimizer, state in zip(self.optimizers, saved, strict=True):
            optimizer.load_state_dict(state)


def joint_text(prompts: Sequence, answers: Sequence[str] | None = None) -> str:
    """CoMLRL's centralized critic's input: each agent's prompt as ``[Agent i] <prompt>``, and for Q a ``[Joint
    Action]`` block with each agent's answer. A chat prompt is read as its messages' text."""
    text = "\n\n".join(f"[Agent {i}] {_text(p)}" for i, p in enumerate(prompts))
    if answers is None:
        return text
    actions = ["[Joint Action]"] + [f"[Agent {i} action]\n{a}" for i, a in enumerate(answers)]
    return text + "\n\n" + "\n\n".join(actions)


def _text(prompt) -> str:
    return prompt if isinstance(prompt, str) else "\n".join(str(m.get("content", "")) for m in prompt)


def completion_table(tree, advantages: torch.Tensor, num_agents: int) -> torch.Tensor:
    """Joint-action advantages (``(A,)`` shared, or ``(agents, A)``) as ``(nodes, agents, K)``: each agent's
    completion k at a node takes the advantage of the joint action it is part of ("aligned": one)."""
    k = max(len(node.completions[0]) for node in tree.nodes)
    table = torch.zeros(len(tree.nodes), num_agents, k)
    rows = advantages.expand(num_agents, -1) if advantages.dim() == 1 else advantages
    for a, action in enumerate(tree.joint_actions):
        for agent, choice in enumerate(action.choice):
            table[action.node, agent, choice] = rows[agent, a]
    return table
