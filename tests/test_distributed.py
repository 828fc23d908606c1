"""Real multi-process training on CPU: torchrun with 2 gloo processes (DDP), and DeepSpeed ZeRO-2/3.

Each test launches tests/distributed/run_length_ratio.py: the length-ratio task, 2 agents, 2 turns, early
termination on (so ranks hold uneven trees). Marked `distributed`; they run in the default suite and in CI.
"""

import json
import os
import socket
import subprocess
import sys
import time

import pytest
import torch

from trl_multiagent.testing import make_model, make_tokenizer


WORKER = os.path.join(os.path.dirname(__file__), "distributed", "run_length_ratio.py")
DS_CONFIGS = os.path.join(os.path.dirname(__file__), "distributed")

# Every test here is `distributed`; the default suite keeps one DDP run, one rank failure, ZeRO-3 (full and shared-base
# LoRA) and the accelerate launch, and the rest are `slow` (`.ci/run` runs both), so it stays under 15 minutes.
pytestmark = pytest.mark.distributed


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(output_dir, *args, nproc=2, timeout=600):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    if nproc == 1:
        command = [sys.executable, WORKER]
    else:
        command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc),
                   "--master_port", str(free_port()), WORKER]  # fmt: skip
    start = time.perf_counter()
    result = subprocess.run(
        [*command, "--output_dir", str(output_dir), *map(str, args)],
        capture_output=True, text=True, timeout=timeout, env=env,
    )  # fmt: skip
    return result, time.perf_counter() - start


def finished(output_dir, *args, nproc=2):
    result, _ = launch(output_dir, *args, nproc=nproc)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-6000:]
    assert_clean_exit(result, ranks=range(nproc) if nproc > 1 else [])
    with open(os.path.join(output_dir, "info.json")) as f:
        info = json.load(f)
    weights = [torch.load(os.path.join(output_dir, f"weights_rank{r}.pt")) for r in range(nproc)]
    return info, weights


def assert_clean_exit(result, ranks):
    """The worker just returns from main: each rank's process groups were released by the trainer before the
    interpreter's finalisation (where a gloo thread held by a DeepSpeed group would abort it), and nothing aborted."""
    for rank in ranks:
        assert f"rank {rank}: process groups at exit: released" in result.stdout, result.stdout[-3000:]
    assert "terminate called" not in result.stdout + result.stderr


def assert_same(a, b, **tolerance):
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(a[name], b[name], msg=name, **tolerance)


def assert_ranks_identical_and_saved(output_dir, info, weights):
    from transformers import AutoModelForCausalLM

    assert info["num_processes"] == 2
    assert_same(weights[0], weights[1], rtol=0, atol=0)
    for i in range(2):
        loaded = AutoModelForCausalLM.from_pretrained(os.path.join(output_dir, "final", f"agent_{i}"))
        for name, p in loaded.named_parameters():
            torch.testing.assert_close(p, weights[0][f"{i}.{name}"], msg=name)


def initial_weights():
    tok = make_tokenizer()
    return {f"{i}.{n}": p.detach().clone() for i in range(2) for n, p in make_model(tok, seed=i).named_parameters()}


def test_ddp_two_processes_train_identical_agents(tmp_path):
    info, weights = finished(tmp_path, "--max_steps", 3)
    assert info["distributed_type"] == "DistributedType.MULTI_CPU"
    assert_ranks_identical_and_saved(tmp_path, info, weights)
    logs = [h for h in info["log_history"] if "turn_1/terminated_frac" in h]
    assert len(logs) == 3 and all("turn_2/reward_mean" in h for h in logs)


@pytest.mark.slow
def test_two_processes_equal_one_process(tmp_path):
    """One step, same global batch and seed: 2 processes reach the 1-process weights (uneven trees included)."""
    common = ("--max_steps", 1, "--per_prompt_seed")
    info2, (two, _) = finished(tmp_path / "two", *common, "--per_device_train_batch_size", 4)
    info1, (one,) = finished(tmp_path / "one", *common, "--per_device_train_batch_size", 8, nproc=1)
    log1, log2 = info1["log_history"][0], info2["log_history"][0]
    # early termination ended some turn-1 nodes but not all: the two ranks grew trees of different sizes
    assert 0.0 < log1["turn_1/terminated_frac"] < 1.0
    assert log2["turn_1/reward_mean"] == pytest.approx(log1["turn_1/reward_mean"])
    assert_same(two, one, rtol=1e-5, atol=1e-6)
    start = initial_weights()
    assert max((one[k] - start[k]).abs().max().item() for k in start) > 1e-4  # the step moved the weights


