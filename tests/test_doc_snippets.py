"""Every python block of README.md and docs/*.md, read from the files: each one runs offline as written, with only
its sizes made tiny and its model the tiny offline one (`trl_multiagent.demo.testing`), or is excluded in `BLOCKS`
with the reason. The blocks of one program (the quickstart's three) run as one script, in a fresh folder, in a
subprocess. The table is checked against the files in the default suite (a block added, moved or changed is named at
once); the runs are slow (a minute or more on 2 cores) and run in CI's slow stage."""

import io
import os
import re
import shutil
import subprocess
import sys
import tokenize
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path

import pytest

from trl_multiagent.demo.testing import make_model, make_tool_tokenizer


ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
PYTHON_BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)
TINY_MODEL = "TINY_MODEL_DIR"  # replaced by the tiny model's folder when a program is written


def page_blocks() -> dict[str, str]:
    """{"PAGE#N": code}: the N-th python block of each page (README.md, docs/NAME.md), N from 1."""
    found = {}
    for page in PAGES:
        name = str(page.relative_to(ROOT))
        for number, code in enumerate(PYTHON_BLOCK.findall(page.read_text(encoding="utf-8")), 1):
            found[f"{name}#{number}"] = code
    return found


@dataclass
class Run:
    program: str  # the blocks of one program, in the table's order, run as one script (PROGRAMS says how)


@dataclass
class Same:
    block: str  # the same text as that block, which runs: this one is run with it


@dataclass
class Excluded:
    reason: str


# Each python block: its first line (so that a block added or moved before it is noticed), and what is done with it.
BLOCKS = {
    "README.md#1": ("import math", Run("quickstart")),
    "README.md#2": ("def length_feedback(prompt, agent_completions, num_agents, **history):", Run("quickstart")),
    "README.md#3": ("config = MAGRPOConfig(", Run("quickstart")),
    "README.md#4": ("reward(completions_agent_0, completions_agent_1, ..., *, prompts, turn, trainer_state, <dataset "
                    "columns>)", Excluded("a call signature, not code")),
    "README.md#5": ("transition(prompt, agent_completions, num_agents, *, prompt_history_per_agent, "
                    "response_history_per_agent, turn,", Excluded("a call signature, not code")),
    "README.md#6": ("from peft import LoraConfig", Excluded("a fragment: `...` stands for the reader's arguments, "
                    "and the models and tokenizers are the reader's")),
    "README.md#7": ("trainer = MAGRPOTrainer(model=..., num_agents=2, tools=[[search], [run_code]], ...)  # one list "
                    "per agent, or one for all", Excluded("a fragment: `...` stands for the reader's arguments")),
    "README.md#8": ("config = MAGRPOConfig(", Run("research options")),
    "docs/agents.md#1": ("from datasets import Dataset", Run("notebook world")),
    "docs/agents.md#2": ("from datasets import Dataset", Run("calculator tools")),
    "docs/agents.md#3": ("class Game:", Run("forkable world")),
    "docs/agents.md#4": ("from openenv.core import GenericEnvClient", Excluded("OpenEnv: needs the [openenv] extra "
                         "and a running environment server (tests/test_openenv*.py run those, marked openenv)")),
    "docs/agents.md#5": ("from openenv_games import HanabiAction, TinyHanabiEnvironment  # recipes/: an openenv-core "
                         "Environment", Excluded("OpenEnv: needs the [openenv] extra (tests/test_openenv*.py)")),
    "docs/agents.md#6": ("from trl.chat_template_utils import qwen2_5_chat_template",
                         Excluded("a fragment: `tokenizer` is the reader's")),
    "docs/critics.md#1": ("        if self.num_generations < 2:", Excluded("a quotation of TRL's GRPOConfig "
                          "(trl/trainer/grpo_config.py), cut from its method")),
    "docs/evaluation.md#1": ("from trl_multiagent.evaluation import write_task_file", Excluded(
        "a fragment: `trainer`, `output_dir` and the module `my_task` are the reader's")),
    "docs/evaluation.md#2": ("from trl_multiagent.evaluation import evaluate_team, write_report, report_text",
                             Run("evaluate the main job")),
    "docs/index.md#1": ("from trl_multiagent import MAGRPOConfig, MAGRPOTrainer", Run("index")),
    "docs/metrics.md#1": ("from trl_multiagent.demo.plot import plot_run",
                          Excluded("a fragment: `trainer` is the reader's")),
    "docs/quickstart.md#1": ("import math", Same("README.md#1")),
    "docs/quickstart.md#2": ("def length_feedback(prompt, agent_completions, num_agents, **history):",
                             Same("README.md#2")),
    "docs/quickstart.md#3": ("config = MAGRPOConfig(", Same("README.md#3")),
    "docs/rewards-and-transitions.md#1": ("reward(completions_agent_0, completions_agent_1, ..., *, prompts, turn, "
                                          "trainer_state, <dataset columns>)", Same("README.md#4")),
    "docs/rewards-and-transitions.md#2": ("from trl_multiagent import joint, per_agent, per_joint_action",
                                          Run("reward conventions")),
    "docs/rewards-and-transitions.md#3": ("transition(prompt, agent_completions, num_agents, *, "
                                          "prompt_history_per_agent, response_history_per_agent, turn,",
                                          Same("README.md#5")),
    "docs/saving.md#1": ("from transformers import AutoModelForCausalLM, AutoTokenizer", Run("load a saved agent")),
    # after the quickstart's blocks, in its script: the team it saved in outputs/quickstart
    "docs/saving.md#2": ("from trl_multiagent import load_team", Run("quickstart")),
    "docs/teams.md#1": ("from peft import LoraConfig", Excluded("a fragment: `...` stands for the reader's "
                        "arguments, and the models and tokenizers are the reader's")),
    "docs/viewer.md#1": ("config = MAGRPOConfig(..., log_rollout_trees=True)  # every logged step; "
                         "rollout_trees_steps=10: every 10th step", Excluded("a fragment: `...` stands for the "
                         "reader's arguments")),
    "docs/vllm.md#1": ("config = MAGRPOConfig(num_turns=2, num_generations=4, max_new_tokens=64, use_vllm=True)  # "
                       'vllm_mode="colocate"', Excluded("vLLM: needs vLLM, in its own environment (tests/test_vllm.py, "
                       "marked vllm)")),
}  # fmt: skip

