"""Runs CoMLRL 1.4.3's own examples (`examples/*.py`) and the Python code of its documentation pages
(`docs/content/docs/**/*.md`), from its PyPI sdist, through `trl_multiagent.comlrl`: each case in a fresh
interpreter, with `comlrl` replaced by `trl_multiagent.comlrl` in the imports and only the edits listed in `EDITS`
(tiny local models for Hub ids, tiny sizes, local data for Hub datasets, W&B off).

    python tests/comlrl_examples/run_comlrl_examples.py [--sdist PATH] [--subset all|ci] [-k TEXT] [--jobs N]
        [--workdir DIR] [--json FILE] [--list] [--list-edits] [--show CASE]

Cases:
- one per example script, run as a script (`__main__`) with the arguments of `ARGUMENTS`;
- one per section of a documentation page that has Python blocks (a section: the blocks under one heading, of any
  level; the blocks before a page's first heading are its section `top`). A case runs, in order, the blocks of the
  sections it needs (`SECTIONS`: on a tutorial page every earlier section; elsewhere the sections the table names),
  then its own, with the harness's context code (`SECTIONS`: what the page leaves to the reader) before them. Blocks
  that are not Python (bash, json, text) are counted and skipped, and so are the Python blocks listed in `FRAGMENTS`.

Each case's outcome is compared with `expected_failures.txt` (beside this file): a case not listed must pass; a listed
one must fail in the block it names with an error whose last line contains the text it gives. Exit status: 0 when
every outcome is the expected one, 1 otherwise, 2 for a usage or set-up error (the sdist missing, an edit that no
longer matches CoMLRL's text).

The sdist: `--sdist`, else `$COMLRL_SDIST`, else `~/.cache/trl_multiagent/comlrl_contract/sdist/comlrl-1.4.3.tar.gz`
(the contract harness's), downloaded there with `pip download --no-deps --no-binary :all: comlrl==1.4.3` when
missing. A `.tar.gz` or an unpacked sdist folder.
"""

from __future__ import annotations

import argparse
import ast
import fnmatch
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from trl_multiagent.demo.contract import OFFLINE_ENVIRONMENT as ENVIRONMENT
from trl_multiagent.demo.contract import say


HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
COMLRL_VERSION = "1.4.3"
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "trl_multiagent"
SDIST_ENV = "COMLRL_SDIST"
DEFAULT_SDIST = CACHE / "comlrl_contract" / "sdist" / f"comlrl-{COMLRL_VERSION}.tar.gz"
DEFAULT_WORKDIR = CACHE / "comlrl_examples"
EXPECTED_FILE = HERE / "expected_failures.txt"
CASES_FILE = HERE / "cases.txt"
DOCS_ROOT = Path("docs") / "content" / "docs"
CASE_TIMEOUT_S = 600
MARK = "[comlrl-examples] block"  # the line each case prints before each block: a failure's block is the last one


class HarnessError(Exception):
    """A usage or set-up error: the sdist is missing, or CoMLRL's text no longer matches an edit."""


# ---------------------------------------------------------------------------------------------------------------
# The edits: every change the harness makes to CoMLRL's text, and why. One table.
# ---------------------------------------------------------------------------------------------------------------

# The tiny local models that stand in for the Hub ids the cases name (built offline by trl_multiagent.demo.testing,
# saved with their tokenizer): two different ones, so that "heterogeneous agents" are two models.
MODEL_FOR_ID = {
    "Qwen/Qwen2.5-0.5B": "tiny-llama",
    "Qwen/Qwen2.5-1.5B": "tiny-llama",
    "Qwen/Qwen2.5-Coder-1.5B": "tiny-llama",
    "Qwen/Qwen2.5-Coder-3B": "tiny-llama",
    "Qwen/Qwen2.5-Coder-7B": "tiny-qwen2",
    "your-org/your-reward-model": "tiny-llama",
}
# A string literal shaped like a Hub id ("org/name") that MODEL_FOR_ID does not map: the harness refuses the case
# (a new model id in CoMLRL's text must be mapped here, not downloaded).
HUB_ID = re.compile(r"""(["'])([A-Za-z][\w-]*/[A-Za-z][\w.-]*)\1""")
LOCAL_DATASET = (
    'Dataset.from_dict({"prompt": ["Summarize: the cat sat on the mat all day.", "Summarize: a dragon wrote a '
    'bedtime story."]})'
)


