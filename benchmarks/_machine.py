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
