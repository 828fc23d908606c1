"""CoMLRL 1.4.3's REINFORCE family in the CoMLRL face (`trl_multiagent.comlrl`): MAREINFORCE, MARLOO and MAReMax
(MAGRPO with `advantage_mode` raw, rloo, max by default), CentralizedMAGRPO (one joint policy, roles split for the
reward) with CoMLRL's tagged adapter; CoMLRL's module paths and `RewardProcessors`; the named `ImportError` of every
CoMLRL name the face does not provide. CoMLRL's numbers are read from its 1.4.3 source (comlrl/trainers/reinforce/,
comlrl/trainers/preference/centralized.py); `test_matches_comlrl_installed` compares with CoMLRL itself where the
contract harness's Python has it."""

import dataclasses
import importlib
import inspect
import json
import os
import subprocess
from pathlib import Path

import pytest
import torch

import trl_multiagent.comlrl as face
from trl_multiagent.comlrl import (
    CentralizedComparatorParseError,
    CentralizedMAGRPOConfig,
    CentralizedMAGRPOTrainer,
    MAGRPOConfig,
    MAGRPOTrainer,
    MAREINFORCEConfig,
    MAREINFORCETrainer,
    MAReMaxConfig,
    MAReMaxTrainer,
    MARLOOConfig,
    MARLOOTrainer,
    RewardProcessors,
    TaggedCentralizedComparatorAdapter,
)
from trl_multiagent.comlrl.not_provided import NOT_PROVIDED, NotProvidedError, names_of
from trl_multiagent.comlrl.trainers.reinforce.centralized_magrpo import CentralizedCollaboration
from trl_multiagent.demo.testing import make_model


