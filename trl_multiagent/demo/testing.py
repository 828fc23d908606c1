"""Tiny offline models: a byte-level BPE tokenizer trained in memory and random small causal LMs, for tests, smoke
runs and benchmarks. Nothing is downloaded: the tokenizer is trained on the few sentences of `CORPUS`.

>>> from trl_multiagent.demo.testing import make_model, make_tokenizer
>>> tokenizer = make_tokenizer()
>>> len(tokenizer), tokenizer.pad_token, tokenizer.eos_token
(400, '<pad>', '</s>')
>>> tokenizer.decode(tokenizer("Design a playground on Mars:")["input_ids"])
'Design a playground on Mars:'
>>> model = make_model(tokenizer, seed=0)
>>> model.config.vocab_size, model.config.hidden_size, model.config.num_hidden_layers
(400, 32, 2)
"""

from __future__ import annotations

import functools

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM


CORPUS = [
    "Describe a city in the clouds:",
    "Invent a new holiday and explain it:",
    "Write a bedtime story for a dragon:",
    "Design a playground on Mars:",
    "Your last answer had 12 characters. The second answer was 2.0 times as long as the first; "
    "the goal is 2 to 3 times. Please write an improved answer.",
    "The quick brown fox jumps over the lazy dog. Once upon a time there was a small robot who loved to paint.",
    "def add(a, b):\n    return a + b\n\nprint(add(1, 2))",
]


@functools.lru_cache(maxsize=4)
def _tokenizer_json(vocab_size: int) -> str:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<pad>", "<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(CORPUS * 20, trainer=trainer)
    return tok.to_str()


def make_tokenizer(vocab_size: int = 400) -> PreTrainedTokenizerFast:
    return PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(_tokenizer_json(vocab_size)),
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
    )


def make_tool_tokenizer(vocab_size: int = 400) -> PreTrainedTokenizerFast:
    """`make_tokenizer` with TRL's Qwen2.5 chat template, which renders tool calls, and its ``<|im_start|>`` /
    ``<|im_end|>`` tokens (``<|im_end|>`` ends a turn: the EOS). The tool tests' and the tool recipe's tokenizer shape.

    >>> from trl.chat_template_utils import supports_tool_calling
    >>> supports_tool_calling(make_tool_tokenizer()), make_tool_tokenizer().eos_token
    (True, '<|im_end|>')
    """
    from trl.chat_template_utils import qwen2_5_chat_template

    tokenizer = make_tokenizer(vocab_size)
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    tokenizer.eos_token = "<|im_end|>"
    tokenizer.chat_template = qwen2_5_chat_template
    return tokenizer


def make_model(
    tokenizer,
    seed: int = 0,
    hidden: int = 32,
    layers: int = 2,
    arch: str = "llama",
    vocab_size: int | None = None,
    heads: int = 4,
    tied: bool = True,
    max_positions: int = 512,
):
    """A random causal LM with tied embeddings (hidden 32, 2 layers by default).

    vLLM's CPU attention needs a head size of at least 32: `make_model(tok, hidden=64, heads=2)`.
    """
    torch.manual_seed(seed)
    common = dict(
        vocab_size=vocab_size or len(tokenizer),
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=max(heads // 2, 1),
        max_position_embeddings=max_positions,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        tie_word_embeddings=tied,
    )
    if arch == "llama":
        model = LlamaForCausalLM(LlamaConfig(**common))
    elif arch == "qwen2":
        model = Qwen2ForCausalLM(Qwen2Config(**common))
    else:
        raise ValueError(arch)
    return model


ALL_PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def with_trained_adapter(model, seed: int = 0, target_modules=ALL_PROJECTIONS):
    """`model` as a PEFT model whose LoRA adapter ("default") is not the identity (random A and B, seeded), as an SFT
    run leaves one: the start of an SFT-then-RL run.

    >>> agent = with_trained_adapter(make_model(make_tokenizer()))
    >>> list(agent.peft_config), all(p.abs().sum() > 0 for n, p in agent.named_parameters() if "lora_B" in n)
    (['default'], True)
    """
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(seed)
    config = LoraConfig(r=4, lora_alpha=8, target_modules=list(target_modules), init_lora_weights=False)
    return get_peft_model(model, config)
