"""``python -m graphopt``: the ``graphopt`` command, for environments without the script on
PATH (a venv not activated, ``pipx run``, CI)."""

import sys

from graphopt.cli.main import main

sys.exit(main())
