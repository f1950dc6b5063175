"""`alibi analyze flips`."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    """Adds the `flips` subcommand (to be written)."""
