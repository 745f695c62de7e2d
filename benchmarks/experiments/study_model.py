"""The learner-leads study model: what the estimator cannot take yet, as a scikit-learn classifier.

One SPDnet per frequency band of ``(n, bands, C, C)`` inputs (BiMap, domain batch norm, ReEig,
LogEig), their tangent vectors concatenated into one linear head, with the parts of TSMNet's
SPDDSMBN (Kobler et al., 2022) the package's domain batch norm leaves out: each domain's
dispersion normalized to a learned target, minibatches of several domains, running domain means
with TSMNet's momentum schedule. It trains as the estimator does with a validation part (Adam
1e-2, 10 % held out, the epochs within one standard error of the lowest validation loss
averaged); it is not part of the package. The experiments ``learner-leads`` (the main job's
splits) and ``unseen-subjects`` (its ``study model`` rows) measure it.
"""

import numpy as np
import torch
from sklearn.base import BaseEstimator, ClassifierMixin
from sklearn.model_selection import train_test_split
from sklearn.utils.validation import check_is_fitted
from torch import nn

from skfedspd.aggregation import projavg
from skfedspd.batchnorm import DomainBatch, DomainSPDBatchNorm
from skfedspd.federated_module import FederatedModule
from skfedspd.functional import expm_sym, logeig, spd_geodesic, sqrtm_invsqrtm
from skfedspd.nn import SPDNet
from skfedspd.training import train_epochs


class DispersionBatchNorm(DomainSPDBatchNorm):
    """Domain batch norm that also rescales each domain's dispersion: the re-centred
    matrices ``Z`` of a domain become ``B^{1/2} exp(s / σ · log Z) B^{1/2}``, ``σ²`` their mean
    squared distance to the identity (to the domain's mean before re-centring) and
    ``s = exp(log_std)`` a learned target (SPDDSMBN)."""

    def __init__(self, n, karcher_steps=1, dtype=torch.float64):
        super().__init__(n, karcher_steps=karcher_steps, dtype=dtype)
        self.log_std = nn.Parameter(torch.zeros((), dtype=dtype))

    def normalize(self, X, M):
        inv_half = sqrtm_invsqrtm(M)[1]
        L = logeig(inv_half @ X @ inv_half)
        power = torch.exp(self.log_std) / torch.sqrt((L**2).sum((-1, -2)).mean() + 1e-8)
        half = self._bias_half()
        return half @ expm_sym(power * L) @ half.transpose(-1, -2)


class RunningDomainBatchNorm(DomainSPDBatchNorm):
    """Domain batch norm with running domain means in training (SPDDSMBN): each domain of a
    minibatch is re-centred by its running mean moved towards the minibatch's mean by the
    momentum ``eta`` (the gradient flows through the minibatch's part), set once per epoch;
    in evaluation each domain of a call is re-centred by its own mean, as in the package."""

    def __init__(self, n, karcher_steps=1, dtype=torch.float64):
        super().__init__(n, karcher_steps=karcher_steps, dtype=dtype)
        self.eta, self.running = 1.0, {}

    def forward(self, X, domains=None):
        if not self.training or domains is None:
            return super().forward(X, domains)
        parts, rows = [], []
        for code in torch.unique(domains).tolist():
            idx = torch.nonzero(domains == code).flatten()
            mean = self.batch_mean(X[idx])
            if code in self.running and self.eta < 1:
                mean = spd_geodesic(self.running[code], mean, self.eta)
            self.running[code] = mean.detach()
            parts.append(self.normalize(X[idx], mean))
            rows.append(idx)
        return torch.cat(parts)[torch.argsort(torch.cat(rows))]


class CompleteDomainBatchNorm(RunningDomainBatchNorm, DispersionBatchNorm):
    """SPDDSMBN as a whole: running domain means in training (:class:`RunningDomainBatchNorm`)
    and each domain's dispersion around the mean it is re-centred by rescaled to the learned
    target (:class:`DispersionBatchNorm`)."""


def momentum_schedule(epoch, horizon=50, final=16 / 64):
    """TSMNet's running-mean momentum at ``epoch`` (from 0): 1 at the first epoch, decaying
    geometrically to ``final`` (trials of a domain / trials of a minibatch) at ``horizon``."""
    rho = final ** (1 / horizon)
    return 1 - (rho ** (horizon * max(horizon - 1 - epoch, 0) / (horizon - 1)) - rho**horizon)


