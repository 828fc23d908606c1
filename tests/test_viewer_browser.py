"""The rollout tree viewer in a real browser: headless Chromium (Debian's `chromium`) driven by Playwright, on the page
made from a real two-turn run of tiny models. Skips with one line when chromium or playwright is missing, unless
TRL_MULTIAGENT_REQUIRE_BROWSER_TESTS=1 (`.ci/run` sets it). With TRL_MULTIAGENT_UPDATE_SCREENSHOTS=1 the screenshots
go to docs/img/ (the README's and docs/viewer.md's); otherwise to a temporary folder."""

import itertools
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import SEED_PROMPTS, length_feedback, length_ratio_reward, skipped_browser_tests
from datasets import Dataset

from trl_multiagent import MAGRPOConfig, MAGRPOTrainer
from trl_multiagent.demo.testing import make_model
from trl_multiagent.trees import read_step, step_files
from trl_multiagent.view import write_page


REQUIRE = "TRL_MULTIAGENT_REQUIRE_BROWSER_TESTS"
ROOT = Path(__file__).resolve().parent.parent


def chromium_path() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.fixture
def browser(shared_browser):
    """The module's browser; a skip is counted for the run's summary line (conftest.py) once per test."""
    if isinstance(shared_browser, str):
        skipped_browser_tests.append(shared_browser)
        pytest.skip(shared_browser)
    return shared_browser


@pytest.fixture(scope="module")
def shared_browser():
    missing = []
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        missing.append('playwright (pip install -e ".[test]")')
    if chromium_path() is None:
        missing.append("chromium (apt-get install -y chromium)")
    if missing:
        message = f"browser tests need {' and '.join(missing)}"
        if os.environ.get(REQUIRE) == "1":
            pytest.fail(f"{REQUIRE}=1 and the {message}.", pytrace=False)
        yield message  # `browser` skips each test with it
        return
    with sync_playwright() as playwright:
        # --no-sandbox: Chromium's own sandbox needs user namespaces, which containers (CI, root) often lack
        browser = playwright.chromium.launch(executable_path=chromium_path(), args=["--no-sandbox"])
        yield browser
        browser.close()


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    from trl_multiagent.demo.testing import make_tokenizer

    tokenizer = make_tokenizer()
    output = tmp_path_factory.mktemp("viewer") / "run"
    trainer = MAGRPOTrainer(
        model=[make_model(tokenizer, seed=i) for i in range(2)],
        processing_class=tokenizer,
        reward_funcs=length_ratio_reward,
        external_transition=length_feedback,
        train_dataset=Dataset.from_dict({"prompt": SEED_PROMPTS[:4]}),
        args=MAGRPOConfig(
            output_dir=str(output), num_turns=2, num_generations=4, per_device_train_batch_size=8,
            max_new_tokens=12, max_steps=3, logging_steps=1, report_to="none", seed=0, save_strategy="no",
            early_termination_threshold=None, log_rollout_trees=True,
        ),
    )  # fmt: skip
    trainer.train()
    trainer.save_state()
    return output


THRESHOLD = 0.5


def turn_reward(completions1, completions2, *, turn, trainer_state):
    """Turn 2 scores above THRESHOLD (1 to 2), turn 1 at most THRESHOLD (a node of it goes on), except at step 2,
    where every turn-1 joint action scores 1: every node ends early, and turn 2 never runs in that step."""
    ratios = length_ratio_reward(completions1, completions2)
    if turn == 2:
        return [1.0 + r for r in ratios]
    if trainer_state.global_step == 1:  # generating for step 2
        return [1.0] * len(ratios)
    return [THRESHOLD * r for r in ratios]


