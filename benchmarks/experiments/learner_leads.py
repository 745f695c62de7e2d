"""The leads for a learner above TS+LR on the main job, measured on its own splits.

PhysionetMI, 4 classes, the main job's 8 subjects and client splits (clients of 2 subjects,
each client's own stratified 85/15 split; one split per seed), test macro-F1 paired seed by
seed with pyRiemann's TS+LR. Each row is one lead towards a learner above TS+LR:

- the shipped learner, ``SPDnetClassifier()`` given the subjects (domain batch norm, each
  test subject predicted in its own call), and its probabilities averaged with TS+LR's;
- a study model for what the estimator cannot take yet: one SPDnet per frequency band
  (8-12, 12-16, 16-24, 24-32 Hz, the 8-32 Hz trials filtered again, one BiMap 64 to 18 and
  domain batch norm per band, their tangent vectors concatenated into one linear head),
  against the same model on the 8-32 Hz band alone, and that model with the dispersion of
  each domain normalized as well (SPDDSMBN's scalar variance, learned target), and that model
  trained on TSMNet's minibatches of 4 subjects x 16 trials, with or without running domain
  means (momentum decaying from 1 to 16/64 over 50 epochs);
- the recommended federation (``SPDnetClassifier(batchnorm="domain")`` on the paper's clients
  of 2 subjects, server momentum, a fresh client Adam every round; each test subject
  predicted in its own call), with each client's data one domain (the default) or each
  subject its own, at 150 and 300 rounds, and with the sites' Adam at lr 1e-3 instead of the
  estimator's 1e-2: what it loses to its centralized counterpart;
- the learning curve: TS+LR and the shipped learner on 25 % and 50 % of each training
  subject's trials (a stratified subsample per seed), the same test trials;
- more matrices per trial: TS+LR and the shipped learner trained on the covariances of five
  2 s windows of each 3 s trial (every 0.25 s; each window a training matrix with its trial's
  label and subject), a test trial's class the mean of its windows' probabilities (the
  network's validation part is drawn over windows, so one trial's windows can fall on both
  sides of it);
- the covariance estimator: TS+LR, re-centred TS+LR (``Recenter``, each subject by its own
  mean; each test subject in its own call) and the shipped learner on OAS (shrunk)
  covariances, beside re-centred TS+LR on the sample covariances;
- capacity and training budget: the shipped learner with a BiMap to 12 or 32 instead of 18,
  and without its validation part (300 epochs on every training trial, the last weights,
  instead of the epochs near the lowest validation loss averaged);
- the filter-bank peer of the band model: TS+LR on the 4 sub-bands, one tangent space per
  band, the vectors concatenated into one logistic regression, on OAS covariances (a narrow
  band's sample covariance of 64 channels over 3 s is near singular);
- an ensemble of networks: the shipped learner trained from 5 seeds (training seeds
  ``5 · seed + k``), its probabilities averaged (scikit-learn's soft ``VotingClassifier``, the
  subjects routed to every network), alone and averaged with TS+LR's (on the sample or the
  OAS covariances, the networks on the sample covariances); and the recommended
  federation likewise (five federations, their probabilities averaged), beside the federated
  classical baseline (``FederatedTangentSpaceLR()`` on the same clients);
- the number of channels: TS+LR (on the sample or the OAS covariances), re-centred TS+LR on
  OAS, the shipped learner, alone, five of them, and five with TS+LR on OAS, on the trials'
  16 sensorimotor channels (:data:`skfedspd.datasets.SENSORIMOTOR_CHANNELS`; the learner's
  BiMap 16 to 8) instead of the 64.

The study model (:mod:`.study_model`) trains as the estimator does with a validation part;
it is not part of the package.

    python -m benchmarks.experiments learner-leads --seeds 8 --jobs 2

``--first-seed 8`` draws eight new splits (seeds 8-15) with the same rows: a replication of
the record on splits no row was chosen on.

Every (row, seed) fit is cached as JSON under ``--out``; the run writes the record
``learner-leads`` (``benchmarks/records/data``), paired by seed with TS+LR.
"""

import json
import logging
import time

import numpy as np
import sklearn
from joblib import Parallel, delayed
from pyriemann.tangentspace import TangentSpace
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import accuracy_score, f1_score
from sklearn.model_selection import train_test_split
from sklearn.pipeline import make_pipeline

