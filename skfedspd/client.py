"""The client side of a federated run: one site's data and its replies (:class:`Site`), the
same on every transport. Nothing here sees another site's data.
"""

import numpy as np
import torch

from .batchnorm import DomainBatch
from .messages import EvalReply, SetupReply, TrainReply
from .training import derive_seed
from .validation import stratified_split, training_weights

__all__ = ["Site", "client_statistic", "client_update", "site_training_weights", "DP_SAMPLE_WEIGHT_ERROR"]

#: Why ``privacy`` refuses sample weights (``fit``, and a site whose data carry them).
DP_SAMPLE_WEIGHT_ERROR = ("sample_weight is not supported with privacy (DP-SGD): the privacy accounting assumes "
                          "unweighted samples")


def client_statistic(est, X, sample_weight=None):
    """A client's input statistic (weighted by its sample weights when it has any).

    Examples
    --------
    >>> import numpy as np
    >>> from skfedspd import SPDnetClassifier
    >>> from skfedspd.client import client_statistic
    >>> est = SPDnetClassifier()
    >>> X = est.check_inputs(np.stack([np.eye(2), np.exp(2) * np.eye(2)]), reset=True)
    >>> client_statistic(est, X)
    1.0
    """
    # Estimators whose statistic ignores weights may omit the argument.
    return est.input_statistic(X) if sample_weight is None else est.input_statistic(X, sample_weight=sample_weight)


def client_update(est, global_params, local_state, X, y, sample_weight, seed, dp, optimizer_state=None, **kwargs):
    """One client's local training (the local estimator's ``local_update``) as a
    :class:`~skfedspd.messages.TrainReply`; ``kwargs``: ``lr``, ``n_epochs``, ``n_threads``.

    Examples
    --------
    >>> import numpy as np
    >>> import torch
    >>> from skfedspd import SPDnetClassifier
    >>> from skfedspd.client import client_update
    >>> from skfedspd.datasets import make_spd_classification
    >>> X, y = make_spd_classification(n_matrices=12, n_channels=4, n_classes=2, seed=0)
    >>> est = SPDnetClassifier()
    >>> X = est.check_inputs(X, reset=True)
    >>> est.set_classes(y); est.set_input_statistic(est.input_statistic(X)); est.init_module(0)
    >>> weights = torch.as_tensor(np.repeat([1.0, 2.0], 6))
    >>> reply = client_update(est, est.get_parameters(), None, est.to_tensor(X), torch.as_tensor(est.encode_labels(y)),
    ...                       weights, seed=1, dp=None, lr=0.01, n_epochs=1)
    >>> reply.n_examples, reply.weight
    (12, 18.0)
    """
    state = None if optimizer_state is None else dict(optimizer_state)
    params, loss, n_skipped = est.local_update(global_params, local_state, X, y, seed=seed, dp=dp,
                                               sample_weight=sample_weight, optimizer_state=state, **kwargs)
    return TrainReply(params, float(loss), int(n_skipped), len(y),
                      None if sample_weight is None else float(sample_weight.sum()), optimizer_state=state)


def site_training_weights(est, y, sample_weight):
    """A site's ``sample_weight`` times the local estimator's dict ``class_weight``; None when
    it has neither (``"balanced"`` is refused: no site knows every class count).

    Examples
    --------
    >>> import numpy as np
    >>> from skfedspd import SPDnetClassifier
    >>> from skfedspd.client import site_training_weights
    >>> y = np.array(["a", "a", "b"])
    >>> site_training_weights(SPDnetClassifier(class_weight={"a": 1.0, "b": 3.0}), y, np.array([1.0, 2.0, 1.0]))
    array([1., 2., 3.])
    """
    class_weight = est.federation_traits().class_weight
    if isinstance(class_weight, str) and class_weight == "balanced":
        raise ValueError("class_weight='balanced' is not supported on a Flower deployment: it needs the class counts "
                         "of every site's data, which no site knows; give class_weight as a dict (label -> weight) or "
                         "put the weights in each site's sample_weight")
    return training_weights(class_weight, y, sample_weight, all_data=False)


