import os
import sys

import pytest

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from tiny import make_model, make_tokenizer  # noqa: E402

# The seed's prompts, joint reward and transition, as the recipe ships them.
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "recipes"))
from length_ratio import PROMPTS as SEED_PROMPTS  # noqa: E402
from length_ratio import length_feedback, length_ratio_reward  # noqa: E402, F401


@pytest.fixture(scope="session")
def tokenizer():
    return make_tokenizer()


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, tokenizer):
    path = tmp_path_factory.mktemp("tiny-llama")
    make_model(tokenizer, seed=0).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)
