"""The benchmark's two tasks, each defined once: prompts, the reward, and what each side is asked.

Every side of a task scores its answers with the same function (`writing_reward`, `arithmetic_correct`), on the same
training and held-out questions; only how the answers are produced differs (one completion, one agent over two turns,
two agents).

**writing** (the MAGRPO paper's setting in miniature, of the seed's kind): a text about a topic in two parts. Part 1 is
a one-line summary, part 2 a description two to three times as long as part 1 (in characters, the seed's length
ratio), and both parts use the topic's keyword. `writing_reward(part_1, part_2, keyword)` is the mean of three checks:

- length: exp(-distance of len(part 2) / len(part 1) from [2, 3]) (the seed's `length_ratio_reward`);
- shared content: 1 when both parts contain the keyword, 0.5 when one does, 0 when neither;
- format: 1 when part 1 is one non-blank line and part 2 is not blank, else 0.

The team writes one part per agent (agent 0 part 1, agent 1 part 2, one turn); the single agent writes both in one
completion, part 1, then a line `###`, then part 2, and is scored on the split (no marker: part 2 is empty).

>>> round(writing_reward("A dragon nap.", "The dragon sleeps all winter long.", "dragon"), 3)
1.0
>>> split_parts("Moon garden\\n###\\nA garden of glass on the Moon.")
('Moon garden', 'A garden of glass on the Moon.')
>>> split_parts("no marker here")
('no marker here', '')

**arithmetic** (a checkable answer): `What is a + b?`, scored 1 when the number in the answer is the sum. The
operands' kind was chosen by the screen (`python -m benchmarks.team_vs_single --screen`, results/screen.json): one
on which the untrained embedded model is right between about 10% and 50% of the time.

The answer read is the first integer after the first `=` when there is one (the model often writes `23 + 8 = 31`),
else the first integer:

>>> answer_number("The answer is 42."), answer_number("23 + 8 = 31. And 2 + 2 = 4"), answer_number("no number")
(42, 31, None)
"""

from __future__ import annotations

import math
import random
import re
from dataclasses import dataclass


WRITING_MARKER = "###"
KEYWORD_TOPICS = [
    # (keyword, topic): the keyword is a word every part must use
    ("dragon", "a dragon who cannot fly"), ("garden", "a garden on the Moon"), ("robot", "a robot that paints"),
    ("river", "a river that flows uphill"), ("castle", "a castle made of ice"), ("train", "a train through time"),
    ("forest", "a forest that sings"), ("ship", "a ship in the clouds"), ("library", "a library under the sea"),
    ("market", "a night market on Mars"), ("lamp", "a lamp that grants wishes"), ("clock", "a clock that runs backward"),
    ("island", "an island that moves"), ("bridge", "a bridge between two stars"), ("school", "a school for wizards"),
    ("festival", "a festival of lights"), ("mountain", "a mountain of books"), ("city", "a city in the clouds"),
    ("bakery", "a bakery for giants"), ("garden", "a rooftop garden in winter"), ("violin", "a violin made of glass"),
    ("desert", "a desert covered in snow"), ("cat", "a cat who runs a cafe"), ("tower", "a tower that grows"),
    ("museum", "a museum of smells"), ("whale", "a whale that sings opera"), ("planet", "a planet of oceans"),
    ("cave", "a cave full of crystals"), ("kite", "a kite that never lands"), ("village", "a village on stilts"),
    ("key", "a key that opens any door"), ("storm", "a storm made of music"), ("owl", "an owl that keeps secrets"),
    ("boat", "a paper boat on a long journey"), ("mirror", "a mirror that shows tomorrow"),
    ("orchard", "an orchard of silver apples"), ("lighthouse", "a lighthouse on the edge of the world"),
    ("balloon", "a hot air balloon race"), ("map", "a map that draws itself"), ("snowman", "a snowman in summer"),
]  # fmt: skip


def split_parts(completion: str) -> tuple[str, str]:
    """The single agent's completion as (part 1, part 2), split at the first `###`; part 2 is empty without it."""
    first, marker, second = completion.partition(WRITING_MARKER)
    return first.strip(), second.strip() if marker else ""


def writing_reward(part_1: str, part_2: str, keyword: str) -> float:
    """The mean of the length, shared-content and format checks (module docstring)."""
    ratio = len(part_2) / max(len(part_1), 1)
    length = math.exp(-(0.0 if 2 <= ratio <= 3 else min(abs(ratio - 2), abs(ratio - 3))))
    shared = (int(keyword.lower() in part_1.lower()) + int(keyword.lower() in part_2.lower())) / 2
    form = float(bool(part_1.strip()) and "\n" not in part_1.strip() and bool(part_2.strip()))
    return (length + shared + form) / 3


_INTEGER = re.compile(r"-?\d+")


def answer_number(text: str) -> int | None:
    _, equals, after = text.partition("=")
    match = _INTEGER.search(after if equals else text)
    return int(match.group()) if match else None