class Site:
    """One client of a federated run: its data, split and declared, then trained and validated.

    Parameters
    ----------
    client_id : int
    X, y : array-like
        All the site's samples and labels.
    sample_weight : ndarray or None
    groups : array-like or None
        The samples' domains for ``batchnorm="domain"``; None: one domain.
    setup : dict
        The run's set-up (:meth:`skfedspd.run.FederatedRun.site_setup`).
    estimator : estimator
        The unfitted local estimator.

    Attributes
    ----------
    reply : SetupReply
        What the site declares at set-up.
    train, val : ndarray
        Indices of the training and validation samples.
    est : estimator or None
        The prepared local estimator (None until the set-up is ``ready``).

    Examples
    --------
    >>> from skfedspd import SPDnetClassifier
    >>> from skfedspd.client import Site
    >>> from skfedspd.datasets import make_spd_classification
    >>> X, y = make_spd_classification(n_matrices=20, n_channels=4, n_classes=2, seed=0)
    >>> setup = {"seed": 0, "validation_fraction": 0.2, "classes": None, "private": False, "ready": False}
    >>> site = Site(0, X, y, None, None, setup, SPDnetClassifier())
    >>> site.reply.n_train, site.reply.n_val, site.reply.labels
    (16, 4, [0, 1])
    """

    def __init__(self, client_id, X, y, sample_weight, groups, setup, estimator):
        est = estimator
        X = est.check_inputs(X, reset=True)
        y = np.asarray(y)
        labels, local_codes = np.unique(y, return_inverse=True)
        if setup["classes"] is not None:
            unknown = sorted(set(labels.tolist()) - set(setup["classes"]), key=repr)
            if unknown:
                raise ValueError(f"this site holds labels {unknown} that are not in the agreed classes "
                                 f"{setup['classes']}")
        try:
            w = site_training_weights(est, y, sample_weight)
        except ValueError as error:  # e.g. a site whose weights are all zero: say which site
            raise ValueError(f"client {int(client_id)}: {error}") from None
        if w is not None and setup.get("private"):
            raise ValueError(DP_SAMPLE_WEIGHT_ERROR)
        # The split sees the labels only through their order and counts: the site's own label
        # codes give the split that the run's codes would.
        self.train, self.val = stratified_split(local_codes.reshape(-1), setup["validation_fraction"],
                                                derive_seed(setup["seed"], 8, client_id))
        w_train = None if w is None else w[self.train]
        weight = None if w is None else float(w_train.sum())  # declared; the run refuses a weight of 0
        self.client_id, self.X, self.y, self.w, self.groups = int(client_id), X, y, w, groups
        self.reply = SetupReply(
            self.client_id, [int(s) for s in X.shape[1:]], None if setup["classes"] is not None else labels.tolist(),
            n_train=len(self.train), n_val=len(self.val), weight=weight,
            statistic=None if setup.get("private") or weight == 0 else client_statistic(est, X[self.train], w_train))
        self._estimator = est
        self.est = None
        if setup["ready"]:
            self.prepare(setup)

    def prepare(self, setup):
        """Build the site's model and tensors from the complete set-up (``ready``)."""
        est = self._estimator
        est.set_classes(setup["classes"])
        codes = est.encode_labels(self.y, len(self.X))
        est.set_input_statistic(setup["input_statistic"])
        est.init_module(setup["seed"])
        # The site's groups (subjects, sessions) are domains of batchnorm="domain".
        domains = est.fit_domains(self.groups, len(self.X))
        self.X_train, self.y_train = est.module_input(self.X, self.train, domains), torch.as_tensor(codes[self.train])
        self.X_val, self.y_val = est.module_input(self.X, self.val, domains), torch.as_tensor(codes[self.val])
        w = self.w
        self.w_train, self.w_val = (None, None) if w is None else (torch.as_tensor(w[self.train]),
                                                                   torch.as_tensor(w[self.val]))
        self._setup_seed, self._domain_references = setup["seed"], setup.get("domain_references")
        self.est = est

    def release_domain_means(self, global_params, dp, released=None):
        """DP mode with ``batchnorm="domain"``: release the site's domain means once (or reuse
        ``released``); returns ``M^{-1/2}`` per layer and domain.
        """
        if not isinstance(self.X_train, DomainBatch):  # the site is one domain
            self.X_train = DomainBatch(self.X_train, np.zeros(len(self.X_train), dtype=np.intp))
        X = self.X_train
        if X.statistics is None:
            if released is None:
                self.est.set_parameters(global_params)
                generator = torch.Generator().manual_seed(derive_seed(self._setup_seed, 10, self.client_id))
                released = self.est.release_domain_means(X, references=self._domain_references, clip=dp["domain_clip"],
                                                         noise_multiplier=dp["domain_noise_multiplier"],
                                                         generator=generator)
            X.statistics = [torch.as_tensor(np.asarray(M), dtype=X.X.dtype, device=X.X.device) for M in released]
        return [M.cpu().numpy() for M in X.statistics]

    def train_update(self, global_params, local_state, *, seed, lr, n_epochs, dp=None, optimizer_state=None,
                     n_threads=None):
        """The site's :class:`~skfedspd.messages.TrainReply` to a train message."""
        return client_update(self.est, global_params, local_state or None, self.X_train, self.y_train, self.w_train,
                             seed, dp, optimizer_state, lr=lr, n_epochs=n_epochs, n_threads=n_threads)

    def validate(self, params, local_state=None, *, load=True):
        """The site's :class:`~skfedspd.messages.EvalReply` of the model ``params`` on its validation part."""
        if load:
            self.est.set_parameters(params)
            if local_state:
                self.est.set_parameters(local_state)
        loss, f1 = self.est.validation_scores(self.X_val, self.y_val, self.w_val)
        return EvalReply(float(loss), float(f1), len(self.val))

    def prior_statistics(self, params):
        """The additive statistics of the domain prior with the model ``params``, on all the site's data."""
        self.est.set_parameters(params)
        return self.est.domain_prior_statistics(self.X, self.groups)
