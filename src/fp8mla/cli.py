"""The ``fp8mla`` command. Each subcommand lives in its own module and registers itself with
``add_parser(subparsers)``, setting ``func`` (``args -> exit status``) as a parser default."""

from __future__ import annotations

import argparse

from fp8mla import demo, doctor
from fp8mla.bench import cli as bench

_SUBCOMMANDS = (doctor, bench, demo)


def main(argv: list[str] | None = None) -> int:
    """Run ``fp8mla <subcommand> ...``; returns the exit status."""
    parser = argparse.ArgumentParser(prog="fp8mla", description=__doc__.split(".")[0])
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for module in _SUBCOMMANDS:
        module.add_parser(sub)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
