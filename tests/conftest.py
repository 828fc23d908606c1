import asyncio
import importlib.util
import os
import shutil
import sys
import threading

import pytest


# Before the imports below, which import torch: OpenMP reads its thread count once, when it starts.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# The seed's prompts, joint reward and transition (the tests import them from here), and the tiny offline models.
from trl_multiagent.demo.examples import PROMPTS as SEED_PROMPTS  # noqa: E402, F401
from trl_multiagent.demo.examples import length_feedback, length_ratio_reward  # noqa: E402, F401
from trl_multiagent.demo.testing import make_model, make_tokenizer  # noqa: E402
from trl_multiagent.devices import reuse_freed_memory  # noqa: E402


# The suite's choice for its own process, as the recipes make it (the trainer never does): the updates' large tensors
# reuse freed heap memory instead of page-faulting fresh pages on every step (docs/benchmarks.md).
reuse_freed_memory()


# The sandbox tests (recipes/sandbox.py) need bubblewrap, which pip cannot install. Without it they skip, and the run
# ends with one line that says how many and what to install; with this variable set to 1 (`.ci/run` sets it) they fail
# instead, so that CI never skips them unseen.
REQUIRE_SANDBOX_TESTS = "TRL_MULTIAGENT_REQUIRE_SANDBOX_TESTS"
SANDBOX_INSTALL = "`apt-get install -y bubblewrap util-linux` (as root)"
skipped_sandbox_tests = []  # node ids, for the run's summary line


@pytest.fixture
def bubblewrap(request):
    """Use through `@pytest.mark.usefixtures("bubblewrap")` on tests that run programs in the bwrap sandbox."""
    if shutil.which("bwrap") is not None and shutil.which("prlimit") is not None:
        return
    if os.environ.get(REQUIRE_SANDBOX_TESTS) == "1":
        pytest.fail(
            f"{REQUIRE_SANDBOX_TESTS}=1 and the sandbox tests need bubblewrap (bwrap) and prlimit, which pip cannot "
            f"install: run {SANDBOX_INSTALL}.",
            pytrace=False,
        )
    skipped_sandbox_tests.append(request.node.nodeid)
    pytest.skip("bubblewrap (bwrap) or prlimit is not installed")


# The browser tests (tests/test_viewer_browser.py) skip without chromium or playwright; why, once, at the run's end.
skipped_browser_tests = []  # the reason, once per skipped test


# CoMLRL's examples and docs (tests/test_comlrl_examples.py) skip without CoMLRL's sdist; why, once, at the run's end.
skipped_comlrl_examples = []  # the reason (the fixture that skips them is made once)

# The slow run of TRL's own test file (tests/test_trl_contract.py) skips where those files are not found; why, at the end.
skipped_trl_contract_tests = []  # the reason, once per skipped test

# TRL-like test files that tests/test_trl_contract.py hands to the harness, not tests of this suite.
collect_ignore = ["trl_contract/synthetic_trl_tests"]


def pytest_terminal_summary(terminalreporter):
    if skipped_sandbox_tests:
        terminalreporter.write_line(
            f"{len(skipped_sandbox_tests)} sandbox tests skipped: bubblewrap (bwrap) or prlimit is not installed, and "
            f"pip cannot install them; {SANDBOX_INSTALL} runs them."
        )
    if skipped_browser_tests:
        terminalreporter.write_line(
            f"{len(skipped_browser_tests)} browser tests skipped: {skipped_browser_tests[0]} (TRL_MULTIAGENT_REQUIRE_"
            "BROWSER_TESTS=1 makes that an error)."
        )
    if skipped_comlrl_examples:
        terminalreporter.write_line(
            f"CoMLRL's examples and docs (tests/test_comlrl_examples.py) skipped: {skipped_comlrl_examples[0]}"
        )
    if skipped_trl_contract_tests:
        terminalreporter.write_line(
            f"{len(skipped_trl_contract_tests)} TRL contract test(s) skipped: {skipped_trl_contract_tests[0]}."
        )


@pytest.fixture(scope="session")
def tokenizer():
    return make_tokenizer()


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, tokenizer):
    path = tmp_path_factory.mktemp("tiny-llama")
    make_model(tokenizer, seed=0).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


def pytest_ignore_collect(collection_path, config):
    """Without vLLM, leave test_vllm.py out of runs that do not select `vllm` tests (the default suite).

    A run that selects them (`-m vllm`) still imports it, and fails loudly where vLLM is missing.
    """
    if collection_path.name != "test_vllm.py" or importlib.util.find_spec("vllm") is not None:
        return None
    from _pytest.mark.expression import Expression

    markexpr = config.getoption("markexpr") or ""
    selects_vllm = not markexpr or Expression.compile(markexpr).evaluate(lambda name: name == "vllm")
    return True if not selects_vllm else None


def assert_same_sgd_step(before: dict, stock_model, ours_model, atol: float = 1e-6) -> None:
    """After one SGD step from the same weights (`before`), both models moved every weight by the same amount, and
    more than ten tensors moved: equal deltas mean equal gradients. `atol`: for bfloat16 weights, whose steps are
    rounded to a unit in the last place of the weight (summation order then shows at that scale)."""
    import torch

    moved = 0
    for name, start in before.items():
        stock_step = stock_model.state_dict()[name].float() - start.float()
        ours_step = ours_model.state_dict()[name].float() - start.float()
        torch.testing.assert_close(ours_step, stock_step, rtol=1e-4, atol=atol, msg=name)
        moved += int(stock_step.abs().sum() > 0)
    assert moved > 10  # the step really changed the weights


EVENT_LOOPS = ["no loop", "a current loop", "a running loop"]


def under_event_loop(loop: str, target):
    """`target()`'s value, called on a new thread that has no event loop, a current one that is not running, or a
    running one (a Jupyter notebook's cell); its exception is raised here."""

    def call():
        if loop == "no loop":
            return target()
        if loop == "a current loop":
            current = asyncio.new_event_loop()
            asyncio.set_event_loop(current)  # set, not running: where asyncio.gather(...) made outside would attach
            try:
                return target()
            finally:
                asyncio.set_event_loop(None)
                current.close()

        async def cell():
            return target()

        return asyncio.run(cell())

    out = {}

    def run():
        try:
            out["value"] = call()
        except BaseException as err:  # handed back to the test
            out["error"] = err

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(timeout=60)
    if "error" in out:
        raise out["error"]
    return out["value"]


@pytest.fixture(autouse=True)
def no_wandb_run_left_open():
    """A wandb run a test opened (the CoMLRL face opens one when built with `wandb_config`, as CoMLRL does) ends with
    the test, so that the next test's `wandb.init` opens its own instead of getting this one back."""
    yield
    wandb = sys.modules.get("wandb")
    if wandb is not None and getattr(wandb, "run", None) is not None:
        wandb.finish()
