"""``FederatedSPDnetClassifier``: FedSPDnet (Algorithm 1 of the paper) as a meta-estimator.

``fit`` validates the parameters and the data, splits the samples into clients, and hands
the run to a backend by name (:data:`BACKENDS`): ``"local"`` (:func:`skfedspd.local.fit_local`, clients
simulated in this process, optionally in parallel with joblib) or ``"flower"`` (an
in-process Flower simulation). Every backend drives one
:class:`~skfedspd.engine.FederatedEngine` (seeded client sampling, reply validation,
failure policy, aggregation, schedule, history); each selected client runs the local
estimator's ``local_update`` (the one local-training routine). The estimator's attributes
are assigned only when the backend succeeds: a fit that raises leaves it as it was.
"""

import copy
import os
import warnings
from numbers import Integral, Real

import numpy as np
import sklearn
import torch
from sklearn.base import BaseEstimator, ClassifierMixin, _fit_context, clone
from sklearn.utils._param_validation import HasMethods, Interval, RealNotInt, StrOptions
from sklearn.utils.validation import check_is_fitted

from .aggregation import AGGREGATIONS, RobustAggregation, check_secure_rule, get_aggregation
from .base import resolve_groups, training_weights, uses_validation
from .classifier import SPDnetClassifier
from .engine import DP_SAMPLE_WEIGHT_ERROR, FederatedEngine, FederatedResult, FitTask, n_selected, rule_name
from .local import fit_local
from .online import drop_domain_requests
from .spec import estimator_from_spec, estimator_to_spec
from .training import derive_seed, draw_seed

__all__ = ["FederatedSPDnetClassifier", "BACKENDS", "fit_local", "make_clients", "partition_indices"]


PARTITIONS = ("stratified", "contiguous", "dirichlet")
# The local estimator's protocol (skfedspd.base.TorchClassifierBase), all that fit calls.
PROTOCOL = ["check_params", "check_inputs", "set_classes", "encode_labels", "input_statistic",
            "set_input_statistic", "to_tensor", "init_module", "get_parameters", "set_parameters",
            "parameter_kinds", "local_update", "fitted_state", "restore_fitted_state"]


def make_clients(groups, groups_per_client=1):
    """Client index arrays from a group (subject) array: sorted groups, merged in chunks.

    Returns ``(client_indices, client_groups)``.

    Examples
    --------
    >>> import numpy as np
    >>> from skfedspd.federated import make_clients
    >>> indices, client_groups = make_clients(np.array([3, 1, 1, 2, 3, 2]), groups_per_client=2)
    >>> [idx.tolist() for idx in indices], client_groups
    ([[1, 2, 3, 5], [0, 4]], [(1, 2), (3,)])
    """
    groups = np.asarray(groups)
    if groups.ndim != 1:
        raise ValueError(f"groups must be 1-D, got shape {groups.shape}")
    unique = np.unique(groups)
    chunks = [unique[i : i + groups_per_client] for i in range(0, len(unique), groups_per_client)]
    indices = [np.flatnonzero(np.isin(groups, chunk)) for chunk in chunks]
    return indices, [tuple(chunk.tolist()) for chunk in chunks]


def partition_indices(y, n_clients, partition, alpha, seed):
    """Client index arrays when no groups are given: ``"stratified"`` (each client a
    seeded stratified share), ``"contiguous"`` (consecutive blocks) or ``"dirichlet"``
    (label skew, class shares drawn from ``Dirichlet(alpha)``).

    Examples
    --------
    >>> import numpy as np
    >>> from skfedspd.federated import partition_indices
    >>> y = np.array([0, 0, 0, 0, 1, 1, 1, 1])
    >>> [idx.tolist() for idx in partition_indices(y, 2, "contiguous", alpha=None, seed=0)]
    [[0, 1, 2, 3], [4, 5, 6, 7]]
    >>> [np.bincount(y[idx]).tolist() for idx in partition_indices(y, 2, "stratified", alpha=None, seed=0)]
    [[2, 2], [2, 2]]
    >>> sum(len(idx) for idx in partition_indices(y, 3, "dirichlet", alpha=0.5, seed=0))
    8
    """
    n = len(y)
    rng = np.random.default_rng(seed)
    if partition == "contiguous":
        return np.array_split(np.arange(n), n_clients)
    if partition == "stratified":
        order = np.concatenate([rng.permutation(np.flatnonzero(y == c)) for c in np.unique(y)])
        return [np.sort(order[i::n_clients]) for i in range(n_clients)]
    if partition == "dirichlet":
        parts = [[] for _ in range(n_clients)]
        for c in np.unique(y):
            idx = rng.permutation(np.flatnonzero(y == c))
            cuts = (np.cumsum(rng.dirichlet(alpha * np.ones(n_clients))) * len(idx)).astype(int)[:-1]
            for part, chunk in zip(parts, np.split(idx, cuts)):
                part.extend(chunk.tolist())
        return [np.sort(np.asarray(p, dtype=int)) for p in parts]
    raise ValueError(f"partition must be one of {PARTITIONS}, got {partition!r}")


def _fit_on_flower(fed, task):
    """The ``"flower"`` backend, :func:`skfedspd.flower.simulation_fit.fit_simulation`,
    imported when used: Flower is an extra."""
    try:
        from .flower.simulation_fit import fit_simulation
    except ModuleNotFoundError as error:
        if (error.name or "").partition(".")[0] != "flwr":
            raise
        raise ImportError(f"backend='flower' needs the flower extra: pip install 'skfedspd[flower]' "
                          f"({error})") from error
    return fit_simulation(fed, task)


#: Backends of ``FederatedSPDnetClassifier(backend=...)``, each called as
#: ``backend(fed, task) -> FederatedResult``. A backend reads the estimator ``fed`` and the
#: :class:`~skfedspd.engine.FitTask` and never imports this module.
BACKENDS = {"local": fit_local, "flower": _fit_on_flower}


#: ``fit``'s warning for server momentum with clients that keep their Adam state.
KEEP_WITH_SERVER_MOMENTUM_WARNING = (
    "server_momentum > 0 with client_optimizer_state='keep': in Table I this pair fell to 31.2 macro-F1, "
    "against 55.8 with client_optimizer_state='reset' (docs/design-decisions.md); use "
    "client_optimizer_state='reset' with server momentum")


