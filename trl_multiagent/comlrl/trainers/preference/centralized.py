"""CoMLRL 1.4.3's centralized protocol (`comlrl.trainers.preference.centralized`): how one joint prompt asks a single
policy for every role's answer, and how its completion is split back into the roles' answers. `CentralizedMAGRPO`
takes such an adapter as `centralized_adapter`."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol


class CentralizedComparatorParseError(ValueError):
    """Raised when a centralized completion cannot be split into agent outputs (CoMLRL's name). A centralized trainer
    reads such a completion as every role answering the empty string."""


class CentralizedComparatorAdapter(Protocol):
    """What a centralized adapter provides (CoMLRL's protocol): `build_prompt` and `parse_completion`."""

    def build_prompt(self, batch_item: dict[str, Any], agent_prompts: Sequence[str]) -> str:
        """One prompt that asks a policy to produce every agent's output."""

    def parse_completion(self, completion: str, batch_item: dict[str, Any], num_agents: int) -> Sequence[str]:
        """One centralized completion split into agent-indexed outputs."""


@dataclass(frozen=True)
class TaggedCentralizedComparatorAdapter:
    """CoMLRL 1.4.3's domain-neutral adapter: the joint prompt lists each agent's own prompt and asks for one
    `<agent_i>...</agent_i>` section per agent; `parse_completion` reads each section (case and spaces inside the tags
    do not matter; a missing one is ""), and raises `CentralizedComparatorParseError` when none is there. The texts
    are CoMLRL's, character for character, so that a policy trained with either reads the same prompt."""

    def build_prompt(self, batch_item: dict[str, Any], agent_prompts: Sequence[str]) -> str:
        del batch_item
        prompt_sections = "\n\n".join(
            f"Agent {agent_idx} original prompt:\n{prompt}" for agent_idx, prompt in enumerate(agent_prompts)
        )
        output_sections = "\n".join(
            f"<agent_{agent_idx}>\n...\n</agent_{agent_idx}>" for agent_idx in range(len(agent_prompts))
        )
        return (
            f"You are a centralized coordinator producing the separate outputs of {len(agent_prompts)} agents.\n\n"
            "Each output must satisfy its corresponding original prompt. Keep the outputs separate;\n"
            "do not merge them or add commentary outside the required tags.\n\n"
            f"{prompt_sections}\n\n"
            "Return exactly one section for each agent in this format:\n"
            f"{output_sections}\n"
        )

    def parse_completion(self, completion: str, batch_item: dict[str, Any], num_agents: int) -> Sequence[str]:
        del batch_item
        outputs, found = [], False
        for agent_idx in range(num_agents):
            pattern = rf"<\s*agent_{agent_idx}\s*>(.*?)<\s*/\s*agent_{agent_idx}\s*>"
            match = re.search(pattern, str(completion), flags=re.IGNORECASE | re.DOTALL)
            found = found or match is not None
            outputs.append(match.group(1).strip() if match is not None else "")
        if not found:
            raise CentralizedComparatorParseError("Centralized completion did not contain any indexed agent sections.")
        return outputs