@dataclass(frozen=True)
class Edit:
    name: str
    cases: tuple[str, ...]  # fnmatch patterns over case ids
    pattern: str  # a regular expression, applied to each line
    replacement: str  # re.sub's replacement ({model:NAME} is replaced by that tiny model's folder)
    why: str
    required: bool = True  # the pattern must match in some case it applies to (else CoMLRL's text changed)


EDITS: tuple[Edit, ...] = (
    Edit(
        "import",
        ("*",),
        r"^(\s*(?:from|import)\s+)comlrl(?=[\s.])",
        r"\1trl_multiagent.comlrl",
        "the one change a user makes: CoMLRL's package -> the face (flat or by CoMLRL's module paths)",
        required=False,
    ),
    *(
        Edit(
            "model",
            ("*",),
            rf"""(["']){re.escape(hub_id)}\1""",
            f"{{model:{model}}}",
            f"no Hub here: {hub_id} -> a tiny random local model ({model}: hidden 32, 2 layers, its tokenizer saved "
            "with it)",
            required=False,
        )
        for hub_id, model in MODEL_FOR_ID.items()
    ),
    Edit(
        "hub-dataset",
        ("examples/tldr-len-ratio.py",),
        r"^from datasets import load_dataset$",
        "from datasets import Dataset, load_dataset",
        "no Hub here: trl-lib/tldr -> two local prompts (Dataset imported for them)",
    ),
    Edit(
        "hub-dataset",
        ("examples/tldr-len-ratio.py",),
        r'load_dataset\("trl-lib/tldr", split="train"\)',
        LOCAL_DATASET,
        "no Hub here: trl-lib/tldr -> two local prompts",
    ),
    # sizes: one optimizer step or two, 8 new tokens, 2 generations
    Edit(
        "tiny",
        ("examples/story-len-ratio.py", "docs/examples/quick-start/length-ratio-training.md#*"),
        r"max_new_tokens=128",
        "max_new_tokens=8",
        "size: 8 new tokens",
    ),
    Edit(
        "tiny",
        ("examples/story-len-ratio.py", "docs/examples/quick-start/length-ratio-training.md#*"),
        r"num_generations=8",
        "num_generations=2",
        "size: 2 generations (CoMLRL's least)",
    ),
    Edit(
        "tiny",
        ("examples/story-len-ratio.py",),
        r"^(\s*train_dataset = Dataset\.from_dict\(train_data\))$",
        r"\1.select(range(2))",
        "size: 2 of the 32 prompts (one generation of CoMLRL's rollout_buffer_size=2)",
    ),
    Edit(
        "tiny",
        ("docs/examples/quick-start/length-ratio-training.md#*",),
        r"^(train_dataset = Dataset\.from_dict\(train_data\))$",
        r"\1.select(range(2))",
        "size: 2 of the 10 prompts",
    ),
    Edit(
        "tiny",
        ("docs/examples/quick-start/length-ratio-training.md#*",),
        r"num_train_epochs=3",
        "num_train_epochs=1",
        "size: 1 epoch",
    ),
    Edit(
        "tiny",
        ("examples/leetcode-func-print.py",),
        r"max_new_tokens=256",
        "max_new_tokens=8",
        "size: 8 new tokens",
    ),
    Edit(
        "tiny",
        ("examples/leetcode-func-print.py",),
        r"num_generations=4",
        "num_generations=2",
        "size: 2 generations",
    ),
    Edit(
        "tiny",
        ("examples/leetcode-func-print.py",),
        r"^(\s*train_dataset = create_code_dataset\(\))$",
        r"\1.select(range(2))",
        "size: 2 of the 4 tasks",
    ),
    Edit(
        "tiny",
        ("docs/examples/advanced/multi-turn-feedback.md#*", "docs/examples/advanced/resume-training.md#*"),
        r"num_generations=4",
        "num_generations=2",
        "size: 2 generations",
    ),
    Edit(
        "tiny",
        ("docs/examples/advanced/multi-turn-feedback.md#*", "docs/examples/advanced/resume-training.md#*"),
        r"max_new_tokens=64",
        "max_new_tokens=8",
        "size: 8 new tokens",
    ),
    Edit(
        "tiny",
        ("docs/examples/advanced/multi-turn-feedback.md#*", "docs/examples/advanced/resume-training.md#*"),
        r"^\}\)$",
        "}).select(range(1))",
        "size: 1 of the 4 prompts (so an epoch is one step; resume-training's epochs are kept)",
    ),
    Edit(
        "tiny",
        ("docs/examples/advanced/multi-turn-feedback.md#two-turn-training",),
        r"num_train_epochs=2",
        "num_train_epochs=1",
        "size: 1 epoch",
    ),
    Edit(
        "tiny",
        ("docs/user-guide/training-entities.md#training-from-saved-models",),
        r"num_train_epochs=3,",
        "num_train_epochs=1, num_generations=2, max_new_tokens=8,",
        "size: 1 epoch, 2 generations, 8 new tokens (the block leaves CoMLRL's 4 and 256)",
    ),
    Edit(
        "tiny",
        ("docs/user-guide/training-initialization.md#*",),
        r'^train_dataset = split\["train"\]$',
        'train_dataset = split["train"].select(range(2))',
        "size: 2 of the 8 training prompts",
    ),
    Edit(
        "tiny",
        ("docs/user-guide/training-initialization.md#training-and-evaluation",),
        r"num_generations=4",
        "num_generations=2",
        "size: 2 generations",
    ),
    Edit(
        "tiny",
        ("docs/user-guide/training-initialization.md#training-and-evaluation",),
        r"max_new_tokens=128",
        "max_new_tokens=8",
        "size: 8 new tokens",
    ),
)

