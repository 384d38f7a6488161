"""``python -m autograd_groups``: the ``autograd-groups`` command, for an environment whose scripts
directory is not on ``PATH``."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
