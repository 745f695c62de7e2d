"""``python -m skfedspd.flower``: write the Flower App, or run FedSPDnet on a deployment.

    python -m skfedspd.flower write-app DIR
    python -m skfedspd.flower fit --superlink HOST:PORT --n-sites N --output model.skfedspd \\
        [--root-certificates ca.crt | --insecure] [--params '{"n_rounds": 50, "estimator__lr": 0.01}']
"""

import argparse
import json
import sys

from ..validation import check_count, check_positive


def _count_argument(text):
    """An argparse type: a count >= 1 written as an integer."""
    try:
        return check_count(int(text), "the value", 1)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an int >= 1, got {text!r}") from None


def _seconds_argument(text):
    """An argparse type: a finite number of seconds > 0."""
    try:
        return check_positive(float(text), "the value")
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a finite number of seconds > 0, got {text!r}") from None


def _params_argument(text):
    """An argparse type: ``--params``, a JSON object of FederatedSPDnetClassifier parameters
    (lists become tuples)."""
    try:
        params = json.loads(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(f"must be a JSON object ({error}), got {text!r}") from None
    if not isinstance(params, dict):
        raise argparse.ArgumentTypeError(f"must be a JSON object of parameters, e.g. '{{\"n_rounds\": 50}}', "
                                         f"got a JSON {type(params).__name__}: {text!r}")
    return {k: tuple(v) if isinstance(v, list) else v for k, v in params.items()}


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m skfedspd.flower", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    app = sub.add_parser("write-app", help="write the FedSPDnet Flower App (pyproject.toml) into DIR")
    app.add_argument("directory")
    fit = sub.add_parser("fit", help="train on the sites of a running SuperLink; the server writes the model")
    fit.add_argument("--superlink", required=True, help="SuperLink address host:port")
    fit.add_argument("--n-sites", type=_count_argument, required=True)
    fit.add_argument("--output", required=True, help="model path on the SuperLink's machine")
    tls = fit.add_mutually_exclusive_group(required=True)
    tls.add_argument("--root-certificates", help="CA certificate (PEM) of the SuperLink's TLS certificate")
    tls.add_argument("--insecure", action="store_true", help="plain HTTP (local tests only)")
    fit.add_argument("--params", type=_params_argument, default={},
                     help="FederatedSPDnetClassifier parameters as JSON (nested: estimator__lr ...)")
    fit.add_argument("--overwrite", action="store_true")
    fit.add_argument("--round-timeout", type=_seconds_argument, default=3600.0)
    fit.add_argument("--connect-timeout", type=_seconds_argument, default=600.0)
    args = parser.parse_args(argv)

    from .deploy import fit_federated, write_app

    if args.command == "write-app":
        print(write_app(args.directory) / "pyproject.toml")
        return 0
    from .. import FederatedSPDnetClassifier, SPDnetClassifier

    try:  # the parameters checked here, before anything starts
        estimator = FederatedSPDnetClassifier(SPDnetClassifier()).set_params(**args.params)
        estimator.check_params()
    except (TypeError, ValueError) as error:
        fit.error(f"argument --params: {error}")
    fed = fit_federated(estimator, args.superlink, args.n_sites, args.output, insecure=args.insecure,
                        root_certificates=args.root_certificates, round_timeout=args.round_timeout,
                        connect_timeout=args.connect_timeout, overwrite=args.overwrite)
    best = fed.history_[fed.best_round_]
    print(f"fitted: {len(fed.history_)} rounds, best round {fed.best_round_} "
          f"(validation macro-F1 {best['val_f1']:.4f}); model at {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