# Command-line arguments of the example scripts: their own flags (the scripts parse them).
TINY_ARGS = ["--num-train-epochs", "1"]
ARGUMENTS = {
    "examples/story-len-ratio.py": TINY_ARGS,
    "examples/leetcode-func-print.py": TINY_ARGS,
    "examples/tldr-len-ratio.py": [*TINY_ARGS, "--dataset-size", "2", "--max-new-tokens", "8"],
}
ARGUMENTS_WHY = (
    "the script's own flags: 1 epoch (tldr: 2 rows, 8 new tokens); its --model-name default is edited (model)"
)

# Why each case runs in the environment it gets: offline, W&B off, one thread; this checkout's trl_multiagent.
ENVIRONMENT_WHY = (
    "offline (no Hub), W&B off (WANDB_MODE=disabled: a wandb_config the docs pass opens a disabled run), "
    "OMP_NUM_THREADS=1 unless set, PYTHONPATH = this checkout, each case in its own empty folder (the pages write "
    "./checkpoints, ./saved-models, ...)"
)

# Context the documentation leaves to the reader, and the sections a case needs. Harness code is written with
# CoMLRL's imports and Hub ids, so that it goes through the same edits as CoMLRL's text.
ENTITIES_CONTEXT = """\
from datasets import Dataset
from comlrl.trainers.reinforce import MAGRPOConfig, MAGRPOTrainer

train_dataset = Dataset.from_dict({"prompt": ["Describe a city in the clouds:"]})


def reward_func(completions1, completions2, completions3=None):
    # the page's reward_func is the reader's: one shared reward per joint answer (the length ratio)
    return [len(second) / max(len(first), 1) for first, second in zip(completions1, completions2)]
"""
ENTITIES_TRAINER = """
trainer = MAGRPOTrainer(
    agent_model="Qwen/Qwen2.5-1.5B",
    num_agents=2,
    reward_func=reward_func,
    train_dataset=train_dataset,
    args=MAGRPOConfig(num_agents=2, num_turns=1, num_train_epochs=1, num_generations=2, max_new_tokens=8),
)
"""
INITIALIZATION_TRAINER = """
from comlrl.trainers.reinforce import MAGRPOConfig, MAGRPOTrainer

trainer = MAGRPOTrainer(
    agent_model="Qwen/Qwen2.5-0.5B",
    num_agents=2,
    formatters=formatters,
    reward_func=reward_func,
    train_dataset=train_dataset,
    eval_dataset=eval_dataset,
    args=MAGRPOConfig(num_turns=1, num_train_epochs=1, num_generations=2, max_new_tokens=8),
    {keywords}
)
"""


@dataclass(frozen=True)
class Section:
    needs: tuple[str, ...] = ()  # sections of the same page whose blocks run first
    context: str = ""  # harness code before them
    epilogue: str = ""  # harness code after the section's blocks
    why: str = ""