class FederatedSPDnetClassifier(ClassifierMixin, BaseEstimator):
    """Federated SPDnet (FedSPDnet) with ProjAvg / RLAvg aggregation.

    Parameters
    ----------
    estimator : TorchClassifierBase, default=None
        The local model and its training parameters (``SPDnetClassifier()`` when None),
        reachable as ``estimator__lr`` etc. Used through its public protocol
        (``docs/guide/protocol.md``): the architecture, ``lr`` (initial learning rate of the
        clients), ``batch_size``, ``dtype``, ``device``, the input scaling. Not used: its
        epoch-level ``max_epochs``, ``patience``, ``lr_patience``, ``lr_factor``,
        ``validation_fraction``, ``warm_start``, ``verbose``, ``random_state`` (this
        estimator's own round-level parameters take their place).
    aggregation : {"projavg", "rlavg", "karcher", "geomedian", "trimmedmean", "krum"} or callable, default="projavg"
        Server rule; a callable has the signature of :mod:`skfedspd.aggregation`
        (``rule(client_params, weights, previous, kinds) -> dict``); its output is checked
        (names, shapes, finite, orthonormal Stiefel arrays) and a bad one raises naming it.
        The robust rules (against a faulty or hostile site) by name have their default
        parameters; set them with an instance, e.g.
        ``aggregation=TrimmedMean(trim=0.25)`` (reachable as ``aggregation__trim``; saved
        and sent to Flower with the estimator): :class:`~skfedspd.aggregation.GeometricMedian`,
        :class:`~skfedspd.aggregation.TrimmedMean`, :class:`~skfedspd.aggregation.Krum`
        (``docs/guide/robust-aggregation.md``). Not with ``secure_aggregation``.
    n_rounds : int, default=150
    local_epochs : int, default=2
    clients_per_round : int, float or None, default=None
        None: every client every round. int: exactly that many. float in (0, 1]:
        ``max(1, floor(fraction * N))`` (the paper's half participation is 0.5).
    patience : int or None, default=None
        Early stopping, in rounds without improvement of the global validation score.
        None: all ``n_rounds`` rounds run (the paper's protocol); the best global model is
        kept either way.
    lr_patience : int, default=20
        Rounds without improvement before the clients' learning rate is multiplied by
        ``lr_factor`` (torch's ``ReduceLROnPlateau`` semantics).
    lr_factor : float in (0, 1], default=0.5
    groups_per_client : int, default=1
        Sorted groups (subjects) are merged this many at a time into one client.
    domains : {"client", "group"}, default="client"
        What a training domain is for a local estimator that uses domains
        (``SPDnetClassifier(batchnorm="domain")``): ``"client"``, each client's data form one
        domain; ``"group"``, each group (subject) of a client is a domain of its own
        (:meth:`~skfedspd.SPDnetClassifier.fit_domains`). The same with one group per client.
        With clients of two subjects, unseen subjects score 2.0 ± 1.2 balanced-accuracy
        points higher with ``"client"`` (40 subjects; ``docs/design-decisions.md``). A
        deployed site's domains are the ``groups`` of its data file (none: the site is one
        domain). Ignored by local estimators without domains.
    n_clients : int, default=5
        Number of clients when ``fit`` gets no groups. A stratified partition (the default)
        makes at most as many clients as the smallest class has samples, so that every
        client holds every class: fewer samples reduce the number of clients (with a
        ``UserWarning``; ``n_clients_`` says how many ran), e.g. 3 clients for 6 matrices of
        2 classes.
    partition : {"stratified", "contiguous", "dirichlet"} or None, default=None
        How samples are split into ``n_clients`` when ``fit`` gets no groups
        (``"dirichlet"``: label skew with concentration ``alpha``). None: stratified, with a
        ``UserWarning`` when the caller probably meant groups (none received while
        scikit-learn's metadata routing is off); set ``"stratified"`` to silence it.
    alpha : float, default=0.5
    weighting : {"n_samples", "uniform"}, default="n_samples"
        Client weights in the aggregation (training samples of each accepted reply; with
        ``sample_weight``, the sum of its training samples' weights).
    validation_fraction : float, default=0.1
        Stratified share of each client's data kept on that client for validation, when
        the local estimator's ``early_stopping`` rule holds one out for the federation as a
        whole (:meth:`held_out_fraction`: with the default ``"auto"``, only when the pooled
        part reaches ``max(50, 2 · n_classes)`` samples; otherwise every sample trains and
        the last global model is kept). A deployment's sites hold it out as given.
    max_update_norm : float or None, default=1000.0
        A client reply whose array ``θ_i`` moved from the broadcast ``θ`` by more than
        ``max_update_norm · (1 + ‖θ‖_F)`` (Frobenius norm, per array) is rejected as a
        failed client. The default only stops absurd replies: an honest round moves a
        Stiefel array by at most ``2√k`` and the other arrays by a few learning-rate steps.
        None: no bound.
    server_lr : float, default=1.0
        Server learning rate ``η`` of the server optimizer (FedAvgM on the Stiefel manifold,
        :mod:`skfedspd.server_optimizer`). With ``Δ`` the aggregate's tangent vector at the
        previous global weight ``W`` (inverse polar retraction, ``uf(W + Δ)`` = the
        aggregate) and ``m`` the momentum: ``m ← β m + Δ``, ``W ← uf(W + η m)``, then ``m``
        is projected onto the tangent space at the new ``W``; Euclidean arrays:
        ``m ← β m + (θ̄ − θ)``, ``θ ← θ + η m``. ``"local"`` arrays are untouched. With
        the defaults (``η = 1``, ``β = 0``) the aggregate is the new global model exactly
        (the paper). The step uses only the aggregate and the server's own state, so it
        keeps the round a function of the clients' weighted sum (secure aggregation).
        With the paper's clients (``client_optimizer_state="reset"``), ``server_momentum=0.9``
        with ``server_lr=1.0`` is recommended (Table I, ``docs/benchmarks/tableone.md``). Not with clients
        that keep their Adam state (the default): in Table I that pair fell to 31.2 macro-F1
        against 55.8 with fresh clients (``docs/design-decisions.md``); ``fit`` and
        :func:`skfedspd.flower.fit_federated` warn (:meth:`warn_about_settings`).
    server_momentum : float in [0, 1), default=0.0
        Server momentum ``β``; the buffer is part of the checkpoint
        (``engine_.state_dict()``), so a resumed run continues bit for bit.
    client_optimizer_state : {"keep", "reset"}, default="keep"
        Whether each client's Adam optimizer keeps its moments and step count from one of
        its rounds to the next (``"keep"``; the learning rate is the round's) or starts
        afresh every round (``"reset"``: the paper's protocol). A small site trains one or
        two minibatches a round, and a fresh Adam's first step is ``lr · sign(g)`` on every
        coordinate: reset every round, local training is sign-SGD at the full learning
        rate, where centralized Adam averages its moments over hundreds of steps
        (``docs/design-decisions.md``). The state never leaves its client: it is not
        aggregated, not part of the global model nor of the fitted estimator, not in any
        secure sum. It lasts one fit: the local backend keeps each simulated client's in the
        engine during the fit (a checkpoint holds it, so a resumed fit continues bit for
        bit), a Flower site in its SuperNode's context (a restarted SuperNode starts
        afresh); a ``warm_start`` fit starts fresh optimizers, as scikit-learn's
        ``MLPClassifier`` does. Under DP-SGD the moments are of privatized gradients
        (post-processing: no budget is spent).
    n_jobs : int or None, default=None
        Processes for the clients' local training: this one and ``n_jobs − 1`` joblib
        workers, each training an equal share of the round's clients with one torch thread
        (None or 1: serial, in this process). The model is the same bit for bit; with
        ``n_jobs > 1`` each record's ``wall_time`` also covers the next round's training, which
        runs beside its validation.
    random_state : int, RandomState instance or None, default=None
    verbose : bool, default=False
        A progress bar over rounds with the global validation macro-F1 (both backends).
    on_client_error : {"raise", "skip"}, default="raise"
        What a failed client does to its round: a client whose local training raises, or
        whose reply fails the checks of :mod:`skfedspd.engine` (names, shapes, dtypes,
        finite values, orthonormality, update norm, sample counts, metrics in range).
        "raise": the fit raises. "skip": the client is left out of that round (recorded in
        ``history_``, with the reason, and a ``RuntimeWarning``); the round fails only if
        every client does.
    warm_start : bool, default=False
        A second ``fit`` continues for ``n_rounds`` more rounds from the last global model.
    checkpoint_path : str, path-like or None, default=None
        The federated state is written there after every round (``backend="local"``), in a
        data-only file (:mod:`skfedspd.persistence`, never a pickle). A ``fit`` that finds a
        checkpoint of the same configuration and data resumes from it and ends
        bit-identical to an uninterrupted fit; a checkpoint of another configuration is
        replaced (with a ``UserWarning``); a file there that is not a skfedspd checkpoint
        (truncated, corrupt, another format) stops the fit with a ValueError naming it, and
        is left alone.
    backend : {"local", "flower"}, default="local"
        "local": clients simulated in this process (joblib). "flower": ``fit`` runs an
        in-process Flower simulation (one virtual SuperNode per client, the ``flower``
        extra); the same ``random_state`` gives a bit-identical model on both backends
        (``n_jobs`` and ``checkpoint_path`` are local-only). Real multi-site deployments
        use :func:`skfedspd.flower.fit_federated` (``docs/guide/deployment.md``).
    secure_aggregation : bool, default=False
        Flower only (``backend="flower"`` or :func:`~skfedspd.flower.fit_federated`):
        every round's train and validation replies reach the server only as sums, by
        Flower's SecAgg+ protocol (:mod:`skfedspd.flower.secure`); ProjAvg / RLAvg are
        computed from the summed weighted arrays and match the plain run to ~1e-7. Needs
        ``aggregation`` "projavg" or "rlavg" (a robust rule needs each client's update, which
        secure aggregation hides: refused at fit) and at least 3 clients per round; tolerates
        ``M − round(2M/3)`` dropouts per round. Client-local arrays (BatchNorm statistics)
        stay on their site; only their training-size weighted sum joins the masked sum (the
        released model's pooled statistics). Combines with ``dp_epsilon`` (the noise is
        added on the site before the sum).
        ``history_`` then holds totals only (``n_samples``: the one-element total, of the
        clients' weights with ``sample_weight``).
        Threat model and what leaves a site: ``docs/guide/privacy.md``.
    init : fitted estimator or None, default=None
        Where the global model starts: a fitted local model of the same class (e.g. an
        ``SPDnetClassifier`` pre-trained on public data) or a fitted
        ``FederatedSPDnetClassifier`` (its global model). Its weights (every exported array)
        replace the seeded initialisation, and the local estimator adopts its input scaling
        (``scaling="trace"`` if it used it, else its fitted ``scale_`` as a constant): the
        weights expect that input, and it is not a statistic of the sites' data, so in DP
        mode nothing is spent on it. Its classes and number of features must be the fit's
        (a ValueError otherwise: agree ``classes`` when sites may miss one), and its
        architecture the local estimator's. Allowed with ``dp_epsilon``: a public model
        costs nothing (pre-train publicly, fine-tune privately; with the local estimator's
        ``trainable="head"`` only its head is trained and privatized). It is read, never
        modified; ``clone`` keeps it as is (cloning would unfit it); the JSON spec
        (:mod:`skfedspd.spec`, ``save_estimator``) stores it as None: the fitted federated
        model holds everything it contributed. A ``warm_start`` continuation ignores it.
    dp_epsilon : float or None, default=None
        Sample-level differential privacy (``docs/guide/privacy.md``): every site's local training
        runs DP-SGD (:func:`skfedspd.privacy.dp_train_epochs`: Poisson sampling at
        ``q = batch_size / n_site``, per-sample gradients — Riemannian for the Stiefel
        weights — clipped jointly to ``dp_clip_norm``, Gaussian noise projected to the
        tangent space, Adam, retraction), with a noise multiplier per site calibrated by
        Google's ``dp-accounting`` (RDP) so that the whole run — ``n_rounds``,
        ``local_epochs``, the exact rounds the seeded schedule draws each site in — spends at
        most ``(dp_epsilon, dp_delta)`` on each site's training samples. None: no DP.
        DP mode is private by construction (:meth:`resolved_settings`, recorded in
        ``privacy_["resolved"]``): no site holds out validation data (scores would steer
        the schedule and the released model outside the budget: a fixed number of rounds
        runs and the last global model is kept), and ``scaling="auto"`` becomes
        ``"trace"`` (per matrix; ``init``'s scaling when given), which shares no statistic
        of the sites. Refused: an explicit validation split (``validation_fraction > 0``
        with the local estimator's ``early_stopping=True``) and ``warm_start`` (the budget
        covers one fit). Sites do not release their training loss or input statistic.
    dp_delta : float or None, default=None
        δ of the guarantee; None: ``min(1e-5, 1 / (10 · n_min))`` (``n_min``: the smallest
        site's training size). A δ not below ``1 / n_min`` is refused.
    dp_clip_norm : float, default=1.0
        Bound ``C`` on each sample's joint gradient norm.
    classes : array-like of shape (n_classes,) or None, default=None
        The label set the consortium agreed out of band (as ``partial_fit``'s ``classes``
        in scikit-learn). None: the union of the sites' labels, each site sending the set
        of labels it holds at set-up, in clear on the Flower backend. Given: ``classes_``
        is this set and no site sends any label: each checks that its own labels are
        among them (a ValueError naming the unknown labels otherwise; on Flower that site
        fails the set-up). A class that no site holds remains a class of the model (its
        head is never trained): the server cannot tell, by design. Needed for the label set
        to stay private (``docs/guide/privacy.md``); with ``warm_start`` it must equal the fitted
        ``classes_``.

    Attributes
    ----------
    global_estimator_ : TorchClassifierBase
        The best global model (highest weighted validation macro-F1 over rounds), fitted.
    engine_ : FederatedEngine
        The run's server state (global and client-local arrays, schedule, history); what
        ``warm_start`` continues.
    classes_ : ndarray
    n_features_in_ : int
    n_clients_ : int
    client_groups_ : list of tuple
        Groups of each client (None entries when clients came from ``partition``).
    client_source_ : str
        ``"groups"``, ``"partition:<name>"`` or ``"flower:client-id"``.
    history_ : list of dict
        One JSON-able record per round: ``round``, ``clients`` (accepted replies),
        ``n_samples`` (their training samples, or sums of sample weights), ``failed_clients`` (``{"client", "stage": "train" | "evaluate",
        "reason"}``), ``train_loss`` (weighted mean), ``val_f1``, ``val_loss`` (global model
        after aggregation, on every client's validation part, weighted by its size),
        ``orthonormality`` (``‖WᵀW − I‖`` per Stiefel weight), ``lr``,
        ``skipped_batches``, ``wall_time``; to spot a faulty site, ``client_distance`` (each
        accepted client's distance to the rule's aggregate,
        :func:`~skfedspd.aggregation.client_distances`, in ``clients`` order), and for a
        robust rule ``effective_weights`` (each client's share of the aggregate) and
        ``downweighted_clients`` (those whose share is below half their weight), None
        otherwise; all three None under secure aggregation.
    best_round_ : int
    privacy_ : dict or None
        DP mode: the JSON-able report of :func:`skfedspd.privacy.plan_dp` (mechanism,
        adjacency, accountant name/class/version, ``target_epsilon``, ``delta``,
        ``clip_norm``, ``rounds_bound``; per site ``n_train``, ``sample_rate``,
        ``noise_multiplier``, planned ``rounds``/``steps``, and ``rounds_run``,
        ``steps_run``, ``epsilon``: ε spent, recomputed by the accountant for the rounds
        actually run), ``privatized_parameters`` (the trainable coordinates that DP-SGD
        clips and noises: fewer with ``trainable="head"``) and ``resolved`` (the private
        settings DP mode chose, :meth:`resolved_settings`). None without DP.

    Notes
    -----
    Schedule semantics: after each round the new global model is evaluated on every
    client's validation part; the global validation macro-F1 is the mean of the clients'
    macro-F1 weighted by their validation sizes (loss likewise). This score drives, in
    rounds, ReduceLROnPlateau (``lr_patience``, ``lr_factor``: the learning rate of the
    clients' optimizers) and early stopping (``patience``), and the best global model
    is kept. Defaults: ``lr_patience=20`` and ``lr_factor=0.5`` are the values the
    meta-estimator used before (then read from the local estimator); ``patience=None``
    (previously the local estimator's 75, in rounds) runs all ``n_rounds`` as in the paper
    and in ``benchmarks/physionet_experiment.py``. With partial participation the score is
    noisier (each round trains a subset, all clients validate) and a round holds fewer
    client updates, so a patience meant for full participation cuts the learning rate too
    early: scale ``lr_patience`` (and ``patience``) by ``N / M``. On PhysionetMI at M = N/2
    this took the learning rate from 2-4 halvings in 150 rounds to 0-1 (seeds 0-2,
    ``python -m benchmarks.experiments table-one-ablation``; ``docs/design-decisions.md``).

    Examples
    --------
    One client per subject (``groups``), three rounds of ProjAvg:

    >>> import numpy as np
    >>> from skfedspd import FederatedSPDnetClassifier, SPDnetClassifier
    >>> from skfedspd.datasets import make_spd_classification
    >>> X, y = make_spd_classification(n_matrices=60, n_channels=6, n_classes=2, seed=0)
    >>> subjects = np.repeat([1, 2, 3, 4], 15)
    >>> fed = FederatedSPDnetClassifier(SPDnetClassifier(hidden_dims=4), n_rounds=3, local_epochs=1,
    ...                                 random_state=0)
    >>> fed = fed.fit(X, y, groups=subjects)
    >>> fed.n_clients_, fed.client_groups_, len(fed.history_)
    (4, [(1,), (2,), (3,), (4,)], 3)
    >>> fed.predict(X[:5]).shape, fed.predict_proba(X[:5]).shape
    ((5,), (5, 2))
    >>> sorted(fed.history_[-1])  # one record per round
    ['client_distance', 'clients', 'downweighted_clients', 'effective_weights', 'failed_clients', 'lr',
     'n_samples', 'orthonormality', 'round', 'skipped_batches', 'train_loss', 'val_f1', 'val_loss',
     'wall_time']

    Without groups, a seeded partition of the samples (3 clients; 0.5 of them, floored: one per
    round) and RLAvg; the local model's parameters are reachable as ``estimator__*``:

    >>> fed = FederatedSPDnetClassifier(SPDnetClassifier(), aggregation="rlavg", n_rounds=2, n_clients=3,
    ...                                 clients_per_round=0.5, partition="stratified", random_state=0)
    >>> fed = fed.set_params(estimator__lr=0.05).fit(X, y)
    >>> fed.client_source_, [record["clients"] for record in fed.history_]
    ('partition:stratified', [[0], [2]])

    Labels agreed in advance (``classes``), so that no site reveals which ones it holds; a
    class no site holds still gets an output:

    >>> fed = FederatedSPDnetClassifier(SPDnetClassifier(hidden_dims=4), n_rounds=2, local_epochs=1,
    ...                                 classes=[0, 1, 2], random_state=0)
    >>> fed.fit(X, y, groups=subjects).classes_, fed.predict_proba(X[:2]).shape
    (array([0, 1, 2]), (2, 3))
    """

    __metadata_request__fit = {"groups": True, "subjects": True}
    # The domain of the trials being predicted (a local estimator with batchnorm="domain"
    # only: see _get_metadata_request).
    __metadata_request__predict = {"domain": True}
    __metadata_request__predict_proba = {"domain": True}
    __metadata_request__decision_function = {"domain": True}
    _params_not_in_spec = ("init",)  # a fitted model: see init, and skfedspd.spec

    _parameter_constraints = {
        "estimator": [HasMethods(PROTOCOL), None],
        "aggregation": [StrOptions(set(AGGREGATIONS)), callable],
        "n_rounds": [Interval(Integral, 1, None, closed="left")],
        "local_epochs": [Interval(Integral, 1, None, closed="left")],
        "clients_per_round": [None, Interval(Integral, 1, None, closed="left"),
                              Interval(RealNotInt, 0, 1, closed="right")],
        "patience": [None, Interval(Integral, 1, None, closed="left")],
        "lr_patience": [Interval(Integral, 0, None, closed="left")],
        "lr_factor": [Interval(Real, 0, 1, closed="right")],
        "groups_per_client": [Interval(Integral, 1, None, closed="left")],
        "n_clients": [Interval(Integral, 1, None, closed="left")],
        "partition": [None, StrOptions(set(PARTITIONS))],
        "alpha": [Interval(Real, 0, None, closed="neither")],
        "weighting": [StrOptions({"n_samples", "uniform"})],
        "validation_fraction": [Interval(Real, 0, 1, closed="left")],
        "max_update_norm": [None, Interval(Real, 0, None, closed="neither")],
        "server_lr": [Interval(Real, 0, None, closed="neither")],
        "server_momentum": [Interval(Real, 0, 1, closed="left")],
        "client_optimizer_state": [StrOptions({"keep", "reset"})],
        "domains": [StrOptions({"client", "group"})],
        "n_jobs": [None, Integral],
        "random_state": ["random_state"],
        "verbose": ["verbose"],
        "on_client_error": [StrOptions({"raise", "skip"})],
        "warm_start": ["boolean"],
        "checkpoint_path": [None, str, os.PathLike],
        "backend": [StrOptions(set(BACKENDS))],
        "secure_aggregation": ["boolean"],
        "dp_epsilon": [None, Interval(Real, 0, None, closed="neither")],
        "dp_delta": [None, Interval(Real, 0, 1, closed="neither")],
        "dp_clip_norm": [Interval(Real, 0, None, closed="neither")],
        "classes": [None, "array-like"],
        "init": [None, HasMethods(["get_params", "predict"])],
    }

    def __init__(
        self,
        estimator=None,
        aggregation="projavg",
        n_rounds=150,
        local_epochs=2,
        clients_per_round=None,
        patience=None,
        lr_patience=20,
        lr_factor=0.5,
        groups_per_client=1,
        n_clients=5,
        partition=None,
        alpha=0.5,
        weighting="n_samples",
        validation_fraction=0.1,
        max_update_norm=1e3,
        server_lr=1.0,
        server_momentum=0.0,
        client_optimizer_state="keep",
        domains="client",
        n_jobs=None,
        random_state=None,
        verbose=False,
        on_client_error="raise",
        warm_start=False,
        checkpoint_path=None,
        backend="local",
        secure_aggregation=False,
        dp_epsilon=None,
        dp_delta=None,
        dp_clip_norm=1.0,
        classes=None,
        init=None,
    ):
        self.estimator = estimator
        self.aggregation = aggregation
        self.n_rounds = n_rounds
        self.local_epochs = local_epochs
        self.clients_per_round = clients_per_round
        self.patience = patience
        self.lr_patience = lr_patience
        self.lr_factor = lr_factor
        self.groups_per_client = groups_per_client
        self.n_clients = n_clients
        self.partition = partition
        self.alpha = alpha
        self.weighting = weighting
        self.validation_fraction = validation_fraction
        self.max_update_norm = max_update_norm
        self.server_lr = server_lr
        self.server_momentum = server_momentum
        self.client_optimizer_state = client_optimizer_state
        self.domains = domains
        self.n_jobs = n_jobs
        self.random_state = random_state
        self.verbose = verbose
        self.on_client_error = on_client_error
        self.warm_start = warm_start
        self.checkpoint_path = checkpoint_path
        self.backend = backend
        self.secure_aggregation = secure_aggregation
        self.dp_epsilon = dp_epsilon
        self.dp_delta = dp_delta
        self.dp_clip_norm = dp_clip_norm
        self.classes = classes
        self.init = init

    # ------------------------------------------------------------------ fit
    @_fit_context(prefer_skip_nested_validation=False)
    def fit(self, X, y, groups=None, subjects=None, sample_weight=None):
        """Run federated training.

        Parameters
        ----------
        X : array-like
            Inputs of the local estimator (SPD matrices for SPDnet).
        y : array-like of shape (n_samples,)
        groups : array-like of shape (n_samples,), default=None
            Client key of each sample (e.g. subject). Requested by default under sklearn
            metadata routing, so ``GridSearchCV(..., cv=GroupKFold()).fit(X, y,
            groups=subjects)`` reaches it with no ``set_fit_request`` call.
        subjects : array-like, default=None
            Alias of ``groups``: MOABB's ``CrossSubjectEvaluation`` routes the training
            subjects under this key.
        sample_weight : array-like of shape (n_samples,), default=None
            Non-negative weights, multiplied by the local estimator's ``class_weight``
            (computed on all of ``y``). Each client trains on its samples' weights (the
            weighted mean loss of :meth:`~skfedspd.base.TorchClassifierBase.local_update`),
            its aggregation weight is their sum, and the pooled input statistic is weighted
            alike; so integer weights equal repeated samples. Under metadata routing,
            request it with ``set_fit_request(sample_weight=True)``. Both backends: with
            ``backend="flower"`` the weights travel with each site's data and the model is
            the local backend's, bit for bit (under ``secure_aggregation`` the weighted sums
            are masked). A real deployment reads each site's weights from its data file
            (``docs/guide/deployment.md``). Not with ``dp_epsilon``.

        Returns
        -------
        self
            Fitted; if ``fit`` raises, the estimator is left exactly as it was.
        """
        if self.secure_aggregation and self.backend == "local":
            raise ValueError("secure_aggregation=True runs Flower's SecAgg+: use backend='flower' (or "
                             "skfedspd.flower.fit_federated); the local backend has no server to hide replies from")
        self._check_aggregation()
        task = self._prepare(X, y, groups, subjects, sample_weight)
        self.warn_about_settings()
        if self.dp_epsilon is not None and task.sample_weight is not None:
            raise ValueError(DP_SAMPLE_WEIGHT_ERROR + (" (here from the local estimator's class_weight)"
                                                       if sample_weight is None else ""))
        backend = BACKENDS[self.backend]
        # Training needs autograd whatever the caller's mode: inference tensors made here
        # could not be trained on (local_update enables gradients itself).
        with torch.inference_mode(False):
            result = backend(self, task)
        set_global_domain_prior(self, result.estimator, task)
        return self.set_result(result)

    def check_params(self):
        """Validate the parameters (``_parameter_constraints``) and the local estimator's.

        ``fit`` does it; a Flower ServerApp (:func:`skfedspd.flower.serve`), which gets the
        estimator as a JSON spec, calls this before contacting any site.

        Raises
        ------
        ValueError
            Naming the parameter, its value and what is allowed.
        """
        self._validate_params()
        self._check_aggregation()
        self._init_model()
        est = self.local_estimator()
        est.check_params()
        if self.dp_epsilon is not None:
            self._check_dp_mode(est)

    def _check_aggregation(self):
        """A robust rule's own parameters; under secure aggregation, a rule of the weighted sum."""
        rule = get_aggregation(self.aggregation)
        if isinstance(rule, RobustAggregation):
            rule.check_params()  # the clients per round are checked by the engine, when they are known
        if self.secure_aggregation:
            check_secure_rule(rule_name(self.aggregation))

    def warn_about_settings(self):
        """Warn about parameter pairs measured to train badly; ``fit`` and
        :func:`skfedspd.flower.fit_federated` call it before training.

        Server momentum with clients that keep their Adam state
        (:data:`KEEP_WITH_SERVER_MOMENTUM_WARNING`, ``docs/design-decisions.md``).
        """
        if self.server_momentum > 0 and self.client_optimizer_state == "keep":
            warnings.warn(KEEP_WITH_SERVER_MOMENTUM_WARNING, UserWarning, stacklevel=3)

    def _check_dp_mode(self, est):
        """DP mode shares nothing outside the budget: refuse an explicit choice that would
        (the defaults resolve to private ones, :meth:`resolved_settings`; docs/guide/privacy.md)."""
        if self.validation_fraction > 0 and getattr(est, "early_stopping", True) is True:
            raise ValueError(f"dp_epsilon with an explicit validation split (validation_fraction="
                             f"{self.validation_fraction} and the local estimator's early_stopping=True): per-site "
                             "validation scores would steer the schedule and the released model outside the privacy "
                             "budget; leave early_stopping='auto' (DP mode then holds nothing out, runs n_rounds "
                             "rounds and keeps the last model) and evaluate on a test set outside the federation")
        if getattr(est, "batchnorm", None) is not None:
            raise ValueError(f"dp_epsilon with the local estimator's batchnorm={est.batchnorm!r}: SPD batch "
                             "normalization re-centres each minibatch (or domain) by its own mean, which mixes the "
                             "samples, so one sample's gradient is not bounded by the clip norm; use batchnorm=None")
        if self.warm_start:
            raise ValueError("dp_epsilon with warm_start=True is not supported: the budget is planned for one fit "
                             "of n_rounds rounds")

    def _prepare(self, X, y, groups, subjects, sample_weight=None):
        """Validated inputs, clients and seed as a :class:`FitTask` (``self`` untouched)."""
        groups = resolve_groups(groups, subjects)
        resume = self.warm_start and self.__sklearn_is_fitted__()
        est = self.local_estimator()
        if self.dp_epsilon is not None:
            self._check_dp_mode(est)
        if resume:  # the fitted model continues; its parameters are still checked
            est.check_params()
            est = copy.deepcopy(self.global_estimator_)
            X = est.check_inputs(X, reset=False)
        else:
            X = est.check_inputs(X, reset=True)
        if self.agreed_classes(est, resume) is None and not resume:
            est.set_classes(y)
        if not resume:
            self.check_init(est)
        codes = est.encode_labels(y, len(X))  # names the labels outside the agreed classes
        weights = training_weights(getattr(est, "class_weight", None), np.asarray(y), sample_weight)
        seed = self.engine_.seed if resume else draw_seed(self.random_state)
        indices, source, client_groups = self._clients(codes, groups, seed)
        n_selected(self.clients_per_round, len(indices))
        return FitTask(estimator=est, X=X, y=np.asarray(y), codes=codes, indices=indices, seed=seed,
                       resume=self.engine_ if resume else None, client_source=source, client_groups=client_groups,
                       sample_weight=weights, validation_fraction=self.held_out_fraction(est, len(codes)),
                       # the domains of batchnorm="domain": None makes each client one
                       groups=None if groups is None or self.domains == "client" else np.asarray(groups))

    def held_out_fraction(self, est, n_samples):
        """The share of each client's data held out for validation in a fit on ``n_samples``.

        The local estimator's ``early_stopping`` rule, applied to the federation as a whole
        (its pooled validation part drives the best-round selection and the round schedule):
        ``"auto"`` holds out ``validation_fraction`` only when ``round(validation_fraction ·
        n_samples)`` reaches ``max(50, 2 · n_classes)`` (:func:`skfedspd.base.uses_validation`),
        otherwise nothing: every sample trains and the last global model is kept (a few
        pooled validation trials would pick a round on noise); ``True``: always
        ``validation_fraction``; ``False``: 0. A local estimator without ``early_stopping``
        counts as ``True``. DP mode (``dp_epsilon``): 0.

        Parameters
        ----------
        est : estimator
            The local estimator, classes set.
        n_samples : int
            Training samples over all clients.

        Returns
        -------
        float

        Examples
        --------
        >>> from skfedspd import FederatedSPDnetClassifier, SPDnetClassifier
        >>> est = SPDnetClassifier().set_params(early_stopping="auto")
        >>> est.classes_ = [0, 1]
        >>> fed = FederatedSPDnetClassifier(est)
        >>> fed.held_out_fraction(est, 45), fed.held_out_fraction(est, 1000)
        (0.0, 0.1)
        >>> fed.held_out_fraction(est.set_params(early_stopping=True), 45)
        0.1
        """
        if self.dp_epsilon is not None:
            return 0.0  # DP mode: no validation scores (resolved_settings)
        keep = uses_validation(n_samples, len(est.classes_), self.validation_fraction,
                               getattr(est, "early_stopping", True))
        return float(self.validation_fraction) if keep else 0.0

    def agreed_classes(self, est, resume):
        """The ``classes`` parameter applied to the local estimator ``est``.

        A fresh fit sets ``est.classes_`` to them; a resumed fit checks that they are its
        fitted ``classes_``. Both backends call it before any site is contacted.

        Parameters
        ----------
        est : TorchClassifierBase
            The local estimator of the fit (fitted when ``resume``).
        resume : bool
            Whether ``warm_start`` continues the fitted model.

        Returns
        -------
        list or None
            ``est.classes_`` as a JSON-able list (what the sites receive), None when
            ``classes`` is None (the sites' labels then make the classes).

        Raises
        ------
        ValueError
            When ``classes`` are not valid classification labels (at least two), or differ
            from the fitted ``classes_`` of a resumed fit.

        Examples
        --------
        >>> from skfedspd import FederatedSPDnetClassifier, SPDnetClassifier
        >>> est = SPDnetClassifier()
        >>> FederatedSPDnetClassifier(classes=[2, 1, 3]).agreed_classes(est, resume=False)
        [1, 2, 3]
        """
        if self.classes is None:
            return None
        if not resume:
            est.set_classes(self.classes)
        elif not np.array_equal(np.unique(np.asarray(self.classes)), est.classes_):
            raise ValueError(f"classes={list(self.classes)!r} differ from the classes {est.classes_.tolist()} of the "
                             "model that warm_start continues")
        return est.classes_.tolist()

    # ------------------------------------------------------------------ starting point
    def resolved_settings(self, est=None):
        """The settings a fresh fit resolves from ``init`` and ``dp_epsilon``.

        ``scaling`` (local estimators with that parameter): ``init``'s input scaling when
        ``init`` is given (``"trace"`` if it used it, else its fitted ``scale_``, a public
        constant); in DP mode ``"auto"`` becomes ``"trace"`` (per matrix, no statistic of
        the sites); otherwise the local estimator's own. ``validation_fraction``: the
        share each site holds out for validation, 0 in DP mode (the rule of
        :meth:`held_out_fraction` otherwise, given here as the parameter it applies).

        Parameters
        ----------
        est : estimator or None, default=None
            The local estimator (None: ``estimator``, or ``SPDnetClassifier()``).

        Returns
        -------
        dict
            ``{"validation_fraction": float, "scaling": value}`` (``scaling`` only for a
            local estimator that has it). DP mode records it in ``privacy_["resolved"]``.

        Examples
        --------
        >>> from skfedspd import FederatedSPDnetClassifier
        >>> FederatedSPDnetClassifier().resolved_settings()
        {'validation_fraction': 0.1, 'scaling': 'auto'}
        >>> FederatedSPDnetClassifier(dp_epsilon=3.0).resolved_settings()
        {'validation_fraction': 0.0, 'scaling': 'trace'}
        """
        if est is None:
            est = self.estimator if self.estimator is not None else SPDnetClassifier()
        private = self.dp_epsilon is not None
        settings = {"validation_fraction": 0.0 if private else float(self.validation_fraction)}
        if "scaling" in est.get_params(deep=False):
            model = self._init_model()
            if model is not None and "scaling" in model.get_params(deep=False):
                settings["scaling"] = "trace" if model.scaling == "trace" else float(model.scale_)
            elif private and est.scaling == "auto":
                settings["scaling"] = "trace"
            else:
                settings["scaling"] = est.scaling
        return settings

    def local_estimator(self):
        """The unfitted local estimator of a fresh fit: a clone of ``estimator``
        (``SPDnetClassifier()`` when None) with its :meth:`resolved_settings` applied.

        Returns
        -------
        estimator

        Examples
        --------
        >>> from skfedspd import FederatedSPDnetClassifier
        >>> FederatedSPDnetClassifier(dp_epsilon=3.0).local_estimator().scaling
        'trace'
        """
        est = clone(self.estimator if self.estimator is not None else SPDnetClassifier())
        settings = self.resolved_settings(est)
        if "scaling" in settings:
            est.set_params(scaling=settings["scaling"])
        return est

    def _init_model(self):
        """The fitted local model ``init`` names (a fitted federated model's global estimator), or None."""
        if self.init is None:
            return None
        model = getattr(self.init, "global_estimator_", self.init)
        fitted = getattr(model, "__sklearn_is_fitted__", None)
        if fitted is None or not fitted() or not hasattr(model, "get_parameters"):
            raise ValueError(f"init must be a fitted local model (e.g. SPDnetClassifier) or a fitted "
                             f"FederatedSPDnetClassifier, got an unfitted {type(self.init).__name__}")
        return model

    def check_init(self, est):
        """Check that ``init`` fits the local estimator ``est`` (input shape and classes set):
        same class, number of features and classes. Does nothing without ``init``.

        Raises
        ------
        ValueError
            Naming what differs.
        """
        model = self._init_model()
        if model is None:
            return
        if type(model) is not type(est):
            raise ValueError(f"init is a fitted {type(model).__name__}, but the local estimator is a "
                             f"{type(est).__name__}")
        if model.n_features_in_ != est.n_features_in_:
            raise ValueError(f"init was fitted on {model.n_features_in_} features (channels), but X has "
                             f"{est.n_features_in_}")
        if not np.array_equal(model.classes_, est.classes_):
            raise ValueError(f"init has the classes {model.classes_.tolist()}, but this fit has "
                             f"{est.classes_.tolist()}: agree the classes (classes=...) or pre-train on the same ones")

    def initialize(self, est, seed):
        """Build the local estimator's module (classes and input shape set): seeded by
        ``seed``, then, with ``init``, loaded with its weights. The backends call it.

        Raises
        ------
        ValueError
            When ``init``'s arrays (names, shapes) are not the local estimator's: another
            architecture.
        """
        est.init_module(seed)
        model = self._init_model()
        if model is None:
            return
        params, shapes = model.get_parameters(), {n: a.shape for n, a in est.get_parameters().items()}
        theirs = {n: a.shape for n, a in params.items()}
        if theirs != shapes:
            raise ValueError(f"init's architecture differs from the local estimator's: arrays {theirs} against "
                             f"{shapes}")
        est.set_parameters(params)

    def __sklearn_clone__(self):
        """scikit-learn's ``clone``, except that ``init`` (a fitted model, only read by
        ``fit``) is kept as is: cloning it would unfit it."""
        params = self.get_params(deep=False)
        init = params.pop("init")
        cloned = type(self)(**{k: clone(v, safe=False) for k, v in params.items()}, init=init)
        if hasattr(self, "_metadata_request"):  # set_fit_request(...), as clone keeps it
            cloned._metadata_request = copy.deepcopy(self._metadata_request)
        return cloned

    def _clients(self, codes, groups, seed):
        """``(indices, client_source, client_groups)``."""
        if groups is not None:
            groups = np.asarray(groups)
            if len(groups) != len(codes):
                raise ValueError(f"groups has {len(groups)} entries but X has {len(codes)} samples")
            indices, client_groups = make_clients(groups, self.groups_per_client)
            return indices, "groups", client_groups
        partition = self.partition or "stratified"
        n_clients = self.n_clients
        if partition != "stratified" and n_clients > len(codes):
            raise ValueError(f"n_clients={self.n_clients} exceeds the {len(codes)} samples")
        if partition == "stratified":
            n_clients = min(n_clients, int(np.unique(codes, return_counts=True)[1].min()))  # classes held
            if n_clients < self.n_clients:
                warnings.warn(f"n_clients={self.n_clients} reduced to {n_clients}, the size of the smallest class, so "
                              "that every client of the stratified partition holds every class", UserWarning,
                              stacklevel=5)
        if self.partition is None and not sklearn.get_config()["enable_metadata_routing"]:
            warnings.warn(
                f"{type(self).__name__}.fit received no groups: its {n_clients} clients are a random "
                "stratified partition of the samples, not one client per subject. Pass groups=subjects to fit "
                "(through GridSearchCV / cross_validate / MOABB, enable sklearn.set_config("
                "enable_metadata_routing=True) so that they reach it), or set partition='stratified' to "
                "silence this warning.", UserWarning, stacklevel=5)
        indices = partition_indices(codes, n_clients, partition, self.alpha, derive_seed(seed, 7))
        empty = [i for i, idx in enumerate(indices) if len(idx) == 0]
        if empty:
            raise ValueError(f"clients {empty} received no samples (partition={partition!r})")
        return indices, f"partition:{partition}", [None] * len(indices)

    def set_result(self, result):
        """Make this estimator the fitted model of a backend's :class:`FederatedResult`.

        Only assignments: what ``fit`` does once its backend has succeeded (and what a
        Flower ServerApp does with :func:`skfedspd.flower.serve`'s result).

        Returns
        -------
        self
        """
        est, engine = result.estimator, result.engine
        self.global_estimator_ = est
        self.engine_ = engine
        self.history_ = engine.history
        self.classes_ = est.classes_
        self.n_features_in_ = est.n_features_in_
        self.n_clients_ = engine.n_clients
        self.client_source_ = result.client_source
        self.client_groups_ = list(result.client_groups)
        self.best_round_ = engine.best_round
        self.privacy_ = engine.privacy_report()
        return self

    # ------------------------------------------------------------------ persistence
    def fitted_state(self):
        """``(arrays, meta)`` of the fitted model (:mod:`skfedspd.persistence`): the local
        estimator's fitted state, the engine's state and the client metadata."""
        check_is_fitted(self)
        est_arrays, est_meta = self.global_estimator_.fitted_state()
        engine_arrays, engine_meta = self.engine_.state_dict()
        arrays = {**{f"estimator/{k}": v for k, v in est_arrays.items()},
                  **{f"engine/{k}": v for k, v in engine_arrays.items()}}
        meta = {"estimator": est_meta, "engine": engine_meta, "client_source": self.client_source_,
                "client_groups": [None if g is None else list(g) for g in self.client_groups_],
                # the local estimator as trained (settings resolved from init, which is not saved)
                "local_estimator": estimator_to_spec(self.global_estimator_)}
        return arrays, meta

    def restore_fitted_state(self, arrays, meta):
        """Inverse of :meth:`fitted_state`, on an unfitted estimator of the same parameters."""
        def part(prefix):
            return {k[len(prefix):]: v for k, v in arrays.items() if k.startswith(prefix)}

        est = (estimator_from_spec(meta["local_estimator"]) if "local_estimator" in meta
               else self.local_estimator())
        est.restore_fitted_state(part("estimator/"), meta["estimator"])
        engine_meta = meta["engine"]
        engine = FederatedEngine.from_estimator(self, est, n_train=engine_meta["n_train"], n_val=engine_meta["n_val"],
                                                seed=engine_meta["seed"], input_statistic=engine_meta["input_statistic"])
        engine.load_state_dict(part("engine/"), engine_meta)
        groups = [None if g is None else tuple(g) for g in meta["client_groups"]]
        self.set_result(FederatedResult(est, engine, meta["client_source"], groups))

    # ------------------------------------------------------------------ predict
    def __sklearn_is_fitted__(self):
        return hasattr(self, "global_estimator_")

    def _get_metadata_request(self):
        requests = super()._get_metadata_request()
        if getattr(self.estimator, "batchnorm", None) == "domain":
            return requests
        return drop_domain_requests(self, requests)

    def _domain_kwargs(self, domain):
        """``{"domain": domain}`` for the global model, ``{}`` without a domain (a local
        estimator without domain statistics takes none)."""
        check_is_fitted(self)
        return {} if domain is None else {"domain": domain}

    def predict(self, X, domain=None):
        """Class labels from the global model; ``domain`` (``batchnorm="domain"``): the
        trials' domain, updated with them first (see
        :meth:`SPDnetClassifier.decision_function <skfedspd.SPDnetClassifier.decision_function>`)."""
        kwargs = self._domain_kwargs(domain)  # first: an unfitted model raises NotFittedError
        return self.global_estimator_.predict(X, **kwargs)

    def predict_proba(self, X, domain=None):
        """Class probabilities from the global model (columns ordered as ``classes_``);
        ``domain`` as in :meth:`predict`."""
        kwargs = self._domain_kwargs(domain)  # first: an unfitted model raises NotFittedError
        return self.global_estimator_.predict_proba(X, **kwargs)

    def decision_function(self, X, domain=None):
        """Class scores of the global model (see the local estimator); ``domain`` as in
        :meth:`predict`."""
        kwargs = self._domain_kwargs(domain)  # first: an unfitted model raises NotFittedError
        return self.global_estimator_.decision_function(X, **kwargs)

    def _global_domain_method(self, name):
        check_is_fitted(self)
        if not hasattr(self.global_estimator_, name):
            raise ValueError(f"{name} needs a local estimator with domain statistics (SPDnetClassifier with "
                             f"batchnorm='domain'), not {type(self.global_estimator_).__name__}")
        return getattr(self.global_estimator_, name)

    def adapt(self, X, domain):
        """Unlabeled calibration of the global model's ``domain`` statistics (see
        :meth:`SPDnetClassifier.adapt <skfedspd.SPDnetClassifier.adapt>`).

        Returns
        -------
        self
        """
        self._global_domain_method("adapt")(X, domain)
        return self

    def reset_domain(self, domain=None):
        """Forget the global model's statistics of ``domain`` (None: of every domain).

        Returns
        -------
        self
        """
        self._global_domain_method("reset_domain")(domain)
        return self

    def fit_domain_prior(self, X, groups=None):
        """(Re)compute the global model's domain prior from training data (see
        :meth:`SPDnetClassifier.fit_domain_prior <skfedspd.SPDnetClassifier.fit_domain_prior>`).

        Returns
        -------
        self
        """
        self._global_domain_method("fit_domain_prior")(X, groups)
        return self

    @property
    def domains_(self):
        """The global model's domains: label → trials seen."""
        return self._global_domain_method("domains_")

    @property
    def domain_prior_(self):
        """The global model's domain prior (list of ndarray, one per batch-norm layer), or None."""
        return self._global_domain_method("domain_prior_")

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.two_d_array = False
        tags.input_tags.three_d_array = True
        return tags


