"""OpenEnv both ways, against real openenv-core servers on 127.0.0.1 (started and stopped here) and in-process.

* TRL's OpenEnv pattern (recipes/openenv_team.py's `HanabiTable`, an echo class as in TRL's echo example): a client
  opened in ``__init__``, ``reset(**row)`` returning a string, public methods as tools, the reward
  ``def reward_func(environments, **kwargs)``, for a team of two on OpenSpiel's tiny Hanabi and on echo servers.
* No HTTP: `trl_multiagent.environments.openenv.OpenEnvWorld` over the server's environment class, forked by deepcopy.
* A server killed mid-rollout: the error names the environment, the row, the turn and the call, and the checkpoints
  saved before it are whole; under one of two processes, both stop with its message.

The agents' tokens come from real generation, then are replaced by a script (which moves each agent makes), as in
tests/distributed/run_tool_team.py: the tiny random model would rarely write a call. Everything past the tokens (the
tool loop, the clients, the servers, the game, the rewards) is real. Marked `openenv`: they need
``pip install -e ".[openenv]"`` (openenv-core, open_spiel), and run with ``python -m pytest -m openenv``.
"""

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest
from datasets import Dataset

from trl_multiagent import MAGRPOConfig, MAGRPOTrainer
from trl_multiagent.demo.testing import make_model, make_tool_tokenizer
from trl_multiagent.environments.faults import EnvironmentLost
from trl_multiagent.environments.worlds import Worlds
from trl_multiagent.generation import TransformersGenerator


pytestmark = pytest.mark.openenv

# OpenSpiel's tiny Hanabi payoffs (tiny_hanabi.cc, the default game), [card_0][card_1][action_0][action_1]: the
# numbers a correct game on the server must give back.
PAYOFF = [
    [[[10, 0, 0], [4, 8, 4], [10, 0, 0]], [[0, 0, 10], [4, 8, 4], [0, 0, 10]]],
    [[[0, 0, 10], [4, 8, 4], [0, 0, 0]], [[10, 0, 0], [4, 8, 4], [10, 0, 0]]],
]
TOOL_RESULT_END = "</tool_response><|im_end|>\n<|im_start|>assistant\n"


@pytest.fixture(scope="module")
def games():
    import openenv_games  # recipes/: fails loudly here without the `[openenv]` extra

    return openenv_games


@pytest.fixture(scope="module")
def hanabi_server(games):
    with games.serve("tiny_hanabi") as server:
        yield server


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny-tool-model")
    tokenizer = make_tool_tokenizer()
    make_model(tokenizer, seed=0, max_positions=2048).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


def call(name, **arguments):
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call><|im_end|>"


@pytest.fixture
def script(monkeypatch):
    """Replace each completion's tokens by `moves(agent, k, prompt_text)` (None: "Done."), after real generation;
    a completion that follows a tool result answers "Done.". Returns the prompts each agent saw."""
    tokenizer = make_tool_tokenizer()
    real_sample = TransformersGenerator._sample
    seen = {0: [], 1: []}
    state = {}

    def install(moves):
        state["moves"] = moves

    def _sample(self, agent, prompt_ids, num_generations, greedy):
        real_sample(self, agent, prompt_ids, num_generations, greedy)
        texts = []
        for ids in prompt_ids:
            text = tokenizer.decode(ids)
            seen[agent].append(text)
            for k in range(num_generations):
                move = None if text.endswith(TOOL_RESULT_END) else state["moves"](agent, k, text)
                texts.append(move or "Done.<|im_end|>")
        return [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts], None

    monkeypatch.setattr(TransformersGenerator, "_sample", _sample)
    install.seen = seen
    return install


