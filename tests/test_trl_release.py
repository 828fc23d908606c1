"""TRL 1.15 and 1.16 (pyproject.toml): what needs 1.16 is refused by name on 1.15, before anything runs
(`trl_multiagent/trl_release.py`). CI runs this file on both releases (.ci/run, one venv per extra release); on 1.16
the refusals are also checked with the package's version reading set to 1.15.0."""

import importlib.util

import pytest
from datasets import Dataset
from packaging.version import Version

from trl_multiagent import MAGRPOConfig, MAGRPOTrainer, trl_release
from trl_multiagent.demo.testing import make_model, make_tokenizer, make_tool_tokenizer
from trl_multiagent.rollout.tools import ToolCalling


ON_TRL_1_15 = trl_release.TRL_VERSION < Version("1.16")
TOOLS_REFUSED = (
    "MAGRPOTrainer: tool calling (tools= or environment_factory=) needs trl>=1.16 (its parse_response types each tool "
    "call's arguments with the tool's JSON schema); installed: trl 1.15.0. Install it with `pip install "
    "'trl>=1.16,<1.17'`."
)


def add(a: int, b: int) -> int:
    """Add two numbers.

    Args:
        a: The first number.
        b: The second number.
    """
    return a + b


def build(tmp_path, tokenizer, prompt, **kwargs):
    return MAGRPOTrainer(
        model=[make_model(tokenizer, max_positions=2048, seed=i) for i in range(2)], processing_class=tokenizer,
        reward_funcs=lambda a, b: [0.0] * len(a), train_dataset=Dataset.from_dict({"prompt": [prompt] * 2}),
        args=MAGRPOConfig(output_dir=str(tmp_path), num_generations=2, per_device_train_batch_size=2,
                          max_new_tokens=4, report_to="none"),
        **kwargs,
    )  # fmt: skip


CHAT = [{"role": "user", "content": "Add 3 and 2."}]


def as_on_trl_1_15(monkeypatch):
    if not ON_TRL_1_15:
        monkeypatch.setattr(trl_release, "TRL_VERSION", Version("1.15.0"))


def test_tool_calling_is_refused_by_name_on_trl_1_15(tmp_path, monkeypatch):
    tokenizer = make_tool_tokenizer()
    if ON_TRL_1_15:  # the whole build (CI's TRL 1.15 stage runs Triton's interpreter, so the log-probs pass)
        with pytest.raises(ValueError) as refused:
            build(tmp_path, tokenizer, CHAT, tools=[add])
        assert str(refused.value) == TOOLS_REFUSED
        return
    assert build(tmp_path, tokenizer, CHAT, tools=[add]).tool_calling is not None
    as_on_trl_1_15(monkeypatch)  # here the log-probs check would refuse first (no Triton): the tools' own check
    with pytest.raises(ValueError) as refused:
        ToolCalling([add], None, [tokenizer, tokenizer], max_iterations=None, max_completion_length=4)
    assert str(refused.value) == TOOLS_REFUSED


def test_log_probs_without_triton_kernels_are_refused_by_name_on_trl_1_15(tmp_path, monkeypatch):
    """TRL 1.15's fused log-prob head runs only Triton kernels (CUDA, XPU, or Triton's interpreter); on a CPU without
    the interpreter its first forward would fail inside TRL with `'NoneType' object has no attribute 'apply'`."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    if not ON_TRL_1_15:
        build(tmp_path / "ok", make_tokenizer(), "Add 3 and 2.")
    as_on_trl_1_15(monkeypatch)
    triton = importlib.util.find_spec("triton") is not None
    with pytest.raises(ValueError) as refused:
        build(tmp_path, make_tokenizer(), "Add 3 and 2.")
    assert str(refused.value) == (
        f"MAGRPOTrainer: computing log-probs on cpu{'' if triton else ' without triton'} needs trl>=1.16 (trl 1.15.0's "
        "fused log-prob head runs only Triton kernels, on CUDA or XPU; 1.16's also runs on plain torch); installed: "
        "trl 1.15.0. Install it with `pip install 'trl>=1.16,<1.17'`."
    )
    if triton:
        trl_release.require_fused_head_kernels("cuda")  # where Triton runs its kernels
        monkeypatch.setenv("TRITON_INTERPRET", "1")  # Triton's interpreter runs them on the CPU (CI's TRL 1.15 stage)
        build(tmp_path / "interpreted", make_tokenizer(), "Add 3 and 2.")
