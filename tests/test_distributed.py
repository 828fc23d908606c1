"""Real multi-process training on CPU: torchrun with 2 gloo processes (DDP), and DeepSpeed ZeRO-2/3.

Each test launches tests/distributed/run_length_ratio.py: the length-ratio task, 2 agents, 2 turns, early
termination on (so ranks hold uneven trees). Marked `distributed`; they run in the default suite and in CI.
"""

import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest
import torch

from trl_multiagent.demo.testing import make_model, make_tokenizer


WORKER = os.path.join(os.path.dirname(__file__), "distributed", "run_length_ratio.py")
DS_CONFIGS = os.path.join(os.path.dirname(__file__), "distributed")

# Every test here is `distributed`; the default suite keeps one DDP run, one rank failure, ZeRO-3 (shared-base LoRA)
# and the accelerate launch (ZeRO-3), and the rest are `slow` (`.ci/run` runs both), so it stays under 15 minutes.
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
    result = run_in_own_group([*command, "--output_dir", str(output_dir), *map(str, args)], timeout, env=env)
    return result, time.perf_counter() - start


def run_in_own_group(command, timeout, **kwargs) -> subprocess.CompletedProcess:
    """`subprocess.run` with output captured, in a process group of its own that is killed whole on a timeout: a
    launcher's ranks left running would take the CPU from every later test."""
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True, **kwargs
    )
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        stdout, stderr = process.communicate()
        raise AssertionError(f"{command[:6]}... ran past {timeout} s\n{stdout[-3000:]}\n{stderr[-6000:]}") from None
    return subprocess.CompletedProcess(command, process.returncode, stdout, stderr)


def finished(output_dir, *args, nproc=2):
    result, _ = launch(output_dir, *args, nproc=nproc)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-6000:]
    keeps_groups = {"--deepspeed", "--use_vllm"} & set(map(str, args))  # their own references (assert_clean_exit)
    assert_clean_exit(result, ranks=range(nproc) if nproc > 1 else [], threads_joined=not keeps_groups)
    with open(os.path.join(output_dir, "info.json")) as f:
        info = json.load(f)
    weights = [torch.load(os.path.join(output_dir, f"weights_rank{r}.pt")) for r in range(nproc)]
    return info, weights


def assert_clean_exit(result, ranks, threads_joined=True):
    """The worker just returns from main, which ends with `trainer.end()`: each rank's process groups were released
    before the interpreter's finalisation, and nothing aborted. `threads_joined`: no gloo thread is left either once
    garbage is collected, the groups were freed (nothing that is never collected holds one: DeepSpeed's functions take
    the world group as a default when DeepSpeed is imported after it is made, so the worker imports it first). Not
    under DeepSpeed, whose engine stays referenced by its own hooks and keeps its parameters, which hold their groups,
    nor with colocated vLLM engines, whose parallel state (`vllm.distributed.parallel_state`, module globals) keeps the
    groups vLLM made."""
    for rank in ranks:
        expected = f"rank {rank}: process groups at exit: released" + (", gloo threads []" if threads_joined else "")
        assert expected in result.stdout, result.stdout[-3000:]
    assert "terminate called" not in result.stdout + result.stderr


def assert_same(a, b, **tolerance):
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(a[name], b[name], msg=name, **tolerance)


def assert_ranks_identical_and_saved(output_dir, info, weights, num_agents=2):
    from transformers import AutoModelForCausalLM

    assert info["num_processes"] == 2
    assert_same(weights[0], weights[1], rtol=0, atol=0)
    for i in range(num_agents):  # one agent is saved as GRPOTrainer saves its model, into the folder itself
        folder = os.path.join(output_dir, "final", *([f"agent_{i}"] if num_agents > 1 else []))
        loaded = AutoModelForCausalLM.from_pretrained(folder)
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


def recorded_trees_hold_every_rank_once(output_dir, steps):
    """The tree files of a 2-process run (`log_rollout_trees`) hold each rank's own trees (as each rank noted them),
    every one once, and nothing else."""
    from trl_multiagent.trees import read_step, step_files

    files = step_files(str(output_dir))
    assert list(files) == list(range(1, steps + 1))
    own = [json.loads((output_dir / f"own_trees_rank{r}.json").read_text()) for r in range(2)]
    for step, path in files.items():
        document = read_step(path)
        got = sorted(
            [
                p["process"],
                p["row"],
                [n["turn"] for n in p["nodes"]],
                [c["text"] for n in p["nodes"] for c in n["agents"][0]["completions"]],
            ]
            for p in document["prompts"]
        )
        expected = sorted([r, *entry] for r in range(2) for entry in own[r][str(step)])
        assert got == expected
        assert {p["process"] for p in document["prompts"]} == {0, 1}


