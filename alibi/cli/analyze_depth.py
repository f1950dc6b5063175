"""`alibi analyze depth`."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    """Adds the `depth` subcommand (to be written)."""
