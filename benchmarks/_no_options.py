"""Command line of a benchmark that takes no options: ``--help`` prints what it measures and
how long it runs (its docstring) instead of running it, and any other argument is refused
with argparse's usage message rather than ignored."""

from __future__ import annotations

import argparse


def parse_no_options(doc: str | None, prog: str) -> None:
    """Exit with usage (status 2) on any argument; print ``doc`` and exit 0 on ``--help``."""
    argparse.ArgumentParser(
        prog=prog,
        description=doc,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    ).parse_args()