from skfedspd import SPDnetClassifier
from skfedspd.datasets import SENSORIMOTOR_CHANNELS, sample_covariance
from skfedspd.server_optimizer import ServerMomentum
from skfedspd.training import torch_threads

from ..records.store import write_record
from . import pipelines, report
from .console import console_and_log, warnings_to_file
from .data import BROAD, SUB_BANDS, band_covariances, channel_names
from .table_one_cells import SERVER_MOMENTUM
from .table_one_protocols import QUICK_SUBJECTS, logged_offline_study, recommended_federated, riemann_reference
from .table_one_report import SEED_METRICS
from .learner_ablation import add_row_arguments, summary
from .pipelines import filter_bank, seed_ensemble
from .study_model import StudySPDnetClassifier
from .table_one_runner import client_split

log = logging.getLogger(__name__)

#: label -> (model, settings)
ROWS = {
    "TS+LR": ("ts-lr", {}),
    "SPDnetClassifier() given the subjects": ("spdnet", {}),
    "SPDnetClassifier() and TS+LR, probabilities averaged": ("ensemble", {}),
    "study model, 8-32 Hz": ("study", {"bands": BROAD}),
    "study model, 4 sub-bands, one BiMap each": ("study", {"bands": SUB_BANDS}),
    "study model, 8-32 Hz, dispersion normalized": ("study", {"bands": BROAD, "dispersion": True}),
    "study model, 8-32 Hz, minibatches of 4 subjects x 16 trials": ("study", {"bands": BROAD, "mixed": True}),
    "study model, 8-32 Hz, minibatches of 4 subjects x 16 trials, running domain means":
        ("study", {"bands": BROAD, "mixed": True, "running": True}),
    "FedSPDnet + domain BN + server momentum": ("federated", {"domains": "client", "rounds": 150}),
    "FedSPDnet + domain BN + server momentum, subject domains": ("federated", {"domains": "group", "rounds": 150}),
    "FedSPDnet + domain BN + server momentum, 300 rounds": ("federated", {"domains": "client", "rounds": 300}),
    "FedSPDnet + domain BN + server momentum, client lr 1e-3":
        ("federated", {"domains": "client", "rounds": 150, "client_lr": 1e-3}),
    "TS+LR, 50 % of the training trials": ("ts-lr", {"fraction": 0.5}),
    "SPDnetClassifier(), 50 % of the training trials": ("spdnet", {"fraction": 0.5}),
    "TS+LR, 25 % of the training trials": ("ts-lr", {"fraction": 0.25}),
    "SPDnetClassifier(), 25 % of the training trials": ("spdnet", {"fraction": 0.25}),
    "TS+LR on 2 s windows, their probabilities averaged": ("windows", {"learner": "ts-lr"}),
    "SPDnetClassifier() on 2 s windows, their probabilities averaged": ("windows", {"learner": "spdnet"}),
    "TS+LR on OAS covariances": ("ts-lr", {"covariances": "oas"}),
    "TS+LR on 4 sub-bands (OAS), one tangent space each, concatenated":
        ("ts-lr", {"bands": SUB_BANDS, "covariances": "oas"}),
    "SPDnetClassifier() on OAS covariances": ("spdnet", {"covariances": "oas"}),
    "Recenter+TS+LR": ("recenter-ts-lr", {}),
    "Recenter+TS+LR on OAS covariances": ("recenter-ts-lr", {"covariances": "oas"}),
    "SPDnetClassifier(hidden_dims=12) given the subjects": ("spdnet", {"estimator": {"hidden_dims": 12}}),
    "SPDnetClassifier(hidden_dims=32) given the subjects": ("spdnet", {"estimator": {"hidden_dims": 32}}),
    "SPDnetClassifier(early_stopping=False) given the subjects: 300 epochs on every training trial":
        ("spdnet", {"estimator": {"early_stopping": False}}),
    "SPDnetClassifier(), 5 training seeds, probabilities averaged": ("spdnet", {"training_seeds": 5}),
    "SPDnetClassifier() over 5 training seeds and TS+LR, probabilities averaged":
        ("ensemble", {"training_seeds": 5}),
    "SPDnetClassifier() over 5 training seeds and TS+LR on OAS covariances, probabilities averaged":
        ("ensemble", {"training_seeds": 5, "ts_lr_covariances": "oas"}),
    "FedSPDnet + domain BN + server momentum, 5 training seeds, probabilities averaged":
        ("federated", {"domains": "client", "rounds": 150, "training_seeds": 5}),
    "FederatedTangentSpaceLR(), the federated classical baseline": ("fed-ts-lr", {}),
    "TS+LR, 16 sensorimotor channels": ("ts-lr", {"channels": "sensorimotor"}),
    "TS+LR on OAS covariances, 16 sensorimotor channels": ("ts-lr", {"channels": "sensorimotor", "covariances": "oas"}),
    "Recenter+TS+LR on OAS covariances, 16 sensorimotor channels":
        ("recenter-ts-lr", {"channels": "sensorimotor", "covariances": "oas"}),
    "SPDnetClassifier() given the subjects, 16 sensorimotor channels": ("spdnet", {"channels": "sensorimotor"}),
    "SPDnetClassifier(), 5 training seeds, probabilities averaged, 16 sensorimotor channels":
        ("spdnet", {"channels": "sensorimotor", "training_seeds": 5}),
    "SPDnetClassifier() over 5 training seeds and TS+LR on OAS covariances, probabilities averaged, 16 sensorimotor "
    "channels": ("ensemble", {"channels": "sensorimotor", "training_seeds": 5, "ts_lr_covariances": "oas"}),
}
#: Window length and step (samples at 160 Hz) of the windowed rows: 5 windows of each 3 s trial.
WINDOW, WINDOW_STEP = 320, 40


