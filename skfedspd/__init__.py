"""skfedspd: SPDnet on SPD (EEG covariance) matrices, centralized or federated, for scikit-learn."""

from .classical import FederatedTangentSpaceLR
from .classifier import SPDnetClassifier
from .eegnet import EEGNetClassifier
from .federated import FederatedSPDnetClassifier
from .persistence import load_estimator, save_estimator
from .recenter import Recenter

__version__ = "0.2.0"  # the one place of the version: pyproject.toml reads it
__all__ = [
    "SPDnetClassifier",
    "EEGNetClassifier",
    "FederatedSPDnetClassifier",
    "FederatedTangentSpaceLR",
    "Recenter",
    "save_estimator",
    "load_estimator",
    "__version__",
]
