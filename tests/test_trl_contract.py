"""The GRPOTrainer/Trainer internals this plugin overrides or calls. A TRL or transformers release that changes one of
them must fail here, loudly, rather than train wrongly. The supported range is pinned in pyproject.toml."""

import inspect
import re

import transformers
import trl
from packaging.version import Version
from transformers import Trainer
from transformers.trainer_utils import rotate_checkpoints
from trl import GRPOTrainer
from trl.models.utils import _unwrap_model_for_generation, disable_gradient_checkpointing
from trl.trainer.utils import add_fused_lm_head, pad


def params(func):
    return list(inspect.signature(func).parameters)


def test_versions_in_tested_range():
    assert Version("1.16") <= Version(trl.__version__) < Version("1.17"), trl.__version__
    assert Version(transformers.__version__).major == 5, transformers.__version__


def test_overridden_methods_keep_their_signatures():
    assert params(GRPOTrainer._generate_and_score_completions) == ["self", "inputs"]
    assert params(GRPOTrainer._prepare_inputs) == ["self", "generation_batch"]
    assert params(GRPOTrainer.compute_loss) == ["self", "model", "inputs", "return_outputs", "num_items_in_batch"]
    assert params(GRPOTrainer._compute_loss) == ["self", "model", "inputs"]
    assert params(Trainer._save) == ["self", "output_dir", "state_dict"]
    assert params(Trainer._load_from_checkpoint) == ["self", "resume_from_checkpoint", "model"]
    assert params(Trainer._save_checkpoint) == ["self", "model", "trial"]
    assert params(GRPOTrainer._get_train_sampler) == ["self", "dataset"]
    assert params(Trainer.train)[:3] == ["self", "resume_from_checkpoint", "trial"]
    assert params(rotate_checkpoints) == [
        "output_dir", "save_total_limit", "best_model_checkpoint", "use_mtime", "checkpoint_prefix",
    ]  # fmt: skip
    # The rotation inside Trainer._save_checkpoint is what MAGRPOTrainer defers until the completion marker.
    assert "rotate_checkpoints(" in inspect.getsource(Trainer._save_checkpoint)
    assert "save_total_limit=self.args.save_total_limit" in inspect.getsource(Trainer._save_checkpoint)


def test_called_helpers_keep_their_signatures():
    assert params(GRPOTrainer._get_per_token_logps_and_entropies)[:6] == [
        "self", "model", "input_ids", "attention_mask", "logits_to_keep", "batch_size",
    ]  # fmt: skip
    assert params(add_fused_lm_head) == ["model", "temperature", "cast_lm_head_to_fp32", "outputs"]
    assert params(_unwrap_model_for_generation) == [
        "model", "accelerator", "gather_deepspeed3_params", "gradient_checkpointing_kwargs",
    ]  # fmt: skip
    assert params(disable_gradient_checkpointing) == ["model", "gradient_checkpointing_kwargs"]
    assert params(pad) == ["tensors", "padding_value", "padding_side", "pad_to_multiple_of"]


def test_loss_reads_the_inputs_we_build():
    source = inspect.getsource(GRPOTrainer._compute_loss)
    for key in ["prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "advantages", "num_items_in_batch",
                "old_per_token_logps", "ref_per_token_logps"]:  # fmt: skip
        assert f'"{key}"' in source, key


def test_loss_normalisations_are_the_ones_the_chunk_weights_assume():
    """`chunking.chunk_weight` mirrors how TRL's `_compute_loss` normalises each loss type; a TRL release that
    changes one (or adds a loss type) must fail here, not silently reweight the chunks."""
    from trl_multiagent.update.chunking import LOSS_TYPES

    source = inspect.getsource(GRPOTrainer._compute_loss)
    assert 'if self.loss_type in ["grpo", "sapo"]:' in source
    assert "((per_token_loss * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).mean()" in source  # per row, mean of rows
    assert "(per_token_loss * mask).sum() / mask.sum().clamp(min=1.0)" in source  # bnpo: per token of the call
    assert "(per_token_loss.size(0) * self.max_completion_length)" in source  # dr_grpo: rows of the call
    assert 'elif self.loss_type in ["cispo", "dapo", "vespo"]:' in source
    assert 'inputs["num_items_in_batch"].clamp(min=1.0)' in source  # the generation batch's tokens
    assert "(per_token_loss * mask).sum(-1).mean()" in source  # luspo: rows of the call
    named = {name for name in LOSS_TYPES if f'"{name}"' in source}
    assert named == set(LOSS_TYPES)


def test_tool_suffix_ids_reads_only_what_the_team_gives_it():
    """`rollout.tools.ToolCalling.suffix_ids` calls TRL's private `GRPOTrainer._get_tool_suffix_ids` on a stand-in
    holding one agent's tokenizer and template. It must keep its signature, read no attribute beyond those, and give
    the tokens that append a tool message to an assistant turn; and `_compute_loss` must mask with `tool_mask`."""
    import types

    from trl.chat_template_utils import add_response_schema

    from trl_multiagent.demo.testing import make_tool_tokenizer

    assert params(GRPOTrainer._get_tool_suffix_ids) == ["self", "tool_messages"]
    source = inspect.getsource(GRPOTrainer._get_tool_suffix_ids)
    given = {"processing_class", "_tokenizer", "chat_template", "chat_template_kwargs", "_is_vlm"}
    assert set(re.findall(r"self\.(\w+)", source)) <= given
    tokenizer = add_response_schema(make_tool_tokenizer())
    owner = types.SimpleNamespace(
        processing_class=tokenizer, _tokenizer=tokenizer, chat_template=None, chat_template_kwargs={}, _is_vlm=False
    )
    suffix = GRPOTrainer._get_tool_suffix_ids(owner, [{"role": "tool", "name": "add", "content": "5"}])
    assert tokenizer.decode(suffix) == (
        "\n<|im_start|>user\n<tool_response>\n5\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )
    assert 'completion_mask * inputs["tool_mask"]' in inspect.getsource(GRPOTrainer._compute_loss)
