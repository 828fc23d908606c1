"""OpenEnv environments to train a team against, built from PyPI packages (`pip install "trl_multiagent[openenv]"`:
`openenv-core` and `open_spiel`; recipes/openenv_team.py and the tests use them): the server side
(`openenv-core`'s `Environment`, served over WebSocket by its FastAPI app) of an echo environment and of OpenSpiel's
tiny Hanabi, and `serve`, which runs one on 127.0.0.1 with uvicorn in a process of its own and stops it.

OpenEnv's own environments (echo, OpenSpiel, TextArena, ...) live in its repository, not in the `openenv-core`
wheel, so these are small ones of our own, written as OpenEnv's are: an `Action` and an `Observation` (pydantic
models), an `Environment` with `reset(seed, episode_id, **kwargs)`, `step(action)` and `state`, and
``SUPPORTS_CONCURRENT_SESSIONS = True`` with `max_concurrent_envs` on the app, because TRL opens one session per
environment instance (TRL's docs, "Server concurrency").

Tiny Hanabi (OpenSpiel's ``tiny_hanabi``) is a two-player cooperative card game: each player is dealt one of two
cards and sees only its own; player 0 plays one of three actions, then player 1, who has seen player 0's action,
plays one; both get the same payoff, 0 to 10, from a table of the cards and both actions. `reset(cards=[c0, c1])`
deals those cards (a dataset row can then tell each agent its own card), `reset(seed=s)` draws them.
"""

from __future__ import annotations

import contextlib
import os
import random
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from typing import Any

from openenv.core.env_server import Action, Environment, Observation, State, create_fastapi_app


# Sessions one server allows at once: one per environment instance a trainer holds (TRL's docs: at least the
# generation batch). A team's pool holds one instance per joint action of a rollout, plus replays.
MAX_SESSIONS = 64


class EchoAction(Action):
    message: str


class EchoObservation(Observation):
    echoed_message: str = ""
    message_length: int = 0


class EchoEnvironment(Environment):
    """OpenEnv's echo environment, written again: each step echoes the message, with reward 0.1 per character."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self):
        super().__init__()
        self._state = State(episode_id=None, step_count=0)

    def reset(self, seed=None, episode_id=None, **kwargs) -> EchoObservation:
        self._state = State(episode_id=episode_id, step_count=0)
        return EchoObservation(echoed_message="Echo environment ready!", done=False, reward=0.0)

    def step(self, action: EchoAction, timeout_s=None, **kwargs) -> EchoObservation:
        self._state.step_count += 1
        message = action.message
        return EchoObservation(
            echoed_message=message, message_length=len(message), done=False, reward=len(message) * 0.1
        )

    @property
    def state(self) -> State:
        return self._state


class HanabiAction(Action):
    action_id: int


class HanabiObservation(Observation):
    info_state: str = ""  # what the player to act knows: its card and the actions so far (OpenSpiel's string)
    current_player: int = -1  # -4 (OpenSpiel's terminal) once both played
    legal_actions: list[int] = []
    cards: list[int] = []
    actions: list[int] = []


class TinyHanabiEnvironment(Environment):
    """OpenSpiel's tiny Hanabi as an OpenEnv environment. The game state is a `pyspiel.State`, which
    `copy.deepcopy` copies (so an instance in this process forks by copying: `trl_multiagent.environments.openenv`)."""

    SUPPORTS_CONCURRENT_SESSIONS = True
    GAME = "tiny_hanabi"

    def __init__(self):
        super().__init__()
        import pyspiel  # the open_spiel package

        self.game = pyspiel.load_game(self.GAME)
        self.game_state = None
        self.cards: list[int] = []
        self._state = State(episode_id=None, step_count=0)

    def reset(self, seed=None, episode_id=None, cards=None, **kwargs) -> HanabiObservation:
        state = self.game.new_initial_state()
        rng = random.Random(seed)
        dealt = []
        while state.is_chance_node():
            outcomes = [a for a, _ in state.chance_outcomes()]
            card = cards[len(dealt)] if cards is not None else rng.choice(outcomes)
            if card not in outcomes:
                raise ValueError(f"tiny Hanabi: card {card!r} is not one of {outcomes}.")
            state.apply_action(card)
            dealt.append(card)
        self.game_state, self.cards = state, dealt
        self._state = State(episode_id=episode_id, step_count=0)
        return self._observe(reward=0.0)

    def step(self, action: HanabiAction, timeout_s=None, **kwargs) -> HanabiObservation:
        state = self.game_state
        if state is None or state.is_terminal():
            raise ValueError("tiny Hanabi: the game is over; reset to play again.")
        if action.action_id not in state.legal_actions():
            raise ValueError(f"tiny Hanabi: action {action.action_id} is not one of {state.legal_actions()}.")
        state.apply_action(action.action_id)
        self._state.step_count += 1
        return self._observe(reward=state.returns()[0] if state.is_terminal() else 0.0)

    def _observe(self, reward: float) -> HanabiObservation:
        state = self.game_state
        player = state.current_player()
        return HanabiObservation(
            info_state=state.information_state_string(player) if player >= 0 else str(state),
            current_player=player,
            legal_actions=list(state.legal_actions()) if player >= 0 else [],
            cards=list(self.cards),
            actions=list(state.history()[len(self.cards) :]),
            done=state.is_terminal(),
            reward=reward,
        )

    @property
    def state(self) -> State:
        return self._state


def echo_app():
    """The echo environment's FastAPI app (uvicorn: ``--factory openenv_games:echo_app``)."""
    return create_fastapi_app(EchoEnvironment, EchoAction, EchoObservation, max_concurrent_envs=MAX_SESSIONS)


