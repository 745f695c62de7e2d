"""What a local model declares to the federation: :class:`FederationTraits`, read instead of
its hyper-parameters (``docs/guide/protocol.md``).
"""

from dataclasses import dataclass

__all__ = ["FederationTraits"]


@dataclass(frozen=True)
class FederationTraits:
    """What a local model declares to the federation.

    Parameters
    ----------
    domains : bool, default=False
        The model re-centres each domain by its own statistics (domain batch norm).
    batch_statistics : bool, default=False
        The model normalizes each minibatch by its own statistics (refused in DP mode).
    class_weight : None, "balanced" or dict, default=None
        The class weights every site multiplies into its samples' weights.
    early_stopping : {"auto", True, False}, default="auto"
        The rule by which a validation part is held out.
    head_only : bool, default=False
        Only the head trains.
    lr : float or None, default=None
        The learning rate of a site's first round.
    batch_size : int or None, default=None
        The minibatch size of local training.

    Examples
    --------
    >>> from skfedspd import SPDnetClassifier
    >>> SPDnetClassifier(batchnorm="domain").federation_traits().domains
    True
    """

    domains: bool = False
    batch_statistics: bool = False
    class_weight: object = None
    early_stopping: object = "auto"
    head_only: bool = False
    lr: object = None
    batch_size: object = None
