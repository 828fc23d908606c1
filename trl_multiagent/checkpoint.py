"""Where each agent lives in a saved run, how its weights are read back on resume, and which checkpoints are complete.

The HF Trainer writes `checkpoint-N/` in place, file by file, and `get_last_checkpoint` takes the highest N whether or
not its writing finished. A checkpoint here is complete once `COMPLETE_MARKER` is in it: written last, by the main
process, after every process has finished writing its files. Resuming with `resume_from_checkpoint=True` takes the
newest complete checkpoint.
"""

from __future__ import annotations

import contextlib
import copy
import os
import re

import torch
from safetensors.torch import load_file
from transformers import TrainerState
from transformers.trainer import TRAINER_STATE_NAME, TRAINING_ARGS_NAME, load_sharded_checkpoint
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, rotate_checkpoints
from transformers.utils import SAFE_WEIGHTS_INDEX_NAME, SAFE_WEIGHTS_NAME, WEIGHTS_INDEX_NAME, WEIGHTS_NAME, logging

from .model_card import TEAM_TAGS, BaseModel, CardAgent, team_card, write_agent_card
from .prepared_models import prepared_description
from .update.batching import EpochSeededSampler


logger = logging.get_logger(__name__)

COMPLETE_MARKER = "checkpoint_complete"


def agent_dir(output_dir: str, index: int) -> str:
    return os.path.join(output_dir, f"agent_{index}")


def agent_dirs(output_dir: str, num_agents: int, agent_folders: bool) -> list[str]:
    """Where each agent of a team is saved in `output_dir`: `agent_{i}/`; a team of one, without `agent_folders`, in
    `output_dir` itself, as GRPOTrainer saves its model (`TeamCheckpointing.one_agent_in_agent_folder`)."""
    if num_agents == 1 and not agent_folders:
        return [output_dir]
    return [agent_dir(output_dir, i) for i in range(num_agents)]


def saved_agent_dirs(folder: str, num_agents: int) -> list[str]:
    """Where `num_agents` agents were saved in `folder`, in either layout (`agent_dirs`): `agent_{i}/` where `agent_0/`
    exists, else, for one agent, `folder` itself."""
    return agent_dirs(folder, num_agents, agent_folders=os.path.isdir(agent_dir(folder, 0)))


def agent_state_dict(team_state_dict: dict | None, index: int) -> dict | None:
    """The part of the team's state dict (keys ``agents.{i}.*``) that belongs to one agent, with that prefix removed."""
    if team_state_dict is None:
        return None
    prefix = f"agents.{index}."
    return {k[len(prefix) :]: v for k, v in team_state_dict.items() if k.startswith(prefix)}


def load_agent_weights(agent: torch.nn.Module, folder: str) -> None:
    """Load weights saved by `save_pretrained` into an existing agent, failing loudly on anything but tied weights."""
    if not os.path.isdir(folder):
        raise FileNotFoundError(f"Checkpoint has no folder {folder!r} for this agent.")
    if any(os.path.isfile(os.path.join(folder, f)) for f in (SAFE_WEIGHTS_INDEX_NAME, WEIGHTS_INDEX_NAME)):
        load_sharded_checkpoint(agent, folder, strict=False, prefer_safe=True)
        return
    if os.path.isfile(os.path.join(folder, SAFE_WEIGHTS_NAME)):
        state = load_file(os.path.join(folder, SAFE_WEIGHTS_NAME))
    elif os.path.isfile(os.path.join(folder, WEIGHTS_NAME)):
        state = torch.load(os.path.join(folder, WEIGHTS_NAME), map_location="cpu", weights_only=True)
    else:
        raise FileNotFoundError(f"No model weights in {folder!r}.")
    result = agent.load_state_dict(state, strict=False)
    tied = set(getattr(agent, "all_tied_weights_keys", {}) or {}) | set(
        getattr(agent, "_tied_weights_keys", None) or []
    )
    missing = [k for k in result.missing_keys if k not in tied]
    if missing or result.unexpected_keys:
        raise RuntimeError(
            f"Checkpoint {folder!r} does not match the agent: missing {missing}, unexpected {result.unexpected_keys}."
        )


def load_adapter_weights(peft_model, folder: str, adapter_name: str) -> None:
    """Load a PEFT adapter saved in `folder` into `adapter_name` of `peft_model`, leaving it trainable."""
    from peft import set_peft_model_state_dict

    path = os.path.join(folder, "adapter_model.safetensors")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"No adapter weights in {folder!r}.")
    result = set_peft_model_state_dict(peft_model, load_file(path), adapter_name=adapter_name)
    unexpected = getattr(result, "unexpected_keys", [])
    if unexpected:
        raise RuntimeError(
            f"Adapter {folder!r} does not match agent adapter {adapter_name!r}: unexpected {unexpected}."
        )


