"""Tests of the privacy-utility benchmark (``python -m benchmarks.experiments privacy``).

The report's target lines and budget check on hand-made records (no fitting), and a smoke
run of the entry point on the offline PhysioNet subjects 1-4 (1 round, ProjAvg only): the
table, the target lines, the budget line, the figure, and a cache that refits only a run
whose setup changed.
"""

import json
import math

import numpy as np
import pytest

from benchmarks.experiments import privacy as pu
from conftest import run_experiment


def record(model, epsilon, f1, seed=0, spent=None, chance=(0.25, 0.3)):
    private = not math.isinf(epsilon)
    return {"model": model, "epsilon": pu.eps_key(epsilon), "seed": seed, "f1": f1, "chance_f1": list(chance),
            "target_epsilon": epsilon if private else None,
            "epsilon_spent": (spent or [0.99 * epsilon, 0.98 * epsilon]) if private else None,
            "noise_multipliers": [1.0, 1.0] if private else None,
            "accountant": {"cls": "dp_accounting.rdp.RdpAccountant", "version": "x"} if private else None}


def results_of(records):
    results = {}
    for r in records:
        results.setdefault((r["model"], r["epsilon"]), []).append(r)
    return results


@pytest.mark.parametrize("private_f1, eeg_f1, ratio_ok, margin_ok", [
    (0.45, 0.30, True, True),  # 90 % of 0.50, +15 points
    (0.35, 0.33, False, False),  # 70 %, +2 points
    (0.28, 0.20, False, True),  # +8 points, but between two models at chance
])
def test_target_lines_compare_the_right_cells(private_f1, eeg_f1, ratio_ok, margin_ok):
    results = results_of([record("spdnet-projavg", math.inf, 0.50), record("spdnet-projavg", 8.0, private_f1),
                          record("eegnet", 8.0, eeg_f1), record("spdnet-projavg", 1.0, 0.31)])
    lines = pu.targets(results)
    ratio = next(line for line in lines if "vs ε = ∞" in line)
    margin = next(line for line in lines if "DP-FedEEGNet at ε = 8" in line)
    assert f"**{100 * private_f1 / 0.5:.0f} %**" in ratio and ("reached" if ratio_ok else "NOT REACHED") in ratio
    assert f"**{100 * (private_f1 - eeg_f1):+.1f} points**" in margin and ("reached" if margin_ok else "NOT REACHED") in margin
    # a margin over EEGNet is flagged when the DP model itself is not above chance (95th percentile 30 %)
    assert ("not above chance" in margin) == (private_f1 <= 0.3)
    chance = next(line for line in lines if "at ε = 1" in line)
    assert "margin **+6.0 points**" in chance and "(+1.0 over the 95th percentile)" in chance
    # RLAvg has no runs: no line claims anything about it
    assert not any("RLAvg" in line for line in lines)


def test_budget_check_flags_a_site_over_its_epsilon():
    ok = results_of([record("spdnet-projavg", 8.0, 0.4), record("eegnet", 1.0, 0.3)])
    assert "every site's ε spent ≤ the requested ε: 4 (site, run) pairs over 2 DP runs" in pu.budget_check(ok)
    over = results_of([record("spdnet-projavg", 8.0, 0.4, spent=[7.9, 8.02])])
    assert "A SITE SPENT MORE" in pu.budget_check(over) and "= 1.0025" in pu.budget_check(over)
    assert pu.budget_check(results_of([record("eegnet", math.inf, 0.5)])) == "no DP run yet"


def test_table_shows_mean_std_and_seed_count():
    results = results_of([record("eegnet", 3.0, 0.2, seed=0), record("eegnet", 3.0, 0.4, seed=1)])
    row = next(line for line in pu.table(results).splitlines() if line.startswith("| DP-FedEEGNet"))
    assert "30.0 ± 10.0 (n=2)" in row and row.count("–") == 3


def test_chance_is_uniform_guessing():
    y = np.repeat(np.arange(4), 25)
    mean, high = pu.chance_f1(y, seed=0, n_draws=300)
    assert 0.2 < mean < 0.3 < high < 0.4