def mixed_minibatches(domains, per_domain, domains_per_batch, generator):
    """One epoch's minibatches of ``domains_per_batch`` chunks of about ``per_domain`` trials,
    each chunk one domain's (TSMNet's stratified domain batches); index tensors."""
    chunks = []
    for code in torch.unique(domains):
        idx = torch.nonzero(domains == code).flatten()
        idx = idx[torch.randperm(len(idx), generator=generator)]
        chunks += list(torch.tensor_split(idx, max(1, round(len(idx) / per_domain))))
    order = torch.randperm(len(chunks), generator=generator).tolist()
    return [torch.cat([chunks[j] for j in order[i:i + domains_per_batch]])
            for i in range(0, len(order), domains_per_batch)]


def train_mixed_epoch(model, optimizer, batch, labels, epoch, generator):
    """One epoch on mixed-domain minibatches, the running-mean momentum of the epoch set."""
    for bn in model.modules():
        if isinstance(bn, RunningDomainBatchNorm):
            bn.eta = momentum_schedule(epoch)
    with torch.enable_grad():
        for idx in mixed_minibatches(batch.domains, 16, 4, generator):
            optimizer.zero_grad(set_to_none=True)
            nn.functional.cross_entropy(model(batch[idx]), labels[idx]).backward()
            optimizer.step()
            model.after_step_()


