"""Generation with vLLM engines inside the training process (`use_vllm=True, vllm_mode="colocate"`).

The team maps onto engines as follows:

- a shared-base LoRA team (`model=..., num_agents=N, peft_config=...`) gets **one** engine on the frozen base, with
  `enable_lora` and one `LoRARequest` per agent; a weight sync writes the changed adapters (a few MB) and nothing else;
- every other agent gets an engine of its own: a full model starts from dummy weights and receives the trainer's at
  the first sync (so models built in memory need no folder); a PEFT agent on its own base serves its adapter like
  the shared base does.

Each engine runs in the policy's dtype (TRL's colocate engine uses vLLM's default, bf16 for a float32 model, which
biases the importance-sampling ratio). Each is seeded per (process, engine), so identical agents on identical
weights still sample different completions. The engine is sized for a whole turn: `max_num_seqs` covers K
completions of every live node of the largest turn, or `generate_chunk_size` when that is smaller (the most rows
decoded at once, as the transformers backend's calls hold at most that many; vLLM queues the rest).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import weakref
from dataclasses import dataclass, field

import torch
from transformers.utils import logging

from ..devices import has_accelerator
from . import vllm_cpu
from .base import gathered_parameters
from .vllm_base import VLLMGenerator
from .vllm_process import kept_for_training
from .vllm_settings import prepare_environment


logger = logging.get_logger(__name__)

# vLLM accepts these LoRA ranks (vllm.config.lora.MaxLoRARanks); an adapter's rank is rounded up to the next one.
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
# A turn larger than this is queued by vLLM's scheduler rather than batched at once.
MAX_NUM_SEQS_CAP = 1024


@dataclass
class Engine:
    llm: object  # vllm.LLM
    agents: list[int]
    lora: bool
    folder: str
    lora_requests: dict = field(default_factory=dict)  # agent -> LoRARequest serving its current adapter


def check_adapters_servable(team) -> None:
    """vLLM serves LoRA adapters only, and no trained base modules (`modules_to_save`)."""
    for agent in range(team.num_agents):
        module = team.agent(agent)
        if not hasattr(module, "peft_config"):
            continue
        config = module.peft_config[team.adapter_name(agent)]
        if str(getattr(config, "peft_type", "")) not in ("LORA", "PeftType.LORA"):
            raise ValueError(
                f"MAGRPOTrainer(use_vllm=True): agent {agent} is a {config.peft_type} adapter; vLLM serves LoRA "
                "adapters only. Use a LoraConfig, or use_vllm=False."
            )
        if getattr(config, "modules_to_save", None):
            raise ValueError(
                f"MAGRPOTrainer(use_vllm=True): agent {agent}'s LoraConfig trains `modules_to_save="
                f"{config.modules_to_save}`, which a vLLM LoRA adapter cannot carry. Remove them, or use_vllm=False."
            )


class VLLMColocateGenerator(VLLMGenerator):
    def __init__(self, *, team, args, accelerator, **common):
        from vllm import LLM

        check_adapters_servable(team)
        prepare_environment(accelerator)
        if not has_accelerator():
            vllm_cpu.keep_linear_weights()
        super().__init__(team=team, args=args, accelerator=accelerator, **common)
        self.sleep = args.vllm_enable_sleep_mode
        self.workdir = tempfile.mkdtemp(prefix="trl_multiagent_vllm_")
        groups = [list(range(team.num_agents))] if team.is_shared_base else [[i] for i in range(team.num_agents)]
        turn = args.max_turn_sequences(team.num_agents)
        max_num_seqs = min(turn, args.generate_chunk_size or MAX_NUM_SEQS_CAP, MAX_NUM_SEQS_CAP)
        self.engines: list[Engine] = []
        # vLLM sets the process up for serving while it builds an engine; the update shares the process.
        with kept_for_training():
            for index, agents in enumerate(groups):
                module = team.agent(agents[0])
                lora = hasattr(module, "peft_config")
                folder = os.path.join(self.workdir, f"engine_{index}")
                self._write_model_folder(module, folder, with_weights=lora)
                llm_kwargs = {}
                if lora:
                    ranks = [module.peft_config[team.adapter_name(a)].r for a in agents]
                    rank = next(r for r in VLLM_LORA_RANKS if r >= max(ranks))
                    llm_kwargs.update(enable_lora=True, max_loras=len(agents), max_lora_rank=rank)
                else:
                    llm_kwargs.update(load_format="dummy")  # the trainer's weights arrive with the first sync
                llm = LLM(
                    model=folder,
                    dtype=str(next(module.parameters()).dtype).removeprefix("torch."),
                    seed=args.seed + accelerator.process_index * len(groups) + index,
                    max_model_len=args.vllm_max_model_length,
                    max_num_seqs=max_num_seqs,
                    # Each engine gets an equal share of what TRL's field allows its one engine.
                    gpu_memory_utilization=args.vllm_gpu_memory_utilization / len(groups),
                    enable_sleep_mode=self.sleep,
                    model_impl=args.vllm_model_impl,
                    distributed_executor_backend="external_launcher",
                    skip_tokenizer_init=True,  # prompts go in as token ids and completions come back as ids
                    generation_config="vllm",  # sampling settings come from MAGRPOConfig, not the model's file
                    logprobs_mode="processed_logprobs",  # log-probs of the distribution actually sampled from
                    enforce_eager=not has_accelerator(),  # torch.compile adds a minute to start-up on a CPU, for little gain
                    trust_remote_code=args.trust_remote_code,
                    **llm_kwargs,
                )
                if self.sleep:
                    llm.sleep(level=1)
                self.engines.append(Engine(llm, agents, lora, folder))
        self.engine_of = {agent: engine for engine in self.engines for agent in engine.agents}
        self._lora_ids = 0
        # The engines shut down one at a time (`shut_down`) when the generator is closed or collected, or at exit:
        # made after vLLM's own finalizers of the engines, this one runs before them at exit, while their shared
        # process groups still exist. `weakref.finalize` holds the engines, not the generator.
        self._shut_down = weakref.finalize(self, shut_down, self.engines, self.workdir)
        accelerator.wait_for_everyone()

    # ------------------------------------------------------------------ building

    def _write_model_folder(self, module, folder: str, with_weights: bool) -> None:
        """The engine's model folder: config only (dummy weights, synced later), or the frozen base of a LoRA agent."""
        os.makedirs(folder, exist_ok=True)
        base = module.get_base_model() if hasattr(module, "get_base_model") else module
        base.config.save_pretrained(folder)
        if not with_weights:
            return
        from safetensors.torch import save_file

        params = [p for name, p in module.named_parameters() if "lora_" not in name]
        with gathered_parameters(params, self.zero3):
            state = {}
            for name, param in module.named_parameters():
                if "lora_" in name:
                    continue
                name = name.removeprefix("base_model.model.").replace(".base_layer", "")
                state[name] = param.detach().to("cpu", copy=True).contiguous()
        save_file(state, os.path.join(folder, "model.safetensors"), metadata={"format": "pt"})

    # ------------------------------------------------------------------ sampling

    def _params(self, agent: int, num_generations: int, greedy: bool):
        from vllm import SamplingParams

        request, extra = self._request(agent, num_generations, greedy)
        return SamplingParams(**{**request, "detokenize": False, **extra})  # ids in, ids out

    def _sample(self, agent, prompt_ids, num_generations, greedy):
        engine = self.engine_of[agent]
        max_model_len = engine.llm.llm_engine.model_config.max_model_len
        longest = max(len(ids) for ids in prompt_ids)
        if longest + self.sampling.max_tokens > max_model_len:
            raise ValueError(
                f"MAGRPOTrainer (vLLM): agent {agent} got a {longest}-token prompt; with max_completion_length="
                f"{self.sampling.max_tokens} it exceeds the engine's max_model_len={max_model_len}. Raise "
                "`vllm_max_model_length`, or shorten the prompts your transition writes."
            )
        with self._awake(engine):
            outputs = engine.llm.generate(
                [{"prompt_token_ids": ids} for ids in prompt_ids],
                sampling_params=self._params(agent, num_generations, greedy),
                lora_request=engine.lora_requests.get(agent),
                use_tqdm=False,
            )
        completions, logps = [], []
        for sample in (sample for request in outputs for sample in request.outputs):
            completions.append(list(sample.token_ids))
            logps.append([step[token].logprob for step, token in zip(sample.logprobs, sample.token_ids, strict=True)])
        return self._repeat_greedy(completions, num_generations, greedy), self._repeat_greedy(
            logps, num_generations, greedy
        )

    @contextlib.contextmanager
    def _awake(self, engine: Engine):
        """With sleep mode, the engine holds its weights and cache only while it works."""
        if not self.sleep:
            yield
            return
        engine.llm.wake_up()
        try:
            yield
        finally:
            engine.llm.sleep(level=1)

    # ------------------------------------------------------------------ weight sync

    def _push(self, agents: set[int], first: bool) -> None:
        for engine in self.engines:
            changed = [a for a in engine.agents if a in agents]
            if not changed:
                continue
            with self._awake(engine):
                if engine.lora:
                    for agent in changed:
                        self._push_adapter(engine, agent)
                else:
                    self._push_full_weights(engine, changed[0])
                engine.llm.reset_prefix_cache()

    def _push_full_weights(self, engine: Engine, agent: int) -> None:
        module = self.team.agent(agent)
        model = engine_model(engine.llm)
        with gathered_parameters(list(module.parameters()), self.zero3):  # one agent at a time under ZeRO-3
            # Tied weights appear once here; vLLM ties its head to the embedding it loads.
            model.load_weights(
                (name.replace("_checkpoint_wrapped_module.", ""), param.data)
                for name, param in module.named_parameters()
            )
        if not has_accelerator():
            vllm_cpu.repack(model)

    def _push_adapter(self, engine: Engine, agent: int) -> None:
        """Write the agent's adapter to a new folder and serve it under a new id; drop the previous one."""
        from vllm.lora.request import LoRARequest

        self._lora_ids += 1  # vLLM caches an adapter by its id: each push gets a new one
        name = self.team.adapter_name(agent)
        folder = os.path.join(engine.folder, f"agent_{agent}_lora_{self._lora_ids}")
        with gathered_parameters(self.team.agent_parameters(agent), self.zero3):
            self.team.agent(agent).save_pretrained(folder, selected_adapters=[name])
        previous = engine.lora_requests.get(agent)
        engine.lora_requests[agent] = LoRARequest(
            f"agent_{agent}_lora_{self._lora_ids}",
            self._lora_ids,
            folder if name == "default" else os.path.join(folder, name),
        )
        if previous is not None:
            engine.llm.llm_engine.remove_lora(previous.lora_int_id)
            shutil.rmtree(os.path.dirname(previous.lora_path) if name != "default" else previous.lora_path)

    def close(self) -> None:
        """Shut every engine down and free its memory; the generator cannot generate afterwards."""
        self._shut_down()  # runs once: later calls, collection and exit do nothing
        self.engine_of.clear()


def shut_down(engines: list, workdir: str) -> None:
    """Shut each engine down with vLLM's own finalizer, one at a time, and remove the engines' model folders."""
    for engine in engines:
        shutdown = getattr(engine.llm.llm_engine.engine_core, "_finalizer", None)  # vLLM's own, runs once
        try:
            if shutdown is not None:
                shutdown()
        except (ValueError, RuntimeError):
            # The engines of one process share vLLM's process groups: the first shutdown destroyed them, and the next
            # one's destroy fails ("Invalid process group specified"). Nothing is left to release.
            pass
    engines.clear()
    shutil.rmtree(workdir, ignore_errors=True)


def engine_model(llm) -> torch.nn.Module:
    """The torch model inside an in-process vLLM engine (as TRL's colocate sync reaches it)."""
    try:
        return llm.llm_engine.model_executor.driver_worker.model_runner.model
    except AttributeError as error:
        raise RuntimeError(
            "trl_multiagent: cannot reach the vLLM engine's model in this process. Colocated engines need "
            "VLLM_ENABLE_V1_MULTIPROCESSING=0 (set by default; do not override it)."
        ) from error