def hanabi_trainer(model_dir, output_dir, factory, rows, **config):
    import openenv_team

    settings = dict(
        output_dir=str(output_dir), num_generations=4, per_device_train_batch_size=4, max_steps=len(rows),
        max_completion_length=96, max_tool_calling_iterations=1, logging_steps=1, report_to="none",
        save_strategy="no", shuffle_dataset=False, seed=0,
    )  # fmt: skip
    settings.update(config)
    return MAGRPOTrainer(
        model=model_dir,
        num_agents=2,
        processing_class=make_tool_tokenizer(),
        reward_funcs=openenv_team.reward_func,
        environment_factory=factory,
        formatters=[openenv_team.first_player_prompt, openenv_team.second_player_prompt],
        train_dataset=Dataset.from_dict({"card_0": [c for c, _ in rows], "card_1": [c for _, c in rows]}),
        args=MAGRPOConfig(**settings),
    )


# Joint action k: agent 0 plays FIRST[k], agent 1 plays SECOND[k] (each on the world of joint action k).
FIRST, SECOND = [0, 1, 2, 0], [0, 1, 2, 2]


def hanabi_moves(agent, k, text):
    return call("play", action=(FIRST if agent == 0 else SECOND)[k])


def expected_mean(card_0, card_1):
    return sum(PAYOFF[card_0][card_1][a][b] for a, b in zip(FIRST, SECOND, strict=True)) / len(FIRST)


def test_trls_openenv_pattern_plays_tiny_hanabi_for_a_team_on_a_real_server(
    games, hanabi_server, model_dir, tmp_path, script, monkeypatch
):
    """Each joint action's two moves reach one server session (its own game), in order: the reward of each step is
    the payoff table's, for that row's cards and the scripted moves. Agents acting on each other's worlds, or on one
    shared session, would change the numbers (or be refused: a game takes two moves)."""
    import openenv_team

    monkeypatch.setattr(openenv_team.HanabiTable, "url", hanabi_server.url)
    monkeypatch.setattr(openenv_team.HanabiTable, "agent_tools", None)  # TRL's pattern: every method for both
    script(hanabi_moves)
    closed = []
    monkeypatch.setattr(openenv_team.HanabiTable, "close", lambda self: closed.append(self.client.close()))
    rows = [(0, 0), (0, 1), (1, 0)]
    trainer = hanabi_trainer(model_dir, tmp_path, openenv_team.HanabiTable, rows)
    trainer.train()
    logs = [log for log in trainer.state.log_history if "turn_1/rewards/reward_func/mean" in log]
    assert [log["turn_1/rewards/reward_func/mean"] for log in logs] == [expected_mean(*r) for r in rows]
    assert [expected_mean(*r) for r in rows] == [4.5, 7.0, 4.5]  # the rows really differ
    assert all(log["turn_1/agent_0/tools/call_frequency"] == 1.0 for log in logs)
    assert all(log["turn_1/agent_1/tools/failure_frequency"] == 0.0 for log in logs)
    # reset's string reached both agents' first prompts; the pool made one instance (one session) per joint action
    prompts = [text for agent in (0, 1) for text in script.seen[agent] if "tiny Hanabi" in text]
    assert len(prompts) == 6 and all("The game has begun." in text for text in prompts)
    assert len(closed) == 4  # the probe is the first of the four pooled instances, each closed once


