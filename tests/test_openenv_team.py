"""recipes/openenv_team.py: its parts by hand, and the script run in-process on a tiny local model, both with the
tiny Hanabi server it starts and stops and with the game in this process (`--in_process`). Marked `openenv`."""

import pytest


pytestmark = pytest.mark.openenv


def test_the_prompts_tell_each_agent_only_its_own_card():
    import openenv_team

    row = {"card_0": 1, "card_1": 0}
    first, second = openenv_team.first_player_prompt(row), openenv_team.second_player_prompt(row)
    assert "you hold card d1" in first[0]["content"] and "d0" not in first[0]["content"]
    assert "you hold card d0" in second[0]["content"] and "d1" not in second[0]["content"]
    assert '{"name": "look", "arguments": {}}' in second[0]["content"]
    assert openenv_team.describe({"actions": [2], "current_player": 1}) == "Your teammate (player 0) played action 2."


@pytest.mark.parametrize("where", ["server", "in_process"])
def test_the_recipe_trains_two_steps_on_a_tiny_model(tmp_path, where):
    import openenv_team

    from trl_multiagent.demo.testing import make_model, make_tool_tokenizer

    tokenizer = make_tool_tokenizer()
    make_model(tokenizer, seed=0, max_positions=2048).save_pretrained(tmp_path / "model")
    tokenizer.save_pretrained(tmp_path / "model")
    flags = ["--model_name_or_path", str(tmp_path / "model"), "--output_dir", str(tmp_path / "out"), "--max_steps",
             "2", "--max_completion_length", "16", "--num_deals", "4", "--lora_target_modules", "q_proj", "v_proj"]  # fmt: skip
    if where == "in_process":
        flags.append("--in_process")
    script_args, args, model_args = openenv_team.make_parser().parse_args_and_config(args=flags)
    assert model_args.use_peft and args.max_tool_calling_iterations == 2 and args.reward_weights == [1.0, 0.5]
    trainer = openenv_team.main(script_args, args, model_args)
    logs = [log for log in trainer.state.log_history if "turn_1/rewards/reward_func/mean" in log]
    assert len(logs) == 2
    assert all(0.0 <= log["turn_1/rewards/reward_func/mean"] <= 10.0 for log in logs)
    assert (tmp_path / "out" / "rewards.png").exists()
    if where == "in_process":
        assert "turn_1/rewards/HanabiWorld/mean" in logs[0] and args.reward_weights == [1.0, 0.5, 0.0]
    else:
        assert openenv_team.HanabiTable.url.startswith("http://127.0.0.1:")
