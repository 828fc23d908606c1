"""Server mode warns, as GRPOTrainer does, for each trainable agent's vLLM server that reports a `logprobs_mode` other
than `processed_logprobs`: the importance-sampling correction is then biased.

Marked `vllm`: `MAGRPOConfig(use_vllm=True)` needs vLLM installed (the vLLM environment, `tests/vllm_suite.sh`), though
no engine is started.
"""

import pytest
from conftest import SEED_PROMPTS, length_feedback, length_ratio_reward
from datasets import Dataset

from trl_multiagent import MAGRPOConfig, MAGRPOTrainer
from trl_multiagent.demo.testing import make_model, make_tokenizer
from trl_multiagent.generation import vllm_server


pytestmark = pytest.mark.vllm


class FakeServerClient:
    """A mock of the server only: stands in for TRL's `VLLMClient` (its weight sync needs NCCL and a GPU, so no real
    `trl vllm-serve` runs here), reporting the `logprobs_mode` each URL is given in `modes`, in the shape of vLLM's
    `/server_info` (`get_server_info()["model_config"]["logprobs_mode"]`). Everything on the trainer's side is real."""

    modes: dict = {}

    def __init__(self, base_url, group_port, connection_timeout):
        self.base_url = base_url

    def init_communicator(self, device):
        pass

    def get_server_info(self):
        return {"model_config": {"logprobs_mode": FakeServerClient.modes[self.base_url]}}


def build(tmp_path, modes, **overrides):
    FakeServerClient.modes = modes
    tok = make_tokenizer()
    args = MAGRPOConfig(
        output_dir=str(tmp_path), use_vllm=True, vllm_mode="server", vllm_server_base_urls=list(modes),
        num_generations=2, per_device_train_batch_size=4, max_new_tokens=4, report_to="none", **overrides,
    )  # fmt: skip
    return MAGRPOTrainer(
        model=[make_model(tok, seed=i) for i in range(len(modes))], processing_class=tok, reward_funcs=length_ratio_reward,
        external_transition=length_feedback, train_dataset=Dataset.from_dict({"prompt": SEED_PROMPTS}), args=args,
    )  # fmt: skip


@pytest.fixture
def warnings(monkeypatch):
    monkeypatch.setattr("trl.generation.vllm_client.VLLMClient", FakeServerClient)
    seen = []
    monkeypatch.setattr(vllm_server.logger, "warning", lambda message, *args: seen.append(message))
    return seen


def test_server_with_raw_logprobs_warns_per_agent(tmp_path, warnings):
    build(tmp_path, {"http://a:1": "raw_logprobs", "http://b:2": "processed_logprobs"})
    assert warnings == [
        "MAGRPOTrainer: agent 0's vLLM server at http://a:1 runs with `--logprobs-mode raw_logprobs`, which biases "
        "the importance sampling correction. Restart it with `--logprobs-mode processed_logprobs`, or set "
        "`vllm_importance_sampling_correction=False`."
    ]


def test_servers_with_processed_logprobs_do_not_warn(tmp_path, warnings):
    build(tmp_path, {"http://a:1": "processed_logprobs", "http://b:2": "processed_logprobs"})
    assert warnings == []


def test_no_warning_without_the_correction_or_for_a_frozen_agent(tmp_path, warnings):
    raw = {"http://a:1": "raw_logprobs", "http://b:2": "raw_logprobs"}
    build(tmp_path, raw, vllm_importance_sampling_correction=False)  # as in GRPOTrainer: nothing to bias
    assert warnings == []
    build(tmp_path, raw, trainable_agents=[1])  # agent 0 keeps its weights: its samples are never reweighted
    assert [message.split(" runs with")[0] for message in warnings] == [
        "MAGRPOTrainer: agent 1's vLLM server at http://b:2"
    ]
