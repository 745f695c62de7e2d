"""The named pipelines every accuracy experiment draws from, the package's from its public API only.

* :data:`PIPELINES`: covariances in (TS+LR, Recenter+TS+LR, SPDnet and FedSPDnet with and
  without domain batch norm), and :data:`ABLATIONS`, each one setting away from one of them;
* :data:`STUDIES`: the study model of :mod:`.study_model` (outside the package), the parts of
  SPDDSMBN added one at a time; :data:`BANDED`: filter banks on four sub-bands;
* :func:`moabb_pipelines`: epochs in, the covariances estimated inside, for MOABB's
  evaluations (``moabb``);
* the paper's Table I estimators are built by :mod:`.table_one_protocols` (its training
  settings per dataset); the MOABB pipeline files in ``moabb_pipelines/`` (for
  ``moabb.benchmark(pipelines=...)``: the paper's FedSPDnet, ProjAvg in YAML, RLAvg in
  Python) are checked against them by ``tests/benchmarks/test_moabb_pipelines.py``.
"""

import numpy as np
import sklearn
from pyriemann.tangentspace import TangentSpace
from sklearn.base import BaseEstimator, ClassifierMixin, MetaEstimatorMixin, clone
from sklearn.ensemble import VotingClassifier
from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import make_pipeline, make_union
from sklearn.preprocessing import FunctionTransformer
from sklearn.utils.metadata_routing import get_routing_for_object
from sklearn.utils.validation import check_is_fitted

from skfedspd import FederatedSPDnetClassifier, FederatedTangentSpaceLR, Recenter, SPDnetClassifier
from skfedspd.clients import ClientPartition

from .study_model import StudySPDnetClassifier


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
    return federated(seed, SPDnetClassifier(**params), clients=ClientPartition(groups_per_client))


