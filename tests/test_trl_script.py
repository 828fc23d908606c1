"""TRL's own `trl/scripts/grpo.py` (shipped in the trl wheel) runs a team with its two classes swapped for ours:
`--reward_funcs think_format_reward` scores each agent, `--log_completions` writes the completions table."""

import glob
import json
import os
import subprocess
import sys

import pandas as pd
import pytest
import trl

from trl_multiagent.demo.testing import make_model, make_tokenizer


CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)
# The swap a TRL user makes, done on the installed script: `GRPOTrainer` -> `MAGRPOTrainer`, `GRPOConfig` ->
# `MAGRPOConfig` (the script imports both from `trl` inside its functions).
SWAPPED = """
import runpy, sys
import trl, trl_multiagent
trl.GRPOTrainer, trl.GRPOConfig = trl_multiagent.MAGRPOTrainer, trl_multiagent.MAGRPOConfig
sys.argv = [sys.argv[1], *sys.argv[2:]]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def run_grpo_script(tmp_path, *extra: str, before: str = "") -> subprocess.CompletedProcess:
    """TRL's `grpo.py`, classes swapped, on a tiny chat model and three prompts (`before`: code run first)."""
    model_dir, data_dir, out = tmp_path / "tiny", tmp_path / "data", tmp_path / "out"
    tokenizer = make_tokenizer()
    tokenizer.chat_template = CHAT_TEMPLATE
    make_model(tokenizer).save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    data_dir.mkdir()
    with open(data_dir / "train.jsonl", "w") as f:
        for text in ["Describe a city in the clouds:", "Invent a new holiday:", "Design a playground on Mars:"] * 2:
            f.write(json.dumps({"prompt": [{"role": "user", "content": text}]}) + "\n")
    script = os.path.join(os.path.dirname(trl.__file__), "scripts", "grpo.py")
    command = [
        sys.executable, "-c", before + SWAPPED, script, "--model_name_or_path", str(model_dir), "--dataset_name",
        str(data_dir), "--reward_funcs", "think_format_reward", "--num_agents", "2", "--output_dir", str(out),
        "--num_generations", "2", "--per_device_train_batch_size", "4", "--max_completion_length", "6",
        "--logging_steps", "1", "--report_to", "none", "--save_strategy", "no", "--learning_rate", "1e-3", *extra,
    ]  # fmt: skip
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "Training completed" in done.stdout
    return done


@pytest.mark.slow  # a run of its own, kept out of the default suite for time (docs/tests.md, "The default suite")
def test_trl_grpo_script_trains_a_team(tmp_path):
    out = tmp_path / "out"
    done = run_grpo_script(tmp_path, "--max_steps", "2", "--log_completions", "--num_completions_to_print", "2")
    for i in range(2):
        assert os.path.exists(out / f"agent_{i}" / "model.safetensors")
    tables = sorted(glob.glob(str(out / "completions" / "completions_*.parquet")))
    assert len(tables) == 2  # one per logged step
    table = pd.read_parquet(tables[-1])
    assert sorted(set(table["agent"])) == [0, 1] and set(table["turn"]) == {1}
    assert len(table) == 2 * 4 and "think_format_reward" in table.columns  # 2 agents x 2 prompts x K=2
    assert "'rewards/think_format_reward/mean':" in done.stdout  # TRL's key, on TRL's console line
    assert "Step 2" in done.stdout  # TRL's console sample of the completions (`num_completions_to_print`)


# Counts every model's `generate_batch` (transformers' continuous batching) and `generate` calls, printed at exit.
COUNT_GENERATION_CALLS = """
import atexit, json
from transformers.generation import GenerationMixin
from transformers.generation.continuous_batching import ContinuousMixin
calls = {"generate_batch": 0, "generate": 0}
def count(cls, name):
    original = getattr(cls, name)
    def counted(self, *args, **kwargs):
        calls[name] += 1
        return original(self, *args, **kwargs)
    setattr(cls, name, counted)
count(ContinuousMixin, "generate_batch")
count(GenerationMixin, "generate")
atexit.register(lambda: print("GENERATION_CALLS", json.dumps(calls), flush=True))
"""


@pytest.mark.slow  # a run of its own, kept out of the default suite for time (docs/tests.md, "The default suite")
def test_trl_grpo_script_with_continuous_batching_generates_through_it(tmp_path):
    """`--use_transformers_continuous_batching`: each agent's turn is one continuous batch, as in GRPOTrainer; the
    engine's settings come from `--transformers_continuous_batching_config` (a small cache: on a CPU the default
    one, sized from free memory, takes seconds to fill at every call)."""
    done = run_grpo_script(
        tmp_path, "--max_steps", "1", "--use_transformers_continuous_batching",
        "--transformers_continuous_batching_config", json.dumps({"num_blocks": 16, "max_batch_tokens": 128}),
        before=COUNT_GENERATION_CALLS,
    )  # fmt: skip
    calls = json.loads(done.stdout.split("GENERATION_CALLS", 1)[1].splitlines()[0])
    assert calls == {"generate_batch": 2, "generate": 0}  # 2 agents x 1 turn x 1 step, none through `generate`
    assert "'rewards/think_format_reward/mean':" in done.stdout  # TRL's key, on TRL's console line
