"""A new subject's calibration trials as its domain statistics (MOABB's cross-subject transfer).

MOABB's ``CrossSubjectEvaluation(cs_mode=...)`` routes a calibration slice of the new subject
to ``fit`` as ``X_target_unlabeled`` or ``X_target_labeled`` (with ``y_target_labeled``, not
requested here). ``Recenter``, ``SPDnetClassifier`` with domain batch norm and
``FederatedSPDnetClassifier`` around one store it as the domain :data:`TARGET_DOMAIN`, which
prediction without ``domain`` starts from instead of the prior. The slice arrives raw: build
the pipeline with ``make_pipeline(Covariances(), ..., transform_input=TARGET_INPUTS)``
(scikit-learn >= 1.6), which passes it through the earlier steps
(``docs/guide/moabb-transfer.md``).
"""

import numpy as np

from .online import THIS_CALL, domain_labels
from .validation import check_spd_batch

__all__ = ["TARGET_DOMAIN", "TARGET_INPUTS", "target_trials"]

#: The domain label under which ``fit`` stores a new subject's calibration trials.
TARGET_DOMAIN = "target"

#: The fields MOABB routes raw that the package's estimators consume: pass as
#: ``Pipeline(transform_input=TARGET_INPUTS)``.
TARGET_INPUTS = ["X_target_unlabeled", "X_target_labeled"]

RAW_SLICE_ERROR = (
    "{name} has shape {shape}: raw trials (n_trials, n_channels, n_times), not SPD matrices. MOABB routes the "
    "calibration slice raw; build the pipeline with make_pipeline(..., transform_input=skfedspd.transfer."
    "TARGET_INPUTS) (scikit-learn >= 1.6) so that the earlier steps (e.g. Covariances) transform it"
)


def target_trials(X_target_unlabeled=None, X_target_labeled=None, n_channels=None):
    """The calibration trials routed to ``fit``, validated: both slices stacked as one batch
    of SPD matrices of size ``n_channels``, or None when neither is given.

    Raises
    ------
    ValueError
        Naming the field: raw trials (a pipeline without ``transform_input``), or matrices
        that are not SPD, not square or of the wrong size.

    Examples
    --------
    >>> import numpy as np
    >>> from skfedspd.transfer import target_trials
    >>> target_trials(np.eye(3)[None], 2 * np.eye(3)[None]).shape
    (2, 3, 3)
    >>> target_trials(np.ones((4, 3, 100)))
    Traceback (most recent call last):
    ...
    ValueError: X_target_unlabeled has shape (4, 3, 100): raw trials (n_trials, n_channels, n_times), not SPD \
matrices. MOABB routes the calibration slice raw; build the pipeline with make_pipeline(..., \
transform_input=skfedspd.transfer.TARGET_INPUTS) (scikit-learn >= 1.6) so that the earlier steps (e.g. \
Covariances) transform it
    """
    parts = []
    for name, X in zip(TARGET_INPUTS, (X_target_unlabeled, X_target_labeled)):
        if X is None:
            continue
        shape = np.shape(X)
        if len(shape) == 3 and shape[1] != shape[2]:
            raise ValueError(RAW_SLICE_ERROR.format(name=name, shape=tuple(shape)))
        try:
            parts.append(check_spd_batch(X, n_channels))
        except ValueError as error:
            raise ValueError(f"{name}: {error}") from None
    return np.concatenate(parts) if parts else None


def adapt_target(estimator, calibration):
    """``estimator.adapt(calibration, TARGET_DOMAIN)``; its refusals (e.g. matrices far
    outside the training range) name the calibration fields."""
    try:
        estimator.adapt(calibration, TARGET_DOMAIN)
    except ValueError as error:
        raise ValueError(f"{' / '.join(TARGET_INPUTS)}: {error}") from None


def call_labels(statistics, domain, n_matrices):
    """Each matrix's domain in a prediction: ``domain``'s labels when given; else the
    calibrated new subject (:data:`TARGET_DOMAIN`, when ``statistics`` hold it) or the
    call's own temporary domain (started from the prior). Without ``domain`` the caller
    does not keep the update."""
    if domain is not None:
        return domain_labels(domain, n_matrices)
    return [TARGET_DOMAIN if TARGET_DOMAIN in statistics.domains else THIS_CALL] * n_matrices


def drop_target_requests(estimator, requests):
    """``requests`` without the calibration fields for ``fit``, for an estimator that has
    no domain statistics to put them in (so MOABB does not route them to it). Requests set
    explicitly (``set_fit_request``) are kept."""
    if not hasattr(estimator, "_metadata_request"):
        for name in TARGET_INPUTS:
            requests.fit.add_request(param=name, alias=False)
    return requests
