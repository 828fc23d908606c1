"""`python -m trl_multiagent.evaluation OUTPUT_DIR [flags]`: `cli.main`, on one torch thread unless OMP_NUM_THREADS is
set (as the recipe: docs/getting-started.md)."""

import os
import sys

from .cli import main


if __name__ == "__main__":
    if "OMP_NUM_THREADS" not in os.environ:
        import torch

        torch.set_num_threads(1)
    sys.exit(main())
