"""TRL's environments for a team (floor 0, no model): `environment_factory` as one world per joint action (`worlds`),
made once and reset per rollout (`pool`), forked per branch after turn 1 (`forks`), their tools called as TRL calls
them (`calls`), a lost world named (`faults`), and OpenEnv's server-side environments in this process (`openenv`)."""