def add_arguments(parser):
    add_row_arguments(parser, ROWS, "learner-leads")
    parser.add_argument("--first-seed", type=int, default=0,
                        help="the first split: seeds FIRST .. FIRST + SEEDS - 1 (default 0; new splits replicate a record)")


def splits_title(seeds):
    """The splits of a run in its record's title: the main job's are seeds 0 to 7."""
    seeds = list(seeds)
    if seeds == list(range(8)):
        return "the main job's splits"
    if seeds == list(range(len(seeds))) and len(seeds) > 8:
        return f"the main job's splits and {len(seeds) - 8} new ones (seeds 0-{seeds[-1]})"
    return f"new splits (seeds {seeds[0]}-{seeds[-1]})" if len(seeds) > 1 else f"one split (seed {seeds[0]})"


def window_covariances(X_raw, length=WINDOW, step=WINDOW_STEP):
    """``(n, n_windows, C, C)`` sample covariances of the windows of ``length`` samples every ``step``."""
    starts = range(0, X_raw.shape[-1] - length + 1, step)
    return np.stack([sample_covariance(X_raw[..., s:s + length]) for s in starts], 1)


def windowed_proba(settings, windows, y, subjects, train, test, seed):
    """Test probabilities of a learner fitted on every window of the training trials, each
    test trial's the mean over its windows (the network predicts each test subject in one call)."""
    n_windows, shape = windows.shape[1], windows.shape[2:]
    X_train = windows[train].reshape(-1, *shape)
    y_train, s_train = np.repeat(y[train], n_windows), np.repeat(subjects[train], n_windows)
    X_test, s_test = windows[test].reshape(-1, *shape), np.repeat(subjects[test], n_windows)
    if settings["learner"] == "ts-lr":
        proba = ts_lr().fit(X_train, y_train).predict_proba(X_test)
    else:
        clf = SPDnetClassifier(random_state=seed).fit(X_train, y_train, groups=s_train)
        proba = per_subject(clf.predict_proba, X_test, s_test)
    return proba.reshape(len(test), n_windows, -1).mean(1)


def sensorimotor_covariances(X_raw):
    """``(n, 2, 16, 16)``: the sample and the OAS covariances of the trials' 16 sensorimotor
    channels (:data:`skfedspd.datasets.SENSORIMOTOR_CHANNELS`)."""
    from pyriemann.estimation import Covariances

    names = channel_names(QUICK_SUBJECTS[0])
    picks = [names.index(channel) for channel in SENSORIMOTOR_CHANNELS]
    return np.stack([sample_covariance(X_raw[:, picks]), Covariances("oas").transform(X_raw[:, picks])], 1)


def per_subject(predict, X, subjects):
    """``predict`` called once per subject (domain batch norm re-centres each call)."""
    parts = [predict(X[subjects == s]) for s in np.unique(subjects)]
    out = np.empty((len(X), parts[0].shape[1]))
    for s, part in zip(np.unique(subjects), parts):
        out[subjects == s] = part
    return out