def test_trls_echo_pattern_forks_by_replay_on_the_server_for_a_second_turn(games, model_dir, tmp_path, script):
    """TRL's echo example for a team over two turns. A client cannot be deep-copied, so each turn-2 branch gets a
    pooled instance replayed on the server: a reset and turn 1's echo again, checked against the recorded result.
    The reward is the last echo's length x 0.1 (the server's), so turn 2's value shows the branch's own message."""

    class EchoToolEnv:  # TRL's docs/source/openenv.md "Quick start" class, on our server
        url = None

        def __init__(self):
            from openenv.core import GenericEnvClient

            self.env = GenericEnvClient(base_url=self.url, message_timeout_s=30).sync()
            self.reward = 0.0

        def reset(self, **kwargs) -> str | None:
            self.reward = 0.0
            self.env.reset()
            return None

        def echo(self, message: str) -> str:
            """Echo the message back from the environment.

            Args:
                message: The message to echo
            """
            observation = self.env.step({"message": message})
            self.reward = observation.reward
            return observation.observation["echoed_message"]

    def reward_func(environments, **kwargs):
        return [env.reward for env in environments]

    def moves(agent, k, text):  # turn 1: agent 0 echoes "ab"; turn 2: agent 1 echoes k+1 letters
        second_turn = "Turn 2." in text
        if agent == 0 and not second_turn:
            return call("echo", message="ab")
        if agent == 1 and second_turn:
            return call("echo", message="x" * (k + 1))
        return None

    def turn_two(prompt, agent_completions, num_agents, **history):
        return [[{"role": "user", "content": "Turn 2."}]] * num_agents

    script(moves)
    with games.serve("echo") as server:
        EchoToolEnv.url = server.url
        trainer = MAGRPOTrainer(
            model=model_dir, num_agents=2, processing_class=make_tool_tokenizer(), reward_funcs=reward_func,
            environment_factory=EchoToolEnv, external_transition=turn_two,
            train_dataset=Dataset.from_dict({"prompt": [[{"role": "user", "content": "Echo."}]]}),
            args=MAGRPOConfig(
                output_dir=str(tmp_path), num_generations=2, per_device_train_batch_size=2, num_turns=2,
                max_steps=1, max_completion_length=96, max_tool_calling_iterations=1, logging_steps=1,
                report_to="none", save_strategy="no", seed=0, early_termination_threshold=None,
            ),
        )  # fmt: skip
        trainer.train()
    log = trainer.state.log_history[0]
    assert trainer.task.worlds.fork_methods == {EchoToolEnv: "replay"}
    assert log["turn_1/rewards/reward_func/mean"] == pytest.approx(0.2)  # "ab"
    # turn 2: 2 branches x 2 joint actions echo "x" and "xx": (0.1 + 0.2) / 2, each on its own replayed session
    assert log["turn_2/rewards/reward_func/mean"] == pytest.approx(0.15)


class DealtHanabi:
    """TRL's OpenEnv pattern on tiny Hanabi whose cards the server deals: with no seed, a random start drawn on the
    server (as TRL's Catch and Sudoku examples); with the row's `seed`, a repeatable one. Hidden information: reset
    tells each agent only its own card (one observation per agent)."""

    url = None

    def __init__(self):
        from openenv.core import GenericEnvClient

        self.client = GenericEnvClient(base_url=self.url, connect_timeout_s=30, message_timeout_s=30).sync()
        self.client.connect()

    def reset(self, seed=None, **row) -> tuple:
        result = self.client.reset(**({} if seed is None else {"seed": seed}))
        self.cards, self.reward, self.done = list(result.observation["cards"]), 0.0, False
        return tuple(f" You hold card d{card}." for card in self.cards)

    def play(self, action: int) -> str:
        """Play your move in tiny Hanabi.

        Args:
            action: Your action: 0, 1 or 2.
        """
        result = self.client.step({"action_id": int(action)})
        self.reward, self.done = float(result.reward or 0.0), result.done
        return "Played."

    def close(self) -> None:
        self.client.close()


def play_by_own_card(agent, k, text):
    """Agent 0 plays its card (0 or 1), agent 1 plays 2 minus its card: a move that depends on what its prompt says
    (None for the pad row a process samples when it has nothing left to continue)."""
    card = re.search(r"You hold card d(\d)\.", text)
    if card is None:
        return None
    return call("play", action=int(card.group(1)) if agent == 0 else 2 - int(card.group(1)))


