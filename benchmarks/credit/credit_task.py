"""The credit suite's task: the seed task's length-ratio reward and feedback, plus a per-agent "on topic" reward.

Team reward of a joint answer (every method trains on it, and the held-out evaluation scores it):

    team = 0.75 * length_ratio(answer_0, answer_1) + 0.25 * mean_i on_topic(answer_i)

* `length_ratio` is the seed's joint reward (`trl_multiagent.demo.examples.length_ratio_reward`): 1 when agent 1's
  answer is 2 to 3 times as long as agent 0's, exp(-distance) outside.
* `on_topic(answer_i)` is agent i's own reward, in TRL's per-agent convention (`f(completions, prompts, **kwargs)`,
  wrapped with `trl_multiagent.per_agent`): 1.0 when the answer contains a content word of its task (the first five
  letters of a word of 4+ letters of the task line, instruction verbs left out: "city", "clouds" for "Describe a city
  in the clouds:"), else 0.0. It reads only the agent's own answer and prompt, so the same function serves both
  seats, and `team_reward_weight` alpha < 1 mixes each agent's own value into its return:
  `alpha * team + (1 - alpha) * own_i`, own_i = 0.75 * length_ratio + 0.25 * on_topic_i (the trainer's definition:
  the weighted sum with the per-agent function's value for agent i in place of the agents' mean).

The team reward stays in [0, 1], so the seed's early termination threshold (0.9) keeps its meaning: a node grows a
second turn unless its joint answers are good on both counts.

Training prompts: the seed's four (`PROMPTS`). Held-out prompts: `HELD_OUT_PROMPTS` of `trl_multiagent.demo.examples`
(8 prompts in the same style, none of them a training prompt; checked at import).
"""

from __future__ import annotations

import re

from trl_multiagent import per_agent
from trl_multiagent.demo.examples import (
    HELD_OUT_PROMPTS,
    PROMPTS,
    chat_length_feedback,
    length_feedback,
    length_ratio_reward,
)


RATIO_WEIGHT, ON_TOPIC_WEIGHT = 0.75, 0.25
INSTRUCTION_WORDS = {"describe", "invent", "explain", "write", "design", "answer", "please", "improved"}
TRAIN_PROMPTS = list(PROMPTS)
HELD_OUT = list(HELD_OUT_PROMPTS)
if set(TRAIN_PROMPTS) & set(HELD_OUT):
    raise RuntimeError("credit benchmark: a held-out prompt is also a training prompt.")

__all__ = [
    "HELD_OUT",
    "ON_TOPIC_WEIGHT",
    "RATIO_WEIGHT",
    "TRAIN_PROMPTS",
    "chat_length_feedback",
    "length_feedback",
    "length_ratio_reward",
    "on_topic",
    "team_reward",
    "topic_keys",
]


def _text(value) -> str:
    """A prompt's or completion's text: a string, or the last message's content of a chat."""
    if isinstance(value, list):
        return str(value[-1]["content"]) if value else ""
    if isinstance(value, dict):
        return str(value.get("content", ""))
    return str(value)


def topic_keys(prompt) -> set[str]:
    """The task's content words (first five letters, lower case) from the task line of a prompt.

    >>> sorted(topic_keys("Describe a city in the clouds:\\n\\nYour last answer had 3 characters."))
    ['city', 'cloud']
    """
    task_line = _text(prompt).split("\n", 1)[0].lower()
    words = re.findall(r"[a-z]{4,}", task_line)
    return {w[:5] for w in words if w not in INSTRUCTION_WORDS}


def on_topic_values(completions, prompts) -> list[float]:
    """1.0 where the completion names one of its prompt's content words, else 0.0.

    >>> on_topic_values(["A cloudy town", "blue"], ["Describe a city in the clouds:"] * 2)
    [1.0, 0.0]
    """
    prompts = prompts if prompts is not None else [""] * len(completions)
    out = []
    for completion, prompt in zip(completions, prompts, strict=True):
        text = _text(completion).lower()
        out.append(1.0 if any(key in text for key in topic_keys(prompt)) else 0.0)
    return out


@per_agent
def on_topic(completions, prompts=None, **kwargs):
    """Agent i's own reward (TRL's per-agent convention): `on_topic_values` of its completions."""
    return on_topic_values(completions, prompts)


def team_reward(completions0, completions1, prompts=None):
    """The team reward as one joint function (for the held-out evaluation): the weighted sum the trainer computes
    from `[length_ratio_reward, on_topic]` with weights `[RATIO_WEIGHT, ON_TOPIC_WEIGHT]` (mean over agents).

    >>> team_reward(["a cloud"], ["cloud " * 3], prompts=[["Describe a city in the clouds:"]] * 2)
    [1.0]
    """
    ratio = length_ratio_reward(completions0, completions1)
    if prompts is None:
        prompts = [[""] * len(completions0)] * 2
    own0 = on_topic_values(completions0, prompts[0])
    own1 = on_topic_values(completions1, prompts[1])
    return [RATIO_WEIGHT * r + ON_TOPIC_WEIGHT * (a + b) / 2 for r, a, b in zip(ratio, own0, own1, strict=True)]
