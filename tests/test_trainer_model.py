"""`trainer.model` as TRL code uses it. A team of one: the agent's own model, as GRPOTrainer's (class, parameter names,
`lm_head`, `generate`, `peft_config`, `save_pretrained`). Several agents: the team (`AgentTeam`), whose `generate`,
`peft_config` and `save_pretrained` serve the same code; `trainer.team.agent(i)` reaches agent i in both."""

from unittest.mock import patch

import torch
from conftest import SEED_PROMPTS
from datasets import Dataset
from peft import LoraConfig
from transformers import AutoModelForCausalLM

from trl_multiagent import MAGRPOConfig, MAGRPOTrainer
from trl_multiagent.demo.testing import make_model


def args(tmp_path, **overrides):
    values = dict(
        output_dir=str(tmp_path / "run"), num_generations=2, per_device_train_batch_size=4, max_new_tokens=4,
        max_steps=1, report_to="none", save_strategy="no", logging_steps=1,
    )  # fmt: skip
    return MAGRPOConfig(**{**values, **overrides})


def test_a_patched_generate_on_trainer_model_is_the_one_that_runs(tmp_path, tokenizer):
    seen = []

    def answer_is(completions, **kwargs):  # TRL's convention: one agent's completions
        seen.extend(completions)
        return [float(c == "ok") for c in completions]

    ok = tokenizer("ok", add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]

    def fake_generate(input_ids, **kwargs):
        return torch.cat([input_ids, torch.tensor([ok] * input_ids.size(0))], dim=-1)

    trainer = MAGRPOTrainer(
        model=[make_model(tokenizer)], processing_class=tokenizer, reward_funcs=answer_is,
        train_dataset=Dataset.from_dict({"prompt": SEED_PROMPTS}),
        args=args(tmp_path, check_functions_before_training=False),  # no placeholder answers in `seen`
    )  # fmt: skip
    with patch.object(trainer.model, "generate", side_effect=fake_generate) as generate:
        trainer.train()
    assert generate.call_count == 1 and seen == ["ok"] * 4  # 2 prompts x K=2, all from the patched generate
    assert trainer.state.log_history[0]["reward"] == 1.0


def lengths(completions, **kwargs):
    return [float(len(c)) for c in completions]


def test_one_agents_trainer_model_is_the_agent_itself(tmp_path, tokenizer):
    agent = make_model(tokenizer)
    names = [name for name, _ in make_model(tokenizer).named_parameters()]
    trainer = MAGRPOTrainer(
        model=[agent], processing_class=tokenizer, reward_funcs=lengths,
        train_dataset=Dataset.from_dict({"prompt": SEED_PROMPTS}), args=args(tmp_path),
    )  # fmt: skip
    assert trainer.model is agent and trainer.team.agent(0) is agent
    assert type(trainer.model) is type(agent)  # TRL's trust_remote_code test reads the class name
    assert [name for name, _ in trainer.model.named_parameters()] == names  # no "agents.0." prefix
    assert trainer.model.lm_head.weight.dtype == torch.float32
    trainer.train()
    assert trainer.model is agent


