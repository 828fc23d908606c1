"""A saved team's files: PEFT's and transformers' files as they wrote them, the cards the trainer writes
(`create_model_card`), the one public loader (`trl_multiagent.load_team`), and a Hub id that cannot be reached (its
prepared copy, said as what it is, or a fast, clear error)."""

import json
import logging
import os
import shutil
import time

import pytest
import torch
from conftest import SEED_PROMPTS, length_ratio_reward
from datasets import Dataset
from peft import LoraConfig

from trl_multiagent import MAGRPOConfig, MAGRPOTrainer, load_team, prepared_models
from trl_multiagent.embedded_model import GGUF_NAME, GGUF_QUANTIZATION, HUB_ID, MARKER, MODEL_NAME, WHEEL_REQUIREMENT
from trl_multiagent.evaluation import EvaluationError, resolve_base


LORA = dict(r=4, target_modules="all-linear", task_type="CAUSAL_LM")


def prepare_copy(root, tiny_model_dir) -> str:
    """A prepared folder as `prepare_default_model` leaves it (the tiny model standing in for the dequantised one)."""
    folder = root / MODEL_NAME
    shutil.copytree(tiny_model_dir, folder)
    marker = {"model": MODEL_NAME, "hub_id": HUB_ID, "source": WHEEL_REQUIREMENT, "gguf_file": GGUF_NAME}
    marker.update(quantization=GGUF_QUANTIZATION, dtype="float32")
    (folder / MARKER).write_text(json.dumps(marker))
    return str(folder)


@pytest.fixture
def no_prepared_copies(tmp_path, monkeypatch):
    """No prepared model and no Hub cache but the test's own (`find_prepared` also searches ~/.cache/trl_multiagent)."""
    monkeypatch.setattr(prepared_models, "DEFAULT_CACHE", tmp_path / "default_cache")
    monkeypatch.setenv(prepared_models.CACHE_ENV, str(tmp_path / "cache"))
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub_cache"))
    return tmp_path / "cache"


def trainer_for(output_dir, model, **kwargs):
    args = MAGRPOConfig(
        output_dir=str(output_dir), report_to="none", num_generations=2, per_device_train_batch_size=2,
        max_new_tokens=4, max_steps=1, save_strategy="no", learning_rate=1e-2,
    )  # fmt: skip
    return MAGRPOTrainer(
        model=model, reward_funcs=length_ratio_reward, train_dataset=Dataset.from_dict({"prompt": SEED_PROMPTS}),
        args=args, **kwargs,
    )  # fmt: skip


@pytest.mark.parametrize("layout", ["shared_base", "separate"])
def test_an_adapters_files_are_byte_for_byte_what_peft_writes(tmp_path, tiny_model_dir, no_prepared_copies, layout):
    """On the embedded model's prepared folder (where the adapter config used to be rewritten), `save_model` leaves
    `adapter_config.json` and the weights as PEFT's own `save_pretrained` writes them for the same model."""
    base = prepare_copy(no_prepared_copies, tiny_model_dir)
    model = dict(model=base, num_agents=2) if layout == "shared_base" else dict(model=[base, base])
    trainer = trainer_for(tmp_path / "run", peft_config=LoraConfig(**LORA), **model)
    trainer.save_model()
    for i in range(2):
        agent = trainer.team.agent(i)
        if layout == "shared_base":  # PEFT writes a named adapter into `<dir>/<name>/`
            agent.save_pretrained(tmp_path / "peft", selected_adapters=[f"agent_{i}"])
        else:
            agent.save_pretrained(tmp_path / "peft" / f"agent_{i}")
        for name in ("adapter_config.json", "adapter_model.safetensors"):
            ours = (tmp_path / "run" / f"agent_{i}" / name).read_bytes()
            assert ours == (tmp_path / "peft" / f"agent_{i}" / name).read_bytes(), (i, name)
        recorded = json.loads((tmp_path / "run" / f"agent_{i}" / "adapter_config.json").read_bytes())
        assert recorded["base_model_name_or_path"] == base  # PEFT's record: the folder the base was read from


