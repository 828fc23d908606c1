"""Generation with real vLLM engines on CPU (`use_vllm=True`): greedy agreement with transformers, real weight syncs,
sampling log-probs, the seed example in 1 and 2 processes, the shared-base LoRA engine, and server mode's routing.

Marked `vllm`: they run in the vLLM environment (README, "Running the tests"; `.ci/run` builds it). Without vLLM
installed this module fails to import: a run of `-m vllm` never skips them silently.
"""

import contextlib
import copy
import gc
import os
import socket
import sys
import time

import pytest
import torch
import vllm  # noqa: F401  (fails collection where vLLM is missing)
from conftest import SEED_PROMPTS, length_feedback, length_ratio_reward
from datasets import Dataset
from peft import LoraConfig
from trl.models.utils import disable_gradient_checkpointing

from trl_multiagent import MAGRPOConfig, MAGRPOTrainer
from trl_multiagent.demo.testing import make_model, make_tokenizer
from trl_multiagent.generation.vllm_colocate import engine_model
from trl_multiagent.generation.vllm_server import VLLMServerGenerator


pytestmark = pytest.mark.vllm

MAX_NEW_TOKENS = 12
LORA_TARGETS = ["q_proj", "v_proj", "o_proj", "gate_proj"]


def vllm_model(tokenizer, seed=0, tied=True):
    return make_model(tokenizer, seed=seed, hidden=64, heads=2, tied=tied)  # vLLM-CPU needs head_dim >= 32


def config(tmp_path, **overrides):
    values = dict(
        output_dir=str(tmp_path), use_vllm=True, num_turns=2, num_generations=4, max_new_tokens=MAX_NEW_TOKENS,
        per_device_train_batch_size=8, early_termination_threshold=None, report_to="none", save_strategy="no",
        logging_steps=1, max_steps=1, seed=0, disable_tqdm=True, top_k=0, top_p=1.0,
    )  # fmt: skip
    values.update(overrides)
    return MAGRPOConfig(**values)


@contextlib.contextmanager
def trainer_for(tmp_path, args_overrides=None, **trainer_kwargs):
    trainer_kwargs.setdefault("reward_funcs", length_ratio_reward)
    trainer_kwargs.setdefault("external_transition", length_feedback)
    trainer_kwargs.setdefault("train_dataset", Dataset.from_dict({"prompt": list(SEED_PROMPTS)}))
    trainer = MAGRPOTrainer(args=config(tmp_path, **(args_overrides or {})), **trainer_kwargs)
    try:
        yield trainer
    finally:
        trainer.generator.close()  # frees the engines' KV caches before the next test builds its own
        del trainer
        gc.collect()


def eval_rollout(trainer, prompts, k):
    """The rows of one evaluation rollout (both turns), per agent."""
    trainer.model.eval()
    batches = trainer._generate_and_score_completions([{"prompt": p} for p in prompts for _ in range(k)])["agents"]
    trainer.model.train()
    return batches


def hf_greedy(trainer, agent, prompts):
    """transformers' greedy completion of each prompt on the trainer's current weights of `agent`, cut after EOS."""
    tok, eos = trainer.tokenizers[agent], trainer.agent_eos_token_ids[agent]
    module = trainer.team.agent(agent)
    out = []
    # As the transformers backend generates: in eval mode, activation checkpointing off (it would disable the cache).
    trainer.model.eval()
    with (
        trainer.team.acting(agent),
        disable_gradient_checkpointing(trainer.team, trainer.args.gradient_checkpointing_kwargs),
        torch.no_grad(),
    ):
        for prompt in prompts:
            ids = torch.tensor([tok(prompt)["input_ids"]])
            row = module.generate(
                ids, attention_mask=torch.ones_like(ids), max_new_tokens=MAX_NEW_TOKENS, do_sample=False,
                eos_token_id=eos, pad_token_id=tok.pad_token_id,
            )[0, ids.size(1) :].tolist()  # fmt: skip
            end = next((t + 1 for t, token in enumerate(row) if token in eos), len(row))
            out.append(row[:end])
    trainer.model.train()
    return out