# CoMLRL 1.4.3: each variant's config class, trainer class, advantage_mode default, algorithm_name; and the TRL
# face's advantage_baseline that the mode sets
VARIANTS = [
    (MAREINFORCEConfig, MAREINFORCETrainer, "raw", "MAREINFORCE", "none"),
    (MARLOOConfig, MARLOOTrainer, "rloo", "MARLOO", "rloo"),
    (MAReMaxConfig, MAReMaxTrainer, "max", "MAReMax", "max"),
]
MODULE_PATHS = {  # CoMLRL's module -> the names it exports that the face provides
    "trainers": [
        "MAGRPOConfig",
        "MAGRPOTrainer",
        "MAREINFORCEConfig",
        "MAREINFORCETrainer",
        "MAReMaxConfig",
        "MAReMaxTrainer",
        "MARLOOConfig",
        "MARLOOTrainer",
        "IACConfig",
        "IACTrainer",
        "MAACConfig",
        "MAACTrainer",
    ],
    "trainers.reinforce": [
        "MAGRPOConfig",
        "MAGRPOTrainer",
        "CentralizedMAGRPOConfig",
        "CentralizedMAGRPOTrainer",
        "MAREINFORCEConfig",
        "MAREINFORCETrainer",
        "MAReMaxConfig",
        "MAReMaxTrainer",
        "MARLOOConfig",
        "MARLOOTrainer",
    ],
    "trainers.reinforce.magrpo": ["MAGRPOConfig", "MAGRPOTrainer"],
    "trainers.reinforce.mareinforce": ["MAREINFORCEConfig", "MAREINFORCETrainer"],
    "trainers.reinforce.marloo": ["MARLOOConfig", "MARLOOTrainer"],
    "trainers.reinforce.maremax": ["MAReMaxConfig", "MAReMaxTrainer"],
    "trainers.reinforce.centralized_magrpo": ["CentralizedMAGRPOConfig", "CentralizedMAGRPOTrainer"],
    "trainers.preference": [
        "CentralizedComparatorAdapter",
        "CentralizedComparatorParseError",
        "TaggedCentralizedComparatorAdapter",
    ],
    "trainers.preference.centralized": [
        "CentralizedComparatorAdapter",
        "CentralizedComparatorParseError",
        "TaggedCentralizedComparatorAdapter",
    ],
    "trainers.actor_critic": ["IACConfig", "IACTrainer", "MAACConfig", "MAACTrainer"],
    "trainers.actor_critic.iac": ["IACConfig", "IACTrainer"],
    "trainers.actor_critic.maac": ["MAACConfig", "MAACTrainer"],
    "utils": ["RewardProcessors", "read_checkpoint_metadata"],
    "utils.reward_processor": ["RewardProcessors"],
    "utils.checkpoint": ["read_checkpoint_metadata"],
}
# What CoMLRL 1.4.3's packages export (their `__all__`; `comlrl.models`, which has none, what its `__init__` imports;
# `comlrl.utils.checkpoint`, its public functions and classes); `test_matches_comlrl_installed` reads them again
COMLRL_EXPORTS = {
    "trainers": {
        *MODULE_PATHS["trainers"],
        *("ActorCriticTrainerBase", "JointRewardModel"),
        *("MADPOConfig", "MADPOTrainer", "MARLHFConfig", "MARLHFTrainer"),
    },
    "trainers.reinforce": set(MODULE_PATHS["trainers.reinforce"]),
    "trainers.preference": {
        *MODULE_PATHS["trainers.preference"],
        *("MADPOConfig", "MADPOTrainer", "MADPOIterConfig", "MADPOIterTrainer", "MARLHFConfig", "MARLHFTrainer"),
        *("MARLHFIterConfig", "MARLHFIterTrainer", "JointRewardModel"),
    },
    "trainers.actor_critic": {
        *MODULE_PATHS["trainers.actor_critic"],
        *("ActorCriticTrainerBase", "RolloutSample"),
    },
    "utils": {
        *("read_checkpoint_metadata", "build_formatters", "ensure_pad_token", "ensure_tokenizer"),
        *("apply_tokenizer_specials", "resolve_tokenizers", "infer_model_name", "resolve_model_sources"),
        *("clone_reference_models", "load_reference_models_from_sources", "reference_kl_coef", "reference_kl_enabled"),
        *(
            "reference_kl_for_sequence",
            "resolve_reference_devices",
            "validate_reference_kl_config",
            "RewardProcessors",
        ),
        *("call_reward_function", "normalize_reward_lengths", "resolve_reward_range", "set_reward_range"),
        *("DistributedContext", "local_context", "unwrap_model"),
    },
    "utils.checkpoint": {
        *("read_checkpoint_metadata", "TrainingCheckpointMixin", "capture_trainer_state", "restore_trainer_state"),
        *("capture_rng_state", "restore_rng_state"),
    },
    "models": {"CausalLMWithValueHead", "ValueHead", "ActorCriticOutput"},
    "schedulers": {"DeviceScheduler"},
}
# CoMLRL 1.4.3's `TaggedCentralizedComparatorAdapter().build_prompt(item, ["write a title", "write a summary"])`
TAGGED_PROMPT = """You are a centralized coordinator producing the separate outputs of 2 agents.

Each output must satisfy its corresponding original prompt. Keep the outputs separate;
do not merge them or add commentary outside the required tags.

Agent 0 original prompt:
write a title

Agent 1 original prompt:
write a summary

Return exactly one section for each agent in this format:
<agent_0>
...
</agent_0>
<agent_1>
...
</agent_1>
"""


def small(config_cls, tmp_path, **overrides):
    values = dict(
        output_dir=str(tmp_path / "run"), num_generations=2, max_new_tokens=4, num_train_epochs=1, logging_steps=1,
        eval_interval=0, early_termination_threshold=None, report_to="none", seed=0, agent_learning_rate=1e-2,
    )  # fmt: skip
    if config_cls is not CentralizedMAGRPOConfig:
        values["num_turns"] = 1
    return config_cls(**{**values, **overrides})


def joint_score(completions1, completions2):
    """Differs between a prompt's answers (the tiny models' answers all have max_new_tokens tokens)."""
    return [float(sum(map(ord, a + b)) % 7) for a, b in zip(completions1, completions2, strict=True)]