def set_global_domain_prior(fed, est, task):
    """Give the trained global model ``est`` its domain prior (``batchnorm="domain"``).

    Computed where the training data are in this process (the local backend and Flower
    simulations, both through ``fit``), in this one place and as the centralized ``fit``
    does: :meth:`SPDnetClassifier.fit_domain_prior <skfedspd.SPDnetClassifier.fit_domain_prior>`
    on all the training matrices, each training domain (a group, or without groups a
    client) normalized by its own means. Its statistics are additive: a Flower deployment,
    whose data stay on the sites, sums the sites' ``est.domain_prior_statistics(X_site,
    groups_site)`` (:func:`skfedspd.flower.server.set_domain_prior_from_sites`). Under
    ``dp_epsilon`` no prior is computed (a statistic of
    the sites' data outside the privacy budget), nor by a deployment that skips it: the
    model then warns when a single trial starts a domain. Stored domain statistics of a
    warm-started model belong to its old weights and are forgotten.
    """
    if getattr(est, "batchnorm", None) != "domain":
        return
    est.domain_statistics_ = None
    if fed.dp_epsilon is not None:
        return
    domains = task.groups
    if domains is None:  # each client one domain, as it trained
        domains = np.zeros(len(task.X), dtype=np.intp)
        for client, idx in enumerate(task.indices):
            domains[idx] = client
    est.fit_domain_prior(task.X, domains)
