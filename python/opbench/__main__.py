"""``python -m opbench``: the opbench command."""

import sys

from .cli.main import main

sys.exit(main())
