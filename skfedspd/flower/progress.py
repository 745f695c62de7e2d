"""A progress bar over the rounds of a FedSPDnet run on Flower: :class:`RoundProgress`.

Shared by the in-process simulation (fed by the strategy's closed rounds) and a
deployment (fed by the server's streamed log).
"""

import re
import sys

import numpy as np
from tqdm.auto import tqdm

__all__ = ["RoundProgress"]

_ROUND_DONE = re.compile(r"FedSPDnet round \d+ done: val-f1 (\S+)")  # strategy.ROUND_LOG


class RoundProgress:
    """A progress bar over the rounds: one step per round the strategy closes, plain or
    secure (:meth:`round_done`; :meth:`feed` reads the strategy's ``ROUND_LOG`` line from a
    streamed server log), with the pooled validation macro-F1 when there is one.

    Examples
    --------
    Two rounds closed, one read from a server log line, one without a validation score:

    >>> from skfedspd.flower.progress import RoundProgress
    >>> progress = RoundProgress(3, disable=True)
    >>> progress.feed("INFO : FedSPDnet round 0 done: val-f1 0.625")
    >>> progress.round_done(float("nan"))
    >>> progress.rounds, progress.scores
    (2, [0.625])
    >>> progress.close()
    """

    def __init__(self, n_rounds, disable):
        self.bar = tqdm(total=n_rounds, desc="FedSPDnet on Flower", unit="round", disable=disable,
                        file=sys.stderr, dynamic_ncols=True)
        self.rounds, self.scores = 0, []

    def feed(self, line):
        if match := _ROUND_DONE.search(line):
            self.round_done(float(match.group(1)))

    def round_done(self, val_f1):
        if np.isfinite(val_f1):  # no validation (e.g. DP mode): the bar advances without a score
            self.scores.append(float(val_f1))
            self.bar.set_postfix(val_f1=f"{self.scores[-1]:.4f}", best=f"{max(self.scores):.4f}", refresh=False)
        self.rounds += 1
        self.bar.update(1)

    def close(self):
        self.bar.close()
