"""GRPOTrainer's arguments that a team honours as GRPOTrainer does: `trust_remote_code` for every load, an
`eval_dataset` given as a dict of datasets."""

import json
import textwrap

import pytest
from conftest import SEED_PROMPTS, length_ratio_reward
from datasets import Dataset

from trl_multiagent import MAGRPOConfig, MAGRPOTrainer
from trl_multiagent.demo.testing import make_model


REMOTE_CODE = {
    "configuration_tiny_remote.py": """
        from transformers import LlamaConfig

        class TinyRemoteConfig(LlamaConfig):
            model_type = "tiny_remote"
    """,
    "modeling_tiny_remote.py": """
        from torch import nn
        from transformers import LlamaForCausalLM, LlamaForSequenceClassification, LlamaModel, LlamaPreTrainedModel

        from .configuration_tiny_remote import TinyRemoteConfig

        class TinyRemoteForCausalLM(LlamaForCausalLM):
            config_class = TinyRemoteConfig

        class TinyRemoteForSequenceClassification(LlamaForSequenceClassification):
            config_class = TinyRemoteConfig

            def __init__(self, config):  # the backbone built here: `AutoModel` would ask for the remote code again
                LlamaPreTrainedModel.__init__(self, config)
                self.num_labels = config.num_labels
                self.model = LlamaModel(config)
                self.score = nn.Linear(config.hidden_size, self.num_labels, bias=False)
                self.post_init()
    """,
}


def remote_code_model(folder, tokenizer):
    """A tiny Llama saved as a model with code of its own (`auto_map`): loading it needs `trust_remote_code=True`."""
    make_model(tokenizer).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    for name, code in REMOTE_CODE.items():
        (folder / name).write_text(textwrap.dedent(code))
    config = json.loads((folder / "config.json").read_text())
    config["model_type"] = "tiny_remote"
    config["architectures"] = ["TinyRemoteForCausalLM"]
    config["auto_map"] = {
        "AutoConfig": "configuration_tiny_remote.TinyRemoteConfig",
        "AutoModelForCausalLM": "modeling_tiny_remote.TinyRemoteForCausalLM",
        "AutoModelForSequenceClassification": "modeling_tiny_remote.TinyRemoteForSequenceClassification",
    }
    (folder / "config.json").write_text(json.dumps(config))
    return str(folder)


def args(tmp_path, **overrides):
    values = dict(
        output_dir=str(tmp_path / "run"), num_generations=2, per_device_train_batch_size=2, max_new_tokens=4,
        max_steps=1, report_to="none", save_strategy="no",
    )  # fmt: skip
    return MAGRPOConfig(**{**values, **overrides})


def test_trust_remote_code_reaches_the_agents_their_tokenizers_and_reward_models(tmp_path, tokenizer, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    remote = remote_code_model(tmp_path / "remote", tokenizer)
    trainer = MAGRPOTrainer(
        model=[remote, remote], reward_funcs=[length_ratio_reward, remote],
        train_dataset=Dataset.from_dict({"prompt": SEED_PROMPTS}), args=args(tmp_path, trust_remote_code=True),
    )  # fmt: skip
    assert [type(trainer.team.agent(i)).__name__ for i in range(2)] == ["TinyRemoteForCausalLM"] * 2
    assert type(trainer.reward_funcs[1]).__name__ == "TinyRemoteForSequenceClassification"
    trainer.train()


def test_without_trust_remote_code_a_remote_code_agent_is_not_run(tmp_path, tokenizer, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    remote = remote_code_model(tmp_path / "remote", tokenizer)
    with pytest.raises(ValueError, match="trust_remote_code"):
        MAGRPOTrainer(
            model=[remote, remote], reward_funcs=length_ratio_reward,
            train_dataset=Dataset.from_dict({"prompt": SEED_PROMPTS}), args=args(tmp_path),
        )  # fmt: skip


def test_every_reward_returning_none_gives_trls_warning(tmp_path, tokenizer, caplog):
    def skip_long(completions_0, completions_1):  # scores nothing: every answer is "too long"
        return [None] * len(completions_0)

    trainer = MAGRPOTrainer(
        model=[make_model(tokenizer), make_model(tokenizer)], processing_class=tokenizer, reward_funcs=skip_long,
        train_dataset=Dataset.from_dict({"prompt": SEED_PROMPTS}), args=args(tmp_path),
    )  # fmt: skip
    with caplog.at_level("WARNING"):
        trainer.train()
    assert "All reward functions returned None for the following kwargs:" in caplog.text
    assert "Please ensure that at least one reward function returns a valid reward." in caplog.text


def test_missing_reward_and_dataset_errors_carry_trls_words(tmp_path, tokenizer):
    model, data = make_model(tokenizer), Dataset.from_dict({"prompt": SEED_PROMPTS})
    with pytest.raises(ValueError, match="MAGRPOTrainer: No reward source provided. Pass `reward_funcs=`"):
        MAGRPOTrainer(model=model, num_agents=2, processing_class=tokenizer, train_dataset=data, args=args(tmp_path))
    with pytest.raises(ValueError, match="`train_dataset` is required unless an `environment_factory` is provided"):
        MAGRPOTrainer(
            model=model,
            num_agents=2,
            processing_class=tokenizer,
            reward_funcs=length_ratio_reward,
            args=args(tmp_path),
        )


def test_an_adapter_on_lm_head_is_refused_as_grpo_trainer_refuses_it(tmp_path, tokenizer):
    from peft import LoraConfig

    lora = LoraConfig(r=4, target_modules=["q_proj", "lm_head"], task_type="CAUSAL_LM")
    with pytest.raises(ValueError, match=r"agent 0: Applying a PEFT adapter to `lm_head` is not supported"):
        MAGRPOTrainer(
            model=make_model(tokenizer, tied=False), num_agents=2, processing_class=tokenizer, peft_config=lora,
            reward_funcs=length_ratio_reward, train_dataset=Dataset.from_dict({"prompt": SEED_PROMPTS}),
            args=args(tmp_path),
        )  # fmt: skip


def test_a_dict_of_eval_datasets_is_evaluated_per_name(tmp_path, tokenizer):
    data = Dataset.from_dict({"prompt": SEED_PROMPTS})
    trainer = MAGRPOTrainer(
        model=[make_model(tokenizer), make_model(tokenizer)], processing_class=tokenizer, reward_funcs=length_ratio_reward,
        train_dataset=data, eval_dataset={"easy": data.select(range(2)), "hard": data.select(range(2, 4))},
        args=args(tmp_path, per_device_eval_batch_size=2),
    )  # fmt: skip
    metrics = trainer.evaluate()
    assert {"eval_easy_loss", "eval_hard_loss"} <= set(metrics)
    logged = [h for h in trainer.state.log_history if "eval_easy_loss" in h or "eval_hard_loss" in h]
    assert len(logged) == 2 and all("eval_turn_1/reward_mean" in h for h in logged)  # each name's own rollout


def test_a_dict_of_eval_datasets_is_checked_by_name(tmp_path, tokenizer):
    data = Dataset.from_dict({"prompt": SEED_PROMPTS})
    with pytest.raises(ValueError, match=r"eval_dataset\['hard'\] has no 'prompt' column"):
        MAGRPOTrainer(
            model=[make_model(tokenizer), make_model(tokenizer)], processing_class=tokenizer,
            reward_funcs=length_ratio_reward, train_dataset=data,
            eval_dataset={"easy": data, "hard": Dataset.from_dict({"question": SEED_PROMPTS})}, args=args(tmp_path),
        )  # fmt: skip
