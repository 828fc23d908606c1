"""Nothing of the user's is touched: building a trainer calls none of their functions or environments, a config does
no more to the process than GRPOConfig does with the same arguments, and training registers no more exit handlers
than GRPOTrainer. The allocator (tests/test_malloc_reuse.py) and PEFT's files (tests/test_checkpoints.py) are checked
beside their code."""

import ast
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import textwrap
from concurrent.futures import ThreadPoolExecutor

import pytest
from conftest import SEED_PROMPTS
from datasets import Dataset

import trl_multiagent
from trl_multiagent import MAGRPOConfig, MAGRPOTrainer
from trl_multiagent.demo.testing import make_model, make_tool_tokenizer


TOUCHED = []  # what the user's functions and environment saw, in order


def untouchable_reward(completions1, completions2):
    TOUCHED.append("reward")
    raise RuntimeError("the reward was called")


def untouchable_transition(prompt, agent_completions, num_agents):
    TOUCHED.append("transition")
    raise RuntimeError("the transition was called")


class UntouchableNotebook:
    """An environment that records anything but its constructor (GRPOTrainer makes one instance when it is built, to
    read its tools)."""

    made = 0

    def __init__(self):
        UntouchableNotebook.made += 1

    def reset(self, **row):
        TOUCHED.append("reset")
        raise RuntimeError("reset was called")

    def write(self, note: str) -> str:
        """Write a note.

        Args:
            note: the text.
        """
        TOUCHED.append("tool")
        raise RuntimeError("a tool was called")

    def get_reward(self):
        TOUCHED.append("get_reward")
        raise RuntimeError("get_reward was called")

    def __deepcopy__(self, memo):
        TOUCHED.append("copy")
        raise RuntimeError("the environment was copied")


def test_building_the_trl_face_calls_no_reward_transition_or_environment(tmp_path):
    tokenizer = make_tool_tokenizer()
    chats = Dataset.from_dict({"prompt": [[{"role": "user", "content": p}] for p in SEED_PROMPTS]})
    TOUCHED.clear()
    UntouchableNotebook.made = 0
    trainer = MAGRPOTrainer(
        model=[make_model(tokenizer, max_positions=2048, seed=s) for s in (0, 1)], processing_class=tokenizer,
        reward_funcs=untouchable_reward, external_transition=untouchable_transition,
        environment_factory=UntouchableNotebook, train_dataset=chats,
        args=MAGRPOConfig(
            output_dir=str(tmp_path), num_turns=2, num_generations=2, per_device_train_batch_size=4,
            max_completion_length=8, report_to="none",
        ),
    )  # fmt: skip
    assert TOUCHED == [] and UntouchableNotebook.made == 1  # the probe that read the tools, as GRPOTrainer's
    with pytest.raises(RuntimeError, match="reset was called"):  # training is what calls them
        trainer.train()
    assert TOUCHED == ["reset"]


def test_building_the_comlrl_face_calls_no_reward_or_transition(tmp_path):
    from trl_multiagent.comlrl import MAGRPOConfig as CoMLRLConfig
    from trl_multiagent.comlrl import MAGRPOTrainer as CoMLRLTrainer
    from trl_multiagent.demo.testing import make_tokenizer

    TOUCHED.clear()
    tokenizer = make_tokenizer()
    trainer = CoMLRLTrainer(
        agents=[make_model(tokenizer, seed=s) for s in (0, 1)], tokenizer=tokenizer,
        reward_func=untouchable_reward, external_transition=untouchable_transition,
        train_dataset=Dataset.from_dict({"prompt": SEED_PROMPTS}),
        args=CoMLRLConfig(output_dir=str(tmp_path), num_generations=2, max_new_tokens=4, report_to="none"),
    )  # fmt: skip
    assert TOUCHED == []
    with pytest.raises(RuntimeError, match="the reward was called"):
        trainer.train()
    assert TOUCHED == ["reward"]