@pytest.mark.parametrize("seeded", [False, True])
def test_a_team_trains_on_a_server_that_deals_its_own_start_each_joint_action_reading_its_own_world(
    games, hanabi_server, model_dir, tmp_path, script, seeded
):
    """Each world's cards are dealt by the server. Each joint action's agents are prompted with their own world's
    cards (agent i with card i only), and play from them: every reward equals the payoff table's for that world's
    cards and the moves its prompts led to. A seeded deal gives a row's worlds the same cards and one shared prompt."""
    DealtHanabi.url = hanabi_server.url
    script(play_by_own_card)
    k = 4
    trainer = MAGRPOTrainer(
        model=model_dir, num_agents=2, processing_class=make_tool_tokenizer(),
        reward_funcs=lambda environments, **kwargs: [env.reward for env in environments],
        environment_factory=DealtHanabi,
        train_dataset=Dataset.from_dict(
            {"prompt": [[{"role": "user", "content": "Play tiny Hanabi."}]] * 2, "seed": [5, 6] if seeded else [None] * 2}
        ),
        args=MAGRPOConfig(
            output_dir=str(tmp_path), num_generations=k, per_device_train_batch_size=2 * k, max_steps=1,
            max_completion_length=96, max_tool_calling_iterations=1, logging_steps=1, report_to="none",
            save_strategy="no", shuffle_dataset=False, seed=0, early_termination_threshold=None,
        ),
    )  # fmt: skip
    trainer.train()
    tree = trainer.last_rollout
    rewards = []
    for node in tree.nodes:
        worlds = [tree.joint_actions[a].environment for a in node.joint_actions]
        for agent in range(2):
            prompts = [node.prompt(agent, c)[-1]["content"] for c in range(k)]
            assert prompts == [f"Play tiny Hanabi. You hold card d{w.cards[agent]}." for w in worlds]
        assert (node.own_prompts is None) == (len({tuple(w.cards) for w in worlds}) == 1)
        for a, world in zip(node.joint_actions, worlds, strict=True):
            c0, c1 = world.cards
            assert tree.joint_actions[a].reward == PAYOFF[c0][c1][c0][2 - c1] == world.reward
            rewards.append(world.reward)
    own = [node.own_prompts is not None for node in tree.nodes]
    # seeded: one deal per row; unseeded: 2 x 4 deals of 4 card pairs, all alike in a row with chance 1/64 each
    assert own == [False, False] if seeded else any(own)
    first_prompts = [t for agent in (0, 1) for t in script.seen[agent] if "Play tiny Hanabi" in t]
    assert len(first_prompts) == (2 * 2 if seeded else 2 * 2 * k)  # 1 prompt x K samples, or K prompts x 1
    assert trainer.state.log_history[0]["turn_1/rewards/<lambda>/mean"] == pytest.approx(sum(rewards) / (2 * k))


def again(prompt, agent_completions, num_agents, **history):
    return [[{"role": "user", "content": "Again."}]] * num_agents


def test_with_two_turns_a_start_dealt_on_the_server_without_a_seed_is_refused_by_name(
    games, hanabi_server, model_dir, tmp_path, script
):
    """A client cannot be copied, DealtHanabi has no `_fork`, and a replay would deal other cards: turn 2's branches
    cannot get their parents' worlds. Refused, naming the class and what would make it work; by the build-time check
    when its replay already deals other cards, else at the first fork (1 chance in 4 with 4 card pairs)."""
    DealtHanabi.url = hanabi_server.url
    script(play_by_own_card)
    with pytest.raises(ValueError) as refused:
        MAGRPOTrainer(
            model=model_dir, num_agents=2, processing_class=make_tool_tokenizer(),
            reward_funcs=lambda environments, **kwargs: [env.reward for env in environments],
            environment_factory=DealtHanabi, external_transition=again,
            train_dataset=Dataset.from_dict({"prompt": [[{"role": "user", "content": "Play tiny Hanabi."}]] * 4}),
            args=MAGRPOConfig(
                output_dir=str(tmp_path), num_generations=4, per_device_train_batch_size=4, max_steps=4, num_turns=2,
                max_completion_length=96, max_tool_calling_iterations=1, report_to="none", save_strategy="no",
                early_termination_threshold=None,
            ),
        ).train()  # fmt: skip
    message = str(refused.value)
    assert "the environment DealtHanabi cannot be forked for the branches of turn 2" in message
    assert "its reset draws its own start" in message and "a seed in the row" in message
    assert "DealtHanabi._fork(self)" in message and "With num_turns=1 no fork is needed" in message


