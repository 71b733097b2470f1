"""`python -m shardsmith ...`, the same as the `shardsmith` command."""

import sys

from shardsmith.cli import main

sys.exit(main())