def mark_complete(folder: str) -> None:
    """Write the completion marker of a checkpoint whose files are all written (atomically: a rename)."""
    partial = os.path.join(folder, f".{COMPLETE_MARKER}.partial")
    with open(partial, "w") as f:
        f.write("every process finished writing this checkpoint\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(partial, os.path.join(folder, COMPLETE_MARKER))


def is_complete(folder: str) -> bool:
    return os.path.isfile(os.path.join(folder, COMPLETE_MARKER))


def checkpoints_by_step(output_dir: str) -> list[str]:
    """The `checkpoint-N` folders of a run, newest first."""
    pattern = re.compile(rf"^{PREFIX_CHECKPOINT_DIR}-(\d+)$")
    found = [(int(m.group(1)), name) for name in os.listdir(output_dir) if (m := pattern.match(name))]
    return [
        os.path.join(output_dir, name)
        for _, name in sorted(found, reverse=True)
        if os.path.isdir(os.path.join(output_dir, name))
    ]


def resolve_resume(output_dir: str, resume_from_checkpoint: bool | str) -> str | None:
    """The folder to resume from: the newest complete checkpoint for `True`, or the given one if it is complete.

    Incomplete checkpoints (a run killed while writing them) are skipped and reported with their paths. On the command
    line `--resume_from_checkpoint true` arrives as the string "true" (the field is a str in TrainingArguments): unless
    a folder has that name, "true" means `True` and "false" means no resume.
    """
    if isinstance(resume_from_checkpoint, str) and not os.path.exists(resume_from_checkpoint):
        if resume_from_checkpoint.lower() == "false":
            return None
        if resume_from_checkpoint.lower() == "true":
            resume_from_checkpoint = True
        else:
            raise FileNotFoundError(
                f"MAGRPOTrainer: resume_from_checkpoint={resume_from_checkpoint!r}: no such folder. Pass a checkpoint "
                f"folder ({os.path.join(output_dir, PREFIX_CHECKPOINT_DIR)}-N), or True for the newest complete "
                f"checkpoint in output_dir ({output_dir!r})."
            )
    if resume_from_checkpoint is not True:
        if not is_complete(resume_from_checkpoint):
            raise ValueError(
                f"MAGRPOTrainer: checkpoint {resume_from_checkpoint!r} is incomplete: it has no {COMPLETE_MARKER!r} "
                "marker, which is written once every process has finished writing it (the run was probably stopped "
                "while saving). Resume from an earlier checkpoint, or pass resume_from_checkpoint=True to take the "
                "newest complete one."
            )
        return resume_from_checkpoint
    folders = checkpoints_by_step(output_dir) if os.path.isdir(output_dir) else []
    for folder in folders:
        if is_complete(folder):
            return folder
        logger.warning(f"MAGRPOTrainer: skipping the incomplete checkpoint {folder} (no {COMPLETE_MARKER!r} marker).")
    raise ValueError(
        f"MAGRPOTrainer: resume_from_checkpoint=True, but {output_dir!r} holds no complete checkpoint"
        + (f" (incomplete: {folders})." if folders else ".")
    )


def checkpoint_step(folder: str) -> int | str:
    state = os.path.join(folder, TRAINER_STATE_NAME)
    return TrainerState.load_from_json(state).global_step if os.path.isfile(state) else os.path.basename(folder)


def agreed_resume(accelerator, output_dir: str, resume_from_checkpoint: bool | str) -> str | None:
    """`resolve_resume` on every process, each in its own `output_dir` (nodes may not share a filesystem), checked to
    agree on the step. A node that found another checkpoint, or none, would resume from other weights than the rest or
    wait in the first collective until `ddp_timeout`; instead every process stops here, naming what each found."""
    try:
        folder, error = resolve_resume(output_dir, resume_from_checkpoint), None
    except (ValueError, FileNotFoundError) as e:
        folder, error = None, e
    if accelerator.num_processes == 1:
        if error is not None:
            raise error
        return folder
    from accelerate.utils import gather_object

    found = gather_object(
        [(None if folder is None else checkpoint_step(folder), None if error is None else str(error))]
    )
    if len(set(found)) == 1:
        if error is not None:
            raise error
        return folder
    seen = {rank: f"step {s}" if e is None else e for rank, (s, e) in enumerate(found)}
    raise ValueError(
        f"MAGRPOTrainer: resume_from_checkpoint={resume_from_checkpoint!r}: the processes do not find the same "
        f"checkpoint in their output_dir: {seen}. Each process reads output_dir on its own node; nodes without a "
        "shared filesystem need save_on_each_node=True, so that every node writes the checkpoints it resumes from."
    )


def resume_folder(accelerator, args, resume_from_checkpoint: str | bool | None) -> str | None:
    """What `train(resume_from_checkpoint=...)` resumes from: for True, the newest *complete* checkpoint in
    `args.output_dir`; a folder given, if complete; found alike on every process (`agreed_resume`), and said."""
    if not resume_from_checkpoint:
        return resume_from_checkpoint
    folder = agreed_resume(accelerator, args.output_dir, resume_from_checkpoint)
    if folder and args.should_log:
        logger.warning(f"MAGRPOTrainer: resuming from {folder} (step {checkpoint_step(folder)}).")
    return folder


@contextlib.contextmanager
def written_by_caller(model):
    """Let the caller decide that this process writes `model`, as the Trainer's `should_save` does.

    transformers 5 writes a model only on global rank 0 once torch.distributed is up
    (`PreTrainedModel.should_save_on_this_rank`), which is right for a tensor-parallel model it gathers, but with
    `save_on_each_node=True` the first process of every node writes its node's checkpoint: without this, the other
    nodes' folders got the tokenizers and no weights, and could not resume. An agent here is never tensor-parallel
    (under ZeRO-3 the caller passes the gathered `state_dict`); one with a `distributed_config` is left as it is.
    """
    if not hasattr(model, "should_save_on_this_rank") or getattr(model.config, "distributed_config", None):
        yield
        return
    # No public way says "this process writes": `save_pretrained(is_main_process=True)` is and-ed with the global rank
    # (a private method, kept by a contract test: tests/test_private_api_contract.py). The model's own attribute, if it
    # set one, is put back as it was.
    own = vars(model).get("should_save_on_this_rank")
    model.should_save_on_this_rank = lambda is_main_process: is_main_process
    try:
        yield
    finally:
        del model.should_save_on_this_rank
        if own is not None:
            model.should_save_on_this_rank = own


def save_team(
    team, tokenizers: list, output_dir: str, state_dict: dict | None = None, agent_folders: bool = True
) -> None:
    """Write each agent into its folder (`agent_dirs`: `agent_{i}/`, or for a team of one without `agent_folders`,
    `output_dir` itself): full weights, or its PEFT adapter alone (not the frozen reference copy of
    `AgentTeam.copy_pretrained_adapters`); with its tokenizer, and an agent folder's card (`write_card`).

    `save_pretrained`'s files (`adapter_config.json`, the weights, the configs) are left as transformers and PEFT
    wrote them; the folder's own card (`README.md` at the top, where PEFT writes one for a shared base) is the
    trainer's (`MAGRPOTrainer.create_model_card`). Full weights load with `AutoModelForCausalLM.from_pretrained(folder)`,
    adapters with `AutoPeftModelForCausalLM.from_pretrained(folder)`, the team with `trl_multiagent.load_team`.
    `state_dict` is the team's (gathered under ZeRO-3), or None.
    """
    os.makedirs(output_dir, exist_ok=True)
    folders = agent_dirs(output_dir, team.num_agents, agent_folders)
    for i, folder in enumerate(folders):
        if team.is_shared_base:
            # PEFT writes a named adapter into `<dir>/<name>/`, and the adapters are named `agent_{i}`.
            team.agent(i).save_pretrained(
                output_dir, selected_adapters=[team.adapter_names[i]], state_dict=agent_state_dict(state_dict, 0)
            )
        else:
            adapter = {"selected_adapters": [team.adapter_name(i)]} if is_adapter(team, i) else {}
            with written_by_caller(team.agent(i)):
                team.agent(i).save_pretrained(folder, state_dict=agent_state_dict(state_dict, i), **adapter)
        tokenizers[i].save_pretrained(folder)
        if folder != output_dir:  # a team of one in the folder itself has the folder's card only
            write_card(team, i, folder, adapter=is_adapter(team, i))


def write_card(team, index: int, folder: str, adapter: bool) -> None:
    """Agent `index`'s `README.md` (`model_card.agent_card`), naming its base (`base_model`)."""
    write_agent_card(folder, index, team.num_agents, base_model(team.agent(index)), adapter)


def is_adapter(team, index: int) -> bool:
    return team.is_shared_base or hasattr(team.agent(index), "peft_config")


def base_model_path(module) -> str | None:
    """The name or folder an agent (or an adapter's base) was loaded from, as its config records it."""
    config = getattr(module, "config", None)
    return getattr(config, "_name_or_path", None) or None


def base_model(module) -> BaseModel:
    """What an agent was trained from, for its card: a Hub id, a prepared copy (`prepared_models`: described, as it is
    not the Hub model it copies), or a local folder (None: a path on this machine means nothing elsewhere)."""
    path = base_model_path(module)
    described = prepared_description(path)
    if described is not None:
        return BaseModel(None, described)
    if path is None or os.path.isdir(path):
        return BaseModel(None, None)
    return BaseModel(path, None)


def save_merged_team(team, tokenizers: list, output_dir: str, agent_folders: bool = True) -> None:
    """Write each agent (into `agent_dirs`, as `save_team`) as full weights, its adapter merged into (a copy of) its
    base model."""
    for i, folder in enumerate(agent_dirs(output_dir, team.num_agents, agent_folders)):
        module = team.agent(i)
        if hasattr(module, "merge_and_unload"):  # the agent's own adapter, not a reference copy beside it
            module = copy.deepcopy(module).merge_and_unload(adapter_names=[team.adapter_name(i)])
        module.save_pretrained(folder)
        tokenizers[i].save_pretrained(folder)
        if folder != output_dir:
            write_card(team, i, folder, adapter=False)


def load_team_weights(team, folder: str) -> None:
    """Read back what `save_team` wrote into `folder` (a checkpoint), agent by agent, in either layout."""
    for i, source in enumerate(saved_agent_dirs(folder, team.num_agents)):
        if is_adapter(team, i):
            load_adapter_weights(team.agent(i), source, team.adapter_name(i))
        else:
            load_agent_weights(team.agent(i), source)


def framework_versions(adapter: bool) -> dict[str, str]:
    """The versions a team card lists (TRL's card lists its own and its dependencies'; here also PEFT's for adapters
    and this package's)."""
    from importlib.metadata import PackageNotFoundError, version

    names = ["trl_multiagent", "trl", "transformers", "torch"] + (["peft"] if adapter else [])
    found = {}
    for name in names:
        try:
            found[name] = version(name.replace("_", "-"))
        except PackageNotFoundError:
            continue
    return found


@contextlib.contextmanager
def args_for_one_call(trainer, **changes):
    """Within the block, `trainer.args` is a shallow copy of the trainer's config with `changes`, for one call of the
    Trainer that reads them there; the config itself is never changed, and is `trainer.args` again after."""
    configured = trainer.args
    call_args = copy.copy(configured)
    for name, value in changes.items():
        setattr(call_args, name, value)
    trainer.args = call_args
    try:
        yield call_args
    finally:
        trainer.args = configured


class TeamCheckpointing:
    """The Trainer's saving and resuming hooks, for a team (mixed into `MAGRPOTrainer`, before `GRPOTrainer`).

    Overrides `_save`, `_save_checkpoint`, `_load_from_checkpoint`, `_get_train_sampler` (each epoch's order seeded by
    the epoch) and `create_model_card` (the team's card), and adds `save_merged_model`. The trainer's `train` resumes
    from `resume_folder`.
    """

    # Where a team of one is saved (`save_model` and every checkpoint): False, as GRPOTrainer saves its model, into the
    # folder itself; True, into `agent_0/` (CoMLRL's layout, which its face sets). A team of several always writes
    # `agent_{i}/`. Resuming and the evaluation command read both layouts.
    one_agent_in_agent_folder: bool = False

    def _save(self, output_dir: str | None = None, state_dict: dict | None = None) -> None:
        """Write each agent (`save_team`: `agent_{i}/`, or a team of one into `output_dir` itself, as
        `one_agent_in_agent_folder` says): full weights or a PEFT adapter, its tokenizer."""
        if self.args.should_save:
            output_dir = output_dir if output_dir is not None else self.args.output_dir
            if state_dict is not None and self.team.trainer_model is not self.team:  # a team of one: the agent's
                state_dict = {f"agents.0.{key}": value for key, value in state_dict.items()}
            save_team(self.team, self.tokenizers, output_dir, state_dict, self.one_agent_in_agent_folder)
            torch.save(self.args, os.path.join(output_dir, TRAINING_ARGS_NAME))
            self.create_model_card(folder=output_dir)

    def create_model_card(
        self,
        model_name: str | None = None,
        dataset_name: str | None = None,
        tags: str | list[str] | None = None,
        *,
        folder: str | None = None,
        merged: bool = False,
    ) -> None:
        """TRL's, for a team: writes the team's card (`model_card.team_card`) as `folder/README.md` (`output_dir` by
        default, where TRL writes its card): the agents and their folders, their bases, whether adapters, the
        rewards and turns, and how to load each agent and the team (`trl_multiagent.load_team`). `_save` writes it
        into every folder it saves the team in, over the card PEFT writes there for a shared base. `merged`: the
        agents as `save_merged_model` writes them (full weights). Written by each process that saves (`should_save`),
        which with `save_on_each_node` is one per node."""
        if not self.args.should_save:
            return
        folder = folder if folder is not None else self.args.output_dir
        if model_name is None:
            hub_id, run = self.args.hub_model_id, os.path.basename(os.path.normpath(self.args.output_dir))
            model_name = hub_id.split("/")[-1] if hub_id else run
        tags = [tags] if isinstance(tags, str) else list(tags or [])
        tags = list(dict.fromkeys(["generated_from_trainer", *TEAM_TAGS, *tags]))
        team = self.team
        agents = [
            CardAgent(
                os.path.relpath(path, folder),
                base_model(team.agent(i)),
                adapter=is_adapter(team, i) and not merged,
            )
            for i, path in enumerate(agent_dirs(folder, team.num_agents, self.one_agent_in_agent_folder))
        ]
        card = team_card(
            model_name,
            agents,
            shared_base=team.is_shared_base and not merged,
            reward_names=self.task.joint_reward.names,
            num_turns=self.args.num_turns,
            tags=tags,
            dataset_name=dataset_name,
            versions=framework_versions(any(a.adapter for a in agents)),
        )
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, "README.md"), "w") as file:
            file.write(card)

    def save_merged_model(self, output_dir: str) -> None:
        """Write each agent, where `save_model` would, as full weights: its adapter merged into (a copy of) its base.

        For adapter agents (`peft_config`); full-model agents are saved as they are. Not under ZeRO-3.
        """
        save_merged_team(self.team, self.tokenizers, output_dir, self.one_agent_in_agent_folder)
        self.create_model_card(folder=output_dir, merged=True)

    def _save_checkpoint(self, model, trial) -> None:
        """`write_complete_checkpoint`, then the rotation with the configured `save_total_limit`: rotating after the
        marker means the limit never deletes a complete checkpoint while the newest one is still being written."""
        self.write_complete_checkpoint(model, trial)
        if self.args.should_save:
            rotate_checkpoints(
                output_dir=self._get_output_dir(trial=trial),
                save_total_limit=self.args.save_total_limit,
                best_model_checkpoint=self.state.best_model_checkpoint,
                use_mtime=True,
            )

    def write_complete_checkpoint(self, model, trial, **arg_changes) -> str:
        """The Trainer's `_save_checkpoint` (and what the classes after this one in the MRO add to it), then, once every
        process has written its files, the completion marker. Returns the checkpoint's folder.

        transformers' `_save_checkpoint` rotates inside itself, with `args.save_total_limit`, as soon as this process
        has written its files, by a function rather than a method (`trainer_utils.rotate_checkpoints`; kept by a
        contract test). It runs on a copy of the args without the limit (`args_for_one_call`), with `arg_changes`
        (the CoMLRL face's staging folder): the user's config is never changed, and the checkpoint's
        `training_args.bin`, which `_save` wrote from the copy, is written again from it before the marker.
        """
        with args_for_one_call(self, save_total_limit=None, **arg_changes):
            super()._save_checkpoint(model, trial)
            folder = os.path.join(
                self._get_output_dir(trial=trial), f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"
            )
        self.accelerator.wait_for_everyone()
        if self.args.should_save:
            torch.save(self.args, os.path.join(folder, TRAINING_ARGS_NAME))
            mark_complete(folder)
        return folder

    def _get_train_sampler(self, dataset=None):
        """GRPOTrainer's sampler, with each epoch's prompt order seeded by the epoch: a resumed run sees the same order."""
        return EpochSeededSampler(super()._get_train_sampler(dataset))

    def _load_from_checkpoint(self, resume_from_checkpoint: str, model=None) -> None:
        """Every agent's weights (or adapter) from the checkpoint, in either layout (`load_team_weights`)."""
        load_team_weights(self.team, resume_from_checkpoint)
