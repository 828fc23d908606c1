"""The screen for the arithmetic task: the untrained model's accuracy on each candidate kind of question.

For every kind in `tasks.ARITHMETIC_KINDS`: the first `questions` held-out questions of that kind (as `tasks.arithmetic_task` draws
them), answered greedily and with `samples` sampled answers at each temperature; the accuracy is the mean over
questions of each question's mean correctness, with its 95% interval over questions. The benchmark takes a kind whose
sampled accuracy at the training temperature lies between 10% and 50%.
"""

from __future__ import annotations

import time

from trl_multiagent.evaluation import mean_ci

from .generation import generate_texts
from .tasks import ARITHMETIC_KINDS, arithmetic_correct, arithmetic_prompt, arithmetic_task


def screen(
    model,
    tokenizer,
    *,
    max_new_tokens: int,
    temperatures: list[float],
    samples: int,
    seed: int,
    questions: int,
    kinds: list[str] | None = None,
) -> list[dict]:
    rows = []
    for kind in kinds or ARITHMETIC_KINDS:
        questions_of_kind = arithmetic_task(kind, max_new_tokens).held_out_rows[:questions]
        prompts = [arithmetic_prompt(q["question"]) for q in questions_of_kind]
        for temperature in temperatures:
            start = time.perf_counter()
            answers = generate_texts(model, tokenizer, prompts, samples=samples, max_new_tokens=max_new_tokens,
                                     temperature=temperature, seed=seed)  # fmt: skip
            values = [
                sum(arithmetic_correct(a, q["answer"]) for a in texts) / len(texts)
                for q, texts in zip(questions_of_kind, answers, strict=True)
            ]
            interval = mean_ci(values)
            rows.append({
                "kind": kind, "temperature": temperature, "samples": len(answers[0]), "questions": len(values),
                "accuracy": interval.mean, "ci95": interval.half_width, "seconds": time.perf_counter() - start,
                "example": {"question": questions_of_kind[0]["question"], "answer": answers[0][0]},
            })  # fmt: skip
            print(f"screen: {kind:>18} T={temperature}: {interval.mean:.3f} ± {interval.half_width:.3f}", flush=True)
    return rows


def screen_markdown(rows: list[dict], passes: list[dict], max_new_tokens: int, questions: int) -> str:
    """screen.md: the passes (kinds, temperatures, seconds, 1-minute load averages), then the table."""
    runs = "; ".join(
        f"kinds {p['kinds']}, temperatures {p['temperatures']}, {p['seconds']:.0f} s, load average "
        f"{p['load_average_before'][0]:.1f} before, {p['load_average_after'][0]:.1f} after"
        for p in passes
    )
    return (f"Screen of the arithmetic kinds on the untrained model ({max_new_tokens} new tokens, chat template, "
            f"{questions} held-out questions per kind). Passes: {runs}.\n\n{screen_table(rows)}\n")  # fmt: skip


def screen_table(rows: list[dict]) -> str:
    lines = ["| kind | temperature | answers per question | questions | accuracy | ± 95% CI | example |",
             "|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        example = f"{r['example']['question']} → {r['example']['answer']!r}".replace("|", "\\|").replace("\n", " ")
        temperature = "greedy" if r["temperature"] == 0 else r["temperature"]
        lines.append(f"| {r['kind']} | {temperature} | {r['samples']} | {r['questions']} | {r['accuracy']:.3f} | "
                     f"{r['ci95']:.3f} | {example[:80]} |")  # fmt: skip
    return "\n".join(lines)
