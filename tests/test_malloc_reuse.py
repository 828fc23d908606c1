"""`reuse_freed_memory`, the opt-in allocator setting: on a CPU, memory the update frees serves its next tensors instead
of coming fresh from the kernel (page faults on every step otherwise); and a trainer built and trained without it
leaves glibc's malloc as it was. Run in fresh subprocesses: the setting changes the process's malloc."""

import os
import platform
import subprocess
import sys
import textwrap

import pytest


PROBE = textwrap.dedent(
    """
    import resource, sys, torch
    from trl_multiagent.devices import reuse_freed_memory

    def faults_per_cycle():
        # a 64 MB tensor, allocated, touched and freed as the update's logits are, ten times
        start = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        for _ in range(10):
            torch.ones(16 * 1024 * 1024)
        return (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - start) / 10

    before = faults_per_cycle()
    if sys.argv[1] == "set":
        done = reuse_freed_memory()
    else:  # a user's training without the setting: the trainer must leave the allocator alone
        from datasets import Dataset
        from trl_multiagent import MAGRPOConfig, MAGRPOTrainer
        from trl_multiagent.demo.testing import make_model, make_tokenizer

        tokenizer = make_tokenizer()
        MAGRPOTrainer(
            model=[make_model(tokenizer), make_model(tokenizer, seed=1)], processing_class=tokenizer,
            reward_funcs=lambda a, b: [float(len(x) - len(y)) for x, y in zip(a, b)],
            train_dataset=Dataset.from_dict({"prompt": ["a b", "c d"]}),
            args=MAGRPOConfig(output_dir=sys.argv[2], num_generations=2, per_device_train_batch_size=2,
                              max_completion_length=4, max_steps=1, report_to="none", save_strategy="no"),
        ).train()
        done = "trained"
    faults_per_cycle()  # the heap grows once
    print(done, before, faults_per_cycle(), sep=chr(10))
    """
)


def probe(mode="set", output_dir="unused", **env):
    environment = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    out = subprocess.run(
        [sys.executable, "-c", PROBE, mode, str(output_dir)], capture_output=True, text=True,
        env={**environment, **env}, timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    done, before, after = out.stdout.splitlines()[-3:]
    return done, float(before), float(after)


@pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="glibc's malloc")
def test_freed_memory_serves_the_next_tensor_without_page_faults():
    done, before, after = probe()
    assert done == "set"
    assert before > 10_000  # 64 MB of fresh 4 KiB pages each time, glibc's own behaviour
    assert after < 100  # served from the heap: no new pages


@pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="glibc's malloc")
def test_a_user_setting_of_the_allocator_is_left_alone():
    done, before, after = probe(MALLOC_MMAP_MAX_="65536")
    assert done == "left as set by MALLOC_MMAP_MAX_"
    assert after > 10_000


@pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="glibc's malloc")
def test_a_trainer_built_and_trained_leaves_the_allocator_alone(tmp_path):
    done, before, after = probe("train", tmp_path)
    assert done == "trained"
    assert before > 10_000 and after > 10_000  # glibc's own behaviour, before training and after it