# The arithmetic kinds the screen tries: name -> (operand ranges, operator). `a op b` with a, b drawn from the ranges.
ARITHMETIC_KINDS = {
    "add_1digit": ((1, 9), (1, 9), "+"),
    "add_2digit_1digit": ((10, 99), (1, 9), "+"),
    "add_2digit": ((10, 99), (10, 99), "+"),
    "sub_2digit_1digit": ((10, 99), (1, 9), "-"),
    "mul_1digit": ((2, 9), (2, 9), "*"),
}


def distinct_questions(kind: str) -> int:
    (lo_a, hi_a), (lo_b, hi_b), _ = ARITHMETIC_KINDS[kind]
    return (hi_a - lo_a + 1) * (hi_b - lo_b + 1)


def arithmetic_questions(kind: str, count: int, seed: int) -> list[dict]:
    """`count` distinct questions of `kind`, drawn with `seed`: rows {"question", "answer"}."""
    if kind not in ARITHMETIC_KINDS:
        raise ValueError(f"arithmetic_questions: kind must be one of {sorted(ARITHMETIC_KINDS)}, got {kind!r}.")
    if count > distinct_questions(kind):
        raise ValueError(f"arithmetic_questions: kind {kind!r} has {distinct_questions(kind)} distinct questions, "
                         f"fewer than the {count} asked for.")  # fmt: skip
    (lo_a, hi_a), (lo_b, hi_b), op = ARITHMETIC_KINDS[kind]
    rng, seen, rows = random.Random(seed), set(), []
    while len(rows) < count:
        a, b = rng.randint(lo_a, hi_a), rng.randint(lo_b, hi_b)
        text, answer = f"{a} {op} {b}", {"+": a + b, "-": a - b, "*": a * b}[op]
        if text not in seen:
            seen.add(text)
            rows.append({"question": f"What is {text}?", "answer": answer})
    return rows


def arithmetic_prompt(question: str) -> str:
    return f"{question} Answer with the number only."


def arithmetic_correct(completion: str, answer: int) -> float:
    return float(answer_number(completion) == answer)


@dataclass(frozen=True)
class Task:
    """A task's name, its training and held-out rows, the tokens one agent may write per turn, and the sampling
    temperature of training and evaluation."""

    name: str
    train_rows: list[dict]
    held_out_rows: list[dict]
    tokens_per_part: int
    temperature: float


def writing_task(tokens_per_part: int, temperature: float = 1.0, held_out: int = 16) -> Task:
    """Training topics and held-out topics are disjoint parts of KEYWORD_TOPICS (24 / 16 by default)."""
    rows = [{"keyword": k, "topic": t} for k, t in KEYWORD_TOPICS]
    return Task("writing", rows[:-held_out], rows[-held_out:], tokens_per_part, temperature)


def arithmetic_task(kind: str, tokens_per_part: int, temperature: float = 1.0, held_out: int = 32,
                    train: int = 256) -> Task:  # fmt: skip
    """Held-out questions are drawn apart from the training questions (none is both); a kind with few distinct
    questions (one-digit operands) trains on those the held-out ones leave."""
    train = min(train, distinct_questions(kind) - held_out)
    rows = arithmetic_questions(kind, train + held_out, seed=1234)
    return Task("arithmetic", rows[:train], rows[train:], tokens_per_part, temperature)


# ---------------------------------------------------------------------- what each side is asked (chat user messages)


def writing_single_prompt(row: dict) -> str:
    return (
        f"Write about {row['topic']} in two parts. Part 1: a one-line summary that uses the word '{row['keyword']}'. "
        f"Then a line with only {WRITING_MARKER}. Part 2: a description two to three times as long as part 1 that "
        f"also uses the word '{row['keyword']}'."
    )


def writing_part_prompt(row: dict, part: int) -> str:
    """Agent 0 writes part 1, agent 1 part 2; each is told what the other writes."""
    if part == 0:
        return (
            f"Write a one-line summary of {row['topic']} that uses the word '{row['keyword']}'. Another writer adds "
            "a description two to three times as long."
        )
    return (
        f"Write a description of {row['topic']} that uses the word '{row['keyword']}', two to three times as long "
        "as a one-line summary that another writer gives."
    )


def arithmetic_revise_prompt(question: str, own: str) -> str:
    """The one-agent side's second turn: its own first answer, to check."""
    return f"{question} You answered: {own.strip()!r}. Check it and give the final answer, the number only."


def arithmetic_check_prompts(question: str, answers: list[str]) -> list[str]:
    """The team's second turn. Agent 1, the checker, checks agent 0's answer against its own and gives the final
    answer; agent 0 sees the checker's first answer and gives its final answer too (both are scored)."""
    first, second = (a.strip() for a in answers)
    return [
        f"{question} You answered: {first!r}. A checker answered: {second!r}. Give your final answer, the number "
        "only.",
        f"{question} A student answered: {first!r}. Your own answer was: {second!r}. Check the student's answer and "
        "give the final answer, the number only.",
    ]
