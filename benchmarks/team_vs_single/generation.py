"""One way to generate, for the screen and for every side's evaluation: transformers' `generate` on chat prompts.

Each prompt is one user message formatted with the model's chat template (`add_generation_prompt=True`), as TRL's
GRPOTrainer and our trainer format a conversational dataset's prompt; the sampling settings are the training ones.
"""

from __future__ import annotations

import torch


def load_agent(base_path: str, adapter_path: str | None = None):
    """The base model in eval mode, with the LoRA adapter saved at `adapter_path` on it (None: the untrained base)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(base_path, dtype=torch.float32)
    if adapter_path is not None:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, adapter_path)
    return model.eval()


def chat_text(tokenizer, user_text: str) -> str:
    return tokenizer.apply_chat_template(
        [{"role": "user", "content": user_text}], tokenize=False, add_generation_prompt=True
    )


@torch.no_grad()
def generate_texts(
    model,
    tokenizer,
    user_texts: list[str],
    *,
    samples: int,
    max_new_tokens: int,
    temperature: float,
    seed: int,
    batch_size: int = 64,
) -> list[list[str]]:
    """`samples` completions per user message (temperature 0: greedy, and one completion), in order.

    Sampling is seeded once per call (`torch.manual_seed(seed)`), so a call's output depends on its inputs and seed
    only. Returns one list of `samples` decoded texts (special tokens dropped) per message.
    """
    if temperature == 0:
        samples = 1
    torch.manual_seed(seed)
    texts = [chat_text(tokenizer, t) for t in user_texts for _ in range(samples)]
    side = tokenizer.padding_side
    tokenizer.padding_side = "left"
    out = []
    try:
        for start in range(0, len(texts), batch_size):
            batch = tokenizer(texts[start : start + batch_size], return_tensors="pt", padding=True,
                              add_special_tokens=False)  # fmt: skip
            sampling = dict(do_sample=True, temperature=temperature, top_p=1.0, top_k=0) if temperature else {}
            ids = model.generate(**batch, max_new_tokens=max_new_tokens, pad_token_id=tokenizer.pad_token_id,
                                 **(sampling or {"do_sample": False}))  # fmt: skip
            completions = ids[:, batch["input_ids"].shape[1] :]
            out += tokenizer.batch_decode(completions, skip_special_tokens=True)
    finally:
        tokenizer.padding_side = side
    return [out[i * samples : (i + 1) * samples] for i in range(len(user_texts))]


def token_count(tokenizer, text: str, cap: int) -> int:
    """Tokens a completion cost: its text re-tokenized (the end-of-turn token not counted), at most `cap`."""
    return min(len(tokenizer(text, add_special_tokens=False)["input_ids"]), cap)
