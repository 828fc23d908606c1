"""`python -m trl_multiagent.models`: the README's command, kept; the module is `trl_multiagent.demo.models`."""

import sys

from .demo.models import main


if __name__ == "__main__":
    sys.exit(main())