TUTORIAL_PAGES = (  # each section needs every earlier one (the page is one script, read in order)
    "docs/examples/advanced/multi-turn-feedback.md",
    "docs/examples/advanced/resume-training.md",
    "docs/examples/quick-start/length-ratio-training.md",
)
INITIALIZATION = ("task-sets", "prompts-from-tasks", "rule-based-rewards")
SECTIONS = {
    "docs/user-guide/training-entities.md#homogeneous-agents": Section(
        context=ENTITIES_CONTEXT,
        epilogue="assert trainer.num_agents == 3 and len(trainer.agents) == 3, trainer.agents\n",
        why="the page's blocks use MAGRPOTrainer, reward_func and train_dataset it never defines; the epilogue checks "
        "the page's 'three agents' (CoMLRL's public trainer.agents)",
    ),
    "docs/user-guide/training-entities.md#heterogeneous-agents": Section(
        context=ENTITIES_CONTEXT,
        epilogue='assert [type(a).__name__ for a in trainer.agents] == ["LlamaForCausalLM", "Qwen2ForCausalLM"]\n',
        why="as above; the epilogue checks that the two ids gave two different models, in order (tiny-llama, "
        "tiny-qwen2)",
    ),
    "docs/user-guide/training-entities.md#centralized-critic": Section(
        context=ENTITIES_CONTEXT
        + "from transformers import AutoTokenizer\nfrom comlrl.trainers.actor_critic import MAACConfig, MAACTrainer\n",
        why="as above, and the MAAC names the block uses",
    ),
    "docs/user-guide/training-entities.md#independent-critics": Section(
        context=ENTITIES_CONTEXT
        + "from transformers import AutoTokenizer\nfrom comlrl.trainers.actor_critic import IACConfig, IACTrainer\n",
        why="as above, and the IAC names the blocks use",
    ),
    "docs/user-guide/training-entities.md#llm-reward-models": Section(context=ENTITIES_CONTEXT, why="as above"),
    "docs/user-guide/training-entities.md#saving-models": Section(
        context=ENTITIES_CONTEXT + ENTITIES_TRAINER, why="`trainer`: a tiny two-agent MAGRPOTrainer"
    ),
    "docs/user-guide/training-entities.md#training-from-saved-models": Section(
        needs=("saving-models",),
        context=ENTITIES_CONTEXT + ENTITIES_TRAINER,
        why="the folders ./saved-models/run-1/agent_i that 'Saving Models' writes",
    ),
    "docs/user-guide/training-entities.md#training-state": Section(
        context=ENTITIES_CONTEXT
        + ENTITIES_TRAINER
        + "resumed_trainer = trainer\nwandb_config = {'project': 'comlrl-examples'}\n",
        why="`trainer`, `resumed_trainer` (the block recreates it: the same trainer here) and `wandb_config`",
    ),
    "docs/user-guide/training-initialization.md#rule-based-rewards": Section(
        needs=INITIALIZATION[:2], why="the task set and formatters of the sections before"
    ),
    "docs/user-guide/training-initialization.md#training-and-evaluation": Section(
        needs=INITIALIZATION, why="the task set, formatters and reward of the sections before"
    ),
    "docs/user-guide/training-initialization.md#weights-biases": Section(
        needs=INITIALIZATION,
        epilogue=INITIALIZATION_TRAINER.format(keywords="wandb_config=wandb_config,") + "trainer.train()\n",
        why="the block's comment: 'Add this keyword when constructing MAGRPOTrainer' (a tiny trainer, trained)",
    ),
    "docs/user-guide/training-initialization.md#custom-metrics": Section(
        needs=INITIALIZATION,
        epilogue=INITIALIZATION_TRAINER.format(keywords="eval_logger=eval_logger, eval_aggregator=eval_aggregator,")
        + "metrics = trainer.evaluate(num_eval_samples=len(eval_dataset))\n"
        + 'assert "eval/turn_1/response_chars" in metrics, sorted(metrics)\n',
        why="the block's comment: 'Add both keywords when constructing MAGRPOTrainer', and the text after it: "
        "'The resulting dictionary includes eval/turn_1/response_chars'",
    ),
    "docs/user-guide/training-initialization.md#local-metrics": Section(
        needs=(*INITIALIZATION, "training-and-evaluation"), why="the trainer of 'Training and Evaluation'"
    ),
}

# Python blocks not run, with why: IAC/MAAC fragments whose names the page never binds.
FRAGMENTS = {
    ("docs/user-guide/training-initialization.md", "training-and-evaluation", 2): (
        "IAC/MAAC only: `ac_trainer` is 'an existing IACTrainer or MAACTrainer', which the page never builds"
    ),
    ("docs/user-guide/training-initialization.md", "custom-metrics", 2): (
        "IAC/MAAC only: `metrics_callback` is for IACTrainer(...) or MAACTrainer(...), which the page never builds"
    ),
}