def test_the_team_folder_has_the_trainers_card(tmp_path, tiny_model_dir, no_prepared_copies):
    """The top-level README.md (written over PEFT's template for a shared base) says what the folder holds: the
    agents and their folders, the base as what it is (the embedded model's dequantised copy, not the Hub model), the
    adapters, the reward and turns, and how to load each agent and the team."""
    base = prepare_copy(no_prepared_copies, tiny_model_dir)
    trainer = trainer_for(tmp_path / "run", model=base, num_agents=2, peft_config=LoraConfig(**LORA))
    trainer.save_model()
    card = (tmp_path / "run" / "README.md").read_text()
    assert "More Information Needed" not in card and "base_model:" not in card  # no Hub model is claimed
    assert (
        "# run: a 2-agent team trained with MAGRPO" in card
        and "- generated_from_trainer\n- trl\n- trl_multiagent\n- magrpo" in card
    )
    assert "| 1 | `agent_1/` | LoRA adapter | a dequantised Q4_1 GGUF copy of SmolLM2-135M-Instruct (below) |" in card
    assert "About the base: a dequantised Q4_1 GGUF copy of SmolLM2-135M-Instruct: the file" in card
    assert f"not the weights of the Hub model `{HUB_ID}`" in card and "loaded once (a shared base)" in card
    assert "Rewards: `length_ratio_reward`, over 1 turn" in card
    assert 'team, tokenizers = load_team("path/to/this/folder")' in card
    assert 'AutoPeftModelForCausalLM.from_pretrained("path/to/this/folder/agent_0")' in card
    for i in range(2):  # each agent folder: its own card, the base said the same way
        agent = (tmp_path / "run" / f"agent_{i}" / "README.md").read_text()
        assert f"# Agent {i} of a 2-agent team" in agent and "base_model:" not in agent
        assert "A LoRA adapter on a dequantised Q4_1 GGUF copy of SmolLM2-135M-Instruct" in agent
    # TRL's own call (`_save_checkpoint` -> `create_model_card(model_name=...)`) writes it at `output_dir`
    os.remove(tmp_path / "run" / "README.md")
    trainer.create_model_card(model_name="named", tags="mine")
    card = (tmp_path / "run" / "README.md").read_text()
    assert "# named: a 2-agent team" in card and "- mine\n" in card


def test_a_full_weight_team_card_names_its_hub_base(tmp_path, tiny_model_dir, monkeypatch):
    """A Hub id base is the card's `base_model` (here `_name_or_path` stands in for a model loaded by id)."""
    trainer = trainer_for(tmp_path / "run", model=[tiny_model_dir, tiny_model_dir])
    for i in range(2):
        monkeypatch.setattr(trainer.team.agent(i).config, "_name_or_path", "org/base")
    trainer.save_model()
    card = (tmp_path / "run" / "README.md").read_text()
    assert card.startswith("---\nbase_model: org/base\nlibrary_name: transformers\n")
    assert "| 0 | `agent_0/` | full weights | `org/base` |" in card
    assert 'AutoModelForCausalLM.from_pretrained("path/to/this/folder/agent_0")' in card


def agent_weights(team, i) -> dict:
    """Agent i's own parameters by name: its model's, or on a shared base its adapter's."""
    if team.is_shared_base:
        return {n: p.detach() for n, p in team.agents[0].named_parameters() if f".{team.adapter_names[i]}." in n}
    return {n: p.detach() for n, p in team.agents[i].named_parameters()}


@pytest.mark.parametrize("kind", ["full", "shared_base"])
def test_load_team_reads_back_a_trained_team(tmp_path, tiny_model_dir, kind):
    """Trained one step, saved, loaded back by the documented way: every agent's weights as trained."""
    peft = dict(num_agents=2, peft_config=LoraConfig(**LORA)) if kind == "shared_base" else {}
    trainer = trainer_for(tmp_path / "run", model=tiny_model_dir if peft else [tiny_model_dir] * 2, **peft)
    before = {i: {n: p.clone() for n, p in agent_weights(trainer.team, i).items()} for i in range(2)}
    trainer.train()
    trainer.save_model()
    team, tokenizers = load_team(str(tmp_path / "run"))
    assert team.num_agents == 2 and team.is_shared_base == (kind == "shared_base") and not team.training
    assert [t("a b")["input_ids"] for t in tokenizers] == [trainer.tokenizers[i]("a b")["input_ids"] for i in (0, 1)]
    for i in range(2):
        trained, loaded = agent_weights(trainer.team, i), agent_weights(team, i)
        assert trained.keys() == loaded.keys() and trained
        for name in trained:
            torch.testing.assert_close(loaded[name], trained[name], rtol=0, atol=0)
        assert any(not torch.equal(before[i][n], trained[n]) for n in trained), "the step changed nothing"