def subsample(train, y, subjects, fraction, seed):
    """A stratified ``fraction`` of each subject's training trials."""
    if fraction == 1.0:
        return train
    kept = [train_test_split(train[subjects[train] == s], train_size=fraction, stratify=y[train][subjects[train] == s],
                             random_state=seed)[0] for s in np.unique(subjects[train])]
    return np.sort(np.concatenate(kept))


def fit_row(name, data, seed):
    """Test probabilities of the row ``name`` for the split ``seed``: ``{"f1", "accuracy", ...}``."""
    model, settings = ROWS[name]
    covariances, oas, bands, windows, sensorimotor, y, subjects = data
    train, test = client_split(y, subjects, seed)
    train = subsample(train, y, subjects, settings.get("fraction", 1.0), seed)
    start = time.perf_counter()
    if model == "study":
        X = bands[:, 1:] if settings["bands"] == SUB_BANDS else bands[:, :1]
        study = StudySPDnetClassifier(random_state=seed, **{key: settings.get(key, False)
                                                            for key in ("dispersion", "mixed", "running")})
        study.fit(X[train], y[train], groups=subjects[train])
        proba = per_subject(study.predict_proba, X[test], subjects[test])
    elif model == "fed-ts-lr":  # as the main job: the paper's clients of 2 subjects, each test subject one call
        baseline = riemann_reference("fed-ts-lr").fit(covariances[train], y[train], groups=subjects[train])
        proba = per_subject(baseline.predict_proba, covariances[test], subjects[test])
    elif model == "windows":
        proba = windowed_proba(settings, windows, y, subjects, train, test, seed)
    elif model == "federated":  # the recommended federation on the paper's clients of 2 subjects
        feds = federations(settings, seed)
        fed = feds[0] if len(feds) == 1 else seed_ensemble(feds)
        with sklearn.config_context(enable_metadata_routing=True):  # groups reach every federation
            fed.fit(covariances[train], y[train], groups=subjects[train])
        proba = per_subject(fed.predict_proba, covariances[test], subjects[test])
        fitted = [fed] if len(feds) == 1 else fed.estimators_
        extra = {"rounds_run": len(fitted[0].history_), "best_round": int(fitted[0].best_round_)}
    else:
        shrunk = settings.get("covariances") == "oas"
        X_oas = sensorimotor[:, 1] if settings.get("channels") == "sensorimotor" else oas[:, 0]
        if settings.get("bands") == SUB_BANDS:
            X = oas[:, 1:] if shrunk else bands[:, 1:]
        elif settings.get("channels") == "sensorimotor":
            X = sensorimotor[:, int(shrunk)]
        else:
            X = X_oas if shrunk else covariances
        proba = 0.0
        if model == "recenter-ts-lr":  # each training subject re-centred by its own mean, each test subject too
            clf = pipelines.fit(pipelines.recenter_ts_lr(seed), X[train], y[train], subjects[train])
            proba = per_subject(clf.predict_proba, X[test], subjects[test])
        if model in ("ts-lr", "ensemble"):
            X_ts = X_oas if settings.get("ts_lr_covariances") == "oas" else X  # the ensemble's TS+LR on OAS
            proba = proba + ts_lr(X.shape[1] if X.ndim == 4 else None).fit(X_ts[train], y[train]).predict_proba(
                X_ts[test])
        if model in ("spdnet", "ensemble"):
            clf = spdnet(seed, settings.get("training_seeds", 1), **settings.get("estimator", {}))
            with sklearn.config_context(enable_metadata_routing=True):  # groups reach every network
                clf.fit(X[train], y[train], groups=subjects[train])
            proba = proba + per_subject(clf.predict_proba, X[test], subjects[test])
    pred = np.argmax(proba, 1)
    return {**(extra if model == "federated" else {}), "seed": seed, "f1": float(f1_score(y[test], pred, average="macro")),
            "accuracy": float(accuracy_score(y[test], pred)), "n_train": int(len(train)),
            "fit_seconds": time.perf_counter() - start, "config": {"row": name, **settings}}


def federations(settings, seed):
    """The recommended federations of a federated row for split ``seed``: one, or one per
    training seed of an ensemble (``settings``: domains, rounds, optionally the sites' Adam
    ``client_lr`` and ``training_seeds``)."""
    server = {"server_optimizer": ServerMomentum(**SERVER_MOMENTUM)}
    local = {"estimator__lr": settings["client_lr"]} if "client_lr" in settings else {}
    return [recommended_federated(1.0, settings["rounds"], s, server).set_params(domains=settings["domains"], **local)
            for s in ensemble_seeds(seed, settings.get("training_seeds", 1))]