def vllm_greedy(trainer, agent, prompts):
    return trainer.generator.generate(agent, prompts, 1, greedy=True).completion_ids


def assert_same_rows(a, b):
    for agent, (x, y) in enumerate(zip(a, b, strict=True)):
        for key in ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask"):
            assert torch.equal(x[key], y[key]), f"agent {agent}: {key} differs"


# ---------------------------------------------------------------------- greedy agreement


@pytest.mark.parametrize("team", ["llama-pair", "llama-qwen2"])
def test_full_model_team_greedy_equals_transformers_at_both_turns(tmp_path, team):
    tok = make_tokenizer()
    if team == "llama-pair":
        agents, tokenizers = [vllm_model(tok, seed=i) for i in range(2)], tok
    else:  # a heterogeneous team: another architecture, vocabulary and tokenizer for agent 1
        tok_b = make_tokenizer(300)
        agents = [vllm_model(tok), make_model(tok_b, seed=1, hidden=64, heads=2, arch="qwen2")]
        tokenizers = [tok, tok_b]
    # A second EOS that agent 0 emits early: stopping on an agent's own EOS tokens is part of what must agree.
    probe = agents[0].generate(torch.tensor([tok(SEED_PROMPTS[0])["input_ids"]]), max_new_tokens=6, do_sample=False)
    extra_eos = int(probe[0, -3])
    agents[0].generation_config.eos_token_id = [tok.eos_token_id, extra_eos]
    prompts, k = SEED_PROMPTS[:2], 2
    common = {"eval_do_sample": False, "num_generations_eval": k}
    hf_agents = copy.deepcopy(agents)
    with trainer_for(
        tmp_path / "hf", {**common, "use_vllm": False}, model=hf_agents, processing_class=tokenizers
    ) as hf:
        expected = eval_rollout(hf, prompts, k)
    with trainer_for(tmp_path / "vllm", common, model=agents, processing_class=tokenizers) as trainer:
        assert len(trainer.generator.engines) == 2
        got = eval_rollout(trainer, prompts, k)

    assert got[0]["completion_ids"].size(0) == (2 + 2 * k) * k  # turn 1 and turn 2 rows
    assert_same_rows(got, expected)
    lengths = got[0]["completion_mask"].sum(1)
    assert (lengths < MAX_NEW_TOKENS).any(), "no completion stopped at agent 0's extra EOS"
    assert not torch.equal(got[0]["completion_ids"][:4, :5], got[1]["completion_ids"][:4, :5])


def test_shared_base_lora_team_one_engine_greedy_equals_transformers(tmp_path):
    tok = make_tokenizer()
    lora = LoraConfig(r=8, lora_alpha=16, target_modules=LORA_TARGETS, init_lora_weights=False)
    prompts, k = SEED_PROMPTS[:2], 2
    common = {"eval_do_sample": False, "num_generations_eval": k}
    rows = {}
    for backend in ("hf", "vllm"):
        torch.manual_seed(0)  # the same random adapters in both teams
        kwargs = dict(model=vllm_model(tok), num_agents=2, peft_config=lora, processing_class=tok)
        with trainer_for(tmp_path / backend, {**common, "use_vllm": backend == "vllm"}, **kwargs) as trainer:
            if backend == "vllm":
                assert len(trainer.generator.engines) == 1
                assert trainer.generator.engines[0].lora
            rows[backend] = eval_rollout(trainer, prompts, k)
    assert_same_rows(rows["vllm"], rows["hf"])
    assert not torch.equal(rows["vllm"][0]["completion_ids"], rows["vllm"][1]["completion_ids"])


# ---------------------------------------------------------------------- weight sync


