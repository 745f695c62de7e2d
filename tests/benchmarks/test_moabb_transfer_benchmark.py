"""The harness of ``python -m benchmarks.experiments moabb-transfer`` (no EEG needed)."""

import importlib.util

import numpy as np
import pandas as pd
import pytest
import sklearn
from sklearn.utils.metadata_routing import get_routing_for_object

from benchmarks.experiments import moabb_transfer

# Checked without importing MOABB: importing it at collection sets up MNE's logger under
# pytest's own handlers, which the main job's entry-point test then finds there.
pytestmark = pytest.mark.skipif(importlib.util.find_spec("moabb") is None, reason="MOABB is not installed")


def test_every_preset_of_moabb_is_run_by_default():
    from moabb.evaluations import CrossSubjectMode

    assert moabb_transfer.modes() == [m.value for m in CrossSubjectMode] and len(moabb_transfer.modes()) == 7


def test_only_the_re_centring_pipelines_consume_the_slice():
    pipes = moabb_transfer.transfer_pipelines()
    assert list(pipes) == moabb_transfer.PIPELINES
    with sklearn.config_context(enable_metadata_routing=True):
        consumed = {name: get_routing_for_object(p).consumes("fit", {"X_target_unlabeled", "X_target_labeled",
                                                                     "y_target_labeled", "subjects"})
                    for name, p in pipes.items()}
    assert consumed["TS+LR"] == consumed["EA+TS+LR"] == set()
    for name in ("Recenter+TS+LR", "SPDnet"):
        assert consumed[name] == {"X_target_unlabeled", "X_target_labeled", "subjects"}, name
        assert pipes[name].transform_input == ["X_target_unlabeled", "X_target_labeled"]


def test_the_no_slice_rows_request_the_subjects_but_not_the_slice_even_cloned():
    pipes = moabb_transfer.transfer_pipelines(list(moabb_transfer.NO_SLICE))
    with sklearn.config_context(enable_metadata_routing=True):
        for name, pipe in pipes.items():
            consumed = get_routing_for_object(sklearn.clone(pipe)).consumes(
                "fit", {"X_target_unlabeled", "X_target_labeled", "subjects"})
            assert consumed == {"subjects"}, name
    assert moabb_transfer.networks(list(moabb_transfer.NO_SLICE)) == ["spdnet-no-slice"]


def test_trialwise_presets_score_roc_auc_only():
    assert list(moabb_transfer.metrics_of("train_trialwise")) == ["roc_auc"]
    assert list(moabb_transfer.metrics_of("train_and_target_unlabeled_20p")) == ["balanced_accuracy", "roc_auc"]


def test_a_preset_report_pairs_every_pipeline_with_ts_lr():
    rng = np.random.default_rng(0)
    frame = pd.DataFrame([{"pipeline": p, "subject": s, "roc_auc": 60 + rng.normal()}
                          for p in ("TS+LR", "SPDnet") for s in range(1, 6)])
    lines = moabb_transfer.mode_lines("train_trialwise", frame, 60.0)
    assert lines[0] == "## train_trialwise (1.0 min)"
    assert "| pipeline | ROC-AUC (%) | subjects |" in lines
    (paired,) = [line for line in lines if line.startswith("- ")]
    assert paired.startswith("- SPDnet − TS+LR: ROC-AUC ") and "(%)" not in paired and "of 5" in paired


def test_an_unknown_preset_is_refused(tmp_path, monkeypatch):
    from benchmarks.experiments.__main__ import main

    monkeypatch.setattr(moabb_transfer, "offline_root", lambda say=None: tmp_path)
    with pytest.raises(SystemExit, match="unknown cs_mode presets"):
        main(["moabb-transfer", "--modes", "no_such_mode", "--out", str(tmp_path)])


def test_reused_training_is_the_model_a_fit_gives():
    """The second preset of a fold reuses the first one's network: its predictions are those
    of a model fitted with the slice, and its training ran once."""
    from skfedspd import SPDnetClassifier
    from skfedspd.datasets import make_spd_classification

    X, y = make_spd_classification(n_matrices=60, n_channels=4, seed=0)
    subjects = np.repeat([1, 2, 3], 20)
    params = dict(max_epochs=3, random_state=0)
    moabb_transfer.ReusedTraining.trained.clear()
    moabb_transfer.ReusedTraining(**params).fit(X[:40], y[:40], subjects=subjects[:40])
    reused = moabb_transfer.ReusedTraining(**params).fit(X[:40], y[:40], subjects=subjects[:40],
                                                         X_target_labeled=X[40:48])
    fitted = SPDnetClassifier(**params).fit(X[:40], y[:40], subjects=subjects[:40], X_target_labeled=X[40:48])
    assert len(moabb_transfer.ReusedTraining.trained) == 1 and reused.domains_ == {"target": 8}
    np.testing.assert_allclose(reused.decision_function(X[48:]), fitted.decision_function(X[48:]), atol=1e-12)
    moabb_transfer.ReusedTraining.trained.clear()


def test_the_network_rows_are_named_as_one_training_seed():
    assert moabb_transfer.networks(["TS+LR", "Recenter+TS+LR", "SPDnet"]) == ["spdnet"]
    assert moabb_transfer.networks(["TS+LR"]) == []
