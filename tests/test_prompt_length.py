"""Prompts that grow over the turns are shortened to `max_prompt_length`: text from the left, chat by messages."""

import pytest
from conftest import SEED_PROMPTS, length_feedback, length_ratio_reward
from datasets import Dataset

from trl_multiagent import MAGRPOConfig, MAGRPOTrainer
from trl_multiagent.demo.testing import make_model, make_tokenizer
from trl_multiagent.generation import Generator


TEMPLATE = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}"


def generator(tok, limit):
    return Generator(tokenizers=[tok], eos_token_ids=[[tok.eos_token_id]], max_prompt_lengths=[limit])


def test_text_prompt_keeps_its_last_tokens():
    tok = make_tokenizer()
    text = SEED_PROMPTS[0] + " " + "Your last answer had 12 characters. Please write an improved answer."
    full = tok(text)["input_ids"]
    gen = generator(tok, 6)
    assert gen.tokenize(0, [text, SEED_PROMPTS[3][:8]]) == [full[-6:], tok(SEED_PROMPTS[3][:8])["input_ids"]]
    assert gen.truncated_prompts == 1


def test_text_prompt_with_bos_keeps_it():
    tok = make_tokenizer()
    gen = generator(tok, 3)
    assert gen.fit_text(0, [tok.bos_token_id, 5, 6, 7, 8, 9]) == [tok.bos_token_id, 8, 9]
    assert gen.fit_text(0, [5, 6, 7, 8, 9]) == [7, 8, 9]
    assert gen.fit_text(0, [5, 6]) == [5, 6]


def test_chat_prompt_drops_its_oldest_messages_after_the_task():
    tok = make_tokenizer()
    tok.chat_template = TEMPLATE
    chat = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": SEED_PROMPTS[0]},
        {"role": "assistant", "content": "An old answer about towers."},
        {"role": "user", "content": "Your last answer had 12 characters."},
        {"role": "assistant", "content": "A newer answer."},
        {"role": "user", "content": "Please write an improved answer."},
    ]
    kept = [chat[0], chat[1], chat[4], chat[5]]
    expected = tok.apply_chat_template(kept, add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"]
    gen = generator(tok, len(expected))
    assert gen.tokenize(0, [chat]) == [list(expected)]
    assert gen.truncated_prompts == 1
    with pytest.raises(ValueError, match=r"agent 0's chat prompt has \d+ tokens with only its first user turn and its "
                                         r"newest message left, more than max_prompt_length=4"):  # fmt: skip
        generator(tok, 4).tokenize(0, [chat])


def test_training_shortens_second_turn_prompts_and_logs_the_count(tmp_path):
    tok = make_tokenizer()
    args = MAGRPOConfig(
        output_dir=str(tmp_path), num_turns=2, num_generations=2, per_device_train_batch_size=4, max_new_tokens=4,
        max_prompt_length=16, max_steps=1, early_termination_threshold=None, report_to="none", logging_steps=1,
    )  # fmt: skip
    trainer = MAGRPOTrainer(
        model=[make_model(tok, seed=i) for i in range(2)], processing_class=tok, reward_funcs=length_ratio_reward,
        external_transition=length_feedback, train_dataset=Dataset.from_dict({"prompt": SEED_PROMPTS}), args=args,
    )  # fmt: skip
    trainer.train()
    assert all(rows["prompt_ids"].size(1) <= 16 for rows in trainer._buffered_inputs[0])
    # 2 prompts x K=2 joint answers -> 4 second-turn nodes, for each of the 2 agents
    assert trainer.state.log_history[0]["prompts/truncated"] == 8


def test_default_limit_is_the_context_left_after_the_completion():
    tok = make_tokenizer()
    args = MAGRPOConfig(output_dir="unused", num_generations=2, per_device_train_batch_size=2, max_new_tokens=12)
    trainer = MAGRPOTrainer(model=[make_model(tok)], processing_class=tok, reward_funcs=lambda c: [0.0] * len(c),
                            train_dataset=Dataset.from_dict({"prompt": SEED_PROMPTS}), args=args)  # fmt: skip
    assert trainer.generator.max_prompt_lengths == [512 - 12]  # tiny models have 512 positions


def test_a_limit_beyond_the_agents_context_is_refused():
    tok = make_tokenizer()
    args = MAGRPOConfig(output_dir="unused", num_generations=2, per_device_train_batch_size=2, max_new_tokens=12,
                        max_prompt_length=501)  # fmt: skip
    with pytest.raises(ValueError, match=r"max_prompt_length=501 plus max_completion_length=12 exceeds a llama agent's "
                                         r"max_position_embeddings=512"):  # fmt: skip
        MAGRPOTrainer(model=[make_model(tok)], processing_class=tok, reward_funcs=lambda c: [0.0] * len(c),
                      train_dataset=Dataset.from_dict({"prompt": SEED_PROMPTS}), args=args)  # fmt: skip
