"""``python -m graphopt.cli``: the ``graphopt`` command."""

import sys

from graphopt.cli.main import main

sys.exit(main())