def test_smoke_run_reports_and_caches(physionet_root, tmp_path, capsys):
    out = tmp_path / "privacy"
    args = ["--profile", "smoke", "--models", "spdnet-projavg", "--out", str(out), "--docs", str(tmp_path / "docs")]
    assert run_experiment(pu, args) == 0
    text = capsys.readouterr().out
    assert "0 of 4 runs cached, 4 to fit" in text
    assert "| DP-FedSPDnet (ProjAvg) |" in text and "(n=1)" in text
    assert "ε = 8 vs ε = ∞" in text and "at ε = 1" in text and "every site's ε spent ≤ the requested ε" in text
    assert "signal / noise = " in text
    assert "Non-private centralized TS+LR on the same trials (seeds 0–0): " in text
    assert "command: python -m benchmarks.experiments privacy --profile smoke" in text and "machine:" in text
    assert (out / "privacy_utility_smoke.png").stat().st_size > 0
    assert (tmp_path / "docs" / "privacy_utility_smoke.png").exists()
    for file in out.glob("*.json"):
        stored = json.loads(file.read_text())
        if stored["target_epsilon"] is not None:
            assert max(stored["epsilon_spent"]) <= stored["target_epsilon"]
    # a run stored with another setup is refitted, the others are reused
    stale = out / "spdnet-projavg__epsinf__seed0.json"
    stored = json.loads(stale.read_text())
    stale.write_text(json.dumps(dict(stored, setup=dict(stored["setup"], lr=1.0))))
    assert run_experiment(pu, args) == 0
    assert "3 of 4 runs cached, 1 to fit" in capsys.readouterr().out


def test_table_adds_a_column_for_another_budget():
    results = results_of([record("spdnet-projavg", 20.0, 0.4), record("spdnet-projavg", math.inf, 0.5)])
    header, _, row, *_ = pu.table(results).splitlines()
    assert header.split(" | ")[1:] == ["ε = 1", "ε = 3", "ε = 8", "ε = 20", "ε = ∞ |"]
    assert "| 40.0 ± 0.0 (n=1) | 50.0 ± 0.0 (n=1) |" in row


def test_setup_names_only_what_differs_from_table_one():
    assert "channels" not in pu.setup(70) and "subjects_per_site" not in pu.setup(70)
    assert pu.setup(70, 4, "sensorimotor") == dict(pu.setup(70), subjects_per_site=4, channels="sensorimotor")


def test_smoke_run_on_the_sensorimotor_channels(physionet_root, tmp_path, capsys):
    out = tmp_path / "privacy"
    args = ["--profile", "smoke", "--models", "spdnet-projavg", "--epsilons", "20", "inf", "--channels",
            "sensorimotor", "--rounds", "2", "--out", str(out)]
    assert run_experiment(pu, args) == 0
    text = capsys.readouterr().out
    assert "PhysionetMI-16ch" in text and "16 channels" in text and "'rounds': 2" in text
    assert "| DP-FedSPDnet (ProjAvg) | – | – | – |" in text and "(n=1)" in text
    assert sorted(json.loads(f.read_text())["setup"]["channels"] for f in out.glob("*.json")) == ["sensorimotor"] * 2


@pytest.mark.parametrize("extra", [["--rounds", "20"], ["--subjects-per-site", "4"], ["--epsilons", "8"],
                                   ["--models", "eegnet"]])
def test_curve_refuses_options_it_would_ignore(extra, tmp_path, capsys):
    with pytest.raises(SystemExit) as stop:
        run_experiment(pu, ["--quick", "--curve", "10", "--out", str(tmp_path), *extra])
    assert stop.value.code == 2 and "--curve sizes the rounds" in capsys.readouterr().err


@pytest.mark.parametrize("model", ["spdnet-projavg", "eegnet"])
def test_sites_reset_their_optimizer_as_in_table_one(model):
    """The documented DP figures were measured with the paper's clients (a fresh Adam every round)."""
    protocol = pu.physionet_protocol(4, [1, 2, 3, 4])  # built without reading any data
    assert pu.estimator(protocol, model, 8.0, 10, 0).client_optimizer_state == "reset"


