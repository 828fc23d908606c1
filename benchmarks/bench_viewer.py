"""How large a recorded tree `python -m trl_multiagent.view` handles: synthetic steps of growing trees, drawn in headless
Chromium (Debian's `chromium`, driven by Playwright), timing what a user waits for.

    python benchmarks/bench_viewer.py            # a table: tree size, page size, open, click a node, switch prompt

Each step has `prompts` prompts, 2 agents, K completions of `chars` characters per agent and node, `turns` turns with
every joint action continued (K**t nodes at turn t+1): 1 + K + K**2 + ... nodes per prompt. Times are the median of
5 tries, in milliseconds, the DOM update and its layout included (a forced reflow ends each timing).
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import tempfile
import time

from trl_multiagent.trees.record import FORMAT_VERSION
from trl_multiagent.trees.store import write_step
from trl_multiagent.view import write_page


def synthetic_step(step: int, prompts: int, k: int, turns: int, chars: int, seed: int = 0) -> dict:
    rng = random.Random(seed + step)
    text = lambda: "".join(rng.choice("abcdefgh ") for _ in range(chars))  # noqa: E731
    records = []
    for row in range(prompts):
        nodes = [{"id": 0, "turn": 1, "parent": None}]
        frontier = [0]
        for turn in range(2, turns + 1):
            nxt = []
            for parent in frontier:
                for j in range(k):
                    nodes.append({"id": len(nodes), "turn": turn, "parent": {"node": parent, "action": j}})
                    nxt.append(len(nodes) - 1)
            frontier = nxt
        children = {(n["parent"]["node"], n["parent"]["action"]): n["id"] for n in nodes if n["parent"]}
        for node in nodes:
            node["terminated"] = False
            node["agents"] = [
                {
                    "prompt": text(),
                    "prompt_tokens": chars // 4,
                    "completions": [
                        {
                            "text": text(),
                            "tokens": chars // 4,
                            "truncated": False,
                            "advantage": rng.gauss(0, 1),
                            "return": rng.random(),
                        }  # fmt: skip
                        for _ in range(k)
                    ],
                }
                for _ in range(2)
            ]
            node["actions"] = [
                {
                    "choice": [j, j],
                    "reward": (r := rng.random()),
                    "rewards": {"f": r},
                    "return": r + rng.random(),
                    "pruned": False,
                    "child": children.get((node["id"], j)),
                }  # fmt: skip
                for j in range(k)
            ]
        records.append({"process": 0, "row": row, "nodes": nodes})
    return {
        "format_version": FORMAT_VERSION, "step": step, "time": time.time(), "num_agents": 2, "num_generations": k,
        "num_turns": turns, "reward_names": ["f"], "max_text_chars": 2000, "prompts": records,
    }  # fmt: skip


TIMED = """([selector, event]) => {
  const times = [];
  for (let i = 0; i < 5; i++) {
    const t = performance.now();
    const el = document.querySelector(selector);
    if (event === 'change') { el.value = el.options[(el.selectedIndex + 1) % el.options.length].value; el.dispatchEvent(new Event('change')); }
    else el.dispatchEvent(new MouseEvent('click', {bubbles: true}));
    document.body.offsetHeight;  // layout now, inside the timing
    times.push(performance.now() - t);
  }
  times.sort((a, b) => a - b);
  return times[2];
}"""


def measure(browser, k, turns, prompts, steps, chars):
    folder = tempfile.mkdtemp()
    try:
        for step in range(1, steps + 1):
            write_step(os.path.join(folder, "rollout_trees"), synthetic_step(step, prompts, k, turns, chars))
        page_file = write_page(folder)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        start = time.perf_counter()
        page.goto("file://" + page_file)
        page.wait_for_selector("body[data-ready='1']", timeout=120_000)
        opened = (time.perf_counter() - start) * 1000
        nodes = page.eval_on_selector_all("#tree .node", "els => els.length")
        click = page.evaluate(TIMED, [f"#tree .node[data-node='{nodes - 1}']", "click"])
        prompt = page.evaluate(TIMED, ["#prompt", "change"])
        step = page.evaluate(TIMED, ["#step", "change"])
        page.close()
        return nodes, os.path.getsize(page_file) / 1e6, opened, click, prompt, step
    finally:
        shutil.rmtree(folder)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--chars", type=int, default=300)
    args = parser.parse_args()
    from playwright.sync_api import sync_playwright

    sizes = [(4, 2), (4, 3), (8, 3), (4, 4), (16, 3), (8, 4), (4, 5), (4, 6)]
    print(f"{args.prompts} prompts per step, {args.steps} steps, 2 agents, {args.chars} characters per text")
    print(
        "| K | turns | nodes per prompt | page MB | open (ms) | click a node (ms) | switch prompt (ms) | switch step (ms) |"
    )
    print("|---|---|---|---|---|---|---|---|")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=shutil.which("chromium"), args=["--no-sandbox"])
        for k, turns in sizes:
            nodes, mb, opened, click, prompt, step = measure(browser, k, turns, args.prompts, args.steps, args.chars)
            print(
                f"| {k} | {turns} | {nodes} | {mb:.1f} | {opened:.0f} | {click:.1f} | {prompt:.1f} | {step:.1f} |",
                flush=True,
            )
        browser.close()


if __name__ == "__main__":
    main()
