"""``python -m autograd_groups.cli``: the ``autograd-groups`` command, as ``python -m autograd_groups``."""

import sys

from . import main

if __name__ == "__main__":
    sys.exit(main())
