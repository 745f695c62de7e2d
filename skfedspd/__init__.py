"""skfedspd: SPDnet on SPD (EEG covariance) matrices, centralized or federated, for scikit-learn."""

from .classifier import SPDnetClassifier

__version__ = "0.1.0"
__all__ = ["SPDnetClassifier", "__version__"]