def hanabi_app():
    """Tiny Hanabi's FastAPI app (``--factory openenv_games:hanabi_app``)."""
    return create_fastapi_app(TinyHanabiEnvironment, HanabiAction, HanabiObservation, max_concurrent_envs=MAX_SESSIONS)


APPS = {"echo": "echo_app", "tiny_hanabi": "hanabi_app"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Server:
    """A running environment server: its URL (``http://127.0.0.1:port``) and its process."""

    name: str
    url: str
    process: subprocess.Popen

    def kill(self) -> None:
        """SIGKILL, as the out-of-memory killer would: no goodbye to the clients."""
        self.process.kill()
        self.process.wait()


@contextlib.contextmanager
def serve(name: str, port: int | None = None, start_timeout: float = 60.0, log: str | None = None):
    """Run the environment `name` (``"echo"`` or ``"tiny_hanabi"``) on 127.0.0.1 with uvicorn, in a process of its
    own, until the block ends (then stop it: SIGTERM, SIGKILL after 10 s). Yields a `Server`. Output goes to `log`
    (a file path), or nowhere."""
    port = port or free_port()
    command = [sys.executable, "-m", "uvicorn", "--factory", f"openenv_games:{APPS[name]}", "--host", "127.0.0.1",
               "--port", str(port), "--log-level", "warning"]  # fmt: skip
    out = open(log, "ab") if log else subprocess.DEVNULL  # noqa: SIM115 (closed below)
    # the server imports this very module, from this folder
    here = os.path.dirname(os.path.abspath(__file__))
    path = os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": path}
    process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env)
    server = Server(name, f"http://127.0.0.1:{port}", process)
    try:
        _wait_healthy(server, start_timeout)
        yield server
    finally:
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if log:
            out.close()


def _wait_healthy(server: Server, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if server.process.poll() is not None:
            raise RuntimeError(f"The {server.name} environment server exited with status {server.process.returncode}.")
        try:
            with urllib.request.urlopen(f"{server.url}/health", timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"The {server.name} environment server did not answer at {server.url} in {timeout} s.")
        time.sleep(0.2)


def describe(observation: dict[str, Any] | HanabiObservation) -> str:
    """A tiny Hanabi observation as text for an agent (a client's dict or the server's model)."""
    get = observation.get if isinstance(observation, dict) else lambda k: getattr(observation, k)
    if get("done"):
        return f"Both played {get('actions')}; the team scored {get('reward')} of 10."
    return f"Actions played so far: {get('actions')}."