@pytest.mark.parametrize("tied", [True, False], ids=["tied-embeddings", "untied"])
def test_engine_generates_with_the_updated_weights_after_a_sync(tmp_path, tied):
    tok = make_tokenizer()
    agents = [vllm_model(tok, seed=i, tied=tied) for i in range(2)]
    before = [copy.deepcopy(a.state_dict()) for a in agents]
    prompts = list(SEED_PROMPTS)
    overrides = {"learning_rate": 0.5, "optim": "sgd", "max_grad_norm": 0.0}  # large enough to change greedy tokens
    with trainer_for(tmp_path, overrides, model=agents, processing_class=tok) as trainer:
        trainer.train()
        assert trainer.state.global_step == 1
        for i in range(2):
            changed = any(not torch.equal(p, before[i][n]) for n, p in trainer.team.agent(i).state_dict().items())
            assert changed, f"agent {i} did not change"
        updated = [hf_greedy(trainer, i, prompts) for i in range(2)]
        # The engines still hold the weights they generated the step's rollout with: the check below must fail
        # without a sync.
        stale = [vllm_greedy(trainer, i, prompts) for i in range(2)]
        assert stale != updated
        trainer.generator.sync_weights(trainer.state.global_step)
        assert [vllm_greedy(trainer, i, prompts) for i in range(2)] == updated


def test_lora_sync_pushes_only_adapters(tmp_path):
    tok = make_tokenizer()
    lora = LoraConfig(r=8, lora_alpha=16, target_modules=LORA_TARGETS)
    overrides = {"learning_rate": 0.05, "optim": "sgd", "max_grad_norm": 0.0, "max_steps": 2}
    kwargs = dict(model=vllm_model(tok), num_agents=2, peft_config=lora, processing_class=tok)
    with trainer_for(tmp_path, overrides, **kwargs) as trainer:
        generator = trainer.generator
        engine = generator.engines[0]
        generator.sync_weights(0)
        base_before = {
            n: p.detach().clone() for n, p in engine_model(engine.llm).named_parameters() if "lora" not in n
        }
        first = {a: r.lora_int_id for a, r in engine.lora_requests.items()}
        trainer.train()
        generator.sync_weights(trainer.state.global_step)
        base_after = {n: p.detach() for n, p in engine_model(engine.llm).named_parameters() if "lora" not in n}
        assert base_before.keys() == base_after.keys() and base_before
        for name in base_before:
            assert torch.equal(base_before[name], base_after[name]), f"engine base weight {name} changed"
        assert all(engine.lora_requests[a].lora_int_id != first[a] for a in range(2)), "adapters were not re-pushed"
        prompts = list(SEED_PROMPTS)
        assert [vllm_greedy(trainer, i, prompts) for i in range(2)] == [
            hf_greedy(trainer, i, prompts) for i in range(2)
        ]
        # config.json, model.safetensors, and one folder per agent's current adapter (the older ones are removed)
        assert len(os.listdir(engine.folder)) == 2 + 2
        logged = [e for e in trainer.state.log_history if "sampling/sampling_logp_difference/max" in e]
        assert len(logged) == 2 and all(e["sampling/sampling_logp_difference/max"] < 1e-4 for e in logged)


def test_prompts_are_shortened_to_fit_the_engine_or_refused_naming_the_agent(tmp_path):
    tok = make_tokenizer()
    agents = [vllm_model(tok, seed=i) for i in range(2)]
    # Turn-1 prompts fit in 32 tokens with the 12 new ones; the feedback prompts of turn 2 do not. By default they
    # keep their last 20 tokens.
    with trainer_for(tmp_path / "fit", {"vllm_max_model_length": 32}, model=agents, processing_class=tok) as trainer:
        trainer.train()
        assert all(rows["prompt_ids"].size(1) <= 20 for rows in trainer._buffered_inputs[0])
        assert trainer.state.log_history[0]["prompts/truncated"] == 2 * 8  # both agents' turn-2 prompts
    # An explicit max_prompt_length the engine cannot hold is refused with the agent's index.
    overrides = {"vllm_max_model_length": 32, "max_prompt_length": 100}
    with trainer_for(tmp_path / "refuse", overrides, model=agents, processing_class=tok) as trainer:
        with pytest.raises(ValueError, match=r"agent 0 got a \d+-token prompt; with max_completion_length=12 it "
                           r"exceeds the engine's max_model_len=32"):  # fmt: skip
            trainer.train()