def test_a_bad_signature_is_still_refused_when_built_without_calling_anything(tmp_path):
    def reads_a_missing_column(completions1, completions2, difficulty):
        TOUCHED.append("reward")
        return [0.0] * len(completions1)

    TOUCHED.clear()
    with pytest.raises(TypeError, match=r"reads_a_missing_column.*'difficulty' is neither a column"):
        MAGRPOTrainer(
            model=["no/such-model"] * 2, reward_funcs=reads_a_missing_column,
            train_dataset=Dataset.from_dict({"prompt": SEED_PROMPTS}),
            args=MAGRPOConfig(output_dir=str(tmp_path), num_generations=2, per_device_train_batch_size=2),
        )  # fmt: skip
    assert TOUCHED == []


# ------------------------------------------------------------------ the process: a fresh interpreter each time

STATE_PROBE = textwrap.dedent(
    """
    import atexit, json, os, sys
    import torch
    import accelerate.state
    import trl, trl_multiagent.comlrl  # every import done before the counts below: they compare what building does

    face, arguments, report_dir = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]
    before_env, before_handlers = dict(os.environ), atexit._ncallbacks()
    error = None
    try:
        if face == "grpo":
            trl.GRPOConfig(**arguments, bf16=False, use_cpu=True)  # the two fields our configs set themselves on a CPU
        elif face == "trl":
            trl_multiagent.MAGRPOConfig(**arguments)
        else:
            trl_multiagent.comlrl.MAGRPOConfig(**arguments)
    except Exception as err:
        error = f"{type(err).__name__}: {err}"
    partial = accelerate.state.PartialState._shared_state
    # A file per rank: under torchrun the ranks share one stdout, where their lines can interleave.
    with open(os.path.join(report_dir, f"rank{os.environ.get('RANK', '0')}.json"), "w") as report:
        json.dump({
        "error": error,
        "environment": sorted(set(os.environ.items()) ^ set(before_env.items())),
        "process_group": torch.distributed.is_available() and torch.distributed.is_initialized(),
        "accelerator_state": accelerate.state.is_initialized(),
        "partial_state": sorted((k, str(v)) for k, v in partial.items() if k in ("backend", "distributed_type", "num_processes")),
        "exit_handlers": atexit._ncallbacks() - before_handlers,
        }, report)
    """
)


