"""Table I: the FedSPDnet paper's protocol, and the package's recommended configuration on the same splits.

The experiment of :mod:`benchmarks.tableone` (``make experiment`` runs it as ``python -m
benchmarks.tableone --jobs 2``), with the same options; a whole profile's run writes its
record, ``benchmarks/records/data/tableone-<profile>-<dataset>.json``.
"""

import argparse
import sys

from benchmarks.tableone import cli

PROG = "python -m benchmarks.experiments table-one"


def add_arguments(parser):
    cli.add_arguments(parser)


def run(args):
    args = cli.check(argparse.ArgumentParser(prog=PROG), args)
    sys.exit(cli.run(argparse.ArgumentParser(prog=PROG), args, " ".join([PROG, *sys.argv[2:]])))
