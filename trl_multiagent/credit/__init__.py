"""Credit assignment (floor 0, plain functions): `assign(tree, rules)` (the `CreditRules` resolved once from the config) gives a grown rollout tree's returns, each
completion's credited return and the group advantages (`returns`); the options it applies are strategies in one
registry (`options`)."""

from .returns import Credit, assign


__all__ = ["Credit", "assign"]