def test_a_run_writes_its_record(tmp_path):
    """Per-seed macro-F1 of every fitted cell, uniform guessing and TS+LR (the reference) on
    the same seeds; the budget, the seed-0 plan and one DP step's signal and noise as facts."""
    records = []
    for seed in range(2):
        for model, epsilon, f1 in (("spdnet-projavg", 8.0, 0.22), ("spdnet-projavg", math.inf, 0.55),
                                   ("eegnet", 8.0, 0.14)):
            r = record(model, epsilon, f1 + 0.01 * seed, seed=seed, chance=(0.24 + 0.01 * seed, 0.3))
            r.update(fit_seconds=60.0, sample_rates=[0.5, 0.64] if r["target_epsilon"] else None,
                     noise_multipliers=[3.2, 3.0] if r["target_epsilon"] else None,
                     classes_predicted=1 if model == "eegnet" or seed == 0 else 4)
            records.append(r)
    diagnoses = {"spdnet-projavg": dict(d=1840, median_norm=9.46, clipped=1.0, signal=0.12, noise=3.7)}
    facts = dict(pu.setup(70), sites=2)
    path = pu.write_record("privacy-test", results_of(records), np.array([0.57, 0.58]), diagnoses, "cmd", facts,
                           [128, 100], 95.0, folder=tmp_path)
    saved = json.loads(path.read_text())
    assert path.name == "privacy-test.json" and saved["reference"] == "tslr" and saved["paired_by"] == "seed"
    rows = saved["rows"]
    assert sorted(rows) == ["chance", "eegnet/8", "spdnet-projavg/8", "spdnet-projavg/inf", "tslr"]
    assert rows["tslr"]["scores"]["macro_f1"] == pytest.approx({"0": 57.0, "1": 58.0})
    assert rows["spdnet-projavg/8"]["scores"]["macro_f1"] == pytest.approx({"0": 22.0, "1": 23.0})
    assert rows["chance"]["scores"]["macro_f1"] == pytest.approx({"0": 24.0, "1": 25.0})
    assert rows["spdnet-projavg/inf"]["label"] == "FedSPDnet (ProjAvg), no DP (ε = ∞)"
    assert rows["eegnet/8"]["label"] == "DP-FedEEGNet (FedAvg), ε = 8"
    facts = saved["facts"]
    assert facts["rounds"] == 70 and facts["seeds"] == 2 and facts["fit_minutes"] == 6.0
    assert facts["dp_runs"] == 4 and facts["site_runs"] == 8 and facts["largest_spent_ratio"] == "0.9900"
    assert facts["budget_within_target"] is True and facts["chance_p95"] == "30.0"
    assert facts["sigma_8"] == "3.0–3.2" and facts["sample_rate"] == "0.500–0.640" and facts["steps_per_round"] == "4"
    assert facts["site_train_trials"] == "100–128" and facts["noise_per_coordinate_8"] == "0.05"
    assert facts["gdp_mu_8"] == f"{pu.gaussian_dp_mu(8.0):.2f}"
    assert facts["spdnet_private_coordinates"] == 1840 and facts["spdnet_gradient_norm"] == "9.5"
    assert facts["spdnet_clipped_mean_norm"] == "0.12" and facts["spdnet_step_noise"] == "3.7"
    assert "eegnet_private_coordinates" not in facts
    assert facts["predicts_one_class"] == ["eegnet/8"]  # one class on every seed, not on one of them
    assert saved["wall_seconds"] == 95.0  # the run's wall time; the 6 runs' summed fit time is fit_minutes


def test_gaussian_dp_mu_is_the_gdp_curve_through_epsilon_delta():
    from scipy.stats import norm

    mu = pu.gaussian_dp_mu(8.0, 1e-5)
    assert norm.cdf(-8 / mu + mu / 2) - math.exp(8) * norm.cdf(-8 / mu - mu / 2) == pytest.approx(1e-5, rel=1e-6)
    assert pu.gaussian_dp_mu(1.0) < pu.gaussian_dp_mu(3.0) < mu


def test_record_name_says_what_differs_from_table_one():
    assert pu.record_name("full") == "privacy-full"
    assert pu.record_name("full", 4, "sensorimotor", 80) == "privacy-full-sites-of-4-sensorimotor-rounds-80"
