"""The records of the defaults ablation and of the Table I ablation (synthetic data, no EEG):
what a run writes to ``benchmarks/records`` is what the docs compute their figures from."""

import numpy as np
import pytest

from benchmarks.experiments import defaults, table_one_ablation
from benchmarks.records import render, store


@pytest.fixture
def records(tmp_path, monkeypatch):
    """Records written to ``tmp_path`` instead of the tracked folder."""
    def write(name, **kw):
        return store.write_record(name, folder=tmp_path, **kw)

    monkeypatch.setattr(defaults, "write_record", write)
    monkeypatch.setattr(table_one_ablation, "write_record", write)
    return lambda name: store.read_record(name, tmp_path)


def fold(auc, acc, cpu=2.0, epochs=300, best=300, params=None):
    return {"auc": auc, "acc": acc, "epochs": epochs, "best": best, "time": 3 * cpu, "cpu": cpu,
            "params": params if params is not None else {"lr": 0.01}}


RULES = [("ts-lr", "TS+LR", "ts-lr", None), ("recommended", "recommended", defaults.RECOMMENDED, "loss")]


def test_a_within_subject_setting_is_recorded_per_subject_against_ts_lr(records):
    """A subject's score is the mean of its 5 folds, the same folds for every rule; the
    facts carry each rule's parameters, epochs and mean CPU time per fold."""
    folds = {"ts-lr": {1: [fold(0.7, 0.6, 0.5, np.nan, np.nan, {})] * 5, 2: [fold(0.8, 0.7, 0.5, np.nan, np.nan, {})] * 5},
             "recommended": {1: [fold(0.75, 0.6)] * 4 + [fold(0.8, 0.65)], 2: [fold(0.9, 0.8)] * 5}}
    cached = folds["ts-lr"][1]
    defaults.write_setting_record("defaults-within", "Within", RULES, folds, "subject", 60.0, cached,
                                  {"subjects": [1, 2]})
    record = records("defaults-within")
    assert record["reference"] == "ts-lr" and record["paired_by"] == "subject"
    assert record["rows"]["recommended"]["scores"]["roc_auc"] == {"1": pytest.approx(76.0), "2": pytest.approx(90.0)}
    assert record["rows"]["ts-lr"]["scores"]["accuracy"] == {"1": pytest.approx(60.0), "2": pytest.approx(70.0)}
    assert render.difference(record, "recommended") == "+8.0 ± 2.0"
    assert render.units(record, "recommended", "accuracy") == "2"
    facts = record["facts"]
    assert (facts["folds"], facts["folds_cached_at_start"]) == (20, 5)
    assert facts["fit_cpu_seconds/recommended"] == 2.0 and facts["fit_cpu_seconds/ts-lr"] == 0.5
    assert facts["epochs/recommended"] == 300 and facts["parameters/recommended"] == "lr=0.01"
    assert "epochs/ts-lr" not in facts
    # the wall time is this call's, even where folds came from the cache; their CPU time is a fact
    assert record["wall_seconds"] == pytest.approx(60.0)
    assert facts["fit_cpu_minutes"] == pytest.approx(round((5 * 0.5 + 5 * 0.5 + 10 * 2.0) / 60, 1))


def test_the_pooled_setting_is_recorded_per_fold(records):
    folds = {"ts-lr": {"pooled": [fold(0.7 + 0.01 * k, 0.6, 0.5, np.nan, np.nan, {}) for k in range(5)]},
             "recommended": {"pooled": [fold(0.8, 0.7) for _ in range(5)]}}
    defaults.write_setting_record("defaults-pooled", "Pooled", RULES, folds, "fold", 10.0, [], {})
    record = records("defaults-pooled")
    assert record["paired_by"] == "fold" and render.units(record, "recommended") == "5"
    assert record["rows"]["ts-lr"]["scores"]["roc_auc"]["4"] == pytest.approx(74.0)
    assert render.reading(record, "recommended") == "higher"


