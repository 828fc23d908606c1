"""Each saved agent's `README.md`: what it is (agent i of a team trained with MAGRPO), its base model and how to load
it. It replaces the card PEFT writes beside an adapter, whose sections all read "More Information Needed" and whose
`base_model` is the folder the base was read from (this machine's cache for the embedded model).

>>> print(agent_card(index=1, num_agents=2, base_model="HuggingFaceTB/SmolLM2-135M-Instruct", adapter=True))
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
A LoRA adapter on `HuggingFaceTB/SmolLM2-135M-Instruct`, trained with MAGRPO (multi-agent GRPO) by [trl_multiagent](https://pypi.org/project/trl-multiagent/): the agents learn together from one joint reward. The other agents are in the sibling folders `agent_0/` ... `agent_1/`.
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


def agent_card(
    index: int, num_agents: int, base_model: str | None, adapter: bool, folder_name: str | None = None
) -> str:
    """The card of agent `index`, saved in a folder named `folder_name` (`agent_{index}` by default; a team of one may
    be saved in the output folder itself); `base_model` is a Hub id, or None when the base was a local folder (a path
    that means nothing on another machine is left out)."""
    header = ["---"] + ([f"base_model: {base_model}"] if base_model else [])
    header += [f"library_name: {'peft' if adapter else 'transformers'}", "tags:", "- trl", "- trl_multiagent"]
    header += ["- magrpo", "---"]
    on = f" on `{base_model}`" if base_model else ""
    kind = f"A LoRA adapter{on}" if adapter else f"A causal LM{' fine-tuned from' + on[3:] if base_model else ''}"
    loader = ("peft", "AutoPeftModelForCausalLM") if adapter else ("transformers", "AutoModelForCausalLM")
    trained = (
        f"{kind}, trained with MAGRPO (multi-agent GRPO) by [trl_multiagent](https://pypi.org/project/trl-multiagent/)"
    )
    if num_agents == 1:
        title, about = "# A model trained with MAGRPO", f"{trained}."
    else:
        title = f"# Agent {index} of a {num_agents}-agent team"
        about = (
            f"{trained}: the agents learn together from one joint reward. The other agents are in the sibling folders"
            f" `agent_0/` ... `agent_{num_agents - 1}/`."
        )
    body = [
        title,
        "",
        about,
        "",
        "```python",
        f"from {loader[0]} import {loader[1]}",
        "",
        f'agent = {loader[1]}.from_pretrained("path/to/{folder_name or f"agent_{index}"}")',
        "```",
        "",
    ]
    return "\n".join(header + [""] + body)


def write_agent_card(folder: str, index: int, num_agents: int, base_model: str | None, adapter: bool) -> None:
    """Write `agent_card` as `folder/README.md`, over any card saved there before."""
    if base_model is not None and os.path.isdir(base_model):
        base_model = None
    name = os.path.basename(os.path.normpath(folder))
    with open(os.path.join(folder, "README.md"), "w") as file:
        file.write(agent_card(index, num_agents, base_model, adapter, name))
