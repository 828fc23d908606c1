"""Demo tooling, outside the core (the core imports none of it): the embedded model (`models`), the main job's prompts
(`examples`), sample answers (`samples`), the summary and plots of a run's logs (`summary`, `plot`), tiny
offline models for tests (`testing`), and a contract harness's comparison with its reviewed list (`contract`)."""
