"""`agent_learning_rates` against the optimizer that would apply them: one given to the trainer, or DeepSpeed's."""

from __future__ import annotations


# DeepSpeed's schedulers that multiply each group's own initial rate, so keep the agents' ratios; the others (WarmupLR,
# WarmupDecayLR, OneCycle, LRRangeTest) set the rate given in their params, one for every group.
RATIO_KEEPING_DEEPSPEED_SCHEDULERS = ("WarmupCosineLR",)


def check_agent_learning_rates(args, optimizers) -> None:
    """`agent_learning_rates` is applied by the Trainer's own optimizer (`team.optimizer`): refused with an optimizer
    given to the trainer (`optimizers=`), which the Trainer uses as it is, and with a DeepSpeed config (`deepspeed=`,
    or `accelerate launch`'s) whose "optimizer" section (DeepSpeed's optimizer, its parameters in one group) or
    "scheduler" section (one rate for every group) would replace the per-agent rates. The rates themselves
    are `team.optimizer.check_rates`'s rule."""
    rates = args.agent_learning_rates
    if rates is None:
        return
    if optimizers is not None and optimizers[0] is not None:
        raise ValueError(
            f"MAGRPOTrainer: `optimizers=` gives an optimizer, and MAGRPOConfig.agent_learning_rates={list(rates)} "
            "asks for one learning rate per agent; the Trainer uses a given optimizer as it is, so the per-agent "
            "rates would be ignored. Pass one of the two: build the per-agent groups into your optimizer "
            "(`trainer.team.agent_parameters(i)`), or leave `optimizers` unset."
        )
    config = getattr(getattr(args, "deepspeed_plugin", None), "deepspeed_config", None) or {}
    sections = [f'"optimizer" ({config["optimizer"].get("type")})'] if "optimizer" in config else []
    scheduler = config.get("scheduler")
    if scheduler is not None and scheduler.get("type") not in RATIO_KEEPING_DEEPSPEED_SCHEDULERS:
        sections.append(f'"scheduler" ({scheduler.get("type")})')
    if sections:
        raise ValueError(
            f"MAGRPOConfig.agent_learning_rates={list(rates)} sets one rate per agent in the Trainer's optimizer, but "
            f"the DeepSpeed config has {' and '.join(sections)}: DeepSpeed's own optimizer holds every parameter in "
            f"one group, and its schedulers other than {', '.join(RATIO_KEEPING_DEEPSPEED_SCHEDULERS)} set one rate "
            "for every group, so the per-agent rates would be ignored. Remove that section from the DeepSpeed config "
            "(the Trainer's `optim` and `lr_scheduler_type` then apply), or leave agent_learning_rates None."
        )
