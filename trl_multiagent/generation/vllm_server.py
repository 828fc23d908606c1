"""Generation with one `trl vllm-serve` per agent (`use_vllm=True, vllm_mode="server"`), through TRL's `VLLMClient`.

The main process sends every process's prompts of an agent to that agent's server in one request (each prompt once,
`n=K`) and hands each process its share back. Weights go to a server over NCCL (`VLLMClient.update_named_params`),
so this path needs GPUs; `benchmarks/gpu_check.sh` runs it end to end.
"""

from __future__ import annotations

from accelerate.utils import broadcast_object_list, gather_object
from transformers.utils import logging

from .base import gathered_parameters
from .vllm_base import VLLMGenerator
from .vllm_settings import server_base_urls


logger = logging.get_logger(__name__)


class VLLMServerGenerator(VLLMGenerator):
    def __init__(self, *, team, args, accelerator, **common):
        super().__init__(team=team, args=args, accelerator=accelerator, **common)
        from trl.generation import vllm_client

        self.urls = server_base_urls(args, team.num_agents)
        self.clients = []
        if accelerator.is_main_process:
            for i, url in enumerate(self.urls):
                try:
                    client = vllm_client.VLLMClient(
                        base_url=url, group_port=args.vllm_group_port + i, connection_timeout=args.vllm_server_timeout
                    )
                except OSError as error:  # requests' ConnectionError, raised after `vllm_server_timeout`
                    raise ConnectionError(
                        f"MAGRPOTrainer: agent {i}'s vLLM server at {url} did not answer within vllm_server_timeout="
                        f"{args.vllm_server_timeout:g} s. Start it with `trl vllm-serve --model <agent {i}'s model> "
                        f"--port <port>`, or fix `vllm_server_base_urls`."
                    ) from error
                client.init_communicator(device=accelerator.device)
                self.clients.append(client)
                if args.vllm_importance_sampling_correction and i in self.trainable:
                    warn_if_logprobs_unprocessed(client, i, url)
        accelerator.wait_for_everyone()

    def _sample(self, agent, prompt_ids, num_generations, greedy):
        asks = gather_object([(len(prompt_ids), num_generations)])  # per process: its prompts, samples of each
        all_prompts = gather_object(prompt_ids)
        # Processes may ask for different sample counts (one whose worlds gave each completion its own prompt asks
        # for 1): the request then sends each prompt once per sample, with n=1.
        n = num_generations
        if len({samples for _, samples in asks}) > 1:
            n, sizes = 1, [count for count, _ in asks]
            starts = [sum(sizes[:p]) for p in range(len(asks))]
            all_prompts = [
                ids
                for start, (count, samples) in zip(starts, asks, strict=True)
                for ids in all_prompts[start : start + count]
                for _ in range(samples)
            ]
        payload = [None]
        if self.accelerator.is_main_process:
            request, extra = self._request(agent, n, greedy)
            output = self.clients[agent].generate(prompts=all_prompts, **request, generation_kwargs=extra)
            logps = output.get("logprobs")
            # One log-prob per token (the sampled one) when `logprobs=0`.
            logps = None if logps is None else [[lp[0] if isinstance(lp, list) else lp for lp in row] for row in logps]
            payload = [(output["completion_ids"], logps)]
        broadcast_object_list(payload, from_process=0)
        completion_ids, logps = (self._repeat_greedy(rows, n, greedy) for rows in payload[0])
        start = sum(count * samples for count, samples in asks[: self.accelerator.process_index])
        share = slice(start, start + len(prompt_ids) * num_generations)
        return completion_ids[share], None if logps is None else logps[share]

    def _push(self, agents: set[int], first: bool) -> None:
        if first:
            return  # each server loaded its agent's starting weights itself
        for agent in sorted(agents):
            module = self.team.agent(agent)
            with gathered_parameters(list(module.parameters()), self.zero3):
                if self.accelerator.is_main_process:
                    named = [(name, param.data) for name, param in module.named_parameters()]
                    metadata = [(n, str(p.dtype).removeprefix("torch."), list(p.shape)) for n, p in named]
                    self.clients[agent].update_named_params(metadata, iter(named))
                    self.clients[agent].reset_prefix_cache()


def warn_if_logprobs_unprocessed(client, agent: int, url: str) -> None:
    """GRPOTrainer's warning, for one agent's server: the importance-sampling correction needs the log-probs after
    temperature scaling and logit processing (`--logprobs-mode processed_logprobs`, which `trl vllm-serve` sets)."""
    logprobs_mode = client.get_server_info()["model_config"]["logprobs_mode"]
    if logprobs_mode != "processed_logprobs":
        logger.warning(
            f"MAGRPOTrainer: agent {agent}'s vLLM server at {url} runs with `--logprobs-mode {logprobs_mode}`, which "
            "biases the importance sampling correction. Restart it with `--logprobs-mode processed_logprobs`, or set "
            "`vllm_importance_sampling_correction=False`."
        )
