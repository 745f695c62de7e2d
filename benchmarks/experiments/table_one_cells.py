"""The cells of Table I: (setting, model, aggregation) as frozen dataclasses."""

from dataclasses import dataclass

from skfedspd.server_optimizer import ServerMomentum

#: Fraction of the clients that train in each round, per federated setting. "+sm": the same
#: participation with the recommended server optimizer (``SERVER_MOMENTUM``), beside the
#: paper-faithful settings (server step = the aggregate).
PARTICIPATION = {"full": 1.0, "half": 0.5, "full+sm": 1.0, "half+sm": 0.5}
#: The recommended server-optimizer setting (docs/design-decisions.md: FedAvgM, eta = 1, beta = 0.9).
SERVER_MOMENTUM = {"lr": 1.0, "momentum": 0.9}  # ServerMomentum's
#: "spdnet-default" and "spdnet-domain" are the package's recommended configuration beside the
#: paper's: ``SPDnetClassifier()`` fitted without the subjects, and with ``batchnorm="domain"``
#: (each subject a domain, what ``SPDnetClassifier()`` given the subjects does); federated,
#: the latter with ``SERVER_MOMENTUM`` and fresh client Adam (the pairing the
#: ``server_optimizer`` docstring recommends).
#: "fed-ts-lr": the federated classical baseline (``FederatedTangentSpaceLR``: re-centred TS+LR whose
#: logistic regression is fitted across the clients), the honest peer of FedSPDnet.
MODELS = ("ts-lr", "mdm", "spdnet", "eegnet", "spdnet-default", "spdnet-domain", "fed-ts-lr")
RECOMMENDED_MODELS = ("spdnet-default", "spdnet-domain")
AGGREGATIONS = ("projavg", "rlavg")
NAMES = {"ts-lr": "TS+LR", "mdm": "MDM", "spdnet": "SPDnet", "eegnet": "EEGNet",
         "spdnet-default": "SPDnet, package defaults", "spdnet-domain": "SPDnet + domain BN, package defaults",
         "fed-ts-lr": "FedRecenter+TS+LR (federated classical baseline)"}