def test_frozen_agent_is_pushed_once(tmp_path):
    tok = make_tokenizer()
    agents = [vllm_model(tok, seed=i) for i in range(2)]
    with trainer_for(
        tmp_path, {"trainable_agents": [1], "max_steps": 2}, model=agents, processing_class=tok
    ) as trainer:
        pushed = []
        push = trainer.generator._push_full_weights
        trainer.generator._push_full_weights = lambda engine, agent: (pushed.append(agent), push(engine, agent))
        trainer.train()
    assert pushed == [0, 1, 1]  # every agent at the first sync, then only the trainable one after its step


def test_building_engines_leaves_the_training_process_as_it_was(tmp_path, monkeypatch):
    """vLLM sets its process up for serving (`generation.vllm_process`); the update shares that process."""
    from trl_multiagent.generation.vllm_process import ENVIRONMENT, fp32_precisions, memory_policy

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)  # vLLM would respect it, and leave the threads alone
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")  # as a launcher with two local processes sets it
    set_num_threads, threads, policy = torch.set_num_threads, torch.get_num_threads(), memory_policy()
    environment = {name: os.environ.get(name) for name in ENVIRONMENT}
    precisions = fp32_precisions()
    assert precisions.get("mkldnn.matmul") == "none"  # torch's default, which an engine's set-up changes
    tok = make_tokenizer()
    with trainer_for(tmp_path, model=[vllm_model(tok, seed=i) for i in range(2)], processing_class=tok) as trainer:
        trainer.generator.generate(0, ["x y"], 2)
        assert torch.set_num_threads is set_num_threads and torch.get_num_threads() == threads
        assert policy is not None and memory_policy() == policy
        assert {name: os.environ.get(name) for name in ENVIRONMENT} == environment
        assert fp32_precisions() == precisions
        # sized for the largest turn: K=4 completions of 2 prompts x 4 joint answers at turn 2
        assert [engine_limit(e) for e in trainer.generator.engines] == [32, 32]


def engine_limit(engine) -> int:
    return engine.llm.llm_engine.vllm_config.scheduler_config.max_num_seqs


def test_generate_chunk_size_bounds_what_the_engines_decode_at_once(tmp_path, caplog):
    tok = make_tokenizer()
    agents = [vllm_model(tok, seed=i) for i in range(2)]
    with trainer_for(tmp_path, {"generate_chunk_size": 6}, model=agents, processing_class=tok) as trainer:
        assert [engine_limit(e) for e in trainer.generator.engines] == [6, 6]
        trainer.train()  # turn 2's 32 completions per agent, six at a time
        assert trainer.state.log_history[0]["step"] == 1
    import trl_multiagent.generation.vllm_settings as settings

    settings.logger.warning_once.cache_clear()
    with caplog.at_level("WARNING"):
        config(tmp_path, vllm_mode="server", generate_chunk_size=6)
    assert "generate_chunk_size=6 does not apply to vllm_mode='server'" in caplog.text
    assert "trl vllm-serve --max_num_seqs 6" in caplog.text


# ---------------------------------------------------------------------- sampling log-probs and the seed