def test_ddp_recorded_trees_hold_every_process_rows_once(tmp_path):
    finished(tmp_path, "--max_steps", 2, "--log_rollout_trees")
    recorded_trees_hold_every_rank_once(tmp_path, 2)


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


ACTOR_CRITIC_WORKER = os.path.join(os.path.dirname(__file__), "distributed", "run_actor_critic.py")


def actor_critic_run(output_dir, *args, nproc=2) -> tuple[dict, list[dict]]:
    """The actor-critics' worker (`run_actor_critic.py`) under torchrun (or alone): its info and each rank's weights."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    launcher = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc), "--master_port",
                str(free_port())] if nproc > 1 else [sys.executable]  # fmt: skip
    command = [*launcher, ACTOR_CRITIC_WORKER, "--output_dir", str(output_dir), *map(str, args)]
    result = run_in_own_group(command, 600, env=env)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-6000:]
    with open(os.path.join(output_dir, "info.json")) as f:
        info = json.load(f)
    return info, [torch.load(os.path.join(output_dir, f"weights_rank{r}.pt")) for r in range(nproc)]


@pytest.mark.slow
@pytest.mark.parametrize("algorithm, critic_type", [("iac", "q"), ("maac", "v")])
def test_actor_critic_two_processes_equal_one_process(tmp_path, algorithm, critic_type):
    """IAC and MAAC in 2 processes (DDP, 2 prompts each) reach the weights one process reaches on the same 4 prompts,
    critics and their AdamW moments included: the TD advantages are standardised over both processes' samples and
    every process's critics step on all of them (`TeamCritic.step`'s `gather`); both ranks' critics stay equal."""
    common = ("--algorithm", algorithm, "--critic_type", critic_type)
    info2, (two, two_rank1) = actor_critic_run(tmp_path / "two", *common, "--prompts_per_process", 2)
    info1, (one,) = actor_critic_run(tmp_path / "one", *common, "--prompts_per_process", 4, nproc=1)
    assert (info2["num_processes"], info1["num_processes"]) == (2, 1)
    log1, log2 = info1["log_history"][0], info2["log_history"][0]
    for key in ("reward", "critic/value_loss", "critic/value_mean"):
        assert log2[key] == pytest.approx(log1[key], rel=1e-5), key
    assert sorted(one) == sorted(two) and any(".adam." in key for key in one)
    for key in one:
        torch.testing.assert_close(two[key], one[key], rtol=1e-4, atol=1e-5)
        assert torch.equal(two_rank1[key], two[key]), key  # the ranks' critics (and actors) are one
    start = {f"agent{i}.{n}": p for i in range(2) for n, p in make_model(make_tokenizer(), seed=i).named_parameters()}
    assert max((one[k] - start[k]).abs().max().item() for k in start) > 1e-4  # the step moved the actors


@pytest.mark.slow
def test_actor_critic_resumed_under_ddp_equals_an_uninterrupted_run(tmp_path):
    """Two steps of IAC in 2 processes, and the same run stopped after its first checkpoint and resumed from it: the
    actors, the critics and the critics' AdamW moments end equal (`critics.pt`, `critic_optimizers.pt`)."""
    common = ("--prompts_per_process", 2, "--epochs", 2, "--save")
    _, (full, _) = actor_critic_run(tmp_path / "full", *common)
    actor_critic_run(tmp_path / "part", *common, "--stop_at", 1)
    checkpoint = tmp_path / "part" / "checkpoint-1"
    assert {"critics.pt", "critic_optimizers.pt"} <= {p.name for p in checkpoint.iterdir()}
    info, (resumed, _) = actor_critic_run(tmp_path / "resumed", *common, "--resume", checkpoint)
    assert info["log_history"][-1]["step"] == 2
    for key in full:
        torch.testing.assert_close(resumed[key], full[key], rtol=1e-5, atol=1e-6)


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