def config_effects(face: str, arguments: dict, tmp_path, processes: int = 1) -> list[dict]:
    """What building `face`'s config with `arguments` did to a fresh process (each of `processes`, under torchrun)."""
    from test_distributed import free_port

    environment = {k: v for k, v in os.environ.items() if not k.startswith(("ACCELERATE_", "WORLD_SIZE", "RANK"))}
    launcher = [sys.executable]
    if processes > 1:
        launcher = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={processes}",
                    f"--master_port={free_port()}", "--no-python", sys.executable]  # fmt: skip
    reports = pathlib.Path(tempfile.mkdtemp(dir=tmp_path, prefix=f"{face}-reports-"))
    done = subprocess.run(
        [*launcher, "-c", STATE_PROBE, face, json.dumps({"output_dir": str(tmp_path / face), **arguments}), str(reports)],
        capture_output=True, text=True, timeout=300, env={**environment, "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return [json.loads((reports / f"rank{rank}.json").read_text()) for rank in range(processes)]


FACES = ("grpo", "trl", "comlrl")
DS_ZERO2 = str(pathlib.Path(__file__).parent / "distributed" / "ds_zero2.json")


# Each comparison starts fresh interpreters (about 10 s each on 2 cores, so the three faces start at once): the
# defaults run in the default suite, the rest in the slow stage.
@pytest.mark.parametrize(
    "arguments",
    [
        pytest.param({}, id="defaults"),
        pytest.param(
            {"deepspeed": DS_ZERO2, "report_to": "tensorboard", "logging_steps": 1, "gradient_checkpointing": True},
            id="deepspeed-tensorboard-checkpointing", marks=pytest.mark.slow,
        ),
    ],
)  # fmt: skip
def test_a_config_does_to_the_process_what_grpoconfig_does(tmp_path, arguments):
    if "deepspeed" in arguments:
        pytest.importorskip("deepspeed")
    with ThreadPoolExecutor(3) as pool:
        effects = dict(
            zip(FACES, pool.map(lambda face: config_effects(face, arguments, tmp_path), FACES), strict=True)
        )
    (grpo,) = effects["grpo"]
    assert grpo["error"] is None and grpo["environment"] == [] and grpo["exit_handlers"] == 0
    assert effects["trl"] == [grpo]
    assert effects["comlrl"] == [grpo]


@pytest.mark.slow
def test_in_two_cpu_processes_a_config_makes_the_process_group_grpoconfig_makes_and_no_deepspeed_state(tmp_path):
    grpo = config_effects("grpo", {}, tmp_path, processes=2)
    assert [rank["process_group"] for rank in grpo] == [True, True]
    assert config_effects("trl", {}, tmp_path, processes=2) == grpo
    # `deepspeed=` on CPU processes: transformers makes no gloo group for it, and neither does the config, which says
    # what the launch must do instead; the process is left as it was.
    for rank in config_effects("trl", {"deepspeed": DS_ZERO2}, tmp_path, processes=2):
        assert (
            rank["error"].startswith("ValueError: MAGRPOConfig: deepspeed=")
            and "PartialState(backend='gloo')" in rank["error"]
        )
        assert (rank["environment"], rank["process_group"], rank["partial_state"]) == ([], False, [])


TRAIN_PROBE = textwrap.dedent(
    """
    import atexit, sys
    import trl, trl_multiagent
    from datasets import Dataset
    from trl_multiagent.demo.testing import make_model, make_tokenizer

    tokenizer = make_tokenizer()
    data = Dataset.from_dict({"prompt": ["a b", "c d"]})

    def reward(completions, **kwargs):
        return [float(len(c)) for c in completions]

    common = dict(num_generations=2, per_device_train_batch_size=2, max_completion_length=4, max_steps=1,
                  report_to="none", save_strategy="no", bf16=False, use_cpu=True, output_dir=sys.argv[2])
    before = atexit._ncallbacks()
    if sys.argv[1] == "grpo":
        trainer = trl.GRPOTrainer(model=make_model(tokenizer), reward_funcs=reward, processing_class=tokenizer,
                                  train_dataset=data, args=trl.GRPOConfig(**common))
    else:
        trainer = trl_multiagent.MAGRPOTrainer(model=[make_model(tokenizer), make_model(tokenizer, seed=1)],
                                               reward_funcs=reward, processing_class=tokenizer, train_dataset=data,
                                               args=trl_multiagent.MAGRPOConfig(**common))
    trainer.train()
    print("exit handlers added:", atexit._ncallbacks() - before)
    """
)


def test_training_registers_no_more_exit_handlers_than_grpo_trainer(tmp_path):
    def added(which: str) -> int:
        done = subprocess.run(
            [sys.executable, "-c", TRAIN_PROBE, which, str(tmp_path / which)], capture_output=True, text=True,
            timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"},
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
        return int(done.stdout.rsplit("exit handlers added:", 1)[1])

    assert added("magrpo") <= added("grpo")


def test_no_module_walks_the_interpreters_objects_or_rewrites_a_functions_defaults():
    """The exit-time surgery this replaces walked `gc.get_objects()` and set `__defaults__` of every function holding a
    process group. Scripts call `trainer.end()` instead (docs/multi-gpu.md)."""
    found = []
    for path in pathlib.Path(trl_multiagent.__file__).parent.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr in ("get_objects", "get_referrers", "get_referents"):
                found.append(f"{path.name}:{node.lineno} {node.attr}")
            if isinstance(node, (ast.Assign, ast.AugAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for target in targets:
                    if isinstance(target, ast.Attribute) and target.attr in ("__defaults__", "__kwdefaults__"):
                        found.append(f"{path.name}:{node.lineno} {target.attr}")
            if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "register":
                if getattr(node.func.value, "id", None) == "atexit":
                    found.append(f"{path.name}:{node.lineno} atexit.register")
    assert found == []