def test_seed_example_with_vllm_sampling_logps_match_the_policy(tmp_path):
    tok = make_tokenizer()
    calls = []

    def recorded_reward(completions1, completions2, **kwargs):
        calls.append((kwargs["turn"], len(completions1)))
        return length_ratio_reward(completions1, completions2)

    overrides = {"max_steps": 2, "learning_rate": 1e-3}
    agents = [vllm_model(tok, seed=i) for i in range(2)]
    with trainer_for(tmp_path, overrides, model=agents, processing_class=tok, reward_funcs=recorded_reward) as trainer:
        passes, logps = [], trainer._get_per_token_logps_and_entropies

        def counted_logps(*args, **kwargs):  # log-prob forwards outside the loss (gradients off)
            passes.extend([] if torch.is_grad_enabled() else [1])
            return logps(*args, **kwargs)

        trainer._get_per_token_logps_and_entropies = counted_logps
        trainer.train()
        history = trainer.state.log_history
        # On-policy rows: TRL's loss weighs each agent's tokens by the ratio of vLLM's log-probs to the loss's own
        # (`RatioFromLoss`), with no old-policy pass before the update.
        for agent_rows in trainer._buffered_inputs[0]:
            assert "old_per_token_logps" not in agent_rows and "importance_sampling_ratio" not in agent_rows
            assert agent_rows["sampling_per_token_logps"].shape == agent_rows["completion_mask"].shape
        assert passes == []
    # Nothing when the trainer is built (check_functions_before_training is opt-in); 2 prompts per step: 4 joint
    # answers per prompt at turn 1 and 16 at turn 2, as without vLLM.
    assert calls == [(1, 8), (2, 32)] * 2
    steps = [e for e in history if "sampling/sampling_logp_difference/max" in e]
    assert len(steps) == 2
    for entry in steps:  # step 2 samples from synced weights: a failed sync or a bf16 engine shows here
        assert entry["sampling/sampling_logp_difference/max"] < 1e-4, entry
        for i in range(2):
            assert entry[f"agent_{i}/sampling/sampling_logp_difference/max"] < 1e-4
        assert (
            0.999
            < entry["sampling/importance_sampling_ratio/min"]
            <= entry["sampling/importance_sampling_ratio/max"]
            < 1.001
        )
        assert "turn_2/reward_mean" in entry


def _distributed(tmp_path, *args):
    from test_distributed import finished

    info, weights = finished(tmp_path, "--use_vllm", "--max_steps", 2, *args)
    assert info["num_processes"] == 2
    for name in weights[0]:
        assert torch.equal(weights[0][name], weights[1][name]), name
    steps = [e for e in info["log_history"] if "sampling/sampling_logp_difference/max" in e]
    assert len(steps) == 2 and all(e["sampling/sampling_logp_difference/max"] < 1e-4 for e in steps), steps
    return info


@pytest.mark.distributed
def test_seed_with_vllm_in_two_processes(tmp_path):
    _distributed(tmp_path)


@pytest.mark.distributed
def test_vllm_under_zero3_two_processes(tmp_path):
    config = os.path.join(os.path.dirname(__file__), "distributed", "ds_zero3.json")
    info = _distributed(tmp_path, "--deepspeed", config)
    assert info["distributed_type"] == "DistributedType.DEEPSPEED"


# ---------------------------------------------------------------------- server mode (NCCL cannot run here)


class FakeClient:
    """Stands in for TRL's `VLLMClient`, whose weight sync needs NCCL: records requests, answers deterministically."""

    instances = []

    def __init__(self, base_url, group_port, connection_timeout):
        self.base_url, self.group_port, self.requests, self.updates = base_url, group_port, [], []
        FakeClient.instances.append(self)

    def init_communicator(self, device):
        self.device = device

    def get_server_info(self):  # what `trl vllm-serve` reports; the backend checks its logprobs_mode
        return {"model_config": {"logprobs_mode": "processed_logprobs"}}

    def generate(self, prompts, n, **params):
        self.requests.append({"prompts": prompts, "n": n, **params})
        agent = FakeClient.instances.index(self)
        completions = [[10 + agent, 20 + j, 2] for p in prompts for j in range(n)]
        return {"completion_ids": completions, "logprobs": [[[-0.5]] * 3 for _ in completions]}

    def update_named_params(self, metadata, named_params):
        self.updates.append([name for name, _ in named_params])

    def reset_prefix_cache(self):
        pass