def changed(before, model) -> bool:
    return any(not torch.equal(b, p) for b, p in zip(before, model.parameters(), strict=True))


# ---- the three REINFORCE variants


@pytest.mark.parametrize("config_cls, trainer_cls, mode, name, baseline", VARIANTS)
def test_variant_config_is_magrpos_with_comlrls_advantage_mode(config_cls, trainer_cls, mode, name, baseline):
    assert issubclass(config_cls, MAGRPOConfig) and issubclass(trainer_cls, MAGRPOTrainer)
    config, magrpo = config_cls(), MAGRPOConfig()
    assert (config.advantage_mode, config.advantage_baseline) == (mode, baseline)
    assert (magrpo.advantage_mode, magrpo.advantage_baseline) == ("mean", "mean")
    # every other field: MAGRPOConfig's default, the same constructor (CoMLRL's variants add no field)
    differing = {
        f.name
        for f in dataclasses.fields(config)
        if f.name != "output_dir" and getattr(config, f.name) != getattr(magrpo, f.name)
    }
    assert differing == {"advantage_mode", "advantage_baseline"}
    assert list(inspect.signature(config_cls).parameters) == list(inspect.signature(MAGRPOConfig).parameters)
    # as in CoMLRL, the mode may still be given, and CoMLRL's refusal of an unknown one holds
    assert config_cls(advantage_mode="mean").advantage_baseline == "mean"
    with pytest.raises(ValueError, match="advantage_mode='median'"):
        config_cls(advantage_mode="median")


@pytest.mark.parametrize("config_cls, trainer_cls, mode, name, baseline", VARIANTS)
def test_variant_trainer_is_magrpos_with_its_default_config(config_cls, trainer_cls, mode, name, baseline, tokenizer):
    assert (trainer_cls.default_config_cls, trainer_cls.algorithm_name, trainer_cls._name) == (config_cls, name, name)
    assert (MAGRPOTrainer.default_config_cls, MAGRPOTrainer.algorithm_name) == (MAGRPOConfig, "MAGRPO")
    assert inspect.signature(trainer_cls) == inspect.signature(MAGRPOTrainer)
    agents = [make_model(tokenizer, seed=0), make_model(tokenizer, seed=1)]
    built = trainer_cls(  # no args: the variant's config (CoMLRL's defaults: two turns, so a transition)
        agents=agents, tokenizer=tokenizer, reward_func=joint_score, external_transition=lambda **_: ["next", "next"]
    )
    assert (built.args.advantage_mode, built.args.advantage_baseline) == (mode, baseline)
    with pytest.raises(TypeError, match=f"{trainer_cls.__name__} \\(CoMLRL face\\) needs"):
        trainer_cls(agents=agents, tokenizer=tokenizer, reward_func=joint_score, args=object())


def test_variant_trainer_keeps_an_args_given(tmp_path, tokenizer):
    """CoMLRL's MAREINFORCETrainer(args=MAGRPOConfig()) trains with that config's mode ('mean'): only a missing
    `args` is the variant's."""
    agents = [make_model(tokenizer, seed=0), make_model(tokenizer, seed=1)]
    trainer = MAREINFORCETrainer(
        agents=agents, tokenizer=tokenizer, reward_func=joint_score, args=small(MAGRPOConfig, tmp_path)
    )
    assert (trainer.args.advantage_mode, trainer.args.advantage_baseline) == ("mean", "mean")


@pytest.mark.parametrize("config_cls, trainer_cls, mode, name, baseline", VARIANTS)
def test_variant_trains_a_step(config_cls, trainer_cls, mode, name, baseline, tmp_path, tokenizer):
    agents = [make_model(tokenizer, seed=0), make_model(tokenizer, seed=1)]
    before = [p.detach().clone() for p in agents[0].parameters()]
    trainer = trainer_cls(
        agents=agents,
        tokenizer=tokenizer,
        reward_func=joint_score,
        train_dataset=[{"prompt": "count to three"}, {"prompt": "name a colour"}],
        args=small(config_cls, tmp_path),
    )
    trainer.train()
    assert trainer.state.global_step == 1 and trainer.env_step == 2 * 2
    assert changed(before, trainer.agents[0])


