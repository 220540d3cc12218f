"""`python -m execkit` is the `execkit` command."""

import sys

from execkit.cli import main

sys.exit(main())
