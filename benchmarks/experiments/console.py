"""Console and log file of an experiment run.

The console gets the experiment's own lines (the loggers under ``benchmarks`` at INFO, and
the report); library output — Python warnings (MNE's montage ``FutureWarning``, h5py's
deprecations, loky's worker messages), MNE's and MOABB's log lines (one per recording),
and the per-run lines of this package (DEBUG) — goes to the log file. Only the entry
point (and a test standing in for it) configures this: importing the package changes
nothing.
"""

import contextlib
import logging
import shlex
import sys
import warnings

LOGGER = "benchmarks"
LIBRARY_LOGGERS = ("moabb",)


def _warnings_to(stream):
    def showwarning(message, category, filename, lineno, file=None, line=None):
        stream.write(warnings.formatwarning(message, category, filename, lineno, line))
        stream.flush()

    return showwarning


@contextlib.contextmanager
def warnings_to_file(path):
    """Python warnings raised inside go to ``path`` (appended), not to stderr.

    Used around each fit in joblib workers too, whose warnings would otherwise reach the
    console through the inherited stderr.
    """
    if path is None:
        yield
        return
    with open(path, "a") as stream, warnings.catch_warnings():
        warnings.showwarning = _warnings_to(stream)
        yield


@contextlib.contextmanager
def console_and_log(path, stream=None):
    """Experiment lines to ``stream`` (default stdout), everything else to ``path``.

    Restores MNE's log target, the loggers' handlers and the warning display on exit.
    """
    import mne

    path.parent.mkdir(parents=True, exist_ok=True)
    file_handler = logging.FileHandler(path, mode="a")
    file_handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s: %(message)s"))
    console = logging.StreamHandler(stream or sys.stdout)
    console.setLevel(logging.INFO)
    console.setFormatter(logging.Formatter("%(message)s"))

    own = logging.getLogger(LOGGER)
    saved = {name: (logging.getLogger(name).handlers[:], logging.getLogger(name).propagate,
                    logging.getLogger(name).level) for name in (LOGGER, *LIBRARY_LOGGERS)}
    own.handlers[:] = [console, file_handler]
    own.setLevel(logging.DEBUG)
    own.propagate = False
    for name in LIBRARY_LOGGERS:
        library = logging.getLogger(name)
        library.handlers[:] = [file_handler]
        library.propagate = False
    mne.set_log_file(str(path), output_format="%(asctime)s mne: %(message)s", overwrite=False)
    try:
        with warnings_to_file(path):
            yield
    finally:
        mne.set_log_file(None)
        for name, (handlers, propagate, level) in saved.items():
            logger = logging.getLogger(name)
            logger.handlers[:], logger.propagate = handlers, propagate
            logger.setLevel(level)
        file_handler.close()


def logged_command(log, log_file):
    """This run's command line, logged first with the machine and where the library output
    goes; returns the command (what a record stores)."""
    from .._machine import machine_line

    command = ("python -m benchmarks.experiments " + shlex.join(sys.argv[1:])).strip()
    log.info(f"command: {command}\nmachine: {machine_line()}\nlibrary output: {log_file}")
    return command
