"""Evaluate a saved team on held-out prompts: each turn's reward with a 95% confidence interval, the same team with
its agents in other seats (role swap), and one agent alone at the same token budget (best-of-N).

The command line of `python -m trl_multiagent.evaluation` (`__main__` runs `main`): its flags, `evaluate_team`, the
report written and printed; a wrong folder, flag or task exits with status 2 and a message naming it.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from .errors import PROG, EvaluationError
from .report import report_text, write_report
from .runs import Settings, evaluate_team
from .task import TASK_FILE


def _bool(text: str) -> bool:
    if text.lower() in ("true", "yes", "1", "on"):
        return True
    if text.lower() in ("false", "no", "0", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def make_parser() -> argparse.ArgumentParser:
    defaults = Settings()
    parser = argparse.ArgumentParser(
        prog=PROG,
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        allow_abbrev=False,  # `--num_turn 3` is an error, not `--num_turns 3`
    )
    parser.add_argument("output_dir", metavar="OUTPUT_DIR", help="the folder holding agent_0/, agent_1/, ...")
    task = parser.add_argument_group(
        f"task (each flag not given: from OUTPUT_DIR/{TASK_FILE}, which the training script writes next to the agents)"
    )
    task.add_argument("--reward", default=None, help=f"module:function (None: the {TASK_FILE}'s)")
    task.add_argument(
        "--transition",
        default=None,
        help=f"module:function writing the next turn's prompts (None: the {TASK_FILE}'s)",
    )
    task.add_argument(
        "--prompts",
        default=None,
        help=f"module:attribute (a list) or a .jsonl file of held-out prompts (None: the {TASK_FILE}'s)",
    )
    task.add_argument(
        "--prompt_format",
        default=defaults.prompt_format,
        choices=["auto", "chat", "plain"],
        help="chat: text prompts become one user message; auto: chat when the tokenizer has a chat template "
        f"(None: the {TASK_FILE}'s, else auto)",
    )
    task.add_argument("--base_model", default=None, help="the base of adapter agents, instead of the recorded one")
    task.add_argument(
        "--initial_models",
        nargs="+",
        default=None,
        help=f"one per agent, the models a full-weight team's training started from: the untrained row (None: the "
        f"{TASK_FILE}'s initial_models)",
    )
    run = parser.add_argument_group("rollout")
    run.add_argument("--num_turns", type=int, default=defaults.num_turns)
    run.add_argument("--greedy", action="store_true", help="greedy decoding, one joint answer per turn (K = 1)")
    run.add_argument("--num_generations", type=int, default=defaults.num_generations, help="K when sampling")
    run.add_argument("--max_new_tokens", type=int, default=defaults.max_new_tokens)
    run.add_argument("--temperature", type=float, default=defaults.temperature)
    run.add_argument("--seed", type=int, default=defaults.seed)
    run.add_argument("--batch_size", type=int, default=defaults.batch_size, help="held-out prompts per rollout")
    base = parser.add_argument_group("baselines")
    base.add_argument(
        "--untrained",
        type=_bool,
        default=True,
        help="also run the team before training: the adapters' base, or a full-weight team's initial models",
    )
    base.add_argument("--role_swap", type=_bool, default=True, help="also run with seat i played by agent (i+1) mod N")
    base.add_argument(
        "--best_of_n", type=_bool, default=True, help="also run one agent alone at the same token budget"
    )
    base.add_argument("--single_agent", type=int, default=defaults.single_agent, help="the agent of best-of-N")
    base.add_argument("--max_best_of", type=int, default=defaults.max_best_of, help="the largest N")
    parser.add_argument("--out", default=None, help="where evaluation.json and evaluation.md go (default OUTPUT_DIR)")
    parser.add_argument("--no_progress", action="store_true", help="no progress bars")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = make_parser()
    args = parser.parse_args(argv)
    settings = {
        name: getattr(args, name)
        for name in (
            "num_turns", "greedy", "num_generations", "max_new_tokens", "temperature", "seed", "batch_size",
            "prompt_format", "untrained", "role_swap", "best_of_n", "single_agent", "max_best_of",
        )
    }  # fmt: skip
    out = args.out or args.output_dir
    try:
        if os.path.exists(out) and not os.path.isdir(out):
            raise EvaluationError(f"--out {out!r} is a file; give the folder evaluation.json and evaluation.md go in.")
        result = evaluate_team(
            args.output_dir,
            reward=args.reward,
            transition=args.transition,
            prompts=args.prompts,
            base_model=args.base_model,
            initial_models=args.initial_models,
            progress=not args.no_progress,
            **settings,
        )
    except EvaluationError as err:
        parser.exit(2, f"{PROG}: error: {err}\n")
    json_path, md_path = write_report(result, out)
    # The console report (sys.stdout: the package's lint allows print only in its scripts)
    sys.stdout.write(report_text(result) + f"\nWrote {json_path} and {md_path}\n")
    return 0
