"""The named pipelines every accuracy experiment draws from, built from the public API only."""

import sklearn
from pyriemann.tangentspace import TangentSpace
from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import make_pipeline
from sklearn.utils.metadata_routing import get_routing_for_object

from skfedspd import FederatedSPDnetClassifier, Recenter, SPDnetClassifier


def ts_lr(seed):
    """pyRiemann's tangent space at the training mean + logistic regression."""
    return make_pipeline(TangentSpace(), LogisticRegression(max_iter=1000))


def recenter_ts_lr(seed):
    """:class:`skfedspd.Recenter` (each domain to the identity) before TS+LR."""
    return make_pipeline(Recenter(), TangentSpace(), LogisticRegression(max_iter=1000))


def spdnet(seed, **params):
    """``SPDnetClassifier`` with the package defaults (``params`` override them)."""
    return SPDnetClassifier(random_state=seed, **params)


def fedspdnet(seed, groups_per_client=2, **params):
    """``FederatedSPDnetClassifier`` with the package defaults, clients of ``groups_per_client``
    subjects; ``params`` go to the local ``SPDnetClassifier``."""
    return federated(seed, SPDnetClassifier(**params), groups_per_client=groups_per_client)


#: name -> factory(seed) of the pipelines the experiments compare.
PIPELINES = {
    "TS+LR": ts_lr,
    "Recenter+TS+LR": recenter_ts_lr,
    "SPDnet": spdnet,
    "SPDnet+dBN": lambda seed: spdnet(seed, batchnorm="domain"),
    "FedSPDnet": fedspdnet,
    "FedSPDnet+dBN": lambda seed: fedspdnet(seed, batchnorm="domain"),
}


def fit(model, X, y, groups):
    """Fit ``model``, handing it ``groups`` only if its routing asks for them (as MOABB does)."""
    with sklearn.config_context(enable_metadata_routing=True):
        wants = get_routing_for_object(model).consumes("fit", {"groups"})
        return model.fit(X, y, **({"groups": groups} if wants else {}))


#: Pipelines that differ from a named one in one setting (the ablations of the design decisions).
ABLATIONS = {
    "FedSPDnet+dBN, subject domains": lambda seed: fedspdnet(seed, batchnorm="domain").set_params(domains="group"),
    "SPDnet+dBN, best epoch": lambda seed: spdnet(seed, batchnorm="domain", checkpoint="best"),
}


def federated(seed, local=None, **params):
    """``FederatedSPDnetClassifier(local, **params)`` (None: the default local
    ``SPDnetClassifier()``), one client per group unless ``params`` say otherwise."""
    return FederatedSPDnetClassifier(local, random_state=seed, **params)
