"""A misspelled config field names the closest fields; a recipe refuses an abbreviated flag instead of guessing."""

import importlib
import inspect
import pathlib
import subprocess
import sys

import pytest

from trl_multiagent import MAGRPOConfig


@pytest.mark.parametrize(
    ("name", "suggested"),
    [
        ("num_turn", "'num_turns' (MAGRPOConfig's)"),
        ("learning_rte", "'learning_rate' (TRL's)"),
        ("agent_learning_rate", "it is CoMLRL's name; TRL's is `learning_rate`"),
    ],
)
def test_a_misspelled_field_names_the_closest_ones_and_stays_a_type_error(name, suggested, tmp_path):
    with pytest.raises(TypeError, match="unexpected keyword argument") as raised:
        MAGRPOConfig(str(tmp_path), **{name: 1})
    assert f"{name!r}" in str(raised.value) and suggested in str(raised.value)


def test_a_name_close_to_nothing_says_so(tmp_path):
    with pytest.raises(TypeError, match=r"'zzzz'\. No name is close\. Every field: docs/configuration\.md"):
        MAGRPOConfig(str(tmp_path), zzzz=1)


def test_the_signature_and_the_fields_are_the_dataclass_ones(tmp_path):
    config = MAGRPOConfig(str(tmp_path), num_turns=2, learning_rate=1e-4, num_generations=2)
    assert (config.num_turns, config.learning_rate) == (2, 1e-4)
    assert "num_turns" in inspect.signature(MAGRPOConfig.__init__).parameters


@pytest.mark.parametrize("recipe", ["length_ratio", "code_collab", "tool_team"])
def test_a_recipe_refuses_an_abbreviated_flag_in_one_line(recipe, capsys):
    parser = importlib.import_module(recipe).make_parser()
    with pytest.raises(SystemExit) as exited:
        parser.parse_args_and_config(["--num_turn", "3"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert err.splitlines() == [
        f"{parser.prog}: unknown flag --num_turn (did you mean --num_turns or --num_iterations?)"
    ]
    _, config, _ = parser.parse_args_and_config(["--num_turns", "3"])
    assert config.num_turns == 3


def test_a_misspelled_config_key_and_a_stray_value_are_named(tmp_path, capsys):
    parser = importlib.import_module("length_ratio").make_parser()
    yaml = tmp_path / "run.yaml"
    yaml.write_text("learning_rte: 0.1\nnum_turns: 2\n")
    with pytest.raises(SystemExit):
        parser.parse_args_and_config(["--config", str(yaml), "--num-generatoins=4"])
    line = capsys.readouterr().err.strip()
    assert line == (
        f"{parser.prog}: unknown flags --num-generatoins (did you mean --num_generations or --num_generations_eval?), "
        "'learning_rte' in the --config file (did you mean --learning_rate or --agent_learning_rates?)"
    )
    with pytest.raises(SystemExit):
        parser.parse_args_and_config(["stray"])
    assert capsys.readouterr().err.strip() == f"{parser.prog}: unexpected value(s) stray: no flag takes them"


@pytest.mark.slow  # a run of its own, kept out of the default suite for time (docs/tests.md, "The default suite")
def test_a_misspelled_recipe_flag_ends_in_one_line_with_no_traceback():
    recipe = pathlib.Path(__file__).resolve().parent.parent / "recipes" / "length_ratio.py"
    done = subprocess.run(
        [sys.executable, str(recipe), "--num_generatoins", "2"], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        "length_ratio.py: unknown flag --num_generatoins (did you mean --num_generations or --num_generations_eval?)"
    ]
