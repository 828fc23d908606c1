"""`sync_ref_model` for a team: every `ref_model_sync_steps` optimizer steps, each agent's reference moves toward that
agent's policy, `reference = (1 - ref_model_mixup_alpha) * reference + ref_model_mixup_alpha * policy` (TR-DPO), as
GRPOTrainer's `SyncRefModelCallback` does for one model.

Full models: the reference agents are the frozen copies the trainer keeps for the KL term; a shared base: each agent's
reference adapter (`AgentTeam.add_reference_adapters`). The mix itself is TRL's (`SyncRefModelCallback.
sync_target_model`, which gathers ZeRO-3 shards), on the (policy, reference) parameter pairs. As in TRL, the synced
reference is not written into checkpoints: a resumed run starts again from the initial reference.
"""

from __future__ import annotations

from collections.abc import Callable

from torch import nn
from transformers import TrainerCallback
from trl.trainer.callbacks import SyncRefModelCallback


class TeamReferenceSync(TrainerCallback):
    """Mix each agent's reference toward its policy at the end of every `ref_model_sync_steps`-th step.

    `pairs` returns the (policy, reference) parameter pairs when called (after accelerate prepared the models).
    """

    def __init__(self, pairs: Callable[[], list[tuple[nn.Parameter, nn.Parameter]]]):
        self.pairs = pairs

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step % args.ref_model_sync_steps == 0:
            policy, reference = zip(*self.pairs(), strict=True)
            SyncRefModelCallback.sync_target_model(
                nn.ParameterList(policy), nn.ParameterList(reference), args.ref_model_mixup_alpha
            )


def reference_sync(accelerator, team, ref_team) -> TeamReferenceSync:
    """The callback for `team`: its reference adapters (added here) on a shared base, else `ref_team`'s copies."""
    if ref_team is None:
        pairs = team.add_reference_adapters()
        return TeamReferenceSync(lambda: pairs)

    def copies() -> list[tuple[nn.Parameter, nn.Parameter]]:
        policy = accelerator.unwrap_model(team).parameters()
        return list(zip(policy, accelerator.unwrap_model(ref_team).parameters(), strict=True))

    return TeamReferenceSync(copies)
