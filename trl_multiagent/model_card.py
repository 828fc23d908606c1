"""The cards of a saved team: each agent folder's `README.md` (`agent_card`: agent i of a team trained with MAGRPO, its
base and how to load it), and the team folder's (`team_card`, which `MAGRPOTrainer.create_model_card` writes: the
agents and their folders, the bases, the adapters, the rewards and turns, how to load each agent and the team).

A base is a `BaseModel`: a Hub id (the card's `base_model`), or a description with no `base_model` where the folder
trained from is not a Hub model: a prepared copy (`prepared_models.prepared_description`) is described as what it is,
and a local folder (a path that means nothing on another machine) is left out.

>>> print(agent_card(1, 2, BaseModel("HuggingFaceTB/SmolLM2-135M-Instruct"), adapter=True))
---
base_model: HuggingFaceTB/SmolLM2-135M-Instruct
library_name: peft
tags:
- trl
- trl_multiagent
- magrpo
---
<BLANKLINE>
# Agent 1 of a 2-agent team
<BLANKLINE>
A LoRA adapter on `HuggingFaceTB/SmolLM2-135M-Instruct`, trained with MAGRPO (multi-agent GRPO) by [trl_multiagent](https://pypi.org/project/trl-multiagent/): the agents learn together from one joint reward. The other agents are in the sibling folders `agent_0/` ... `agent_1/`; the team loads with `trl_multiagent.load_team` on the folder above this one.
<BLANKLINE>
```python
from peft import AutoPeftModelForCausalLM
<BLANKLINE>
agent = AutoPeftModelForCausalLM.from_pretrained("path/to/agent_1")
```
<BLANKLINE>
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import NamedTuple


PACKAGE_URL = "https://pypi.org/project/trl-multiagent/"
# The tags of every card the trainer writes, after transformers' "generated_from_trainer" (TRL's cards: "trl" and the
# method).
TEAM_TAGS = ("trl", "trl_multiagent", "magrpo")


class BaseModel(NamedTuple):
    """What an agent was trained from: `hub_id` (None unless a Hub model), or `description` for a prepared copy."""

    hub_id: str | None = None
    description: str | None = None

    def short(self) -> str | None:
        """The base in a few words, for the team card's table (a description up to its details, which follow it)."""
        if self.hub_id or not self.description:
            return self.words()
        return self.description.split(";")[0].split(":")[0] + " (below)"

    def words(self) -> str | None:
        """The base as the card's text names it (None for a local folder, which is left out)."""
        return f"`{self.hub_id}`" if self.hub_id else self.description


class CardAgent(NamedTuple):
    """One agent as the team card lists it: its folder (relative to the team's), its base, whether an adapter."""

    folder: str
    base: BaseModel
    adapter: bool


def _header(bases: Sequence[BaseModel], adapter: bool, tags: Sequence[str], model_name: str | None = None) -> list:
    hub_ids = list(dict.fromkeys(b.hub_id for b in bases if b.hub_id))
    lines = ["---"]
    if len(hub_ids) == 1:
        lines.append(f"base_model: {hub_ids[0]}")
    elif hub_ids:
        lines += ["base_model:"] + [f"- {hub_id}" for hub_id in hub_ids]
    lines.append(f"library_name: {'peft' if adapter else 'transformers'}")
    if model_name:
        lines.append(f"model_name: {model_name}")
    return lines + ["tags:"] + [f"- {tag}" for tag in tags] + ["---"]


def _loader(adapter: bool) -> tuple[str, str]:
    return ("peft", "AutoPeftModelForCausalLM") if adapter else ("transformers", "AutoModelForCausalLM")


def agent_card(index: int, num_agents: int, base: BaseModel, adapter: bool, folder_name: str | None = None) -> str:
    """The card of agent `index`, saved in a folder named `folder_name` (`agent_{index}` by default)."""
    words = base.words()
    on = f" on {words}" if words else ""
    kind = f"A LoRA adapter{on}" if adapter else f"A causal LM{' fine-tuned from' + on[3:] if words else ''}"
    trained = f"{kind}, trained with MAGRPO (multi-agent GRPO) by [trl_multiagent]({PACKAGE_URL})"
    if num_agents == 1:
        title, about = "# A model trained with MAGRPO", f"{trained}."
    else:
        title = f"# Agent {index} of a {num_agents}-agent team"
        about = (
            f"{trained}: the agents learn together from one joint reward. The other agents are in the sibling folders"
            f" `agent_0/` ... `agent_{num_agents - 1}/`; the team loads with `trl_multiagent.load_team` on the folder"
            " above this one."
        )
    package, loader = _loader(adapter)
    body = [title, "", about, "", "```python", f"from {package} import {loader}", ""]
    body += [f'agent = {loader}.from_pretrained("path/to/{folder_name or f"agent_{index}"}")', "```", ""]
    return "\n".join(_header([base], adapter, TEAM_TAGS) + [""] + body)