class BandSPDNet(FederatedModule):
    """One SPDnet (BiMap, domain batch norm, ReEig, LogEig) per band of ``(n, bands, C, C)``
    inputs, their tangent vectors concatenated into one linear head."""

    def __init__(self, n_bands, n_channels, hidden_dim, n_classes, seed, dispersion=False, running=False):
        super().__init__()
        self.nets = nn.ModuleList(SPDNet(n_channels, (hidden_dim,), n_classes, eps=1e-2, seed=seed * 100 + band,
                                         batchnorm="domain") for band in range(n_bands))
        layer = {(True, True): CompleteDomainBatchNorm, (True, False): DispersionBatchNorm,
                 (False, True): RunningDomainBatchNorm}.get((dispersion, running))
        if layer is not None:
            for net in self.nets:
                net.batchnorms = nn.ModuleList(layer(hidden_dim) for _ in net.batchnorms)
        self.head = nn.Linear(n_bands * hidden_dim * (hidden_dim + 1) // 2, n_classes, dtype=torch.float64)

    def forward(self, batch):
        features = [net.features(batch.with_inputs(batch.X[:, band])) for band, net in enumerate(self.nets)]
        return self.head(torch.cat(features, 1))

    def after_step_(self):
        for net in self.nets:
            net.after_step_()

    def parameter_kinds(self):
        kinds = {f"nets.{band}.{name}": kind for band, net in enumerate(self.nets)
                 for name, kind in net.parameter_kinds().items() if not name.startswith("head.")}
        return {**kinds, "head.weight": "euclidean", "head.bias": "euclidean"}

    def _exported_state(self):
        return {name: value for name, value in self.state_dict(keep_vars=True).items()
                if name in self.parameter_kinds()} | {
            f"nets.{band}.bimaps.0.weight": net.bimaps[0].weight for band, net in enumerate(self.nets)}

    def _load_array(self, name, value, state):
        if ".bimaps." in name:
            self.nets[int(name.split(".")[1])].bimaps[0].set_weight(value)
        else:
            super()._load_array(name, value, state)


def fit_study(X, y, domains, seed, dispersion=False, mixed=False, running=False, hidden_dim=18, max_epochs=150,
              patience=25):
    """The study model fitted as the estimator fits with a validation part; returns it.
    ``mixed``: minibatches of 4 domains x 16 trials (else one domain each, as the package)."""
    torch.manual_seed(seed)
    train, val = train_test_split(np.arange(len(y)), test_size=0.1, stratify=y, random_state=seed)
    model = BandSPDNet(X.shape[1], X.shape[-1], hidden_dim, int(y.max()) + 1, seed, dispersion, running)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    generator = torch.Generator().manual_seed(seed)
    batch, labels = DomainBatch(torch.as_tensor(X), domains), torch.as_tensor(y)
    checkpoints, losses = [], []
    for epoch in range(max_epochs):
        model.train()
        if mixed:
            train_mixed_epoch(model, optimizer, batch[torch.as_tensor(train)], labels[train], epoch, generator)
        else:
            train_epochs(model, optimizer, batch[torch.as_tensor(train)], labels[train], n_epochs=1, batch_size=64,
                         generator=generator)
        model.eval()
        with torch.no_grad():  # each validation domain re-centred by its own trials, as a test subject
            per_trial = torch.cat([nn.functional.cross_entropy(model(batch[torch.as_tensor(part)]), labels[part],
                                                               reduction="none")
                                   for part in (val[domains[val] == d] for d in np.unique(domains[val]))])
        losses.append((float(per_trial.mean()), float(per_trial.std() / len(per_trial) ** 0.5)))
        checkpoints.append(model.get_parameters())
        if len(losses) - 1 - int(np.argmin([loss for loss, _ in losses])) >= patience:
            break
    lowest = min(losses)
    chosen = [c for c, (loss, _) in zip(checkpoints, losses) if loss <= lowest[0] + lowest[1]]
    model.set_parameters(projavg(chosen, [1 / len(chosen)] * len(chosen), None, model.parameter_kinds()))
    return model.eval()


class StudySPDnetClassifier(ClassifierMixin, BaseEstimator):
    """The study model (:class:`BandSPDNet`, fitted by :func:`fit_study`) as a classifier.

    Every band's matrices are scaled by one constant, their mean trace over the training
    matrices divided by the number of channels. The subjects (``groups``, required) are the
    training domains; each call of ``predict_proba`` is one domain, re-centred by its own
    matrices (predict a subject in one call).

    Parameters
    ----------
    dispersion : bool, default=False
        Normalize each domain's dispersion to a learned target.
    mixed : bool, default=False
        Minibatches of 4 domains x 16 trials (else one domain each, as the package).
    running : bool, default=False
        Running domain means in training, TSMNet's momentum schedule (with ``mixed``).
    hidden_dim : int, default=18
        The BiMap's output size.
    max_epochs : int, default=150
    random_state : int, default=0

    Attributes
    ----------
    classes_ : ndarray of shape (n_classes,)
    trace_ : ndarray of shape (n_bands,)
        The training matrices' mean trace per band.
    module_ : BandSPDNet
    """

    __metadata_request__fit = {"groups": True}

    def __init__(self, dispersion=False, mixed=False, running=False, hidden_dim=18, max_epochs=150, random_state=0):
        self.dispersion = dispersion
        self.mixed = mixed
        self.running = running
        self.hidden_dim = hidden_dim
        self.max_epochs = max_epochs
        self.random_state = random_state

    def __sklearn_is_fitted__(self):
        return hasattr(self, "module_")

    def fit(self, X, y, groups=None):
        if groups is None:
            raise ValueError("StudySPDnetClassifier needs the subjects of the training matrices as groups")
        if self.running and not self.mixed:
            raise ValueError("running=True needs mixed=True: the running means' momentum follows the mixed epochs")
        X = self._bands(X)
        self.trace_ = np.trace(X, axis1=-2, axis2=-1).mean(0)
        self.classes_, labels = np.unique(y, return_inverse=True)
        domains = np.unique(groups, return_inverse=True)[1]
        self.module_ = fit_study(self._scaled(X), labels, domains, self.random_state, dispersion=self.dispersion,
                                 mixed=self.mixed, running=self.running, hidden_dim=self.hidden_dim,
                                 max_epochs=self.max_epochs)
        return self

    def predict_proba(self, X):
        check_is_fitted(self)
        X = self._scaled(self._bands(X))
        with torch.no_grad():
            return torch.softmax(self.module_(DomainBatch(torch.as_tensor(X), np.zeros(len(X)))), 1).numpy()

    def predict(self, X):
        return self.classes_[self.predict_proba(X).argmax(1)]

    @staticmethod
    def _bands(X):
        X = np.asarray(X, dtype=np.float64)
        return X[:, None] if X.ndim == 3 else X

    def _scaled(self, X):
        return X / self.trace_[None, :, None, None] * X.shape[-1]