def test_one_lora_agent_trains_its_adapter_under_grpotrainers_parameter_names(tmp_path, tokenizer):
    """TRL's PEFT tests, for `model=` with `peft_config` and one agent: the parameters `trainer.model` names
    `base_model.model.<base name>` (and the wrapped `base_layer`s) stay as they were, every other one (the adapter's)
    moves."""
    base = make_model(tokenizer)
    base_names = {f"base_model.model.{name}" for name, _ in base.named_parameters()}
    lora = LoraConfig(r=4, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    trainer = MAGRPOTrainer(
        model=base, num_agents=1, processing_class=tokenizer, peft_config=lora, reward_funcs=lengths,
        train_dataset=Dataset.from_dict({"prompt": SEED_PROMPTS * 2}),
        args=args(tmp_path, num_generations=4, per_device_train_batch_size=8, max_new_tokens=8, max_steps=2,
                  learning_rate=0.05),
    )  # fmt: skip
    before = {name: p.clone() for name, p in trainer.model.named_parameters()}
    assert "base_model.model.model.embed_tokens.weight" in before and any("lora_A" in name for name in before)
    trainer.train()
    for name, p in before.items():
        if name in base_names or ".base_layer." in name:  # the frozen base, under LoRA's wrapper or not
            assert torch.equal(p, trainer.model.get_parameter(name)), name
        else:
            assert not torch.allclose(p, trainer.model.get_parameter(name)), name


def test_one_agents_ref_model_is_its_frozen_copy_under_the_same_names(tmp_path, tokenizer):
    """As GRPOTrainer's `ref_model` (TRL's sync_ref_model test reads its parameters by the policy's names)."""
    trainer = MAGRPOTrainer(
        model=[make_model(tokenizer)], processing_class=tokenizer, reward_funcs=lengths,
        train_dataset=Dataset.from_dict({"prompt": SEED_PROMPTS}), args=args(tmp_path, beta=0.1),
    )  # fmt: skip
    assert trainer.ref_model is not trainer.model and type(trainer.ref_model) is type(trainer.model)
    names = [name for name, _ in trainer.model.named_parameters()]
    assert [name for name, _ in trainer.ref_model.named_parameters()] == names
    for name in names:
        assert torch.equal(trainer.ref_model.get_parameter(name), trainer.model.get_parameter(name)), name
        assert not trainer.ref_model.get_parameter(name).requires_grad


def test_a_teams_trainer_model_is_the_team(tmp_path, tokenizer):
    agents = [make_model(tokenizer, seed=s) for s in (1, 2)]
    trainer = MAGRPOTrainer(
        model=agents, processing_class=tokenizer, reward_funcs=lambda a, b: [0.0] * len(a),
        train_dataset=Dataset.from_dict({"prompt": SEED_PROMPTS}), args=args(tmp_path),
    )  # fmt: skip
    assert trainer.model is trainer.team and [trainer.team.agent(i) for i in range(2)] == agents


def test_peft_config_and_save_pretrained_of_one_adapter_agent_are_the_agents(tmp_path, tokenizer):
    lora = LoraConfig(r=4, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    trainer = MAGRPOTrainer(
        model=[make_model(tokenizer)], processing_class=tokenizer, peft_config=lora, reward_funcs=lambda c, **k: [0.0] * len(c),
        train_dataset=Dataset.from_dict({"prompt": SEED_PROMPTS}), args=args(tmp_path),
    )  # fmt: skip
    agent = trainer.team.agent(0)
    assert trainer.model.peft_config == agent.peft_config and set(trainer.model.peft_config) == {"default"}
    trainer.model.save_pretrained(tmp_path / "saved")
    assert (tmp_path / "saved" / "adapter_config.json").exists()  # the folder a GRPOTrainer's model would write


def test_save_pretrained_of_a_team_writes_each_agent(tmp_path, tokenizer):
    agents = [make_model(tokenizer, seed=s) for s in (1, 2)]
    trainer = MAGRPOTrainer(
        model=agents, processing_class=tokenizer, reward_funcs=lambda a, b: [0.0] * len(a),
        train_dataset=Dataset.from_dict({"prompt": SEED_PROMPTS}), args=args(tmp_path),
    )  # fmt: skip
    trainer.model.save_pretrained(tmp_path / "saved")
    for i in range(2):
        loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "saved" / f"agent_{i}")
        torch.testing.assert_close(loaded.lm_head.weight, trainer.team.agent(i).lm_head.weight)


class Counter:
    def reset(self, **row):
        self.start = row["start"]
        return f" (counter at {self.start})"

    def add(self, amount: int) -> int:
        """Add to the counter.

        Args:
            amount: how much to add.
        """
        self.start += amount
        return self.start


def shout(text: str) -> str:
    """Shout a text.

    Args:
        text: what to shout.
    """
    return text.upper()


def test_tools_and_environments_are_grpo_trainers_attributes(tmp_path):
    from trl_multiagent.demo.testing import make_tool_tokenizer

    tokenizer = make_tool_tokenizer()
    prompts = [[{"role": "user", "content": p}] for p in SEED_PROMPTS[:2]]
    trainer = MAGRPOTrainer(
        model=[make_model(tokenizer, max_positions=2048, seed=s) for s in (1, 2)], processing_class=tokenizer,
        reward_funcs=lambda a, b: [0.0] * len(a), tools=[shout], environment_factory=Counter,
        train_dataset=Dataset.from_dict({"prompt": prompts, "start": [3, 7]}), args=args(tmp_path),
    )  # fmt: skip
    assert sorted(tool.__name__ for tool in trainer.tools) == ["add", "shout"]  # every agent's, each once
    trainer.train()
    # one world per rollout of the last generation (2 prompts x K=2), each reset with its row, as TRL's `environments`
    assert [type(w) for w in trainer.environments] == [Counter] * 4
    assert sorted(w.start for w in trainer.environments) == [3, 3, 7, 7]