# The main job's run folder (`recipes/length_ratio.py`'s outputs/length_ratio), made on the tiny model with tiny sizes:
# the folder that the pages after the main job read. A program with `main_job=True` runs beside it.
MAIN_JOB = ["recipes/length_ratio.py", "--model_name_or_path", TINY_MODEL, "--output_dir", "outputs/length_ratio",
            "--max_steps", "1", "--max_new_tokens", "8", "--report_to", "none"]  # fmt: skip


@dataclass
class Program:
    # (text, replacement): each text must occur in the program exactly once; only sizes and the model change
    edits: list[tuple[str, str]] = field(default_factory=list)
    # what the page leaves to the reader (imported or defined earlier on the page), written before the blocks
    prelude: str = ""
    main_job: bool = False
    # what the run must leave or print, beyond its exit status 0: files under its folder, and text in its output
    files: list[str] = field(default_factory=list)
    prints: list[str] = field(default_factory=list)


MODEL_EDITS = [("model_name = prepare_default_model()", f'model_name = "{TINY_MODEL}"')]
PROGRAMS = {
    "quickstart": Program(
        edits=[*MODEL_EDITS, ("max_steps=16", "max_steps=2"), ("max_new_tokens=24", "max_new_tokens=8")],
        files=["outputs/quickstart/agent_1/adapter_config.json", "outputs/quickstart/trainer_state.json"],
        prints=["Summary over 2 logged steps"],
    ),
    "research options": Program(prelude="from trl_multiagent import MAGRPOConfig\n"),
    "notebook world": Program(
        edits=[
            *MODEL_EDITS,
            ("max_steps=40", "max_steps=1"),
            ("max_completion_length=96", "max_completion_length=24"),
        ],
        files=["outputs/notebook"],
    ),
    "calculator tools": Program(
        edits=[
            *MODEL_EDITS,
            ("max_steps=20", "max_steps=1"),
            ("max_completion_length=64", "max_completion_length=24"),
        ],
        files=["outputs/calculators"],
    ),
    "forkable world": Program(),
    "evaluate the main job": Program(main_job=True, files=["outputs/length_ratio/evaluation.json"]),
    "index": Program(
        edits=[
            ('"HuggingFaceTB/SmolLM2-135M-Instruct"', f'"{TINY_MODEL}"'),
            ("early_termination_threshold=0.9)", "early_termination_threshold=0.9, max_steps=1, max_new_tokens=8)"),
        ],
        prelude="from datasets import Dataset\n"
        "from trl_multiagent.demo.examples import PROMPTS, length_feedback as feedback, length_ratio_reward as "
        "joint_reward\n\ndataset = Dataset.from_dict({'prompt': PROMPTS})\n",
    ),  # fmt: skip
    "reward conventions": Program(),
    "load a saved agent": Program(main_job=True),
}