@dataclass(frozen=True)
class Cell:
    """One cell of Table I.

    Parameters
    ----------
    setting : {"centralized", "full", "half", "full+sm", "half+sm"}
        Pooled training data, or federated with full / half participation; "+sm" adds the
        recommended server momentum (``SERVER_MOMENTUM``, SPDnet only).
    model : {"ts-lr", "mdm", "spdnet", "eegnet", "spdnet-default", "spdnet-domain"}
        pyRiemann references (centralized only), a network with the paper's training
        settings, or the package's recommended configuration: ``"spdnet-default"``
        (centralized only) and ``"spdnet-domain"`` (centralized, or federated with server
        momentum and ProjAvg).
    aggregation : {"projavg", "rlavg"} or None
        Server rule of a federated cell (None when centralized). EEGNet's weights are
        Euclidean: its ProjAvg is FedAvg.
    """

    setting: str
    model: str
    aggregation: str = None

    def __post_init__(self):
        if self.setting != "centralized" and self.setting not in PARTICIPATION:
            raise ValueError(f"unknown setting {self.setting!r}; expected 'centralized' or one of "
                             f"{tuple(PARTICIPATION)}")
        if self.model not in MODELS:
            raise ValueError(f"unknown model {self.model!r}; expected one of {MODELS}")
        if self.federated and self.model not in ("spdnet", "eegnet", "spdnet-domain", "fed-ts-lr"):
            raise ValueError(f"{self.model!r} is centralized only")
        if self.model == "fed-ts-lr":
            if self.setting != "full" or self.aggregation is not None:
                raise ValueError("the federated classical baseline is ('full', 'fed-ts-lr'): every client, its "
                                 "logistic regression fitted on the sum of their losses (no aggregation rule)")
        elif self.federated != (self.aggregation is not None):
            raise ValueError(f"{self}: an aggregation rule goes with a federated setting, and only there")
        if self.aggregation is not None and self.aggregation not in AGGREGATIONS:
            raise ValueError(f"unknown aggregation {self.aggregation!r}; expected one of {AGGREGATIONS}")
        if self.model == "eegnet" and self.aggregation not in (None, "projavg"):
            raise ValueError("federated EEGNet is aggregated by FedAvg (aggregation='projavg')")
        if self.server_optimized and (self.model not in ("spdnet", "spdnet-domain") or self.aggregation != "projavg"):
            raise ValueError("the server-momentum rows are FedSPDnet ProjAvg only")
        if self.model == "spdnet-domain" and self.federated and not self.server_optimized:
            raise ValueError("the federated recommended configuration has server momentum: use a '+sm' setting")

    @property
    def federated(self):
        return self.setting != "centralized"

    @property
    def participation(self):
        """Fraction of the clients per round (federated cells)."""
        return PARTICIPATION[self.setting]

    @property
    def server_optimized(self):
        """Whether the server applies ``SERVER_MOMENTUM`` (the "+sm" settings)."""
        return self.setting.endswith("+sm")

    @property
    def server_params(self):
        """Server-optimizer parameters of the federated estimator ({} = the paper's)."""
        return {"server_optimizer": ServerMomentum(**SERVER_MOMENTUM)} if self.server_optimized else {}

    @property
    def network(self):
        """SPDnet or EEGNet: trained in epochs / rounds, with a validation curve."""
        return self.model in ("spdnet", "eegnet") + RECOMMENDED_MODELS

    @property
    def recommended(self):
        """The package's recommended configuration rather than the paper's training settings."""
        return self.model in RECOMMENDED_MODELS

    @property
    def domains(self):
        """Each subject a domain of ``batchnorm="domain"`` (or re-centred by its own mean, the
        federated classical baseline): fitted with the subjects as ``groups``, and each test
        subject predicted in its own call (its own mean)."""
        return self.model in ("spdnet-domain", "fed-ts-lr")

    @property
    def key(self):
        """``setting/model[-aggregation]``: names the cached records (stable across versions)."""
        suffix = f"-{self.aggregation}" if self.model == "spdnet" and self.federated else ""
        return f"{self.setting}/{self.model}{suffix}"

    @property
    def label(self):
        """Human name, e.g. ``FedSPDnet ProjAvg (half)`` or ``TS+LR``."""
        if not self.federated or self.model == "fed-ts-lr":
            return NAMES[self.model] + (" (centr.)" if self.network and not self.recommended else "")
        setting = self.setting.replace("+sm", " + server momentum")
        if self.recommended:
            return f"FedSPDnet + domain BN, package defaults ({setting})"
        rule = "" if self.model == "eegnet" else f" {'ProjAvg' if self.aggregation == 'projavg' else 'RLAvg'}"
        return f"Fed{NAMES[self.model]}{rule} ({setting})"


CELLS = (
    Cell("centralized", "ts-lr"),
    Cell("centralized", "mdm"),
    Cell("centralized", "spdnet"),
    Cell("centralized", "eegnet"),
    *(Cell(setting, model, aggregation) for setting in ("full", "half")
      for model, aggregation in (("spdnet", "projavg"), ("spdnet", "rlavg"), ("eegnet", "projavg"))),
    Cell("full+sm", "spdnet", "projavg"),
    Cell("half+sm", "spdnet", "projavg"),
    Cell("centralized", "spdnet-default"),
    Cell("centralized", "spdnet-domain"),
    Cell("full+sm", "spdnet-domain", "projavg"),
    Cell("full", "fed-ts-lr"),
)


def select(patterns, cells=CELLS):
    """Cells whose key starts or ends with one of ``patterns`` (all when empty or None)."""
    if not patterns:
        return tuple(cells)
    chosen = tuple(c for c in cells if any(c.key.startswith(p) or c.key.endswith(p) for p in patterns))
    if not chosen:
        raise ValueError(f"no cell matches {list(patterns)}; keys: {[c.key for c in cells]}")
    return chosen