@pytest.fixture(scope="module")
def ended_run_dir(tmp_path_factory):
    """Three steps of two turns with early_termination_threshold=THRESHOLD: turn 2 scores above it at steps 1 and 3,
    and at step 2 every root ends early (no turn 2)."""
    from trl_multiagent.demo.testing import make_tokenizer

    tokenizer = make_tokenizer()
    output = tmp_path_factory.mktemp("viewer_ended") / "run"
    trainer = MAGRPOTrainer(
        model=[make_model(tokenizer, seed=i) for i in range(2)],
        processing_class=tokenizer,
        reward_funcs=turn_reward,
        external_transition=length_feedback,
        train_dataset=Dataset.from_dict({"prompt": SEED_PROMPTS[:2]}),
        args=MAGRPOConfig(
            output_dir=str(output), num_turns=2, num_generations=2, per_device_train_batch_size=2,
            max_new_tokens=6, max_steps=3, logging_steps=1, report_to="none", seed=0, save_strategy="no",
            early_termination_threshold=THRESHOLD, log_rollout_trees=True,
        ),
    )  # fmt: skip
    trainer.train()
    trainer.save_state()
    return output


def screenshot_path(tmp_path, name: str) -> Path:
    folder = ROOT / "docs" / "img" if os.environ.get("TRL_MULTIAGENT_UPDATE_SCREENSHOTS") == "1" else tmp_path
    return folder / name


def open_page(browser, url: str):
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.set_default_timeout(10_000)
    errors, remote = [], []
    page.on("pageerror", lambda error: errors.append(str(error)))

    def only_local(route):  # the page must need no network: any http(s) request is refused and counted
        if route.request.url.startswith(("file:", "data:", "http://127.0.0.1")):
            return route.continue_()
        remote.append(route.request.url)
        return route.abort()

    page.route("**/*", only_local)
    page.goto(url)
    page.wait_for_selector("body[data-ready='1']")
    return page, errors, remote


def as_shown(text: str) -> str:
    """A text as the page shows it: control characters but tab and newline as \\xNN (HTML would drop them)."""
    return re.sub(r"[\x00-\x08\x0b-\x1f\x7f]", lambda m: f"\\x{ord(m.group()):02x}", text)


def panel_values(page, selector: str) -> list[float]:
    return [float(v) for v in page.eval_on_selector_all(selector, "els => els.map(e => e.dataset.value)")]


def test_a_node_shows_its_completions_rewards_advantages_and_siblings(browser, run_dir, tmp_path):
    page_file = write_page(str(run_dir))
    page, errors, remote = open_page(browser, Path(page_file).as_uri())
    files = step_files(str(run_dir))
    last = max(files)
    document = read_step(files[last])
    assert page.input_value("#step") == str(last)  # opens on the newest step

    nodes = document["prompts"][0]["nodes"]
    target = 2  # a turn-2 node: child of the root's joint action 1
    assert nodes[target]["turn"] == 2 and nodes[target]["parent"] == {"node": 0, "action": 1}
    page.click(f"#tree .node[data-node='{target}']")
    node = nodes[target]
    shown = page.eval_on_selector_all("#panel .completion pre.text", "els => els.map(e => e.textContent)")
    expected = [
        as_shown(node["agents"][i]["completions"][k]["text"])
        for a in node["actions"]
        for i, k in enumerate(a["choice"])
    ]
    assert shown == expected and len(set(expected)) > 1
    assert panel_values(page, "#panel .action > .nums .reward") == [a["reward"] for a in node["actions"]]
    assert panel_values(page, "#panel .action > .nums .return") == [a["return"] for a in node["actions"]]
    advantages = [
        node["agents"][i]["completions"][k]["advantage"] for a in node["actions"] for i, k in enumerate(a["choice"])
    ]
    assert panel_values(page, "#panel .completion .advantage") == advantages
    assert any(abs(a) > 0.1 for a in advantages)
    # the displayed numbers, as a reader sees them
    first_reward = page.inner_text("#panel .action[data-action='0'] > .nums .reward b")
    assert first_reward == f"{node['actions'][0]['reward']:.4f}"
    # the siblings: the root's four children, the clicked one marked
    siblings = page.eval_on_selector_all("#panel .siblings button", "els => els.map(e => Number(e.dataset.goto))")
    assert siblings == [a["child"] for a in nodes[0]["actions"]] == [1, 2, 3, 4]
    assert page.get_attribute("#panel .siblings button.current", "data-goto") == str(target)

    # the turn summary holds the logged per-turn mean reward of the step (trainer_state.json)
    logged = next(
        e
        for e in json.loads((run_dir / "trainer_state.json").read_text())["log_history"]
        if e.get("step") == last and "turn_2/reward_mean" in e
    )
    for turn in (1, 2):
        assert panel_values(page, f"#turns tr[data-turn='{turn}'] .mean-reward")[0] == pytest.approx(
            logged[f"turn_{turn}/reward_mean"], abs=1e-6
        )
    page.screenshot(path=str(screenshot_path(tmp_path, "viewer.png")), full_page=True)

    # the step picker changes the tree: step 1's texts and rewards
    page.select_option("#step", "1")
    page.click(f"#tree .node[data-node='{target}']")
    first = read_step(files[1])["prompts"][0]["nodes"][target]
    shown = page.eval_on_selector_all("#panel .completion pre.text", "els => els.map(e => e.textContent)")
    assert shown == [
        as_shown(first["agents"][i]["completions"][k]["text"])
        for a in first["actions"]
        for i, k in enumerate(a["choice"])
    ]
    assert shown != expected
    assert panel_values(page, "#panel .action > .nums .reward") == [a["reward"] for a in first["actions"]]

    # the prompt picker: the second prompt's root
    page.select_option("#prompt", "1")
    root = read_step(files[1])["prompts"][1]["nodes"][0]
    assert page.eval_on_selector_all("#panel .completion pre.text", "els => els.map(e => e.textContent)")[
        0
    ] == as_shown(root["agents"][0]["completions"][0]["text"])

    # a point of the reward curve opens its step
    page.locator(f"#curve .pt[data-step='{last}']").last.click()  # the top one of the series' points at that step
    assert page.input_value("#step") == str(last)
    assert errors == [] and remote == []