def test_server_mode_routes_each_agent_to_its_server(tmp_path, monkeypatch):
    tok = make_tokenizer()
    FakeClient.instances = []
    monkeypatch.setattr("trl.generation.vllm_client.VLLMClient", FakeClient)
    args = config(tmp_path, vllm_mode="server", vllm_server_base_urls=["http://a:1", "http://b:2"], temperature=0.7)
    trainer = MAGRPOTrainer(
        model=[vllm_model(tok, seed=i) for i in range(2)], processing_class=tok, reward_funcs=length_ratio_reward,
        external_transition=length_feedback, train_dataset=Dataset.from_dict({"prompt": list(SEED_PROMPTS)}),
        args=args,
    )  # fmt: skip
    assert isinstance(trainer.generator, VLLMServerGenerator)
    a, b = FakeClient.instances
    assert (a.base_url, a.group_port, b.base_url, b.group_port) == ("http://a:1", args.vllm_group_port, "http://b:2",
                                                                     args.vllm_group_port + 1)  # fmt: skip
    generation = trainer.generator.generate(1, ["x y", "z"], 4)
    assert a.requests == [] and len(b.requests) == 1
    request = b.requests[0]
    assert request["prompts"] == tok(["x y", "z"])["input_ids"]  # each prompt once, n=K
    assert request["n"] == 4 and request["temperature"] == 0.7 and request["max_tokens"] == MAX_NEW_TOKENS
    assert request["generation_kwargs"]["stop_token_ids"] == trainer.agent_eos_token_ids[1]
    assert generation.completion_ids == [[11, 20 + j, 2] for _ in range(2) for j in range(4)]
    assert generation.sampling_logps == [[-0.5] * 3] * 8
    greedy = trainer.generator.generate(0, ["x"], 1, greedy=True)
    assert a.requests[0]["temperature"] == 0.0 and greedy.completion_ids == [[10, 20, 2]]

    trainer.generator.sync_weights(0)  # the servers start from the agents' own weights
    assert a.updates == [] and b.updates == []
    trainer.generator.sync_weights(1)
    names = [n for n, _ in trainer.team.agent(0).named_parameters()]
    assert a.updates == [names] and len(b.updates) == 1
    trainer.generator.sync_weights(1)  # unchanged step: nothing pushed
    assert len(a.updates) == 1