def program_code(name: str, blocks: dict[str, str]) -> str:
    """The program's blocks in order, after its prelude, with its edits made (each found exactly once)."""
    parts = [block for block, (_, action) in BLOCKS.items() if isinstance(action, Run) and action.program == name]
    program = PROGRAMS[name]
    code = program.prelude + "\n".join(blocks[block] for block in parts)
    for text, replacement in program.edits:
        assert code.count(text) == 1, f"program {name!r}: the edit's text {text!r} occurs {code.count(text)} times"
        code = code.replace(text, replacement)
    return code


def test_the_table_names_every_python_block_of_the_readme_and_docs_as_it_is():
    blocks = page_blocks()
    assert set(blocks) == set(BLOCKS), (
        f"update BLOCKS: new {set(blocks) - set(BLOCKS)}, gone {set(BLOCKS) - set(blocks)}"
    )
    for block, (first_line, action) in BLOCKS.items():
        assert blocks[block].splitlines()[0] == first_line, f"{block} starts otherwise: update BLOCKS"
        if isinstance(action, Same):
            assert blocks[block] == blocks[action.block], f"{block} is no longer the same as {action.block}"
            assert isinstance(BLOCKS[action.block][1], Run | Excluded)
    run = {action.program for _, action in BLOCKS.values() if isinstance(action, Run)}
    assert run == set(PROGRAMS)
    for name in PROGRAMS:  # each edit still finds its text, and no program is left to fetch or prepare a model
        assert hub_models(program_code(name, blocks)) == [], name


def hub_models(code: str) -> list[str]:
    """The Hub ids (strings "org/name" of the Hub's model owners named here) and `prepare_default_model()` calls in
    code, comments left out: what would reach the Hub or prepare the real model instead of the tiny one."""
    tokens = list(tokenize.generate_tokens(io.StringIO(code).readline))
    ids = [t.string for t in tokens if t.type == tokenize.STRING and re.search(r"\b(HuggingFaceTB|Qwen)/", t.string)]
    calls = [f"{a.string}()" for a, b in pairwise(tokens) if a.string == "prepare_default_model" and b.string == "("]
    return ids + calls


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> str:
    """A tiny random model with a tokenizer that has a chat template (TRL's Qwen2.5 one, which renders tools), and room
    for the tools' descriptions, which its small vocabulary spells in many tokens (about 700)."""
    folder = tmp_path_factory.mktemp("tiny-chat-model")
    tokenizer = make_tool_tokenizer()
    make_model(tokenizer, seed=0, max_positions=2048).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)


def run_python(arguments: list[str], cwd: Path) -> subprocess.CompletedProcess:
    # the checkout's package, whichever copy is installed; the Hub is offline: a snippet that reached it would fail
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1",
           "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}  # fmt: skip
    return subprocess.run([sys.executable, *arguments], cwd=cwd, env=env, capture_output=True, text=True, timeout=900)


@pytest.fixture(scope="module")
def main_job_folder(tmp_path_factory, tiny_model) -> Path:
    """A folder holding outputs/length_ratio, as the README's main job leaves it (tiny model, one step)."""
    folder = tmp_path_factory.mktemp("main-job")
    arguments = [str(ROOT / MAIN_JOB[0]), *(tiny_model if a == TINY_MODEL else a for a in MAIN_JOB[1:])]
    done = run_python(arguments, folder)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    return folder


@pytest.mark.slow  # each program trains or evaluates a tiny model in a fresh process: 10 to 60 s each on 2 cores
@pytest.mark.parametrize("name", list(PROGRAMS))
def test_the_snippet_runs_offline_as_written(name, tmp_path, tiny_model, request):
    code = program_code(name, page_blocks()).replace(TINY_MODEL, tiny_model)
    program = PROGRAMS[name]
    if program.main_job:
        shutil.copytree(request.getfixturevalue("main_job_folder") / "outputs", tmp_path / "outputs")
    (tmp_path / "snippet.py").write_text(code, encoding="utf-8")
    done = run_python(["snippet.py"], tmp_path)
    assert done.returncode == 0, f"{name}:\n{code}\n{done.stdout[-3000:]}{done.stderr[-6000:]}"
    for path in program.files:
        assert (tmp_path / path).exists(), f"{name}: {path} was not written"
    for text in program.prints:
        assert text in done.stdout, f"{name}: {text!r} not printed:\n{done.stdout[-3000:]}"
