"""Tests of the public pre-training protocol (``python -m benchmarks.experiments
privacy-pretrain``): the split, the rows' estimators, the paired
report on hand-made records, and a smoke run of the entry point on synthetic matrices."""

import json
import math

import numpy as np
import pytest

pytest.importorskip("dp_accounting")

from benchmarks.experiments import privacy_pretrain as pp  # noqa: E402
from conftest import run_experiment  # noqa: E402
from skfedspd.datasets import make_spd_classification  # noqa: E402


def record(row, epsilon, score, seed=0, spent=None):
    """A record whose every test subject scores ``score`` (a fraction)."""
    private = not math.isinf(epsilon)
    return {"row": row, "epsilon": pp.eps_key(epsilon), "seed": seed,
            "balanced_accuracy": {"16": score, "17": score}, "auc": {"16": score, "17": score},
            "train_loss": None, "target_epsilon": epsilon if private else None,
            "epsilon_spent": (spent or [0.99 * epsilon] * 3) if private else None}


def results_of(records):
    results = {}
    for r in records:
        results.setdefault((r["row"], r["epsilon"]), []).append(r)
    return results


def test_site_split_is_per_subject_stratified_and_seeded():
    subjects = np.repeat(np.arange(1, 43), 10)
    y = np.tile(["left_hand", "right_hand"], len(subjects) // 2)
    train, test = pp.site_split(y, subjects, seed=0)
    assert set(subjects[test]) == set(subjects[train]) == set(pp.SITE_SUBJECTS)
    assert not set(train) & set(test)
    for s in pp.SITE_SUBJECTS:
        held = test[subjects[test] == s]
        assert len(held) == 2 and sorted(y[held]) == ["left_hand", "right_hand"]
    assert not np.array_equal(test, pp.site_split(y, subjects, seed=1)[1])


def test_paired_difference_mean_standard_error_and_wins():
    results = results_of([record("dp-finetune", 8.0, a, seed=s) for s, a in enumerate([0.60, 0.62, 0.58])]
                         + [record("public", math.inf, b, seed=s) for s, b in enumerate([0.55, 0.55, 0.60])])
    mean, se, wins, n = pp.paired(results, ("dp-finetune", 8.0), ("public", math.inf))
    diff = np.array([5.0, 7.0, -2.0])
    assert mean == pytest.approx(diff.mean()) and se == pytest.approx(diff.std(ddof=1) / math.sqrt(3))
    assert (wins, n) == (2, 3)
    assert pp.paired(results, ("dp-finetune", 1.0), ("public", math.inf)) is None


@pytest.mark.parametrize("dp8, dp1, met8, met_ratio, met1", [
    (0.64, 0.60, True, True, True),  # +4 over public, 91 % of 0.70, +0 at ε = 1
    (0.61, 0.58, False, False, False),  # +1, 87 %, −2
])
def test_target_lines(dp8, dp1, met8, met_ratio, met1):
    results = results_of([record("public", math.inf, 0.60), record("fed-finetune", math.inf, 0.70),
                          record("dp-finetune", 8.0, dp8), record("dp-finetune", 1.0, dp1)])
    lines = pp.targets(results)
    over = next(line for line in lines if "whole network) at ε = 8 − public" in line)
    ratio = next(line for line in lines if "whole network) at ε = 8 / non-private" in line)
    low = next(line for line in lines if "whole network) at ε = 1 − public" in line)
    assert f"**{100 * (dp8 - 0.60):+.1f}" in over and over.endswith("met" if met8 else "MISSED")
    assert f"**{100 * dp8 / 0.70:.0f} %**" in ratio and ("met" if met_ratio else "MISSED") in ratio
    assert low.endswith("met" if met1 else "MISSED")
    assert not any("(head)" in line for line in lines)  # no head runs: no claim about them


def test_budget_check_flags_a_site_over_its_epsilon():
    assert "every site's ε spent ≤ the requested ε" in pp.budget_check(results_of([record("dp-scratch", 3.0, 0.5)]))
    over = results_of([record("dp-scratch", 8.0, 0.5, spent=[7.0, 8.1])])
    assert "A SITE SPENT MORE" in pp.budget_check(over)
    assert pp.budget_check(results_of([record("public", math.inf, 0.5)])) == "no DP run yet"


@pytest.mark.parametrize("row, private, init, trainable, lr", [
    ("fed-scratch", False, False, "all", pp.SCRATCH_LR),
    ("fed-finetune", False, True, "all", pp.FINETUNE_LR),
    ("dp-scratch", True, False, "all", pp.SCRATCH_LR),
    ("dp-finetune", True, True, "all", pp.FINETUNE_LR),
    ("dp-finetune-head", True, True, "head", pp.FINETUNE_LR),
])
def test_rows_build_their_estimator(row, private, init, trainable, lr):
    public = object()
    fed = pp.federated(row, 3.0, public, rounds=5, site_size=4, seed=2)
    assert (fed.privacy is not None and fed.privacy.epsilon == 3.0) == private and (fed.init is public) == init
    assert fed.estimator.trainable == trainable and fed.estimator.lr == lr
    assert fed.clients.groups_per_client == 4 and fed.validation_fraction == 0.0 and fed.random_state == 2


def test_runs_cover_every_row_and_budget():
    runs = pp.runs_of([1.0, 8.0], seeds=2)
    assert len(runs) == 2 * (7 + 4 * 2)
    assert ("dp-finetune-head", 1.0, 1) in runs and ("tslr", math.inf, 0) in runs and ("dp-dbn", 8.0, 1) in runs


def test_unseen_split_holds_out_whole_subjects_in_no_site():
    subjects = np.repeat(np.arange(1, 43), 10)
    y = np.tile(["left_hand", "right_hand"], len(subjects) // 2)
    plain_train, _ = pp.site_split(y, subjects, seed=7)
    train, test = pp.site_split(y, subjects, seed=7, unseen=True)
    held = pp.held_out_subjects(7)
    assert len(held) == pp.UNSEEN_BLOCK and set(subjects[test]) == set(held)
    assert np.array_equal(test, np.flatnonzero(np.isin(subjects, held)))  # all their trials
    assert np.array_equal(train, plain_train[~np.isin(subjects[plain_train], held)])  # the others' training part
    blocks = {pp.held_out_subjects(seed) for seed in range(len(pp.SITE_SUBJECTS) // pp.UNSEEN_BLOCK)}
    assert sorted(s for block in blocks for s in block) == sorted(pp.SITE_SUBJECTS)


def test_domain_rows_re_centre_each_subject():
    public = object()
    fed = pp.federated("dp-dbn", 8.0, public, rounds=5, site_size=4, seed=2)
    assert fed.estimator.batchnorm == "domain" and fed.domains == "group" and fed.init is public
    assert fed.privacy.epsilon == 8.0 and fed.estimator.lr == pp.FINETUNE_LR
    assert pp.federated("fed-dbn", 8.0, public, rounds=5, site_size=4, seed=2).privacy is None


def test_the_harness_names_both_privacy_experiments():
    from benchmarks.experiments.__main__ import EXPERIMENTS

    assert EXPERIMENTS["privacy-pretrain"] is pp and EXPERIMENTS["privacy"].__name__ == "benchmarks.experiments.privacy"


def test_smoke_run_reports_and_caches(tmp_path, monkeypatch, capsys):
    """The entry point end to end on synthetic matrices (1 round, ε = 8): every row, the
    table, the targets, the budget line, the figure; a second run fits nothing."""
    subjects = np.repeat([*pp.PUBLIC_SUBJECTS, *pp.SITE_SUBJECTS], 10)
    X, codes = make_spd_classification(n_matrices=len(subjects), n_channels=4, n_classes=2, seed=0)
    y = np.array(["left_hand", "right_hand"])[codes]
    monkeypatch.setattr(pp, "load_covariances", lambda cache, channels: (X, y, subjects))
    monkeypatch.chdir(tmp_path)
    argv = ["--profile", "smoke", "--epsilons", "8", "--out", str(tmp_path / "out")]
    assert run_experiment(pp, argv) == 0
    text = (tmp_path / "out" / "report.md").read_text()
    assert "| DP-FedSPDnet fine-tuned (head) |  |" in text and "every site's ε spent ≤ the requested ε" in text
    assert "at ε = 8 − public only (target ≥ +3)" in text
    assert (tmp_path / "out" / "privacy_pretraining_smoke_sites_of_4.png").exists()
    saved = json.loads((tmp_path / "out" / "dp-finetune-head__eps8__seed0.json").read_text())
    assert saved["resolved"] == {"validation_fraction": 0.0, "scaling": "trace"}
    assert len(saved["balanced_accuracy"]) == len(pp.SITE_SUBJECTS)
    capsys.readouterr()
    assert run_experiment(pp, argv) == 0
    assert "11 of 11 runs cached" in capsys.readouterr().out


def test_a_complete_run_writes_its_record(tmp_path):
    """Per-seed scores of every cell, the ε split and the budget facts; nothing while a cell
    lacks a seed."""
    def dp(seed, score):
        r = record("dp-dbn", 8.0, score, seed=seed)
        r.update(noise_multipliers=[2.0, 2.0], training_epsilon=[7.6, 7.6],
                 domain_release={"noise_multiplier": 2.1, "layers": 1, "epsilon": 2.0}, setup={"rounds": 3})
        return r

    records = [record("recenter-tslr", math.inf, 0.6, seed=s) for s in range(2)] + [dp(s, 0.62) for s in range(2)]
    for r in records:
        r.setdefault("fit_seconds", 30.0)
    settings = dict(pp.setup(pp.PROFILES["quick"], 4, "sensorimotor"), profile="quick")
    args = (["dp-dbn", "recenter-tslr"], [8.0], 2, settings, "cmd", False, [144, 144], 36, 50.0)
    assert pp.write_record(results_of(records[:-1]), *args, folder=tmp_path) is None
    path = pp.write_record(results_of(records), *args, folder=tmp_path)
    saved = json.loads(path.read_text())
    assert path.name == "privacy-pretrain-quick-sites-of-4.json" and saved["reference"] == "recenter-tslr/inf"
    assert saved["rows"]["dp-dbn/8"]["scores"]["balanced_accuracy"] == {"0": 62.0, "1": 62.0}
    assert saved["wall_seconds"] == 50.0 and saved["facts"]["fit_minutes"] == 2.0  # wall time, summed fit time
    facts = saved["facts"]
    assert facts["release_epsilon_8"] == "2.00" and facts["training_epsilon_8"] == "7.60"
    assert facts["largest_spent_ratio"] == "0.9900" and float(facts["subject_epsilon_8"]) > 8