@pytest.mark.slow
def test_ddp_resume_matches_uninterrupted(tmp_path):
    _, (full, _) = finished(tmp_path / "full", "--max_steps", 4, "--save_steps", 2)
    finished(tmp_path / "part", "--max_steps", 4, "--save_steps", 2, "--stop_at", 2)
    checkpoint = tmp_path / "part" / "checkpoint-2"
    info, (resumed, _) = finished(tmp_path / "resumed", "--max_steps", 4, "--resume", checkpoint)
    assert info["log_history"][-1]["step"] == 4
    assert_same(resumed, full, rtol=1e-5, atol=1e-6)


def test_failure_on_one_rank_stops_every_rank_quickly(tmp_path):
    result, seconds = launch(tmp_path, "--max_steps", 2, "--fail_on_rank", 1, timeout=300)
    assert result.returncode != 0
    log = result.stdout + result.stderr
    assert "[rank1]: RuntimeError: transition failure on rank 1" in log
    # the healthy rank names the failing one instead of waiting in a collective until the gloo timeout (30 min)
    assert "the rollout failed on process(es) [1]: {1: 'RuntimeError: transition failure on rank 1'}" in log
    assert seconds < 120


@pytest.mark.slow
def test_failure_in_generate_on_one_rank_stops_every_rank_quickly(tmp_path):
    result, seconds = launch(tmp_path, "--max_steps", 2, "--fail_on_rank", 1, "--fail_in", "generate", timeout=300)
    assert result.returncode != 0
    log = result.stdout + result.stderr
    assert "[rank1]: RuntimeError: generate failure on rank 1" in log
    assert "the rollout failed on process(es) [1]: {1: 'RuntimeError: generate failure on rank 1'}" in log
    assert seconds < 60


@pytest.fixture(scope="module")
def ddp_reference(tmp_path_factory):
    """Two DDP steps of the worker, the reference the ZeRO runs must match."""
    _, (weights, _) = finished(tmp_path_factory.mktemp("ddp"), "--max_steps", 2)
    return weights


@pytest.mark.slow
def test_ddp_chunked_update_equals_unchunked(tmp_path, ddp_reference):
    """The reference runs the update in chunks of 4 rows per agent (the worker's per_device_train_batch_size, up to 12
    rows per agent per rank, uneven across ranks); one pass per micro-batch reaches the same weights. The ZeRO and
    LoRA runs below are chunked too, and match this DDP run."""
    _, (whole, _) = finished(tmp_path, "--max_steps", 2, "--update_chunk_size", 1000)
    assert_same(whole, ddp_reference, rtol=1e-5, atol=1e-6)
    start = initial_weights()
    assert max((whole[k] - start[k]).abs().max().item() for k in start) > 1e-4


@pytest.mark.parametrize("stage", [pytest.param(2, marks=pytest.mark.slow), 3])
def test_deepspeed_zero_matches_ddp(tmp_path, stage, ddp_reference):
    pytest.importorskip("deepspeed")
    config = os.path.join(DS_CONFIGS, f"ds_zero{stage}.json")
    info, weights = finished(tmp_path, "--max_steps", 2, "--deepspeed", config)
    assert info["distributed_type"] == "DistributedType.DEEPSPEED"
    assert_ranks_identical_and_saved(tmp_path, info, weights)
    assert_same(weights[0], ddp_reference, rtol=1e-5, atol=1e-6)
    own, others, own_at_end = zip(*info["visible_while_generating"], strict=True)
    assert min(own) > 0
    assert min(own_at_end) > 0  # still gathered after every decoding step: generate's forwards released nothing
    if stage == 3:
        # generation gathers the generating agent alone: the other agents stay partitioned
        assert max(others) == 0
    else:
        assert min(others) > 0


@pytest.mark.slow
def test_zero3_generation_in_chunks_matches_ddp(tmp_path):
    """One prompt (K=2 rows) per `generate` call: at turn 2 the ranks have different numbers of live nodes, so
    different numbers of calls; ZeRO-3's generate runs collectives, so the lighter rank pads with empty calls."""
    pytest.importorskip("deepspeed")
    common = ("--max_steps", 2, "--generate_chunk_size", 2)
    _, (ddp, _) = finished(tmp_path / "ddp", *common)
    info, (zero3, _) = finished(tmp_path / "zero3", *common, "--deepspeed", os.path.join(DS_CONFIGS, "ds_zero3.json"))
    assert_same(zero3, ddp, rtol=1e-5, atol=1e-6)
    assert any(0 < h.get("turn_1/terminated_frac", 0) < 1 for h in info["log_history"])


@pytest.fixture(scope="module")
def shared_lora_ddp(tmp_path_factory):
    info, weights = finished(tmp_path_factory.mktemp("lora-ddp"), "--max_steps", 2, "--shared_lora")
    assert info["num_processes"] == 2
    assert_same(weights[0], weights[1], rtol=0, atol=0)
    return weights[0]


