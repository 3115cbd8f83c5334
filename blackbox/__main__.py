"""`python -m blackbox` is the `blackbox` command."""

import sys

from blackbox.cli import main

sys.exit(main())
