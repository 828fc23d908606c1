"""CoMLRL 1.4.3's own examples and documentation pages, run through `trl_multiagent.comlrl` (run_comlrl_examples.py)."""
