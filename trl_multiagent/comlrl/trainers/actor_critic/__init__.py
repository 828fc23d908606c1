"""CoMLRL's `comlrl.trainers.actor_critic`: none of its names is provided; each raises `NotProvidedError`, naming it
(`not_provided`)."""

from ...not_provided import module_getattr


__all__: list[str] = []
__getattr__ = module_getattr(__name__, "trainers.actor_critic")
