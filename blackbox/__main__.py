"""`python -m blackbox` is the `blackbox` command."""

import sys

from blackbox.cli.main import main

sys.exit(main())