# ---- CentralizedMAGRPO


def test_centralized_config_defaults_and_refusals():
    config = CentralizedMAGRPOConfig()
    assert (config.num_turns, config.collaboration_mode, config.num_agents) == (1, "centralized", 2)
    assert MAGRPOConfig().num_turns == 2
    assert isinstance(config, MAGRPOConfig) and not hasattr(MAGRPOConfig(), "collaboration_mode")
    with pytest.raises(ValueError, match="requires centralized collaboration.*got 'decentralized'"):
        CentralizedMAGRPOConfig(collaboration_mode="decentralized")
    with pytest.raises(ValueError, match="supports num_turns=1 only, got num_turns=2"):
        CentralizedMAGRPOConfig(num_turns=2)
    with pytest.raises(ValueError, match="one joint policy has one reference"):
        CentralizedMAGRPOConfig(reference_kl_enabled=True, reference_devices=["cpu", "cpu"])
    assert CentralizedMAGRPOConfig(reference_kl_enabled=True, reference_devices=["cpu"]).beta == 0.1


def test_centralized_trainer_signature_is_comlrls():
    parameters = inspect.signature(CentralizedMAGRPOTrainer).parameters
    assert list(parameters) == [
        "centralized_adapter", "num_agents", "agents", "tokenizer", "reward_func", "formatters", "args", "kwargs",
    ]  # fmt: skip
    assert all(p.kind is p.KEYWORD_ONLY for name, p in parameters.items() if name != "kwargs")
    assert parameters["num_agents"].default == 2
    assert (CentralizedMAGRPOTrainer.default_config_cls, CentralizedMAGRPOTrainer.algorithm_name) == (
        CentralizedMAGRPOConfig,
        "MAGRPO",
    )


@pytest.mark.parametrize(
    "change, error, message",
    [
        (lambda a, m, t: {"args": MAGRPOConfig()}, ValueError, "requires centralized configuration.*got MAGRPOConfig"),
        (lambda a, m, t: {"num_agents": 3}, ValueError, "must match args.num_agents.*num_agents=3, args.num_agents=2"),
        (lambda a, m, t: {"agents": [a, m]}, ValueError, "exactly one actor model.*got 2"),
        (lambda a, m, t: {"tokenizer": [t, t]}, ValueError, "one actor tokenizer, got 2"),
        (lambda a, m, t: {"reward_func": None}, ValueError, "reward_func must be callable"),
        (lambda a, m, t: {"centralized_adapter": object()}, TypeError, "centralized_adapter.build_prompt must be"),
    ],
)
def test_centralized_trainer_refuses_what_comlrl_refuses(change, error, message, tokenizer):
    model = make_model(tokenizer, seed=0)
    arguments = dict(
        centralized_adapter=TaggedCentralizedComparatorAdapter(), agents=[model], tokenizer=tokenizer,
        reward_func=joint_score, args=CentralizedMAGRPOConfig(),
    )  # fmt: skip
    with pytest.raises(error, match=message):
        CentralizedMAGRPOTrainer(**{**arguments, **change(model, make_model(tokenizer, seed=1), tokenizer)})


class HalvesAdapter(TaggedCentralizedComparatorAdapter):
    """Splits any joint completion into its two halves (a random tiny model writes no tags)."""

    def build_prompt(self, batch_item, agent_prompts):
        return "joint: " + " | ".join(agent_prompts)

    def parse_completion(self, completion, batch_item, num_agents):
        half = len(completion) // 2
        return [completion[:half], completion[half:]]


