"""`python -m trl_multiagent.view` without a browser: what the page embeds, the reward curve's source, the errors."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from trl_multiagent.trees.record import FORMAT_VERSION
from trl_multiagent.trees.store import write_step
from trl_multiagent.view import ViewError, page_html
from trl_multiagent.view.__main__ import main
from trl_multiagent.view.page import reward_curve


def document(step, text="an answer", rewards=(0.25, 0.75)):
    node = {
        "id": 0, "turn": 1, "parent": None, "terminated": False,
        "agents": [{"prompt": "a task", "prompt_tokens": 3,
                    "completions": [{"text": text, "tokens": 2, "truncated": False, "advantage": 0.0, "return": r}
                                    for r in rewards]}],
        "actions": [{"choice": [k], "reward": r, "rewards": {"f": r}, "return": r, "pruned": False, "child": None}
                    for k, r in enumerate(rewards)],
    }  # fmt: skip
    return {"format_version": FORMAT_VERSION, "step": step, "time": 0.0, "num_agents": 1, "num_generations": 2,
            "num_turns": 1, "reward_names": ["f"], "max_text_chars": 2000,
            "prompts": [{"process": 0, "row": 0, "nodes": [node]}]}  # fmt: skip


def embedded_steps(html: str) -> dict[int, dict]:
    found = re.findall(r'<script type="application/json" id="step-(\d+)">(.*?)</script>', html, re.S)
    return {int(step): json.loads(text) for step, text in found}


def test_a_text_that_closes_a_script_tag_stays_inside_its_step(tmp_path):
    text = "</script><script>alert(1)</script> <!-- done"
    write_step(str(tmp_path / "rollout_trees"), document(3, text))
    html = page_html(str(tmp_path))
    assert html.count("</script>") == 3  # the index, the step and the viewer's own script: nothing from the text
    assert embedded_steps(html)[3]["prompts"][0]["nodes"][0]["agents"][0]["completions"][0]["text"] == text
    assert "src=" not in html and "<link" not in html and "http://" not in html.replace('xmlns="http://www.w3.org', "")


def test_the_curve_comes_from_the_trainer_state_else_from_the_trees(tmp_path):
    for step in (1, 2):
        write_step(str(tmp_path / "rollout_trees"), document(step, rewards=(0.25 * step, 0.75)))
    docs = {s: document(s, rewards=(0.25 * s, 0.75)) for s in (1, 2)}
    from_trees = reward_curve(str(tmp_path), docs)
    assert from_trees["series"] == {"turn_1/reward_mean": [[1, 0.5], [2, 0.625]]}
    state = {"log_history": [{"step": 1, "reward": 0.1, "turn_1/reward_mean": 0.2}, {"step": 2, "reward": 0.3},
                             {"train_runtime": 5.0, "step": 2}]}  # fmt: skip
    (tmp_path / "trainer_state.json").write_text(json.dumps(state))
    logged = reward_curve(str(tmp_path), docs)
    assert logged["series"] == {"reward": [[1, 0.1], [2, 0.3]], "turn_1/reward_mean": [[1, 0.2]]}


def test_the_command_writes_the_chosen_steps_and_names_what_is_missing(tmp_path, capsys):
    for step in (1, 2, 3):
        write_step(str(tmp_path / "rollout_trees"), document(step))
    out = tmp_path / "two.html"
    assert main([str(tmp_path), "--steps", "1", "3", "--out", str(out)]) == 0
    assert sorted(embedded_steps(out.read_text())) == [1, 3]
    assert main([str(tmp_path), "--steps", "2", "7"]) == 2
    assert "no recorded tree for step(s) [7]; recorded: [1, 2, 3]" in capsys.readouterr().err
    assert main([str(tmp_path / "nothing")]) == 2
    assert "log_rollout_trees=True" in capsys.readouterr().err


def test_another_format_version_is_refused(tmp_path):
    write_step(str(tmp_path / "rollout_trees"), {**document(1), "format_version": 99})
    with pytest.raises(ValueError, match="format_version 99; this trl_multiagent reads version 1"):
        page_html(str(tmp_path))
    with pytest.raises(ViewError):
        page_html(str(tmp_path / "empty"))


def test_the_command_imports_no_torch(tmp_path):
    """`python -m trl_multiagent.view` writes the page without importing torch, TRL, transformers or accelerate (the
    package's names load on first use): it takes a fraction of a second, not the seconds torch takes to load."""
    write_step(str(tmp_path / "rollout_trees"), document(1))
    script = (
        "import runpy, sys\n"
        f"sys.argv = ['trl_multiagent.view', {str(tmp_path)!r}]\n"
        "try:\n    runpy.run_module('trl_multiagent.view', run_name='__main__')\n"
        "except SystemExit as exit:\n    assert exit.code in (0, None), exit.code\n"
        "print(sorted(m for m in ('torch', 'trl', 'transformers', 'accelerate') if m in sys.modules))\n"
    )
    root = Path(__file__).resolve().parent.parent
    out = subprocess.run([sys.executable, "-c", script], cwd=root, capture_output=True, text=True, check=True).stdout
    assert out.splitlines()[0].startswith("Wrote ") and (tmp_path / "rollout_trees.html").is_file()
    assert out.splitlines()[-1] == "[]"


def test_the_package_names_load_on_first_use():
    import trl_multiagent

    assert trl_multiagent.__all__ == [
        "AgentTeam",
        "MAGRPOConfig",
        "MAGRPOTrainer",
        "joint",
        "load_team",
        "per_agent",
        "per_joint_action",
    ]
    from trl_multiagent import MAGRPOTrainer
    from trl_multiagent.trainer import MAGRPOTrainer as defined

    assert MAGRPOTrainer is defined and set(trl_multiagent.__all__) <= set(dir(trl_multiagent))
    with pytest.raises(AttributeError, match="module 'trl_multiagent' has no attribute 'MAGRPOTrainr'"):
        trl_multiagent.MAGRPOTrainr  # noqa: B018