def edits_in_words() -> list[str]:
    """Every change the harness makes, one line each (`--list-edits`; the table of tests/comlrl_examples/README.md)."""
    lines = [f"{e.name}: {', '.join(e.cases)}: /{e.pattern}/ -> {e.replacement!r}: {e.why}" for e in EDITS]
    lines += [f"arguments: {case}: {' '.join(argv)}: {ARGUMENTS_WHY}" for case, argv in ARGUMENTS.items()]
    lines.append(f"environment: {', '.join(f'{k}={v}' for k, v in ENVIRONMENT.items())}: {ENVIRONMENT_WHY}")
    for case, section in SECTIONS.items():
        parts = [f"needs {', '.join(section.needs)}"] if section.needs else []
        parts += ["context code"] if section.context else []
        parts += ["epilogue code"] if section.epilogue else []
        lines.append(f"sections: {case}: {'; '.join(parts)}: {section.why}")
    lines += [f"tutorial page (each section needs the earlier ones): {page}" for page in TUTORIAL_PAGES]
    lines += [f"fragment not run: {page}#{section} block {n}: {why}" for (page, section, n), why in FRAGMENTS.items()]
    return lines


# ---------------------------------------------------------------------------------------------------------------
# The sdist and the cases
# ---------------------------------------------------------------------------------------------------------------


def sdist_source(given: Path | None = None) -> Path:
    """The sdist given (`--sdist`, else $COMLRL_SDIST, else the default cache path)."""
    return Path(given or os.environ.get(SDIST_ENV) or DEFAULT_SDIST)


