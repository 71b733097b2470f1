"""`python -m shardsmith ...`, the same as the `shardsmith` command."""

from shardsmith.cli import run

run()
