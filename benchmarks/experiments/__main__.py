"""``python -m benchmarks.experiments NAME``: run a named accuracy experiment."""

import argparse
import logging
import os
import sys
import warnings

os.environ.setdefault("OMP_NUM_THREADS", "1")  # one thread per process: a shared machine
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import torch  # noqa: E402

from .._machine import code_commit  # noqa: E402
from . import (  # noqa: E402
    client_optimizer_state,
    defaults,
    drift,
    flower_table_one,
    learner_ablation,
    learner_leads,
    moabb_evaluation,
    moabb_transfer,
    online,
    privacy,
    privacy_pretrain,
    robust_aggregation,
    table_one,
    table_one_ablation,
    unseen_subjects,
)

EXPERIMENTS = {
    "table-one": table_one,
    "unseen-subjects": unseen_subjects,
    "online": online,
    "drift": drift,
    "defaults": defaults,
    "client-optimizer-state": client_optimizer_state,
    "table-one-ablation": table_one_ablation,
    "learner-ablation": learner_ablation,
    "learner-leads": learner_leads,
    "flower-table-one": flower_table_one,
    "moabb": moabb_evaluation,
    "moabb-transfer": moabb_transfer,
    "privacy": privacy,
    "privacy-pretrain": privacy_pretrain,
    "robust-aggregation": robust_aggregation,
}


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m benchmarks.experiments", description=__doc__)
    commands = parser.add_subparsers(dest="experiment", required=True)
    for name, module in EXPERIMENTS.items():
        module.add_arguments(commands.add_parser(name, help=module.__doc__.split("\n")[0],
                                                 description=module.__doc__,
                                                 formatter_class=argparse.RawDescriptionHelpFormatter))
    args = parser.parse_args(argv)
    code_commit()  # the commit its records name: the code as the run starts
    torch.set_num_threads(1)
    # Library noise (MNE's per-recording montage warnings, MOABB's logging) stays out of the console.
    logging.getLogger("mne").setLevel(logging.ERROR)
    logging.getLogger("moabb").setLevel(logging.ERROR)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", module="mne")
        status = EXPERIMENTS[args.experiment].run(args)
    sys.exit(status or 0)


if __name__ == "__main__":
    main()
