"""A misspelled config field names the closest fields; a recipe refuses an abbreviated flag instead of guessing."""

import importlib
import inspect

import pytest

from trl_multiagent import MAGRPOConfig


@pytest.mark.parametrize(
    ("name", "suggested"),
    [
        ("num_turn", "'num_turns' (MAGRPOConfig's)"),
        ("learning_rte", "'learning_rate' (TRL's)"),
        ("agent_learning_rat", "'agent_learning_rate' (CoMLRL's)"),
    ],
)
def test_a_misspelled_field_names_the_closest_ones_and_stays_a_type_error(name, suggested, tmp_path):
    with pytest.raises(TypeError, match="unexpected keyword argument") as raised:
        MAGRPOConfig(str(tmp_path), **{name: 1})
    assert f"{name!r}. Closest names: " in str(raised.value) and suggested in str(raised.value)


def test_a_name_close_to_nothing_says_so(tmp_path):
    with pytest.raises(TypeError, match=r"'zzzz'\. No name is close\. Every field: docs/configuration\.md"):
        MAGRPOConfig(str(tmp_path), zzzz=1)


def test_the_signature_and_the_fields_are_the_dataclass_ones(tmp_path):
    config = MAGRPOConfig(str(tmp_path), num_turns=2, agent_learning_rate=1e-4, num_generations=2)
    assert (config.num_turns, config.learning_rate) == (2, 1e-4)
    assert "num_turns" in inspect.signature(MAGRPOConfig.__init__).parameters


@pytest.mark.parametrize("recipe", ["length_ratio", "code_collab", "tool_team"])
def test_a_recipe_refuses_an_abbreviated_flag(recipe):
    parser = importlib.import_module(recipe).make_parser()
    with pytest.raises(ValueError, match=r"not used by the HfArgumentParser: \['--num_turn', '3'\]"):
        parser.parse_args_and_config(["--num_turn", "3"])
    _, config, _ = parser.parse_args_and_config(["--num_turns", "3"])
    assert config.num_turns == 3