def test_an_openenv_environment_in_process_is_forked_by_deepcopy(games):
    """`OpenEnvWorld` over the server's own TinyHanabiEnvironment: no HTTP, and a turn-2 fork is a deep copy of the
    real OpenSpiel state. Each branch plays on from its parent's move; the parent and the siblings are untouched."""
    import openenv_team

    worlds = Worlds(openenv_team.HanabiWorld, num_agents=2)
    row = {"card_0": 1, "card_1": 1}
    (first, second), _, _ = worlds.start(row, [[{"role": "user", "content": "x"}]] * 2, count=2)
    first.play(2)  # agent 0's move in joint action 0
    branches = [worlds.fork(first, turn=2) for _ in range(3)]
    assert worlds.fork_methods == {openenv_team.HanabiWorld: "copy"}
    assert [b.env.game_state is first.env.game_state for b in branches] == [False] * 3
    results = [branch.play(action) for branch, action in zip(branches, [0, 1, 2], strict=True)]
    assert [b.get_reward() for b in branches] == [PAYOFF[1][1][2][a] for a in (0, 1, 2)] == [10.0, 0.0, 0.0]
    assert results[0] == "Both played: player 0 chose 2, player 1 chose 0."
    assert first.env.game_state.history() == [1, 1, 2] and not first.done  # the parent waits for player 1
    assert second.env.game_state.history() == [1, 1] and second.look() == "Nobody has played yet."
    with pytest.raises(ValueError, match="is over"):
        branches[0].play(1)
    worlds.close()


def test_the_in_process_world_trains_a_team(games, model_dir, tmp_path, script):
    """The same scripted game as on the server, with the world in this process: the same rewards."""
    import openenv_team

    script(hanabi_moves)
    rows = [(0, 0), (0, 1)]
    trainer = hanabi_trainer(model_dir, tmp_path, openenv_team.HanabiWorld, rows, reward_weights=[1.0, 0.0])
    trainer.train()
    logs = [log for log in trainer.state.log_history if "turn_1/rewards/HanabiWorld/mean" in log]
    assert [log["turn_1/rewards/HanabiWorld/mean"] for log in logs] == [expected_mean(*r) for r in rows]
    assert [log["turn_1/rewards/reward_func/mean"] for log in logs] == [expected_mean(*r) for r in rows]


def test_a_server_killed_mid_rollout_stops_training_naming_the_environment_and_the_row(
    games, model_dir, tmp_path, script, monkeypatch
):
    """The server dies (SIGKILL) in step 3, after agent 0 played and before agent 1 plays. Agent 1's call fails on a
    closed WebSocket: training stops at once with an error that names the environment, the row, the turn, the agent
    and the call, instead of handing the agent `{"error": ...}` and training on a lost game. No update of step 3:
    checkpoints 1 and 2 are whole and no checkpoint-3 is written."""
    import openenv_team

    with games.serve("tiny_hanabi") as server:
        monkeypatch.setattr(openenv_team.HanabiTable, "url", server.url)
        monkeypatch.setattr(openenv_team.HanabiTable, "timeout", 10.0)
        steps = {"agent 1 turns": 0}

        def moves(agent, k, text):
            if agent == 1 and k == 0 and "tiny Hanabi" in text:  # agent 1's first prompt of a step
                steps["agent 1 turns"] += 1
                if steps["agent 1 turns"] == 3:  # step 3, between agent 0's move and agent 1's
                    server.kill()
            return hanabi_moves(agent, k, text)

        script(moves)
        rows = [(0, 0), (0, 1), (1, 1), (1, 0)]
        trainer = hanabi_trainer(model_dir, tmp_path, openenv_team.HanabiTable, rows, save_strategy="steps",
                                 save_steps=1)  # fmt: skip
        start = time.monotonic()
        with pytest.raises(EnvironmentLost) as caught:
            trainer.train()
        elapsed = time.monotonic() - start
    message = str(caught.value)
    assert "the environment HanabiTable is gone: agent 1's call play({'action': 0}) in turn 1" in message
    assert "on the row {'card_0': 1, 'card_1': 1}" in message
    assert "ConnectionClosedError" in message
    assert elapsed < 60
    assert sorted(p for p in os.listdir(tmp_path) if p.startswith("checkpoint-")) == ["checkpoint-1", "checkpoint-2"]
    for step in (1, 2):
        with open(tmp_path / f"checkpoint-{step}" / "trainer_state.json") as f:
            assert json.load(f)["global_step"] == step
        assert any(re.match(r".*\.safetensors$", name) for _, _, files in os.walk(tmp_path / f"checkpoint-{step}")
                   for name in files)  # fmt: skip