def test_unreachable_server_fails_within_the_timeout_naming_its_url(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    tok = make_tokenizer()
    urls = [f"http://127.0.0.1:{port}", f"http://127.0.0.1:{port}"]
    args = config(tmp_path, vllm_mode="server", vllm_server_base_urls=urls, vllm_server_timeout=3)
    start = time.perf_counter()
    with pytest.raises(
        ConnectionError,
        match=f"agent 0.s vLLM server at http://127.0.0.1:{port} did not answer within vllm_server_timeout=3 s",
    ):
        MAGRPOTrainer(
            model=[vllm_model(tok, seed=i) for i in range(2)], processing_class=tok, reward_funcs=length_ratio_reward,
            external_transition=length_feedback, train_dataset=Dataset.from_dict({"prompt": list(SEED_PROMPTS)}),
            args=args,
        )  # fmt: skip
    assert time.perf_counter() - start < 3 + 20


# ---------------------------------------------------------------------- bad input, before any model is loaded


def test_bad_vllm_settings_are_refused_before_loading(tmp_path):
    with pytest.raises(ValueError, match="vllm_mode must be one of"):
        config(tmp_path, vllm_mode="remote")
    with pytest.raises(ValueError, match="vllm_enable_sleep_mode=True needs CUDA"):
        config(tmp_path, vllm_enable_sleep_mode=True)
    with pytest.raises(ValueError, match="vllm_tensor_parallel_size=2"):
        config(tmp_path, vllm_tensor_parallel_size=2)
    args = config(tmp_path, vllm_mode="server", vllm_server_base_urls=["http://a:1"])
    with pytest.raises(ValueError, match="has 1 URLs for 2 agents"):  # the agent ids below are never loaded
        MAGRPOTrainer(model=["no/such-model-a", "no/such-model-b"], reward_funcs=length_ratio_reward, args=args)
    lora = LoraConfig(r=8, target_modules=LORA_TARGETS)
    with pytest.raises(ValueError, match="vllm_mode='server' serves full-weight agents"):
        MAGRPOTrainer(model="no/such-model", num_agents=2, peft_config=lora, reward_funcs=length_ratio_reward,
                      args=config(tmp_path, vllm_mode="server"))  # fmt: skip


def test_untested_vllm_version_warns_with_the_tested_range(tmp_path, monkeypatch, caplog):
    from packaging.version import Version

    import trl_multiagent.generation.vllm_settings as settings

    monkeypatch.setattr(settings, "vllm_version", lambda: Version("0.20.1"))
    settings.logger.warning_once.cache_clear()
    with caplog.at_level("WARNING"):
        config(tmp_path)
    assert "tested with vLLM >=0.32.0,<0.33; found 0.20.1" in caplog.text


# ---------------------------------------------------------------------- the recipes


@pytest.fixture(scope="module")
def vllm_model_dir(tmp_path_factory):
    tok = make_tokenizer()
    path = tmp_path_factory.mktemp("tiny-llama-vllm")
    model = vllm_model(tok)
    model.config.max_position_embeddings = 4096  # the code recipe's second-turn prompts carry both agents' code
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return str(path)


def _load_recipe(name):
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"{name}_recipe_vllm", os.path.join(RECIPES, f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve the recipe's string annotations through sys.modules
    spec.loader.exec_module(module)
    return module


RECIPES = os.path.join(os.path.dirname(__file__), "..", "recipes")


def assert_vllm_run(trainer, steps):
    assert trainer.state.global_step == steps and trainer.use_vllm
    logged = [e for e in trainer.state.log_history if "turn_1/reward_mean" in e]
    assert len(logged) == steps
    assert all(e["sampling/sampling_logp_difference/max"] < 1e-4 for e in logged)


def test_length_ratio_recipe_with_use_vllm(vllm_model_dir, tmp_path):
    recipe = _load_recipe("length_ratio")
    flags = ["--model_name_or_path", vllm_model_dir, "--output_dir", str(tmp_path / "run"), "--max_steps", "2",
             "--max_new_tokens", "6", "--report_to", "none", "--seed", "0", "--use_vllm", "true"]  # fmt: skip
    script_args, training_args, model_args = recipe.make_parser().parse_args_and_config(args=flags)
    trainer = recipe.main(script_args, training_args, model_args)
    assert_vllm_run(trainer, 2)
    assert (tmp_path / "run" / "agent_1" / "model.safetensors").is_file()
    trainer.generator.close()


def test_code_collab_recipe_with_use_vllm(vllm_model_dir, tmp_path):
    import shutil

    if shutil.which("bwrap") is None:
        pytest.fail("the code recipe's sandbox needs bubblewrap (`apt-get install bubblewrap`; .ci/run installs it)")
    cc = _load_recipe("code_collab")
    script_args, training_args, model_args = cc.make_parser().parse_args_and_config(
        args=[
            "--model_name_or_path", vllm_model_dir, "--output_dir", str(tmp_path / "run"), "--num_problems", "2",
            "--num_generations", "2", "--per_device_train_batch_size", "2", "--max_new_tokens", "8",
            "--max_steps", "2", "--report_to", "none", "--seed", "0", "--sandbox_timeout_s", "2",
            "--use_vllm", "true",
        ]
    )  # fmt: skip
    trainer = cc.main(script_args, training_args, model_args)
    assert_vllm_run(trainer, 2)
    assert "turn_2/reward_mean" in trainer.state.log_history[-2]
    trainer.generator.close()


# ---------------------------------------------------------------------- agents that act


def add(a: int, b: int) -> int:
    """Add two numbers.

    Args:
        a: The first number.
        b: The second number.
    """
    return a + b


@pytest.mark.parametrize("lora", [False, True], ids=["engine-per-agent", "one-lora-engine"])
def test_tool_rounds_continue_on_the_engine_as_transformers_would(tmp_path, lora):
    """After a tool round, each completion continues on the vLLM engine from its prompt + call + tool result, and
    that continuation is transformers' greedy one; tool tokens carry 0 in the tool mask and in vLLM's log-probs.

    The tiny random model never writes a tool call, so the first sample of each prompt is replaced by one (the engine
    still generates it); what follows the tool result is the engine's own."""
    from trl_multiagent.demo.testing import make_tool_tokenizer
    from trl_multiagent.rollout.tools import ToolCalling

    tok = make_tool_tokenizer()
    call = tok('<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call><|im_end|>',
               add_special_tokens=False)["input_ids"]  # fmt: skip
    agents = [make_model(tok, seed=i, hidden=64, heads=2, max_positions=2048) for i in range(2)]
    extra = {"peft_config": LoraConfig(r=8, target_modules=LORA_TARGETS)} if lora else {}
    team = {"model": agents[0], "num_agents": 2, **extra} if lora else {"model": agents}
    prompts = [[{"role": "user", "content": "Add 2 and 3."}]]
    with trainer_for(
        tmp_path, {"num_turns": 1, "max_new_tokens": 160, "eval_do_sample": False, "num_generations_eval": 2},
        processing_class=tok, tools=[add], external_transition=None, reward_funcs=lambda a, b: [0.0] * len(a),
        train_dataset=Dataset.from_dict({"prompt": prompts}), **team,
    ) as trainer:  # fmt: skip
        real_sample = type(trainer.generator)._sample
        continued = []

        def scripted(self, agent, prompt_ids, num_generations, greedy):
            ids, logps = real_sample(self, agent, prompt_ids, num_generations, greedy)
            if num_generations > 1:  # the first round: a tool call, with the engine's log-probs' length
                return [list(call)] * len(ids), None if logps is None else [[-1.0] * len(call)] * len(ids)
            continued.append((agent, prompt_ids, ids))
            return ids, logps

        type(trainer.generator)._sample = scripted
        try:
            batches = eval_rollout(trainer, prompts, 2)
        finally:
            type(trainer.generator)._sample = real_sample
        assert isinstance(trainer.tool_calling, ToolCalling) and len(continued) == 2  # one round per agent
        for agent, (batch, (_, sequences, engine_ids)) in enumerate(zip(batches, continued, strict=True)):
            row = batch["completion_ids"][0][batch["completion_mask"][0].bool()].tolist()
            mask = batch["tool_mask"][0][: len(row)].tolist()
            suffix = [t for t, m in zip(row[len(call) :], mask[len(call) :], strict=True) if m == 0]
            assert row[: len(call)] == call and mask[: len(call)] == [1] * len(call)
            assert tok.decode(suffix).startswith("\n<|im_start|>user\n<tool_response>\n5\n</tool_response>")
            tail = row[len(call) + len(suffix) :]  # the engine's continuation, cut to the completion's budget (TRL)
            assert 0 < len(tail) <= 160 - len(call) - len(suffix) and tail == engine_ids[0][: len(tail)]
            expected = hf_greedy_ids(trainer, agent, sequences[0], len(tail))
            assert tail == expected, f"agent {agent}: vLLM's continuation differs from transformers'"


def hf_greedy_ids(trainer, agent, ids, max_new_tokens):
    """transformers' greedy continuation of token ids on the trainer's current weights of `agent`."""
    module, eos = trainer.team.agent(agent), trainer.agent_eos_token_ids[agent]
    trainer.model.eval()
    with trainer.team.acting(agent), torch.no_grad():
        x = torch.tensor([ids])
        row = module.generate(
            x, attention_mask=torch.ones_like(x), max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=eos,
            pad_token_id=trainer.tokenizers[agent].pad_token_id,
        )[0, x.size(1) :].tolist()  # fmt: skip
    trainer.model.train()
    end = next((t + 1 for t, token in enumerate(row) if token in eos), len(row))
    return row[:end]