def write_agent_card(folder: str, index: int, num_agents: int, base: BaseModel, adapter: bool) -> None:
    """Write `agent_card` as `folder/README.md`, over any card saved there before (PEFT's template, for an adapter)."""
    name = os.path.basename(os.path.normpath(folder))
    with open(os.path.join(folder, "README.md"), "w") as file:
        file.write(agent_card(index, num_agents, base, adapter, name))


def team_card(
    model_name: str,
    agents: Sequence[CardAgent],
    shared_base: bool,
    reward_names: Sequence[str],
    num_turns: int,
    tags: Sequence[str],
    dataset_name: str | None = None,
    versions: dict[str, str] | None = None,
) -> str:
    """The `README.md` of a saved team's folder (a team of one saved in the folder itself has `folder` ".").

    >>> agents = [CardAgent(f"agent_{i}", BaseModel("org/base"), adapter=False) for i in range(2)]
    >>> card = team_card("run", agents, False, ["ratio"], 2, ["trl", "magrpo"])
    >>> print(card[card.index("| Agent"):card.index("## How")])
    | Agent | Folder | Weights | Base model |
    |---|---|---|---|
    | 0 | `agent_0/` | full weights | `org/base` |
    | 1 | `agent_1/` | full weights | `org/base` |
    <BLANKLINE>
    Rewards: `ratio`, over 2 turns (one joint reward for the team at each turn).
    <BLANKLINE>
    <BLANKLINE>
    """
    n, adapter = len(agents), any(a.adapter for a in agents)
    bases = list(dict.fromkeys(a.base for a in agents))
    described = [b.description for b in bases if b.description]
    if n == 1:
        title = f"# {model_name}: a model trained with MAGRPO"
        about = f"A model trained with MAGRPO (multi-agent GRPO), a team of one, by [trl_multiagent]({PACKAGE_URL})."
    else:
        title = f"# {model_name}: a {n}-agent team trained with MAGRPO"
        about = (
            f"{n} agents trained together with MAGRPO (multi-agent GRPO) by [trl_multiagent]({PACKAGE_URL}), from one "
            f"joint reward. Each agent is saved in its own folder: "
            + ", ".join(f"`{a.folder}/`" for a in agents)
            + "."
        )
    if adapter:
        about += (
            " The agents are LoRA adapters on one base model, loaded once (a shared base)."
            if shared_base
            else " The agents are LoRA adapters, each on its own copy of its base model."
        )
    lines = [title, "", about, "", "| Agent | Folder | Weights | Base model |", "|---|---|---|---|"]
    for i, agent in enumerate(agents):
        weights = "LoRA adapter" if agent.adapter else "full weights"
        folder = "the folder itself" if agent.folder == "." else f"`{agent.folder}/`"
        lines.append(f"| {i} | {folder} | {weights} | {agent.base.short() or 'a local folder'} |")
    lines.append("")
    if dataset_name:
        lines += [f"Trained on the dataset `{dataset_name}`.", ""]
    rewards = ", ".join(f"`{name}`" for name in reward_names) or "none named"
    turns = f"{num_turns} turn{'s' if num_turns != 1 else ''}"
    lines += [f"Rewards: {rewards}, over {turns} (one joint reward for the team at each turn).", ""]
    for text in described:
        lines += [f"About the base: {text}.", ""]
    if described and adapter:
        lines += [
            "An adapter's `adapter_config.json` (PEFT's, as it wrote it) names the folder the base was read from on"
            " the machine that trained it. `trl_multiagent.load_team` prepares that copy again where the folder is"
            " missing (as `python -m trl_multiagent.models` does); `AutoPeftModelForCausalLM` needs the"
            " folder to exist.",
            "",
        ]
    lines += ["## How to load it", ""]
    package, loader = _loader(adapter)
    if n > 1:
        lines += [
            "The team (`trl_multiagent.load_team`: every agent on its base, and each agent's tokenizer):",
            "",
            "```python",
            "from trl_multiagent import load_team",
            "",
            'team, tokenizers = load_team("path/to/this/folder")',
            "agent_0 = team.agent(0)",
            "```",
            "",
            f"One agent (`{package}`):",
            "",
        ]
    first = "" if agents[0].folder == "." else f"/{agents[0].folder}"
    lines += ["```python", f"from {package} import {loader}", ""]
    lines += [f'agent = {loader}.from_pretrained("path/to/this/folder{first}")', "```", ""]
    if versions:
        lines += ["## Framework versions", ""] + [f"- {name}: {version}" for name, version in versions.items()]
        lines.append("")
    header = _header([a.base for a in agents], adapter, tags, model_name)
    return "\n".join(header + [""] + lines)