# (when rank 1's server dies, in which step, what fails first)
KILLS = {
    "mid_rollout": ("before_move", 2, "the environment HanabiTable is gone: agent 1's call play("),
    "between_steps": ("after_move", 1, "HanabiTable.reset(**row) raised ConnectionClosedError"),
}


REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_group(command, env, timeout):
    """`command` in a process group of its own; past `timeout` the whole group is killed (a launcher killed alone
    leaves its workers running, which is what a hang would otherwise leave behind), then TimeoutExpired."""
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                               start_new_session=True)  # fmt: skip
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
        raise
    return subprocess.CompletedProcess(command, process.returncode, stdout, stderr)


LAUNCHERS = {
    "ddp": ["-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port"],
    # ZeRO-3: every generation gathers the weights, so the process that lost its world must still join the round's
    "zero3": ["-m", "accelerate.commands.launch", "--config_file", os.path.join(REPO, "accelerate_configs", "zero3.yaml"),
              "--num_processes", "2", "--mixed_precision", "no", "--main_process_port"],
}  # fmt: skip


@pytest.mark.distributed
@pytest.mark.parametrize(
    "kill, launcher",
    [
        ("mid_rollout", "ddp"),
        pytest.param("between_steps", "ddp", marks=pytest.mark.slow),
        pytest.param("mid_rollout", "zero3", marks=pytest.mark.slow),
    ],
)
def test_a_server_killed_under_one_of_two_processes_stops_both_with_its_message(games, tmp_path, kill, launcher):
    """2 gloo processes (torchrun DDP, or accelerate with ZeRO-3), each on its own server. Rank 1's server dies
    (SIGKILL): in step 2 between agent 0's move and agent 1's (a tool round fails), or after step 1's game (step 2's
    reset fails); rank 0's is fine. Both processes stop within seconds, each printing the lost environment's message
    (rank 0 names rank 1 and its error), instead of rank 0 waiting in a collective until the gloo timeout (30
    minutes), and checkpoint-1 is whole (no checkpoint-2)."""
    kill_when, kill_at_step, lost = KILLS[kill]
    worker = os.path.join(os.path.dirname(__file__), "distributed", "run_openenv_team.py")
    with games.serve("tiny_hanabi") as server_0, games.serve("tiny_hanabi") as server_1:
        command = [sys.executable, *LAUNCHERS[launcher], str(games.free_port()), worker, "--output_dir", str(tmp_path),
                   "--urls", server_0.url, server_1.url, "--kill_pid", str(server_1.process.pid), "--kill_at_step",
                   str(kill_at_step), "--kill_when", kill_when]  # fmt: skip
        path = os.pathsep.join(p for p in (REPO, os.environ.get("PYTHONPATH")) if p)  # this checkout's package
        env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "PYTHONPATH": path}
        start = time.monotonic()
        result = run_group(command, env, timeout=400)
        elapsed = time.monotonic() - start
        assert server_0.process.poll() is None  # rank 0's server lived through it
    log = result.stdout + result.stderr
    assert result.returncode != 0, log[-3000:]
    lost = f"EnvironmentLost: MAGRPOTrainer: {lost}"
    assert f"[rank1]: trl_multiagent.environments.faults.{lost}" in log, log[-5000:]
    assert "on the row {'card_0': " in log
    assert f'[rank0]: RuntimeError: MAGRPOTrainer: the rollout failed on process(es) [1]: {{1: "{lost}' in log, log[
        -5000:
    ]
    assert elapsed < 240
    checkpoints = sorted(p for p in os.listdir(tmp_path) if p.startswith("checkpoint-"))
    assert checkpoints == ["checkpoint-1"], checkpoints
    with open(tmp_path / "checkpoint-1" / "trainer_state.json") as f:
        assert json.load(f)["global_step"] == 1
    assert not (tmp_path / "info.json").exists()
