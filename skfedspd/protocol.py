"""What a local model declares to the federation: :class:`FederationTraits`.

The federation (:mod:`skfedspd.run`, the sites, the Flower apps) never reads a local
model's hyper-parameters by name nor reaches into its network: it asks the model's
:meth:`~skfedspd.base.TorchClassifierBase.federation_traits` what it needs to know, and
calls the model's public methods (``docs/guide/protocol.md``).
"""

from dataclasses import dataclass

__all__ = ["FederationTraits"]


@dataclass(frozen=True)
class FederationTraits:
    """What a local model declares to the federation.

    Parameters
    ----------
    domains : bool, default=False
        The model re-centres each domain (a subject, a session) by its own statistics
        (domain batch norm): the sites pass their domains, the released model gets a domain
        prior (:meth:`fit_domain_prior`, :meth:`set_domain_prior`), and in DP mode each site
        first releases its domains' means (:meth:`release_domain_means`).
    batch_statistics : bool, default=False
        The model normalizes each minibatch by statistics of that minibatch (SPD batch
        norm), which mixes its samples: refused in DP mode, where one sample's gradient must
        stay bounded.
    class_weight : None, "balanced" or dict, default=None
        The class weights every site multiplies into its samples' weights.
    early_stopping : {"auto", True, False}, default="auto"
        The rule by which a validation part is held out
        (:func:`skfedspd.validation.uses_validation`), applied to the federation as a whole.
    head_only : bool, default=False
        Only the head trains (meant for a model that starts from trained weights).
    lr : float or None, default=None
        The learning rate of a site's first round (the federated schedule lowers it from
        there).
    batch_size : int or None, default=None
        The minibatch size of local training: what DP mode plans its sampling rate from.

    Examples
    --------
    >>> from skfedspd import SPDnetClassifier
    >>> SPDnetClassifier(batchnorm="domain").federation_traits().domains
    True
    >>> from skfedspd.protocol import FederationTraits
    >>> FederationTraits()
    FederationTraits(domains=False, batch_statistics=False, class_weight=None, early_stopping='auto', head_only=False, lr=None, batch_size=None)
    """

    domains: bool = False
    batch_statistics: bool = False
    class_weight: object = None
    early_stopping: object = "auto"
    head_only: bool = False
    lr: object = None
    batch_size: object = None