def test_load_team_prepares_a_missing_embedded_base_again(tmp_path, tiny_model_dir, no_prepared_copies, caplog):
    """An adapter records the folder of the embedded model's copy on the machine that trained it. Where that folder
    is missing, the copy prepared here is used (it is prepared here already: `prepare_default_model` returns it at
    once), said at WARNING as what it is."""
    trained_on = prepare_copy(tmp_path / "elsewhere", tiny_model_dir)
    trainer = trainer_for(tmp_path / "run", model=trained_on, num_agents=2, peft_config=LoraConfig(**LORA))
    trainer.save_model()
    shutil.rmtree(trained_on)
    here = prepare_copy(no_prepared_copies, tiny_model_dir)
    with caplog.at_level(logging.WARNING):
        team, _ = load_team(str(tmp_path / "run"))
    assert team.agent(0).get_base_model().config._name_or_path == here
    said = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and trained_on in r.getMessage()]
    assert len(said) == 1 and f"the copy prepared here is used, {here}" in said[0] and "dequantised" in said[0]
    for i in range(2):
        for name, value in agent_weights(trainer.team, i).items():
            torch.testing.assert_close(agent_weights(team, i)[name], value, rtol=0, atol=0)


def hub_id_warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and HUB_ID in r.getMessage()]


def test_a_hub_id_offline_trains_its_prepared_copy_and_says_so_once(tmp_path, tiny_model_dir, no_prepared_copies,
                                                                     monkeypatch, caplog):  # fmt: skip
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    copy = prepare_copy(no_prepared_copies, tiny_model_dir)
    with caplog.at_level(logging.WARNING):
        trainer = trainer_for(tmp_path / "run", model=HUB_ID, num_agents=2)
    assert [trainer.team.agent(i).config._name_or_path for i in range(2)] == [copy, copy]
    said = hub_id_warnings(caplog)
    assert len(said) == 1, said
    assert "HF_HUB_OFFLINE is set" in said[0] and f"the copy prepared here, {copy}" in said[0]
    assert "dequantised Q4_1 GGUF copy" in said[0] and f"not the weights of the Hub model `{HUB_ID}`" in said[0]
    caplog.clear()
    with caplog.at_level(logging.WARNING):  # evaluation resolves an adapter's Hub id base the same way
        assert resolve_base(HUB_ID, "agent_0") == copy
    assert len(hub_id_warnings(caplog)) == 1 and "dequantised" in hub_id_warnings(caplog)[0]


def test_a_hub_id_without_a_connection_uses_the_copy(tmp_path, tiny_model_dir, no_prepared_copies, monkeypatch,
                                                    caplog):  # fmt: skip
    """HF_HUB_OFFLINE unset, but no connection (here the Hub's address refuses it, through huggingface_hub's own HTTP
    client): one request, without the download retries, tells, and the copy is used."""
    from huggingface_hub import constants

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")  # the discard port: nothing listens
    copy = prepare_copy(no_prepared_copies, tiny_model_dir)
    start = time.perf_counter()
    with caplog.at_level(logging.WARNING):
        trainer = trainer_for(tmp_path / "run", model=HUB_ID, num_agents=2)
    assert time.perf_counter() - start < 30  # the trainer's build included; the loader's retries take 25 s per file
    assert trainer.team.agent(1).config._name_or_path == copy
    said = hub_id_warnings(caplog)
    assert len(said) == 1 and "the Hub (http://127.0.0.1:9) cannot be reached" in said[0], said
    assert "HF_HUB_OFFLINE is not set" in said[0] and "dequantised" in said[0]


def test_a_hub_id_offline_without_a_copy_fails_at_once(tmp_path, no_prepared_copies, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    start = time.perf_counter()
    with pytest.raises(ValueError) as caught:
        trainer_for(tmp_path / "run", model=HUB_ID, num_agents=2)
    assert time.perf_counter() - start < 10  # not the loader's retries (about 25 s per file without a connection)
    message = str(caught.value)
    assert f"MAGRPOTrainer: model = '{HUB_ID}' cannot be loaded: HF_HUB_OFFLINE is set" in message
    assert "prepare_default_model()" in message and str(no_prepared_copies) in message
    with pytest.raises(EvaluationError, match=r"the base of 'agent_0' = .*HF_HUB_OFFLINE is set.*--base_model"):
        resolve_base(HUB_ID, "agent_0")
