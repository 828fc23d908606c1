"""`reuse_freed_memory`, the opt-in allocator setting, read from glibc's own accounting (`mallinfo2`): after it, a
64 MiB tensor comes from the heap instead of its own `mmap`, and its memory stays in the heap, free, to serve the next
one, as its docstring promises; a trainer built and trained without it leaves glibc's malloc as it was; a user's
setting of the allocator is left alone. Each case runs in a fresh subprocess: the setting changes the process's
malloc for good (and the suite's own process has it, tests/conftest.py)."""

import ctypes
import os
import platform
import subprocess
import sys
import textwrap

import pytest


def has_mallinfo2() -> bool:
    """glibc 2.33 or later: the accounting these tests read."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    return hasattr(ctypes.CDLL(None), "mallinfo2")


pytestmark = pytest.mark.skipif(not has_mallinfo2(), reason="glibc's malloc, 2.33 or later (mallinfo2)")

MIB = 2**20

# Prints one line per event, after `malloc`: what glibc holds (main heap, mmapped chunks, free bytes in the heap), in bytes.
PROBE = textwrap.dedent(
    """
    import ctypes, sys, torch
    from trl_multiagent.devices import reuse_freed_memory

    class MallInfo2(ctypes.Structure):  # glibc >= 2.33's struct mallinfo2
        _fields_ = [(name, ctypes.c_size_t) for name in (
            "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]

    libc = ctypes.CDLL(None)
    libc.mallinfo2.restype = MallInfo2

    def show(event):
        info = libc.mallinfo2()
        print("malloc", event, info.arena, info.hblkhd, info.fordblks)

    def cycle(name):
        # a 64 MiB tensor, as large as a chunk's logits in the update, held and then freed
        show(name + ":before")
        tensor = torch.ones(16 * 1024 * 1024)
        show(name + ":held")
        del tensor
        show(name + ":freed")

    if sys.argv[1] == "train":  # a user's training without the setting: the trainer must leave the allocator alone
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
    cycle("without")
    print("malloc", "done", reuse_freed_memory())
    cycle("with")
    cycle("again")
    """
)


def probe(mode: str, output_dir="unused", **env) -> tuple[str, dict[str, tuple[int, int, int]]]:
    """What `reuse_freed_memory` returned, and event -> (heap, mmapped, free in the heap) in bytes."""
    environment = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "GLIBC_TUNABLES"}
    out = subprocess.run(
        [sys.executable, "-c", PROBE, mode, str(output_dir)], capture_output=True, text=True,
        env={**environment, **env}, timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    lines = [line.split()[1:] for line in out.stdout.splitlines() if line.startswith("malloc ")]  # not the trainer's
    done = next(" ".join(words[1:]) for words in lines if words[0] == "done")
    return done, {words[0]: tuple(map(int, words[1:])) for words in lines if ":" in words[0]}


def assert_glibcs_own_behaviour(events, name):
    """glibc's default: a 64 MiB block is its own `mmap`, unmapped when freed; the heap does not take it."""
    before, held, freed = (events[f"{name}:{event}"] for event in ("before", "held", "freed"))
    assert held[1] - before[1] >= 64 * MIB, (name, before, held)
    assert freed[1] - before[1] < MIB, (name, before, freed)
    assert (held[0] - held[2]) - (before[0] - before[2]) < 64 * MIB, (name, before, held)  # not in the heap


def assert_reused(events):
    """The opt-in's promise: large blocks come from the heap, and a freed block stays there for the next request."""
    before, held, freed = (events[f"with:{event}"] for event in ("before", "held", "freed"))
    assert held[1] - before[1] < MIB, (before, held)  # no mmapped chunk for it
    assert (held[0] - held[2]) - (before[0] - before[2]) >= 64 * MIB, (before, held)  # in use in the heap
    assert freed[0] == held[0] and freed[2] - held[2] >= 64 * MIB, (held, freed)  # not trimmed: free in the heap
    again_held, again_freed = events["again:held"], events["again:freed"]
    assert again_held[0] == freed[0] and again_held[1] - freed[1] < MIB, (freed, again_held)  # served from the heap
    assert again_freed[0] == freed[0], (freed, again_freed)


def test_a_trainer_leaves_the_allocator_alone_and_the_opt_in_reuses_freed_memory(tmp_path):
    done, events = probe("train", tmp_path)
    assert_glibcs_own_behaviour(events, "without")  # after a trainer was built and trained
    assert done == "set"
    assert_reused(events)


def test_a_user_setting_of_the_allocator_is_left_alone():
    done, events = probe("set", MALLOC_MMAP_MAX_="65536")  # glibc's default value, set by the user
    assert done == "left as set by MALLOC_MMAP_MAX_"
    for name in ("without", "with", "again"):
        assert_glibcs_own_behaviour(events, name)
