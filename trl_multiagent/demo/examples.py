"""The seed example's task: its four prompts, the joint reward and the feedback transition, and eight held-out prompts
for evaluating a trained team. The recipe `recipes/length_ratio.py`, the benchmarks and the tests all use these.

It imports only the standard library: the benchmarks' CoMLRL workers use it, and it should bring nothing into their
process beyond the package itself. Importing it runs `trl_multiagent/__init__.py` (the trainer and the libraries it
builds on), so both workers of `benchmarks/bench_vs_comlrl.py` import `trl_multiagent` before they take their memory
baseline, and neither side counts it.

Agent 1's answer should be 2 to 3 times as long as agent 0's (agents are numbered from 0, as their `agent_{i}` folders):

>>> from trl_multiagent.demo.examples import length_feedback, length_ratio_reward
>>> length_ratio_reward(["four", "four"], ["ten chars.", "four"])
[1.0, 0.36787944117144233]
>>> feedback = length_feedback("Describe a city in the clouds:", ["four", "four"], num_agents=2)
>>> len(feedback), "had 4 characters. The second answer was 1.0 times as long as the first" in feedback[0]
(2, True)

No held-out prompt is a training prompt:

>>> set(PROMPTS) & set(HELD_OUT_PROMPTS)
set()
"""

import math


PROMPTS = [
    "Describe a city in the clouds:",
    "Invent a new holiday and explain it:",
    "Write a bedtime story for a dragon:",
    "Design a playground on Mars:",
]

# Held-out prompts for evaluating a trained team (`python -m trl_multiagent.evaluation`; the recipe names them in its
# run folder's evaluation_task.json), in the style of the four training prompts, none of them a training prompt.
HELD_OUT_PROMPTS = [
    "Describe a library under the sea:",
    "Invent a new sport and explain its rules:",
    "Write a lullaby for a robot:",
    "Design a garden on the Moon:",
    "Describe a train that travels through time:",
    "Invent a musical instrument and explain how it sounds:",
    "Write a letter from a cat to its owner:",
    "Design a school for young wizards:",
]


def length_ratio_reward(completions1, completions2):
    rewards = []
    for first, second in zip(completions1, completions2, strict=True):
        ratio = len(second) / max(len(first), 1)
        distance = 0.0 if 2 <= ratio <= 3 else min(abs(ratio - 2), abs(ratio - 3))
        rewards.append(math.exp(-distance))
    return rewards


def length_feedback(prompt, agent_completions, num_agents, **history):
    lengths = [len(text) for text in agent_completions]
    ratio = lengths[1] / max(lengths[0], 1)
    return [
        f"{prompt}\n\nYour last answer had {lengths[i]} characters. "
        f"The second answer was {ratio:.1f} times as long as the first; "
        "the goal is 2 to 3 times. Please write an improved answer."
        for i in range(num_agents)
    ]


def as_user_message(text):
    """A chat prompt of one user message: the seed's prompts for a conversational dataset."""
    return [{"role": "user", "content": text}]


def chat_length_feedback(prompt, agent_completions, num_agents, **history):
    """`length_feedback` for a conversational dataset: `prompt` is the row's messages, and each agent's next prompt is
    the same feedback text as one user message."""
    texts = length_feedback(prompt[-1]["content"], agent_completions, num_agents, **history)
    return [as_user_message(text) for text in texts]