def test_a_setting_is_fitted_once_and_read_back_from_the_cache(spd_domains, tmp_path, records):
    """Every rule on the same folds of each unit; a second call fits nothing and reports its
    folds as cached."""
    X, y, _ = spd_domains(n_groups=1, n_per_group=30, n_channels=4)
    units = {1: (X, y), 2: (X[::-1], y[::-1])}
    rules = [RULES[0], ("tiny", "tiny", lambda n, c, k: {"max_epochs": 2, "hidden_dims": (2,)}, "loss")]
    first = defaults.evaluate_setting("Synthetic", units, rules, lambda text: None, 1, tmp_path)
    rows, folds, _, cached = defaults.evaluate_setting("Synthetic", units, rules, lambda text: None, 1, tmp_path)
    assert first[3] == [] and len(cached) == 2 * 2 * 5 and [r["name"] for r in rows] == ["TS+LR", "tiny"]
    assert set(folds) == {"ts-lr", "tiny"} and all(len(folds["tiny"][u]) == 5 for u in units)
    assert folds == first[1]
    defaults.write_setting_record("defaults-synthetic", "Synthetic", rules, folds, "subject", 1.0, cached, {})
    record = records("defaults-synthetic")
    assert record["rows"]["tiny"]["scores"]["roc_auc"]["1"] == pytest.approx(
        100 * np.mean([r["auc"] for r in folds["tiny"][1]]))
    assert record["facts"]["epochs/tiny"] == 2


def test_the_ablation_records_each_variant_cell_per_seed_against_centralized_spdnet(records):
    central, full = table_one_ablation.CENTRALIZED_SPDNET, table_one_ablation.FULL

    def runs(f1s, fit=60.0):
        return [{"seed": s, "f1": f, "accuracy": f + 0.01, "fit_seconds": fit, "cpu_seconds": fit / 2}
                for s, f in enumerate(f1s)]

    rows = [("protocol", central, runs([0.55, 0.60, 0.50])), ("protocol", full, runs([0.45, 0.40, 0.44])),
            ("kept client Adam", full, runs([0.40, 0.41, 0.39]))]
    table_one_ablation.write_ablation_record("tableone-ablation-test", rows, "python -m ...", 100.0, rows[0][2],
                                             {"seeds": 3})
    record = records("tableone-ablation-test")
    assert record["reference"] == "protocol/centralized/spdnet" and record["paired_by"] == "seed"
    assert list(record["rows"]) == ["protocol/centralized/spdnet", "protocol/full/spdnet-projavg",
                                    "kept-client-adam/full/spdnet-projavg"]
    assert record["rows"]["kept-client-adam/full/spdnet-projavg"]["label"] == "kept client Adam: FedSPDnet ProjAvg (full)"
    assert record["rows"]["protocol/full/spdnet-projavg"]["scores"]["macro_f1"] == {
        "0": pytest.approx(45.0), "1": pytest.approx(40.0), "2": pytest.approx(44.0)}
    assert render.pair(record, "kept-client-adam/full/spdnet-projavg", "protocol/full/spdnet-projavg").startswith(
        "−3.0 ± 2.0, higher on 1 of 3 seeds")
    assert record["wall_seconds"] == pytest.approx(100.0)  # the wall time, not the runs' summed fit time
    facts = record["facts"]
    assert (facts["runs"], facts["runs_cached_at_start"], facts["fit_minutes"], facts["cpu_minutes"]) == (9, 3, 9.0, 4.5)
    assert facts["variants"] == ["protocol", "kept client Adam"]


def test_without_centralized_spdnet_the_first_row_is_the_reference(records):
    rows = [("kept client Adam", table_one_ablation.FULL, [{"seed": 0, "f1": 0.4, "accuracy": 0.4, "fit_seconds": 1.0}])]
    table_one_ablation.write_ablation_record("tableone-ablation-test", rows, "cmd", 1.0, [], {})
    assert records("tableone-ablation-test")["reference"] == "kept-client-adam/full/spdnet-projavg"


@pytest.mark.parametrize("settings, keys", [(["full"], ["full/spdnet-projavg", "full+sm/spdnet-projavg"]),
                                            (["centralized", "half"], ["half+sm/spdnet-projavg", "half/spdnet-projavg"])])
def test_ablation_settings_choose_the_cells_of_each_variant(settings, keys):
    names = ["protocol + server momentum", "kept client Adam"]
    chosen = [c.key for name in names for c in table_one_ablation.variant_cells(name, settings)[0]]
    assert sorted(set(chosen)) == sorted(keys)
