"""What every benchmark and experiment says about the machine it ran on: one helper for the
speed scripts (``from _machine import cpu_name``), the harness and the records."""

import os
import platform


def cpu_name():
    """CPU model from /proc/cpuinfo (``platform.processor()`` elsewhere)."""
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def machine_line():
    """One line about the machine (CPU, cores, Python, torch)."""
    import torch

    return f"{cpu_name()}, {os.cpu_count()} cores, Python {platform.python_version()}, torch {torch.__version__}"


def machine_facts():
    """The machine as a record stores it: CPU, cores, Python, torch, and its load average
    (1 min) now."""
    import torch

    return {"cpu": cpu_name(), "cores": os.cpu_count(), "python": platform.python_version(),
            "torch": torch.__version__, "load_average": round(os.getloadavg()[0], 2)}


def load_average():
    """``"load average 1.2, 1.5, 1.9"`` (1, 5 and 15 min)."""
    return "load average " + ", ".join(f"{v:.1f}" for v in os.getloadavg())


#: The libraries a record names the version of: distribution name -> the name a record shows.
LIBRARIES = {"numpy": "numpy", "scipy": "scipy", "scikit-learn": "scikit-learn", "torch": "torch",
             "pyriemann": "pyRiemann", "moabb": "MOABB", "mne": "MNE", "flwr": "Flower"}


def library_versions():
    """``{"numpy": "2.1.3", ..., "Flower": None}``: the installed version of every library of
    :data:`LIBRARIES` (None for one not installed)."""
    from importlib import metadata

    versions = {}
    for distribution, name in LIBRARIES.items():
        try:
            versions[name] = metadata.version(distribution)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def git_commit(root=None, ignore=("benchmarks/records/data/",)):
    """``{"sha": "<40 hex digits>", "dirty": bool}`` of the git checkout at ``root`` (this
    repository by default), or None when it is not a git checkout (or git is missing).

    ``dirty``: a tracked file differs from the commit, other than under ``ignore`` (a run
    that rewrites the records does not make the code it ran dirty)."""
    import subprocess
    from pathlib import Path

    root = Path(__file__).resolve().parents[1] if root is None else Path(root)

    def git(*args):
        return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, check=True).stdout

    try:
        if Path(git("rev-parse", "--show-toplevel").strip()).resolve() != root.resolve():
            return None  # root is inside some other checkout, not a checkout of its own
        sha = git("rev-parse", "HEAD").strip()
        changed = [line[3:] for line in git("status", "--porcelain", "--untracked-files=no").splitlines()]
    except (OSError, subprocess.CalledProcessError):
        return None
    return {"sha": sha, "dirty": any(not path.startswith(ignore) for path in changed)}


_CODE_COMMIT = []


def code_commit():
    """:func:`git_commit` of this repository when the process first asked: the code it runs.
    An experiment asks at its start (``benchmarks.experiments.main``), so a commit made while
    it runs is not put on its records."""
    if not _CODE_COMMIT:
        _CODE_COMMIT.append(git_commit())
    return _CODE_COMMIT[0]