def spdnet(seed, n_seeds=1, **params):
    """``SPDnetClassifier(**params)``, or the seed ensemble of ``n_seeds`` of them (training
    seeds ``n_seeds · seed + k``, their probabilities averaged by a soft ``VotingClassifier``)."""
    if n_seeds == 1:
        return SPDnetClassifier(random_state=seed, **params)
    return seed_ensemble([SPDnetClassifier(random_state=s, **params) for s in ensemble_seeds(seed, n_seeds)])


def ensemble_seeds(seed, n_seeds):
    """The training seeds of split ``seed``: the seed itself, or ``n_seeds · seed + k`` for an
    ensemble (a new set for each split)."""
    return [seed] if n_seeds == 1 else [n_seeds * seed + k for k in range(n_seeds)]


def ts_lr(n_bands=None):
    """pyRiemann's TS+LR (:func:`.pipelines.ts_lr`); with ``n_bands`` (``(n, bands, C, C)``
    input) a filter bank: one tangent space per band, the vectors concatenated into one
    logistic regression."""
    if n_bands is None:
        return pipelines.ts_lr(None)
    return make_pipeline(filter_bank(lambda: [TangentSpace()], n_bands), LogisticRegression(max_iter=1000))


def cached_fit(name, data, seed, out, log_file):
    path = out / report.row_key(name) / f"seed{seed}.json"
    config = json.loads(json.dumps({"row": name, **ROWS[name][1]}))
    if path.exists():
        run = json.loads(path.read_text())
        if run["config"] == config:
            return run, True
    with torch_threads(1), warnings_to_file(log_file):
        run = fit_row(name, data, seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(run))
    return run, False


def run(args):
    log_file = args.out / "leads.log"
    with console_and_log(log_file):
        command, loaded = logged_offline_study(log, log_file)
        if loaded is None:
            return 1
        protocol, X_raw, covariances, y, subjects = loaded
        keep = np.isin(subjects, QUICK_SUBJECTS)
        X_raw, covariances, y, subjects = X_raw[keep], covariances[keep], y[keep], subjects[keep]
        y = np.unique(y, return_inverse=True)[1]
        bands = band_covariances(X_raw, BROAD + SUB_BANDS, protocol.fs)
        oas = band_covariances(X_raw, BROAD + SUB_BANDS, protocol.fs, "oas")
        data = (covariances, oas, bands, window_covariances(X_raw), sensorimotor_covariances(X_raw), y, subjects)
        names = ["TS+LR"] + [name for name in args.rows if name != "TS+LR"]
        start = time.perf_counter()
        seeds = range(args.first_seed, args.first_seed + args.seeds)
        jobs = [(name, seed) for name in names for seed in seeds]
        done = Parallel(n_jobs=args.jobs)(delayed(cached_fit)(name, data, seed, args.out, log_file)
                                          for name, seed in jobs)
        elapsed = time.perf_counter() - start
        results = {name: [r for (n, _), (r, _) in zip(jobs, done) if n == name] for name in names}
        cached = [r for r, was_cached in done if was_cached]
        rows = {report.row_key(name): {"label": name, "scores": {
            "macro_f1": {r["seed"]: 100 * r["f1"] for r in runs},
            "accuracy": {r["seed"]: 100 * r["accuracy"] for r in runs}}} for name, runs in results.items()}
        path = write_record(
            args.record, title="The learner's leads on PhysionetMI, 4 classes, " + splits_title(seeds) + ", against TS+LR",
            command=command, rows=rows, metrics=SEED_METRICS, reference=report.row_key("TS+LR"),
            paired_by="seed", wall_seconds=elapsed,
            facts={"seeds": list(seeds), "subjects": list(QUICK_SUBJECTS), "dataset": protocol.name,
                   "bands_hz": [list(b) for b in SUB_BANDS], "runs_cached_at_start": len(cached),
                   "training_trials": {name: sorted({r["n_train"] for r in runs}) for name, runs in results.items()},
                   "best_round_by_seed": {name: {r["seed"]: r["best_round"] for r in runs}
                                          for name, runs in results.items() if ROWS[name][0] == "federated"},
                   "fit_minutes": round(sum(r["fit_seconds"] for rs in results.values() for r in rs) / 60, 1)})
        log.info("\n" + summary(results, command, elapsed) + f"\n\nRecord: {path}")
    return 0

