"""`python -m trl_multiagent.plot`: the command the docs give, kept; the module is `trl_multiagent.demo.plot`."""

import sys

from .demo.plot import main


if __name__ == "__main__":
    sys.exit(main())
