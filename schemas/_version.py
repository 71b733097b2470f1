"""The shardsmith version, recorded in every manifest (setup.py reads it too)."""

__version__ = "0.1.0"