#: name -> factory(seed) of the pipelines the experiments compare.
PIPELINES = {
    "TS+LR": ts_lr,
    "Recenter+TS+LR": recenter_ts_lr,
    # the federated classical baseline: sites of 2 subjects, as the FedSPDnet rows
    "FedRecenter+TS+LR": lambda seed: FederatedTangentSpaceLR(groups_per_client=2),
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


class TrainingSubjects(MetaEstimatorMixin, ClassifierMixin, BaseEstimator):
    """``estimator`` fitted on ``n_subjects`` of the training subjects (``groups``), drawn by
    ``random_state``: the same subjects for every pipeline given the same training subjects.

    Attributes
    ----------
    estimator_ : the fitted clone of ``estimator``
    subjects_ : ndarray of shape (n_subjects,)
    classes_ : ndarray of shape (n_classes,)
    """

    __metadata_request__fit = {"groups": True}

    def __init__(self, estimator, n_subjects, random_state=0):
        self.estimator = estimator
        self.n_subjects = n_subjects
        self.random_state = random_state

    def __sklearn_is_fitted__(self):
        return hasattr(self, "estimator_")

    def fit(self, X, y, groups=None):
        subjects = np.unique(groups) if groups is not None else []
        if len(subjects) < self.n_subjects:
            raise ValueError(f"TrainingSubjects needs at least n_subjects={self.n_subjects} subjects as groups, "
                             f"got {len(subjects)}")
        self.subjects_ = np.random.default_rng(self.random_state).choice(subjects, self.n_subjects, replace=False)
        kept = np.isin(groups, self.subjects_)
        self.estimator_ = fit(clone(self.estimator), X[kept], np.asarray(y)[kept], np.asarray(groups)[kept])
        self.classes_ = self.estimator_.classes_
        return self

    def predict_proba(self, X):
        check_is_fitted(self)
        return self.estimator_.predict_proba(X)

    def predict(self, X):
        check_is_fitted(self)
        return self.estimator_.predict(X)


#: Pipelines that differ from a named one in one setting (the ablations of the design decisions,
#: and the number of training subjects).
ABLATIONS = {
    "FedSPDnet+dBN, subject domains": lambda seed: fedspdnet(seed, batchnorm="domain").set_params(domains="group"),
    "SPDnet+dBN, best epoch": lambda seed: spdnet(seed, batchnorm="domain", checkpoint="best"),
    **{f"{name}, {n} training subjects": (lambda seed, name=name, n=n: TrainingSubjects(PIPELINES[name](seed), n))
       for name in ("Recenter+TS+LR", "SPDnet+dBN") for n in (8, 16)},
}

def band_of(X, band):
    """The matrices of one band of ``(n, bands, C, C)`` input."""
    return X[:, band]


def filter_bank(steps, n_bands):
    """A filter bank over ``(n, bands, C, C)`` input: the steps ``steps()`` on each band, their
    outputs concatenated (scikit-learn's ``FeatureUnion``, which routes ``groups`` to them)."""
    return make_union(*[make_pipeline(FunctionTransformer(band_of, kw_args={"band": band}), *steps())
                        for band in range(n_bands)])


#: Pipelines on the OAS covariances of the four sub-bands, ``(n, 4, C, C)``
#: (:data:`.data.SUB_BANDS`, :func:`.data.load_left_right_bands`).
BANDED = {
    "Recenter+TS+LR, 4 sub-bands (OAS)": lambda seed: make_pipeline(filter_bank(lambda: [Recenter(), TangentSpace()], 4),
                                                              LogisticRegression(max_iter=1000)),
    "study model, 4 sub-bands (OAS), one BiMap each": lambda seed: StudySPDnetClassifier(random_state=seed),
}

#: Pipelines on the OAS covariances of the 8-32 Hz trials, ``(n, C, C)``
#: (:func:`.data.load_left_right_bands` with :data:`.data.BROAD`): the shrunk classical baseline.
SHRUNK = {
    "Recenter+TS+LR on OAS covariances": recenter_ts_lr,
}

#: Pipelines on the 16 sensorimotor channels of the 8-32 Hz trials
#: (:data:`skfedspd.datasets.SENSORIMOTOR_CHANNELS`; sample covariances): the number of channels.
SENSORIMOTOR = {
    "Recenter+TS+LR, 16 sensorimotor channels": recenter_ts_lr,
    "SPDnet+dBN, 16 sensorimotor channels": PIPELINES["SPDnet+dBN"],
}

#: Re-centred TS+LR on the OAS covariances of the 16 sensorimotor channels.
SENSORIMOTOR_SHRUNK = {
    "Recenter+TS+LR on OAS covariances, 16 sensorimotor channels": recenter_ts_lr,
}

#: The SPDDSMBN study model (:mod:`.study_model`) with the parts of SPDDSMBN added one at a time.
STUDIES = {
    "study model": lambda seed: StudySPDnetClassifier(random_state=seed),
    "study model, dispersion normalized": lambda seed: StudySPDnetClassifier(dispersion=True, random_state=seed),
    "study model, minibatches of 4 subjects x 16 trials":
        lambda seed: StudySPDnetClassifier(mixed=True, random_state=seed),
    "study model, minibatches of 4 subjects x 16 trials, dispersion normalized":
        lambda seed: StudySPDnetClassifier(mixed=True, dispersion=True, random_state=seed),
    "study model, minibatches of 4 subjects x 16 trials, running domain means":
        lambda seed: StudySPDnetClassifier(mixed=True, running=True, random_state=seed),
    "study model, complete SPDDSMBN":
        lambda seed: StudySPDnetClassifier(mixed=True, running=True, dispersion=True, random_state=seed),
}


def federated(seed, local=None, **params):
    """``FederatedSPDnetClassifier(local, **params)`` (None: the default local
    ``SPDnetClassifier()``), one client per group unless ``params`` say otherwise."""
    return FederatedSPDnetClassifier(local, random_state=seed, **params)


def seed_ensemble(models):
    """``models`` (one per training seed) as one classifier: their probabilities averaged by
    scikit-learn's soft ``VotingClassifier``, which routes ``groups`` to each under metadata
    routing."""
    return VotingClassifier([(f"seed{k}", model) for k, model in enumerate(models)], voting="soft")


def moabb_pipelines(quick, groups_per_client=2):
    """name -> pipeline of MOABB's evaluations (``moabb``): epochs in, covariances estimated
    inside, MOABB's own definitions where it has one (OAS covariances for the tangent-space
    and MDM pipelines, FgMDM as its ``FgMDM.yml``; SCM covariances for SPDnet, as in the paper);
    the SPDnet rows are those of :data:`PIPELINES` (``random_state=0``; ``"SPDnet, 5 seeds"``:
    five of them, seeds 0-4, in a soft ``VotingClassifier``); ``quick`` leaves TS+SVM and EEGNet
    out."""
    from pyriemann.classification import MDM, FgMDM
    from pyriemann.estimation import Covariances
    from sklearn.svm import SVC

    from skfedspd import EEGNetClassifier

    def ts(clf):
        return make_pipeline(Covariances("oas"), TangentSpace(metric="riemann"), clf)

    out = {"TS+LR": ts(LogisticRegression(C=1.0))}
    if not quick:
        out["TS+SVM"] = ts(SVC(kernel="linear", C=1.0))
    out["MDM"] = make_pipeline(Covariances("oas"), MDM(metric="riemann"))
    out["FgMDM"] = make_pipeline(Covariances("oas"), FgMDM(metric="riemann"))
    out["Recenter+TS+LR"] = make_pipeline(Covariances("oas"), Recenter(), TangentSpace(metric="riemann"),
                                          LogisticRegression(C=1.0))
    out["SPDnet"] = make_pipeline(Covariances("scm"), spdnet(0))
    out["SPDnet, 5 seeds"] = make_pipeline(Covariances("scm"), seed_ensemble([spdnet(k) for k in range(5)]))
    out["FedSPDnet"] = make_pipeline(Covariances("scm"), federated(0, clients=ClientPartition(groups_per_client)))
    out["SPDnet + domain BN"] = make_pipeline(Covariances("scm"), spdnet(0, batchnorm="domain"))
    out["FedSPDnet + domain BN"] = make_pipeline(Covariances("scm"),
                                                 fedspdnet(0, groups_per_client, batchnorm="domain"))
    if not quick:
        out["EEGNet"] = EEGNetClassifier(fs=160.0, random_state=0)
    return out