# Both stages in the slow stage (about 2.5 min with their DDP reference); ZeRO-3 stays in the default suite through
# the shared-base LoRA run and the accelerate launch of the recipe.
@pytest.mark.parametrize("stage", [pytest.param(2, marks=pytest.mark.slow), pytest.param(3, marks=pytest.mark.slow)])
def test_deepspeed_zero_matches_ddp(tmp_path, stage, ddp_reference):
    pytest.importorskip("deepspeed")
    config = os.path.join(DS_CONFIGS, f"ds_zero{stage}.json")
    info, weights = finished(tmp_path, "--max_steps", 2, "--deepspeed", config, "--log_rollout_trees")
    assert info["distributed_type"] == "DistributedType.DEEPSPEED"
    recorded_trees_hold_every_rank_once(tmp_path, 2)  # recording the trees gathers them under ZeRO too
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
def test_one_agent_is_the_wrapped_model_under_ddp_and_zero3(tmp_path):
    """A team of one: the Trainer's model is the agent itself (GRPOTrainer's layout), so DDP and the ZeRO-3 engine wrap
    the agent, not the team. Both ranks train it identically and it moves; ZeRO-3 reaches DDP's weights, and its saved
    folder (written from the gathered state dict, whose keys are the agent's own) loads to them."""
    pytest.importorskip("deepspeed")
    info, ddp = finished(tmp_path / "ddp", "--max_steps", 2, "--one_agent")
    assert_ranks_identical_and_saved(tmp_path / "ddp", info, ddp, num_agents=1)
    start = {k: v for k, v in initial_weights().items() if k.startswith("0.")}
    assert ddp[0].keys() == start.keys()
    assert max((ddp[0][k] - start[k]).abs().max().item() for k in start) > 1e-4
    zero3_config = os.path.join(DS_CONFIGS, "ds_zero3.json")
    info, zero3 = finished(tmp_path / "zero3", "--max_steps", 2, "--one_agent", "--deepspeed", zero3_config)
    assert info["distributed_type"] == "DistributedType.DEEPSPEED"
    assert_ranks_identical_and_saved(tmp_path / "zero3", info, zero3, num_agents=1)
    assert_same(zero3[0], ddp[0], rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_a_trained_adapters_reference_under_zero3_is_its_frozen_copy(tmp_path):
    """One PEFT model with a trained adapter, beta > 0: under ZeRO-3 as under DDP its reference is the frozen copy of
    the adapter ("ref"): KL 0 at the first step, the same weights after two, the copy still the adapter it arrived
    with while the adapter moved, and the saved adapter (from the gathered state dict) the trained one, without the
    copy. Resumed from the first step's checkpoint, the run ends on the same weights, its copy still the adapter it
    arrived with."""
    pytest.importorskip("deepspeed")
    from safetensors.torch import load_file

    from trl_multiagent.demo.testing import with_trained_adapter

    common = ("--max_steps", 2, "--one_agent", "--trained_adapter", "--beta", 0.1)
    zero3_args = ("--deepspeed", os.path.join(DS_CONFIGS, "ds_zero3.json"), "--save_steps", 1)
    ddp_info, ddp = finished(tmp_path / "ddp", *common)
    info, zero3 = finished(tmp_path / "zero3", *common, *zero3_args)
    assert info["distributed_type"] == "DistributedType.DEEPSPEED"
    for run in (ddp_info, info):
        assert [h["kl"] for h in run["log_history"] if "kl" in h][0] == 0.0
    assert_same(zero3[0], zero3[1], rtol=0, atol=0)
    assert_same(zero3[0], ddp[0], rtol=1e-5, atol=1e-5)  # as the shared-base LoRA runs: summation order, ~1e-6
    checkpoint = tmp_path / "zero3" / "checkpoint-1"
    assert not (checkpoint / "ref").exists() and not any(
        ".ref." in k for k in load_file(checkpoint / "adapter_model.safetensors")
    )
    _, resumed = finished(tmp_path / "resumed", *common, *zero3_args, "--resume", checkpoint)
    assert_same(resumed[0], zero3[0], rtol=1e-5, atol=1e-6)
    start = dict(with_trained_adapter(make_model(make_tokenizer(), seed=0)).named_parameters())
    adapter = [name for name in start if ".default." in name]
    for name in adapter:
        torch.testing.assert_close(zero3[0][f"0.{name.replace('.default.', '.ref.')}"], start[name], rtol=0, atol=0)
    assert sum(not torch.allclose(zero3[0][f"0.{name}"], start[name]) for name in adapter) > len(adapter) // 2
    saved = load_file(tmp_path / "zero3" / "final" / "adapter_model.safetensors")
    assert sorted(saved) == sorted(name.replace(".default.", ".") for name in adapter)
    for name in adapter:
        torch.testing.assert_close(saved[name.replace(".default.", ".")], zero3[0][f"0.{name}"], rtol=0, atol=0)


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
    result = run_in_own_group(command, 600, cwd=tmp_path, env={**os.environ, "OMP_NUM_THREADS": "1", **env})
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


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie has exited; only its parent has not collected it yet
        return f.read().split(")")[-1].split()[0] != "Z"


# A kill while generating in the default suite; one during the update in the slow stage, for time.
@pytest.mark.parametrize("phase", ["generate", pytest.param("update", marks=pytest.mark.slow)])
def test_sigkilled_rank_ends_the_job_quickly(tmp_path, phase):
    """Rank 1 dies from SIGKILL (as from the out-of-memory killer), mid-generation (first step, turn 2) or mid-update
    (its first loss). torchrun's teardown ends the survivor: the job exits non-zero well before ddp_timeout (30 s here,
    30 minutes by default), and no process is left behind."""
    result, _ = launch(tmp_path, "--max_steps", 2, "--fail_on_rank", 1, "--sigkill_in", phase, "--ddp_timeout", 30,
                       timeout=300)  # fmt: skip
    ended = time.time()
    with open(tmp_path / "killed.json") as f:
        killed = json.load(f)
    survivor = int((tmp_path / "pid_rank0").read_text())
    outlived = ended - killed["time"]
    print(f"SIGKILL in {phase}: torchrun exit status {result.returncode}, {outlived:.1f} s after the kill")  # noqa: T201
    log = result.stdout + result.stderr
    assert result.returncode != 0, log[-3000:]
    assert f"Signal 9 (SIGKILL) received by PID {killed['pid']}" in log, log[-3000:]
    assert outlived < 60
    assert not alive(survivor) and not alive(killed["pid"])
    assert not (tmp_path / "info.json").exists()  # rank 0 never finished training


REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# How each mode's nodes are launched: DDP as cpu_2proc.yaml says (MULTI_GPU with ACCELERATE_USE_CPU), ZeRO-3 with the
# shipped DeepSpeed config, as a user launches it.
TWO_NODE_LAUNCH = {
    "ddp": (["--multi_gpu"], {"ACCELERATE_USE_CPU": "true"}),
    "zero3": (["--config_file", os.path.join(REPO, "accelerate_configs", "zero3.yaml")], {}),
}


def launch_two_nodes(output_dirs, *args, mode="ddp", timeout=600, check=True):
    """Two "nodes" of one process each on this machine, as on two machines: one `accelerate launch` per node, with
    --num_machines 2, its --machine_rank and the main node's address; each node may have its own output folder."""
    port = str(free_port())
    launcher, launcher_env = TWO_NODE_LAUNCH[mode]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", **launcher_env}
    nodes = []
    for machine_rank, output_dir in enumerate(output_dirs):
        command = ["accelerate", "launch", *launcher, "--num_machines", "2", "--machine_rank", str(machine_rank),
                   "--main_process_ip", "127.0.0.1", "--main_process_port", port, "--num_processes", "2",
                   "--mixed_precision", "no", "--dynamo_backend", "no", WORKER, "--output_dir", str(output_dir),
                   *map(str, args)]  # fmt: skip
        nodes.append(
            subprocess.Popen(
                command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, start_new_session=True
            )
        )
    try:
        outputs = [node.communicate(timeout=timeout)[0] for node in nodes]
    except subprocess.TimeoutExpired:  # both nodes' launchers and ranks, so that none runs on into later tests
        for node in nodes:
            os.killpg(node.pid, signal.SIGKILL)
        outputs = [node.communicate()[0] for node in nodes]
        raise AssertionError(f"two nodes ran past {timeout} s\n" + "\n\n".join(o[-4000:] for o in outputs)) from None
    if not check:
        return [node.returncode for node in nodes], outputs
    for node, output in zip(nodes, outputs, strict=True):
        assert node.returncode == 0, "\n\n".join(o[-4000:] for o in outputs)
        assert "terminate called" not in output
    return outputs


def two_node_weights(output_dirs):
    return [torch.load(os.path.join(d, f"weights_rank{rank}.pt")) for rank, d in enumerate(output_dirs)]


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["ddp", "zero3"])
@pytest.mark.parametrize("storage", ["shared", "per_node"])
def test_two_nodes_resume_matches_uninterrupted(tmp_path, mode, storage):
    """Two nodes, the seed task with two turns, a checkpoint every step, stopped after step 2 and resumed on both
    nodes from the newest complete checkpoint: the weights equal an uninterrupted run's, on both nodes. `per_node`:
    each node has its own output folder (no shared filesystem) and `save_on_each_node=True`, so each node writes
    the checkpoint files it needs to resume. Under DeepSpeed that cannot resume (DeepSpeed writes its `latest` tag on
    the first node only): the config refuses it on both nodes, before any model is built."""
    if mode == "zero3":
        pytest.importorskip("deepspeed")
    common = ("--max_steps", 3, "--save_steps", 1)
    if storage == "per_node":
        common += ("--save_on_each_node",)

    def folders(name):
        return [tmp_path / name] * 2 if storage == "shared" else [tmp_path / name / f"node{n}" for n in range(2)]

    if storage == "per_node" and mode == "zero3":
        codes, outputs = launch_two_nodes(folders("full"), *common, mode=mode, check=False)
        assert codes[0] != 0 and codes[1] != 0
        for output in outputs:
            assert "save_on_each_node=True with DeepSpeed on several nodes is not supported" in output, output[-3000:]
        assert not list(tmp_path.glob("full/node*/checkpoint-*"))
        return

    launch_two_nodes(folders("full"), *common, mode=mode)
    full = two_node_weights(folders("full"))
    assert_same(full[0], full[1], rtol=0, atol=0)
    launch_two_nodes(folders("part"), *common, "--stop_at", 2, mode=mode)
    for folder in set(folders("part")):  # what each node has: its own RNG state, and complete checkpoints
        names = sorted(p.name for p in (folder / "checkpoint-2").glob("rng_state_*.pth"))
        assert names == (["rng_state_0.pth", "rng_state_1.pth"] if storage == "shared" else [
            f"rng_state_{folders('part').index(folder)}.pth"]), names  # fmt: skip
        assert checkpoint_complete(folder / "checkpoint-2")
    outputs = launch_two_nodes(folders("part"), *common, "--resume", "latest", mode=mode)
    assert all("resuming from" in output and "checkpoint-2 (step 2)" in output for output in outputs[:1])
    resumed = two_node_weights(folders("part"))
    for rank in range(2):
        assert_same(resumed[rank], full[rank], rtol=1e-5, atol=1e-6)
    start = initial_weights()
    assert max((full[0][k] - start[k]).abs().max().item() for k in start) > 1e-4