@pytest.mark.slow
def test_shared_base_lora_chunked_update_equals_unchunked(tmp_path, shared_lora_ddp):
    """Shared base, one adapter per agent, non-reentrant activation checkpointing (TRL's default): the chunked
    reference (4 rows per agent) has the weights of one pass per micro-batch."""
    _, (whole, _) = finished(tmp_path, "--max_steps", 2, "--shared_lora", "--update_chunk_size", 1000)
    assert_same(whole, shared_lora_ddp, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("stage", [pytest.param(2, marks=pytest.mark.slow), 3])
def test_shared_base_lora_under_zero_matches_ddp(tmp_path, stage, shared_lora_ddp):
    config = os.path.join(DS_CONFIGS, f"ds_zero{stage}.json")
    info, weights = finished(tmp_path, "--max_steps", 2, "--shared_lora", "--deepspeed", config)
    assert info["distributed_type"] == "DistributedType.DEEPSPEED" and info["num_processes"] == 2
    assert_same(weights[0], weights[1], rtol=0, atol=0)
    assert_same(weights[0], shared_lora_ddp, rtol=1e-5, atol=1e-5)
    trained = [name for name in shared_lora_ddp if "lora_B" in name]
    assert trained and all(shared_lora_ddp[name].abs().max() > 0 for name in trained)  # both adapters moved


@pytest.mark.slow
def test_zero3_resume_matches_uninterrupted(tmp_path):
    pytest.importorskip("deepspeed")
    zero3 = ("--deepspeed", os.path.join(DS_CONFIGS, "ds_zero3.json"), "--max_steps", 4, "--save_steps", 2)
    _, (full, _) = finished(tmp_path / "full", *zero3)
    finished(tmp_path / "part", *zero3, "--stop_at", 2)
    info, (resumed, _) = finished(tmp_path / "resumed", *zero3, "--resume", tmp_path / "part" / "checkpoint-2")
    assert info["log_history"][-1]["step"] == 4
    assert_same(resumed, full, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "config, env",
    [("zero3.yaml", {}), pytest.param("cpu_2proc.yaml", {"ACCELERATE_USE_CPU": "true"}, marks=pytest.mark.slow)],
)
def test_recipe_under_accelerate_launch(tmp_path, tiny_model_dir, config, env):
    """The README's launch command, unchanged but for CPU flags: 2 processes, the shipped accelerate config."""
    repo = os.path.dirname(os.path.dirname(__file__))
    command = [
        "accelerate", "launch", "--config_file", os.path.join(repo, "accelerate_configs", config),
        "--num_processes", "2", "--main_process_port", str(free_port()), "--mixed_precision", "no", os.path.join(repo, "recipes", "length_ratio.py"),
        "--model_name_or_path", tiny_model_dir, "--output_dir", str(tmp_path), "--max_new_tokens", "8",
        "--num_train_epochs", "1", "--report_to", "none",
    ]  # fmt: skip
    result = subprocess.run(
        command, capture_output=True, text=True, timeout=600, cwd=tmp_path,
        env={**os.environ, "OMP_NUM_THREADS": "1", **env},
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-6000:]
    from transformers import AutoModelForCausalLM

    for i in range(2):
        AutoModelForCausalLM.from_pretrained(tmp_path / f"agent_{i}")
    checkpoint = tmp_path / "checkpoint-1"
    if config == "zero3.yaml":
        # DeepSpeed wrote one ZeRO-3 optimizer shard per process
        shards = sorted(p.name for p in (checkpoint / "global_step1").glob("*optim_states.pt"))
        assert len(shards) == 2
        state = torch.load(checkpoint / "global_step1" / shards[0], weights_only=False, map_location="cpu")
        assert state["ds_config"]["zero_optimization"]["stage"] == 3
    else:
        assert sorted(p.name for p in checkpoint.glob("rng_state_*.pth")) == ["rng_state_0.pth", "rng_state_1.pth"]


@pytest.mark.slow
def test_zero3_with_kl_reference_matches_ddp(tmp_path):
    """beta > 0: each agent's frozen reference is sharded like the policy; weights match DDP's."""
    pytest.importorskip("deepspeed")
    common = ("--max_steps", 2, "--beta", 0.1)
    _, (ddp, _) = finished(tmp_path / "ddp", *common)
    info, (zero3, _) = finished(tmp_path / "zero3", *common, "--deepspeed", os.path.join(DS_CONFIGS, "ds_zero3.json"))
    kl = [h["kl"] for h in info["log_history"] if "kl" in h]
    assert kl[0] == 0.0 and kl[1] > 0.0
    assert_same(zero3, ddp, rtol=1e-5, atol=1e-6)
