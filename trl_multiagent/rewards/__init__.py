"""The joint reward (floor 0, no model): `JointReward` and its weights, aggregation and normalisation (`joint`); the
conventions a reward states (`wrappers`) or that its signature shows (`signatures`); the checks of what it returns
(`values`); reward models (`models`); TRL's `log_extra` columns (`log_extra`)."""
