"""What the standalone accuracy scripts share: the budget a profile and the command line
give, the report file, and the machine's load."""

import os


def resolve_profile(args, profiles):
    """``(profile name, budget, number of seeds)`` from ``--profile``/``--quick``, ``--rounds``
    and ``--seeds`` (each overriding the profile's)."""
    profile = args.profile or ("quick" if args.quick else "full")
    budget = dict(profiles[profile])
    if args.rounds is not None:
        budget["rounds"] = args.rounds
    return profile, budget, budget["seeds"] if args.seeds is None else args.seeds


def write_report(lines, out, figure, docs):
    """Print the report, write it to ``out/report.md`` and copy the figure to ``docs`` (if given)."""
    text = "\n".join(lines)
    print("\n" + text)
    (out / "report.md").write_text(text + "\n")
    if docs:
        docs.mkdir(parents=True, exist_ok=True)
        (docs / figure.name).write_bytes(figure.read_bytes())


def load_average():
    return "load average " + ", ".join(f"{v:.1f}" for v in os.getloadavg())