def test_served_on_localhost(browser, run_dir, tmp_path):
    out = tmp_path / "page.html"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}  # this checkout's package, whichever copy is installed
    server = subprocess.Popen(
        [sys.executable, "-m", "trl_multiagent.view", str(run_dir), "--out", str(out), "--serve", "--port", "0"],
        stdout=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    try:
        lines = [server.stdout.readline(), server.stdout.readline()]
        url = lines[1].split()[1]
        assert lines[0].startswith("Wrote ") and url.startswith("http://127.0.0.1:"), lines
        page, errors, remote = open_page(browser, url)
        assert page.eval_on_selector_all("#tree .node", "els => els.length") == 5  # 1 + 4 nodes per prompt
        assert errors == [] and remote == []
    finally:
        server.terminate()
        server.wait(timeout=10)


def test_statistics_of_a_step_match_its_tree(run_dir):
    """The recorded tree of the run the browser sees: a node's mean return is the mean of its joint actions'."""
    document = read_step(step_files(str(run_dir))[1])
    root = document["prompts"][0]["nodes"][0]
    children = [document["prompts"][0]["nodes"][a["child"]] for a in root["actions"]]
    for action, child in zip(root["actions"], children, strict=True):
        assert action["return"] == pytest.approx(
            action["reward"] + statistics.mean(c["return"] for c in child["actions"])
        )


def logged(run_dir: Path, step: int) -> dict:
    return next(
        e
        for e in json.loads((run_dir / "trainer_state.json").read_text())["log_history"]
        if e.get("step") == step and "reward" in e
    )


def test_a_last_turn_node_did_not_end_early(browser, ended_run_dir):
    """A node of the last turn is not 'ended early', whatever its reward: not in the record, not in
    turn_2/terminated_frac, not on the page; a turn-1 node above the threshold still is, in all three."""
    files = step_files(str(ended_run_dir))
    page, errors, remote = open_page(browser, Path(write_page(str(ended_run_dir))).as_uri())
    for step in (1, 3):
        nodes = read_step(files[step])["prompts"][0]["nodes"]
        last = [n for n in nodes if n["turn"] == 2]
        assert len(last) == 2 and all(statistics.mean(a["reward"] for a in n["actions"]) > THRESHOLD for n in last)
        assert not any(n["terminated"] for n in nodes)
        assert logged(ended_run_dir, step)["turn_2/terminated_frac"] == 0.0
        page.select_option("#step", str(step))
        assert page.eval_on_selector_all("#tree .node.terminated", "els => els.length") == 0
        for node in last:
            page.click(f"#tree .node[data-node='{node['id']}']")
            assert page.inner_text("#panel h2").startswith(f"Node {node['id']} · turn 2")
            assert page.eval_on_selector_all("#panel .ended", "els => els.length") == 0
    # step 2: the root ended early (turn 1 of 2, mean reward 1 > THRESHOLD), and says so
    nodes = read_step(files[2])["prompts"][0]["nodes"]
    assert [(n["turn"], n["terminated"]) for n in nodes] == [(1, True)]
    step_2 = logged(ended_run_dir, 2)
    assert step_2["turn_1/terminated_frac"] == 1.0 and "turn_2/reward_mean" not in step_2
    page.select_option("#step", "2")
    assert page.eval_on_selector_all("#tree .node.terminated", "els => els.length") == 1
    assert page.inner_text("#panel .ended") == "ended early (mean reward above the threshold)"
    assert page.inner_text("#threshold") == str(THRESHOLD)
    assert errors == [] and remote == []


def test_the_reward_curve_breaks_where_a_turn_did_not_run(browser, ended_run_dir):
    page, errors, remote = open_page(browser, Path(write_page(str(ended_run_dir))).as_uri())
    segments = page.eval_on_selector_all(
        "#curve .segment", "els => els.map(e => [e.dataset.series, e.tagName, e.dataset.steps])"
    )
    # turn 2 ran at steps 1 and 3 only: two lone points, no line across step 2; `reward` has every step
    assert [s for s in segments if s[0] == "turn_2/reward_mean"] == [
        ["turn_2/reward_mean", "circle", "1"],
        ["turn_2/reward_mean", "circle", "3"],
    ]
    assert ["reward", "polyline", "1 2 3"] in segments and ["turn_1/reward_mean", "polyline", "1 2 3"] in segments
    # labelled axes with ticks: every step, and round reward values spanning the logged ones
    assert page.eval_on_selector_all("#curve .xtick", "els => els.map(e => e.textContent)") == ["1", "2", "3"]
    yticks = [float(v) for v in page.eval_on_selector_all("#curve .ytick", "els => els.map(e => e.textContent)")]
    values = [
        v for s in (1, 2, 3) for k, v in logged(ended_run_dir, s).items() if k.endswith("reward_mean") or k == "reward"
    ]
    assert len(yticks) >= 4 and min(values) <= yticks[0] and yticks[-1] <= max(values)
    assert len({round(b - a, 9) for a, b in itertools.pairwise(yticks)}) == 1  # evenly spaced
    assert page.eval_on_selector_all("#curve .axistitle", "els => els.map(e => e.textContent)") == [
        "training step",
        "mean joint reward",
    ]
    assert errors == [] and remote == []


STOPS = [(215, 48, 39), (254, 224, 139), (26, 152, 80)]


def expected_colour(value: float, lo: float, hi: float) -> str:
    """The page's colour scale, by hand: red at lo, yellow halfway, green at hi."""
    t = max(0.0, min(1.0, (value - lo) / (hi - lo))) * 2
    i = min(1, int(t))
    f = t - i
    a, b = STOPS[i], STOPS[i + 1]
    return "rgb(" + ",".join(str(round(x + (y - x) * f + 1e-9)) for x, y in zip(a, b, strict=True)) + ")"


def test_colours_show_the_mean_joint_reward_and_the_legend_says_how_to_read_them(browser, run_dir):
    page, errors, remote = open_page(browser, Path(write_page(str(run_dir))).as_uri())
    files = step_files(str(run_dir))
    document = read_step(files[max(files)])
    nodes = document["prompts"][0]["nodes"]
    actions = [a for p in document["prompts"] for n in p["nodes"] for a in n["actions"]]

    def shown(key):
        lo, hi = min(a[key] for a in actions), max(a[key] for a in actions)
        assert (page.inner_text("#lo"), page.inner_text("#hi")) == (f"{lo:.4f}", f"{hi:.4f}")
        for node in nodes:
            value = statistics.mean(a[key] for a in node["actions"])
            selector = f"#tree .node[data-node='{node['id']}']"
            assert page.get_attribute(f"{selector} circle.body", "fill") == expected_colour(value, lo, hi)
            # under the node: the coloured value first, the other beside it
            labels = page.eval_on_selector_all(f"{selector} .value", "els => els.map(e => e.dataset.key)")
            assert labels == [key, "return" if key == "reward" else "reward"]
        return [page.get_attribute(f"#tree .node[data-node='{n['id']}'] circle.body", "fill") for n in nodes]

    # by default the mean joint reward, which turn-1 returns (reward + future) would dwarf
    assert page.input_value("#measure") == "reward" and page.inner_text("#measurename") == "joint reward"
    by_reward = shown("reward")
    page.select_option("#measure", "return")
    assert page.inner_text("#measurename") == "return"
    assert shown("return") != by_reward
    # the legend: colours, returns (why above the rewards), the joint action's indices, the dashed ring
    legend = {key: page.inner_text(f"#legend-{key}") for key in ("colour", "return", "action", "ended")}
    assert "red the step's lowest" in legend["colour"] and "green the" in legend["colour"]
    assert "Return = reward + discount (1) × the mean return" in legend["return"]
    assert document["discount"] == 1.0
    assert "joint action j (a, b): the node's j-th joint action, made of completion a of agent 0" in legend["action"]
    assert "before the last turn" in legend["ended"]
    # the panel's joint action titles use those indices: joint action j (choice of each agent)
    page.click("#tree .node[data-node='0']")
    titles = page.eval_on_selector_all("#panel .action h3 > span:first-child", "els => els.map(e => e.textContent)")
    assert titles == [
        f"joint action {j} ({a['choice'][0]}, {a['choice'][1]})" for j, a in enumerate(nodes[0]["actions"])
    ]
    assert errors == [] and remote == []


def test_a_clicked_node_opens_where_the_reader_looks(browser, run_dir):
    """The panel starts below the fold (the tree and the side cards above it): a click on a node scrolls it into the
    window, its heading at the top or, for a short panel, the whole panel shown; a click in a panel already in view
    (a sibling) leaves the page where it is."""
    page, errors, remote = open_page(browser, Path(write_page(str(run_dir))).as_uri())

    def panel_box() -> tuple[float, float, float]:
        return tuple(page.evaluate("[...['top', 'bottom'].map(k => panel.getBoundingClientRect()[k]), innerHeight]"))

    def settled_scroll() -> float:  # smooth scrolling: the position once it stops moving
        positions = [-1.0, page.evaluate("scrollY")]
        while positions[-1] != positions[-2]:
            page.wait_for_timeout(200)
            positions.append(page.evaluate("scrollY"))
        return positions[-1]

    top, bottom, height = panel_box()
    # before the click, at most the heading's line shows at the window's bottom edge (else the test shows nothing)
    assert top > 0.9 * height and bottom > height and page.evaluate("scrollY") == 0
    page.click("#tree .node[data-node='2']")
    scrolled = settled_scroll()
    assert page.inner_text("#panel h2").startswith("Node 2 · turn 2")
    top, bottom, height = panel_box()
    assert scrolled > 0 and 0 <= top and (top < 2 or bottom <= height)
    page.evaluate("scrollBy(0, -10)")  # the reader scrolls a little: the panel stays in view, off its scrolled place
    scrolled = settled_scroll()
    page.click("#panel .siblings button[data-goto='3']")
    assert page.inner_text("#panel h2").startswith("Node 3 · turn 2")
    assert settled_scroll() == scrolled
    assert errors == [] and remote == []