def download_sdist(target: Path = DEFAULT_SDIST) -> Path:
    target.parent.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:"]
    command += [f"comlrl=={COMLRL_VERSION}", "-d", str(target.parent)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    if done.returncode != 0 or not target.exists():
        raise HarnessError(f"could not download CoMLRL's sdist ({' '.join(command)}): {done.stderr[-1500:]}")
    return target


def unpacked_sdist(source: Path, workdir: Path, download: bool = True) -> Path:
    """The folder of the unpacked sdist (holding examples/ and docs/content/docs/), downloading the default sdist
    when it is missing and `download` is set."""
    if not source.exists():
        if not (download and source == DEFAULT_SDIST):
            raise HarnessError(
                f"CoMLRL {COMLRL_VERSION}'s sdist is missing at {source} (set {SDIST_ENV} to the .tar.gz or its "
                f"unpacked folder, or leave it unset to download it with pip into {DEFAULT_SDIST})"
            )
        download_sdist(source)
    if source.is_file():
        root = workdir / "source" / source.name.removesuffix(".tar.gz")
        if not (root / "examples").is_dir():
            shutil.rmtree(root, ignore_errors=True)
            with tarfile.open(source) as archive:
                archive.extractall(root.parent, filter="data")
        source = root
    if not (source / "examples").is_dir() or not (source / DOCS_ROOT).is_dir():
        raise HarnessError(f"{source} holds no CoMLRL examples/ and {DOCS_ROOT}/: give CoMLRL's sdist or its folder")
    return source


@dataclass
class Block:
    section: str  # the slug of its section
    number: int  # 1-based, within its section
    language: str
    code: str
    line: int  # of the opening fence, in the page


@dataclass
class Case:
    id: str
    path: Path  # the example script or the page
    page: str = ""  # docs cases: the page's id (docs/...md)
    section: str = ""
    title: str = ""
    sections: dict[str, list[Block]] = field(default_factory=dict)  # docs: the page's Python blocks by section


HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*(?:\{#([\w-]+)\})?\s*$")
FENCE = re.compile(r"^```\s*([\w+-]*)")


def slug(title: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-")


def read_page(path: Path) -> tuple[dict[str, str], list[Block]]:
    """A page's sections (slug -> title, in order) and every fenced block, Python or not."""
    titles, blocks = {"top": "(before the first heading)"}, []
    current, counts, fence = "top", {}, None
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if fence is not None:
            if line.startswith("```"):
                counts[current] = counts.get(current, 0) + 1
                blocks.append(Block(current, counts[current], fence[0], "\n".join(fence[2]) + "\n", fence[1]))
                fence = None
            else:
                fence[2].append(line)
            continue
        if match := FENCE.match(line):
            fence = (match.group(1).lower() or "text", number, [])
        elif match := HEADING.match(line):
            current = match.group(3) or slug(match.group(2))
            titles[current] = match.group(2)
    return titles, blocks


def collect(root: Path) -> tuple[list[Case], list[tuple[str, Block]]]:
    """The cases of the sdist at `root` (examples, then docs sections, sorted), and the blocks not run (non-Python
    blocks and FRAGMENTS), each with its page."""
    cases = [Case(f"examples/{p.name}", p) for p in sorted((root / "examples").glob("*.py"))]
    not_run = []
    for path in sorted((root / DOCS_ROOT).rglob("*.md")):
        page = "docs/" + path.relative_to(root / DOCS_ROOT).as_posix()
        titles, blocks = read_page(path)
        sections: dict[str, list[Block]] = {}
        for block in blocks:
            if block.language not in ("python", "py") or (page, block.section, block.number) in FRAGMENTS:
                not_run.append((page, block))
            else:
                sections.setdefault(block.section, []).append(block)
        for name in titles:
            if name in sections:
                cases.append(Case(f"{page}#{name}", path, page, name, titles[name], sections))
    return cases, not_run


def needed_sections(case: Case) -> list[str]:
    """The sections whose blocks the case runs, in page order (its own last)."""
    order = list(case.sections)
    if case.page in TUTORIAL_PAGES:
        return order[: order.index(case.section) + 1]
    needs = SECTIONS.get(case.id, Section()).needs
    unknown = [name for name in needs if name not in order]
    if unknown:
        raise HarnessError(f"{case.id}: SECTIONS names sections the page has no Python in: {unknown}")
    return [name for name in order if name in needs] + [case.section]


# ---------------------------------------------------------------------------------------------------------------
# A case's script
# ---------------------------------------------------------------------------------------------------------------


def block_start(label: str) -> str:
    return f'print("{MARK} {label}", flush=True)  # harness: where a failure happened\n'


def raw_script(case: Case) -> str:
    """The case's script before the edits: the example itself, or the page's blocks with the harness's parts."""
    if not case.page:
        return case.path.read_text(encoding="utf-8")
    section = SECTIONS.get(case.id, Section())
    parts = [f"# {case.id}: CoMLRL {COMLRL_VERSION}'s {case.page}, section '{case.title}', run by the harness\n"]
    if section.context:
        parts += ["\n# --- harness context: " + section.why + "\n", block_start("context"), section.context]
    for name in needed_sections(case):
        for block in case.sections[name]:
            label = f"#{name}.{block.number}"
            parts += [f"\n# --- {case.page}{label} (line {block.line}) ---\n", block_start(label), block.code]
    if section.epilogue:
        parts += ["\n# --- harness epilogue: " + section.why + "\n", block_start("epilogue"), section.epilogue]
    return "".join(parts)


def applies(edit: Edit, case_id: str) -> bool:
    return any(fnmatch.fnmatchcase(case_id, pattern) for pattern in edit.cases)


def edited_script(case: Case, models: dict[str, str]) -> tuple[str, set[int]]:
    """The case's script with EDITS made, line by line, each changed line marked `# harness: NAMES`; and the indices
    in EDITS of the edits made. Raises HarnessError when a Hub id is left unmapped."""
    lines = raw_script(case).splitlines()
    made: dict[str, int] = {}
    for index, line in enumerate(lines):
        names = []
        for number, edit in enumerate(EDITS):
            if not applies(edit, case.id):
                continue
            replacement = re.sub(
                r"\{model:([\w-]+)\}", lambda m: repr(models[m.group(1)]).replace("\\", "\\\\"), edit.replacement
            )
            line, count = re.subn(edit.pattern, replacement, line)
            if count:
                made[number] = made.get(number, 0) + count
                names.append(edit.name)
        if names:
            lines[index] = f"{line}  # harness: {', '.join(dict.fromkeys(names))}"
    text = "\n".join(lines) + "\n"
    unmapped = sorted({m.group(2) for m in HUB_ID.finditer(text)})
    if unmapped:
        raise HarnessError(f"{case.id}: Hub ids {unmapped} are not mapped to a tiny model (MODEL_FOR_ID)")
    unmarked = "\n".join(line.split("  # harness: ")[0] for line in lines)
    if ast.dump(ast.parse(text)) != ast.dump(ast.parse(unmarked)):
        raise HarnessError(f"{case.id}: a `# harness:` mark landed inside a string")
    return text, set(made)


def check_edits(cases: list[Case], models: dict[str, str]) -> None:
    """Every required edit matches in some case it applies to (else CoMLRL's text changed: update EDITS), and every
    case's script builds."""
    made = set().union(*(edited_script(case, models)[1] for case in cases))
    missing = [f"{e.cases[0]}: /{e.pattern}/" for n, e in enumerate(EDITS) if e.required and n not in made]
    if missing:
        raise HarnessError(f"edits that match nothing (CoMLRL's text changed: update EDITS): {missing}")


def case_arguments(case: Case, models: dict[str, str]) -> list[str]:
    return [re.sub(r"\{model:([\w-]+)\}", lambda m: models[m.group(1)], a) for a in ARGUMENTS.get(case.id, [])]


# ---------------------------------------------------------------------------------------------------------------
# Models, runs, outcomes
# ---------------------------------------------------------------------------------------------------------------

MODEL_RECIPES = {"tiny-llama": dict(seed=0, arch="llama"), "tiny-qwen2": dict(seed=1, arch="qwen2")}


def tiny_models(workdir: Path) -> dict[str, str]:
    """The tiny models of MODEL_FOR_ID, saved once under WORKDIR/models/ (name -> folder)."""
    from trl_multiagent.demo.testing import make_model, make_tokenizer

    folders = {}
    for name, recipe in MODEL_RECIPES.items():
        folder = workdir / "models" / name
        if not (folder / "config.json").exists():
            tokenizer = make_tokenizer()
            # positions for the leetcode example's long prompts (about 600 tokens)
            make_model(tokenizer, max_positions=2048, **recipe).save_pretrained(folder)
            tokenizer.save_pretrained(folder)
        folders[name] = str(folder)
    return folders


@dataclass
class Result:
    id: str
    outcome: str  # passed | failed | timeout
    block: str  # the last block started (docs), "script" (examples)
    error: str  # the exception's line, for a failure
    seconds: float
    folder: str


def error_line(stderr: str) -> str:
    """The exception's last line in a traceback (`Type: message`), else the last line of stderr."""
    lines = [line for line in stderr.splitlines() if line.strip()]
    for line in reversed(lines):
        if re.match(r"^[\w.]+(Error|Exception|Exit|Interrupt|Warning)\b.*", line) or line.startswith("AssertionError"):
            return line.strip()
    return lines[-1].strip() if lines else ""


def run_case(case: Case, workdir: Path, models: dict[str, str], timeout: float = CASE_TIMEOUT_S) -> Result:
    """Runs one case in a fresh interpreter, in its own empty folder under WORKDIR/runs/."""
    folder = workdir / "runs" / re.sub(r"[^\w.-]+", "_", case.id)
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    script, _ = edited_script(case, models)
    (folder / "case.py").write_text(script, encoding="utf-8")
    env = {
        **os.environ,
        **ENVIRONMENT,
        "HF_HOME": str(workdir / "hf_home"),
        "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p),
    }
    env.setdefault("OMP_NUM_THREADS", "1")
    command = [sys.executable, "case.py", *case_arguments(case, models)]
    start = time.time()
    try:
        done = subprocess.run(command, cwd=folder, env=env, capture_output=True, text=True, timeout=timeout)
        stdout, stderr, returncode = done.stdout, done.stderr, done.returncode
    except subprocess.TimeoutExpired as expired:
        stdout, stderr, returncode = str(expired.stdout or ""), str(expired.stderr or ""), None
    seconds = time.time() - start
    (folder / "stdout.log").write_text(stdout)
    (folder / "stderr.log").write_text(stderr)
    blocks = [line.removeprefix(MARK).strip() for line in stdout.splitlines() if line.startswith(MARK)]
    block = blocks[-1] if case.page and blocks else ("script" if not case.page else "")
    outcome = "passed" if returncode == 0 else "timeout" if returncode is None else "failed"
    error = "" if outcome == "passed" else error_line(stderr) or f"exit status {returncode}"
    return Result(case.id, outcome, block, error, round(seconds, 1), str(folder))


@dataclass(frozen=True)
class Expected:
    block: str
    error: str  # text the error's line contains
    reason: str  # "[kind] why"


def load_expected(path: Path = EXPECTED_FILE) -> dict[str, Expected]:
    """`CASE | BLOCK | ERROR CONTAINS | [KIND] REASON` a line; `#` starts a comment line."""
    expected = {}
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        fields = [part.strip() for part in line.split(" | ")]
        if len(fields) != 4 or not re.match(r"^\[[\w-]+\] ", fields[3]):
            raise HarnessError(f"{path.name}:{number}: want `CASE | BLOCK | ERROR CONTAINS | [KIND] REASON`: {line}")
        if fields[0] in expected:
            raise HarnessError(f"{path.name}:{number}: {fields[0]} listed twice")
        expected[fields[0]] = Expected(*fields[1:])
    return expected


def read_case_list(path: Path = CASES_FILE) -> dict[str, bool]:
    """cases.txt: every case id the sdist gives, `ci` after the ones of the default suite's subset."""
    cases = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip() and not line.startswith("#"):
            case, *flags = line.split()
            cases[case] = flags == ["ci"]
    return cases


def verdict(result: Result, expected: Expected | None) -> str:
    """'' when the outcome is the expected one, else what differs."""
    if expected is None:
        return (
            ""
            if result.outcome == "passed"
            else f"expected to pass; {result.outcome} in {result.block}: {result.error}"
        )
    if result.outcome == "passed":
        return f"listed as failing ({expected.reason}) but passed: remove it from {EXPECTED_FILE.name}"
    if result.outcome != "failed" or result.block != expected.block or expected.error not in result.error:
        return (
            f"listed as failing in {expected.block} with '{expected.error}'; {result.outcome} in {result.block}: "
            f"{result.error}"
        )
    return ""


# ---------------------------------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------------------------------


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="run_comlrl_examples.py", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--sdist",
        type=Path,
        help=f"CoMLRL's sdist or its folder (default ${SDIST_ENV}, else {DEFAULT_SDIST}, downloaded when missing)",
    )
    parser.add_argument("--workdir", type=Path, default=DEFAULT_WORKDIR, help=f"default {DEFAULT_WORKDIR}")
    parser.add_argument("--subset", choices=("all", "ci"), default="all", help="ci: the cases marked ci in cases.txt")
    parser.add_argument("-k", dest="match", help="only the cases whose id contains this text")
    parser.add_argument("--jobs", type=int, default=1, help="cases run at once (default 1)")
    parser.add_argument("--json", type=Path, help="write each case's result here")
    parser.add_argument("--list", action="store_true", help="list the cases and the blocks not run, and exit")
    parser.add_argument("--list-edits", action="store_true", help="print every edit the harness makes, and exit")
    parser.add_argument("--show", metavar="CASE", help="print a case's edited script, and exit")
    args = parser.parse_args(argv)
    if args.list_edits:
        say("\n".join(f"{n}. {line}" for n, line in enumerate(edits_in_words(), 1)))
        return 0
    workdir = args.workdir.resolve()
    root = unpacked_sdist(sdist_source(args.sdist), workdir)
    cases, not_run = collect(root)
    if args.list:
        for case in cases:
            say(case.id)
        for page, block in not_run:
            say(f"not run: {page}#{block.section} block {block.number} ({block.language}, line {block.line})")
        return 0
    models = tiny_models(workdir)
    if args.show:
        chosen = [case for case in cases if case.id == args.show]
        if not chosen:
            raise HarnessError(f"--show: no case {args.show!r} (--list lists them)")
        say(edited_script(chosen[0], models)[0] + f"# arguments: {case_arguments(chosen[0], models)}")
        return 0
    expected = load_expected()
    listed = read_case_list()
    selected = [c for c in cases if (args.subset == "all" or listed.get(c.id)) and (args.match or "") in c.id]
    check_edits(cases, models)  # before anything runs
    results, wrong = [], 0
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        for result in pool.map(lambda case: run_case(case, workdir, models), selected):  # printed as they come
            results.append(result)
            problem = verdict(result, expected.get(result.id))
            wrong += bool(problem)
            shown = f"{result.outcome:7} {result.seconds:6.1f}s  {result.id}"
            if result.outcome != "passed":
                shown += f"  [{result.block}] {result.error[:160]}"
            say(shown + (f"\n    UNEXPECTED: {problem}" if problem else ""))
    passed = sum(r.outcome == "passed" for r in results)
    say(
        f"\n{len(results)} cases: {passed} passed, {len(results) - passed} failed ({wrong} not as expected); "
        f"{len(not_run)} blocks of the pages not run (non-Python or fragments: --list)"
    )
    if args.json:
        args.json.write_text(json.dumps([r.__dict__ for r in results], indent=1))
    return 1 if wrong else 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except HarnessError as error:
        sys.stderr.write(f"run_comlrl_examples: error: {error}\n")
        sys.exit(2)