def test_centralized_trains_one_joint_policy_on_the_roles_reward(tmp_path, tokenizer):
    calls = []

    def task_reward(first, second, *, batch_items, prompts):  # CoMLRL's call for two agents
        calls.append((first, second, prompts, batch_items))
        return [float(sum(map(ord, first[0])) % 5 - sum(map(ord, second[0])) % 3)]

    task_reward.reward_range = (-2, 4)
    model = make_model(tokenizer, seed=0)
    before = [p.detach().clone() for p in model.parameters()]
    trainer = CentralizedMAGRPOTrainer(
        centralized_adapter=HalvesAdapter(),
        agents=[model],
        tokenizer=tokenizer,
        reward_func=task_reward,
        formatters=[lambda row: "left " + row["prompt"], lambda row: "right"],
        train_dataset=[{"prompt": "count"}, {"prompt": "name"}],
        args=small(CentralizedMAGRPOConfig, tmp_path, max_new_tokens=6),
    )
    assert (trainer.num_agents, trainer.args.num_agents, len(trainer.agents)) == (1, 2, 1)
    assert trainer.reward_func is trainer.centralized_collaboration
    assert trainer.reward_func.reward_range == (-2.0, 4.0)
    trainer.train()
    assert trainer.state.global_step == 1 and trainer.env_step == 2 * 2  # 2 prompts x 2 joint completions
    tree = trainer.last_rollout
    node = tree.nodes[0]
    assert node.prompts == ["joint: left count | right"]  # the one policy's prompt: the adapter's joint prompt
    joint = node.completions[0]
    row_calls = [c for c in calls if c[3] == [{"prompt": "count"}]]
    assert [(first[0], second[0]) for first, second, _, _ in row_calls[-2:]] == [
        (text[: len(text) // 2], text[len(text) // 2 :]) for text in joint
    ]  # the reward got each role's half of the joint completion
    assert all(prompts == ["left count"] for _, _, prompts, _ in row_calls)  # role 0's prompt, as in CoMLRL
    rewards = [tree.joint_actions[a].reward for a in node.joint_actions]
    assert rewards == [float(sum(map(ord, t[: len(t) // 2])) % 5 - sum(map(ord, t[len(t) // 2 :])) % 3) for t in joint]
    assert changed(before, trainer.agents[0])


def test_centralized_reward_splits_the_joint_completion_into_roles():
    """The joint reward over CoMLRL's tagged sections: each role's answer to the user's reward; an unparsable
    completion gives every role "" (CentralizedComparatorParseError); a wrong number of roles is refused."""

    def task_reward(left, right):
        return [float(left[0] == "good") + float(right[0] == "good")]

    collaboration = CentralizedCollaboration(TaggedCentralizedComparatorAdapter(), None, task_reward, 2)
    item = {"prompt": "task"}
    good, bad = (
        "<agent_0> good </agent_0> <agent_1>good</agent_1>",
        "<AGENT_0>bad</ agent_0> <agent_1> good </agent_1>",
    )
    assert collaboration([good, bad, "no tags"], batch_items=[item]) == [2.0, 1.0, 0.0]
    assert collaboration.build_prompt(item) == TAGGED_PROMPT.replace("write a title", "task").replace(
        "write a summary", "task"
    )  # no formatters: each role's prompt is the row's
    assert collaboration.split_eval([[[good], [bad]]], [item, item]) == [[["good"], ["bad"]], [["good"], ["good"]]]
    one_output = type("OneOutput", (), {"build_prompt": lambda *a: "p", "parse_completion": lambda *a: ["x"]})()
    with pytest.raises(ValueError, match="exactly 2 outputs, got 1"):
        CentralizedCollaboration(one_output, None, task_reward, 2).split("x", item)
    with pytest.raises(ValueError, match="Number of formatters must match num_agents.*3 formatters for 2 roles"):
        CentralizedCollaboration(one_output, [str, str, str], task_reward, 2)
    task_reward.reward_range = (1, 1)
    with pytest.raises(ValueError, match="reward_range minimum must be less than maximum"):
        CentralizedCollaboration(one_output, None, task_reward, 2)


def test_centralized_eval_logger_receives_each_roles_answers(tmp_path, tokenizer):
    seen = []

    def eval_logger(**kwargs):
        seen.append(kwargs)
        return [{"first_length": float(len(kwargs["agent_completions_turns"][0][0][0]))}]

    trainer = CentralizedMAGRPOTrainer(
        centralized_adapter=HalvesAdapter(),
        agents=[make_model(tokenizer, seed=0)],
        tokenizer=tokenizer,
        reward_func=lambda first, second: [float(len(first[0]))],
        eval_dataset=[{"prompt": "task"}],
        eval_logger=eval_logger,
        eval_aggregator=lambda metrics, num_turns: {"turn_1/first_length": metrics[0]["first_length"]},
        args=small(CentralizedMAGRPOConfig, tmp_path, max_new_tokens=6),
    )
    assert trainer.eval_logger is eval_logger  # the user's, as CoMLRL keeps it
    trainer.evaluate()
    node = trainer.last_rollout.nodes[0]
    joint = node.completions[0][trainer.last_rollout.joint_actions[node.joint_actions[0]].choice[0]]
    half = len(joint) // 2
    assert seen == [
        {
            "agent_completions_turns": [[[joint[:half]]], [[joint[half:]]]],
            "batch_items": [{"prompt": "task"}],
            "prompts": ["task"],
        }
    ]


def test_tagged_adapter_is_comlrls():
    adapter = TaggedCentralizedComparatorAdapter()
    assert adapter.build_prompt({}, ["write a title", "write a summary"]) == TAGGED_PROMPT
    assert adapter.parse_completion("<agent_1> b </agent_1>\n< Agent_0 >a\nline</agent_0>", {}, 2) == ["a\nline", "b"]
    assert adapter.parse_completion("<agent_0>only</agent_0>", {}, 3) == ["only", "", ""]
    with pytest.raises(CentralizedComparatorParseError, match="did not contain any indexed agent sections"):
        adapter.parse_completion("plain text", {}, 2)
    assert issubclass(CentralizedComparatorParseError, ValueError)
    with pytest.raises(dataclasses.FrozenInstanceError):
        adapter.anything = 1


# ---- imports


@pytest.mark.parametrize("path, names", MODULE_PATHS.items())
def test_comlrls_module_paths_give_the_face_classes(path, names):
    module = importlib.import_module(f"trl_multiagent.comlrl.{path}")
    for name in names:
        assert getattr(module, name) is getattr(face, name), (path, name)


@pytest.mark.parametrize("path", sorted(COMLRL_EXPORTS))
def test_each_comlrl_package_exports_what_comlrls_does_less_the_names_not_provided(path):
    module = importlib.import_module(f"trl_multiagent.comlrl.{path}")
    refused = set(names_of(path))
    assert set(module.__all__) | refused == COMLRL_EXPORTS[path] and not set(module.__all__) & refused
    assert set(MODULE_PATHS.get(path, [])) <= set(module.__all__)
    for name in module.__all__:
        getattr(module, name)


def test_reward_processors_are_comlrls():
    assert RewardProcessors.scale(factor=100.0)(0.25) == 25.0
    assert RewardProcessors.shift(value=-1.0)(0.25) == -0.75
    assert RewardProcessors.scale()(3.0) == RewardProcessors.shift()(3.0) == 3.0


@pytest.mark.parametrize("name", sorted(NOT_PROVIDED))
def test_each_name_not_provided_raises_an_import_error_naming_it(name):
    _, modules = NOT_PROVIDED[name]
    for path in ["", *(f".{m}" for m in modules)]:
        with pytest.raises(NotProvidedError) as raised:
            exec(f"from trl_multiagent.comlrl{path} import {name}", {})
        message = str(raised.value)
        assert message.startswith(f"{name} (CoMLRL 1.4.3's ") and "is not provided by trl_multiagent.comlrl" in message
        assert "docs/from_comlrl.md" in message and raised.value.name == name
        assert isinstance(raised.value, ImportError)


def test_the_table_names_no_provided_name_and_a_misspelling_is_pythons_error():
    provided = {name for names in MODULE_PATHS.values() for name in names}
    assert not provided & set(NOT_PROVIDED)
    assert set(face.__all__) == provided
    with pytest.raises(ImportError, match="cannot import name 'IACTrainr'") as raised:
        exec("from trl_multiagent.comlrl.trainers import IACTrainr", {})
    assert not isinstance(raised.value, NotProvidedError)
    assert not hasattr(face, "IACTrainr")
    # a name CoMLRL's module does not export is not refused there: `comlrl.trainers` has no CentralizedMAGRPOTrainer
    with pytest.raises(ImportError, match="cannot import name 'CentralizedMAGRPOTrainer'"):
        exec("from trl_multiagent.comlrl.trainers import CentralizedMAGRPOTrainer", {})


# ---- against CoMLRL itself, where the contract harness's Python has it

CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "trl_multiagent" / "comlrl_contract"
COMLRL_PYTHON = Path(os.environ.get("COMLRL_CONTRACT_PYTHON", CACHE / "venv" / "bin" / "python"))
READ_COMLRL = """
import dataclasses, inspect, json
from comlrl.trainers import reinforce
from comlrl.trainers.preference import TaggedCentralizedComparatorAdapter
out = {}
for name in ("MAREINFORCE", "MARLOO", "MAReMax", "CentralizedMAGRPO"):
    config, trainer = getattr(reinforce, name + "Config"), getattr(reinforce, name + "Trainer")
    out[name] = {
        "defaults": {f.name: f.default for f in dataclasses.fields(config) if f.default is not dataclasses.MISSING},
        "algorithm_name": trainer.algorithm_name,
        "trainer_parameters": list(inspect.signature(trainer.__init__).parameters)[1:],
    }
out["prompt"] = TaggedCentralizedComparatorAdapter().build_prompt({}, ["a", "b", "c"])
import importlib, inspect as i
exports = {}
for path in ("trainers", "trainers.reinforce", "trainers.preference", "trainers.actor_critic", "utils", "models",
             "schedulers", "utils.checkpoint"):
    module = importlib.import_module("comlrl." + path)
    names = getattr(module, "__all__", None) or [
        n for n, v in vars(module).items()
        if not n.startswith("_") and (i.isclass(v) or i.isfunction(v)) and getattr(v, "__module__", "").startswith(module.__name__)
    ]
    exports[path] = sorted(names)
out["exports"] = exports
print(json.dumps(out))
"""


@pytest.mark.slow  # a second interpreter imports CoMLRL (torch, transformers)
def test_matches_comlrl_installed():
    if not COMLRL_PYTHON.exists():
        pytest.skip(f"no Python with CoMLRL 1.4.3 at {COMLRL_PYTHON} (run_comlrl_tests.py makes it)")
    done = subprocess.run([str(COMLRL_PYTHON), "-c", READ_COMLRL], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    comlrl = json.loads(done.stdout.splitlines()[-1])
    for name in ("MAREINFORCE", "MARLOO", "MAReMax", "CentralizedMAGRPO"):
        config, trainer = getattr(face, name + "Config")(), getattr(face, name + "Trainer")
        for field, value in comlrl[name]["defaults"].items():
            if field in ("train_batch_size", "eval_batch_size"):  # the face's InitVars: CoMLRL's values are kept apart
                assert config.comlrl_batch_sizes[field] == (value or config.rollout_buffer_size), field
                continue
            assert getattr(config, field) == value, (name, field)
        assert trainer.algorithm_name == comlrl[name]["algorithm_name"]
        ours = list(inspect.signature(trainer.__init__).parameters)[1:]
        theirs = comlrl[name]["trainer_parameters"]
        assert ours[: len(theirs)] == theirs or ours == [*theirs, "dataset_type", "trl_arguments"], name
    assert TaggedCentralizedComparatorAdapter().build_prompt({}, ["a", "b", "c"]) == comlrl["prompt"]
    assert {path: set(names) for path, names in comlrl["exports"].items()} == COMLRL_EXPORTS
