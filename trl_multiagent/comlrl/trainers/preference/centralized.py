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


# The joint prompt's wording and the section tags are CoMLRL 1.4.3's protocol: a policy trained through either library
# reads the same text and writes the same sections.
JOINT_PROMPT = (
    "You are a centralized coordinator producing the separate outputs of {count} agents.\n\n"
    "Each output must satisfy its corresponding original prompt. Keep the outputs separate;\n"
    "do not merge them or add commentary outside the required tags.\n\n"
    "{prompts}\n\n"
    "Return exactly one section for each agent in this format:\n"
    "{sections}\n"
)


def tagged_section(text: str, index: int) -> str | None:
    """Agent `index`'s section of a joint completion (its first `<agent_i>...</agent_i>`, tags in any case, spaces
    allowed inside them), stripped; None when there is none."""
    found = re.search(rf"<\s*agent_{index}\s*>(.*?)<\s*/\s*agent_{index}\s*>", text, flags=re.IGNORECASE | re.DOTALL)
    return None if found is None else found.group(1).strip()


@dataclass(frozen=True)
class TaggedCentralizedComparatorAdapter:
    """CoMLRL 1.4.3's domain-neutral adapter: the joint prompt lists each agent's own prompt and asks for one
    `<agent_i>...</agent_i>` section per agent (`JOINT_PROMPT`); `parse_completion` reads each section (a missing one
    is ""), and raises `CentralizedComparatorParseError` when none is there.

    >>> adapter = TaggedCentralizedComparatorAdapter()
    >>> adapter.parse_completion("<agent_0> short </agent_0><AGENT_1>longer</agent_1>", {}, 3)
    ['short', 'longer', '']
    """

    def build_prompt(self, batch_item: dict[str, Any], agent_prompts: Sequence[str]) -> str:
        prompts = "\n\n".join(f"Agent {i} original prompt:\n{prompt}" for i, prompt in enumerate(agent_prompts))
        sections = "\n".join(f"<agent_{i}>\n...\n</agent_{i}>" for i in range(len(agent_prompts)))
        return JOINT_PROMPT.format(count=len(agent_prompts), prompts=prompts, sections=sections)

    def parse_completion(self, completion: str, batch_item: dict[str, Any], num_agents: int) -> Sequence[str]:
        sections = [tagged_section(str(completion), i) for i in range(num_agents)]
        if all(section is None for section in sections):
            raise CentralizedComparatorParseError("Centralized completion did not contain any indexed agent sections.")
        return [section or "" for section in sections]
