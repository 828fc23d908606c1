"""`python -m trl_multiagent.view RUN_DIR`: the recorded rollout trees of a run as one self-contained HTML page."""

from .page import ViewError, page_html, write_page


__all__ = ["ViewError", "page_html", "write_page"]