def checkpoint_complete(folder) -> bool:
    from trl_multiagent.checkpoint import is_complete

    return is_complete(str(folder))


@pytest.mark.slow
def test_nodes_that_find_different_checkpoints_stop_naming_them(tmp_path):
    """A folder per node without `save_on_each_node`: only the main node writes complete checkpoints, so the other
    finds none. Both nodes stop when the resume starts, with what each found, instead of training on different
    weights or waiting in a collective."""
    folders = [tmp_path / f"node{n}" for n in range(2)]
    launch_two_nodes(folders, "--max_steps", 2, "--save_steps", 1, "--stop_at", 1)
    assert checkpoint_complete(folders[0] / "checkpoint-1") and not checkpoint_complete(folders[1] / "checkpoint-1")
    start = time.perf_counter()
    codes, outputs = launch_two_nodes(folders, "--max_steps", 2, "--save_steps", 1, "--resume", "latest", check=False)
    assert codes[0] != 0 and codes[1] != 0
    assert time.perf_counter() - start < 120
    expected = "the processes do not find the same checkpoint in their output_dir: {0: 'step 1', 1: \"MAGRPOTrainer:"
    for output in outputs:
        assert expected in output and "need save_on_each_node=True" in output, output[-3000:]


@pytest.mark.slow
def test_a_round_of_tool_calls_on_one_rank_only_keeps_zero3_in_step(tmp_path):
    """Rank 0's agents call tools, rank 1's do not: rank 1 joins rank 0's extra generation with no prompt, so the
    ZeRO-3 gathers of every generation stay paired; a rank that skipped it would leave the other waiting."""
    repo = os.path.dirname(os.path.dirname(__file__))
    command = [
        "accelerate", "launch", "--config_file", os.path.join(repo, "accelerate_configs", "zero3.yaml"),
        "--num_processes", "2", "--main_process_port", str(free_port()), "--mixed_precision", "no",
        os.path.join(DS_CONFIGS, "run_tool_team.py"), "--output_dir", str(tmp_path),
    ]  # fmt: skip
    result = run_in_own_group(command, 300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-6000:]
    with open(tmp_path / "info.json") as f:
        info = json.load(f)
    assert info["processes"] == 2
    log = info["log"][0]
    # rank 0: each agent called one tool per completion; rank 1: none. Gathered over both processes.
    assert log["turn_1/agent_0/tools/call_frequency"] == 0.5 and log["turn_1/agent_1/tools/call_frequency"] == 0.5
    assert log["turn_1/rewards/Notebook/mean"] == 0.5  # rank 0's notebooks hold one note each, rank 1's none
