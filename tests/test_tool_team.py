"""recipes/tool_team.py: its rewards by hand, and the script run in-process on a tiny local model (parsing, training
with the shared notebook, saving, the tool-call panel)."""

import json

import tool_team
from trl.chat_template_utils import supports_tool_calling

from trl_multiagent.demo.testing import make_model, make_tokenizer, make_tool_tokenizer


def notebook(first="maple", second="river", notes=()):
    world = tool_team.Notebook()
    world.reset(first=first, second=second)
    for note in notes:
        world.write(note)
    return world


def test_full_code_needs_both_words_in_the_keepers_last_words():
    worlds = [notebook(), notebook(), notebook()]
    keeper = [
        "<tool_response>\nmaple\n</tool_response>The code is maple river.",  # read, then answered
        "<tool_response>\nmaple\n</tool_response>The code is river.",  # its own word only
        "maple river<tool_response>\nx\n</tool_response>I do not know.",  # both words, but before the tool result
    ]
    assert tool_team.full_code(["", "", ""], keeper, worlds) == [1.0, 0.0, 0.0]


def test_tool_use_rewards_only_a_call_that_ran():
    ran = [{"role": "assistant", "content": "", "tool_calls": [{"type": "function"}]}, {"role": "tool", "content": ""}]
    opened = [{"role": "assistant", "content": 'Sure. <tool_call> ["read"'}]
    closed = [{"role": "assistant", "content": '<tool_call> {"name": "read"} </tool_call> <tool_call> ["read"'}]
    plain = [{"role": "assistant", "content": "river"}]
    assert tool_team.tool_use([ran, opened, closed, plain]) == [1.0, 0.0, 0.0, 0.0]


def test_the_notebook_rewards_the_scouts_word_and_gives_each_agent_its_tools():
    assert notebook(notes=["The word is Maple"]).get_reward() == 1.0
    assert notebook(notes=["river"]).get_reward() == 0.0
    assert tool_team.Notebook.agent_tools == [["write"], ["read"]]
    assert notebook(notes=["a", "b"]).read() == "a\nb" and notebook().read() == "The notebook is empty."


def test_a_template_without_tools_gets_trls_qwen2_5_template(tmp_path):
    plain = make_tokenizer()
    plain.save_pretrained(tmp_path)
    _, args, model_args = tool_team.make_parser().parse_args_and_config(
        args=["--model_name_or_path", str(tmp_path), "--output_dir", str(tmp_path / "out")]
    )
    assert supports_tool_calling(tool_team.tool_tokenizer(model_args, args))


def test_the_recipe_trains_a_step_on_a_tiny_model(tmp_path):
    tokenizer = make_tool_tokenizer()
    make_model(tokenizer, seed=0, max_positions=2048).save_pretrained(tmp_path / "model")
    tokenizer.save_pretrained(tmp_path / "model")
    script_args, args, model_args = tool_team.make_parser().parse_args_and_config(
        args=[
            "--model_name_or_path",
            str(tmp_path / "model"),
            "--output_dir",
            str(tmp_path / "out"),
            "--max_steps",
            "2",
            "--max_completion_length",
            "16",
            "--num_codes",
            "4",
            "--lora_target_modules",
            "q_proj",
            "v_proj",
        ]  # fmt: skip
    )
    assert args.reward_weights == [0.5, 1.0, 1.0] and args.max_tool_calling_iterations == 1 and model_args.use_peft
    trainer = tool_team.main(script_args, args, model_args)
    log = trainer.state.log_history[0]
    assert {"turn_1/rewards/tool_use/mean", "turn_1/rewards/full_code/mean", "turn_1/rewards/Notebook/mean"} <= set(
        log
    )
    assert "turn_1/agent_1/tools/call_frequency" in log
    assert (tmp_path / "out" / "agent_1" / "adapter_config.json").exists() and (
        tmp_path / "out" / "rewards.png"
    ).exists()
    state = json.loads((tmp_path / "out" / "trainer_state.json").read_text())
    assert len(state["log_history"]) >= 2
