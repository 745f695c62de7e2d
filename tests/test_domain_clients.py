"""Tests of ``benchmarks/domain_clients.py``: its ablation row, its rows' routing and its
paired lines (no EEG, no MOABB run)."""

import numpy as np
import pandas as pd
import pytest

from benchmarks import domain_clients as dc
from skfedspd import SPDnetClassifier


def test_the_ablation_row_makes_each_client_one_domain(spd_domains):
    X, y, subjects = spd_domains(n_groups=4, n_per_group=15)
    fed = dc.ClientDomainFederated(SPDnetClassifier(batchnorm="domain"), groups_per_client=2, random_state=0)
    task = fed._prepare(X, y, subjects + 5, None)
    assert [sorted(set(task.groups[rows])) for rows in task.indices] == [[0], [1]]
    assert [sorted(set(subjects[rows])) for rows in task.indices] == [[0, 1], [2, 3]]  # the clients are unchanged


def test_rows_that_federate_or_recentre_get_the_training_subjects():
    """MOABB hands ``subjects`` only to pipelines that consume it (see test_moabb_evaluation)."""
    from sklearn import config_context
    from sklearn.utils.metadata_routing import get_routing_for_object

    with config_context(enable_metadata_routing=True):
        consumes = {name: bool(get_routing_for_object(pipe).consumes("fit", {"subjects"}))
                    for name, pipe in dc.pipelines(2).items()}
    assert consumes == {name: name != "TS+LR" for name in consumes}
    assert all(pipe[-1].groups_per_client == 2 for name, pipe in dc.pipelines(2).items() if "FedSPDnet" in name)


def test_paired_lines():
    rows = {"FedSPDnet + domain BN, each subject a domain": [0.8, 0.7, 0.9],
            "FedSPDnet + domain BN, each client one domain": [0.7, 0.7, 0.8]}
    table = pd.DataFrame([{"score": v, "subject": s, "pipeline": name} for name, values in rows.items()
                          for s, v in zip((1, 2, 3), values)])
    (line,) = dc.paired_lines(table)
    assert line.startswith("- FedSPDnet + domain BN, each subject a domain vs FedSPDnet + domain BN, each client one "
                           "domain: 80.0 vs 73.3, difference **+6.7** ± 3.3 (SE over 3 subjects; higher on 2)")


@pytest.mark.parametrize("k", [0, -1])
def test_bad_groups_per_client_refused(k, capsys, tmp_path):
    with pytest.raises(SystemExit):
        dc.main(["--groups-per-client", str(k), "--out", str(tmp_path)])
    assert "--groups-per-client must be at least 1" in capsys.readouterr().err


def test_a_row_out_of_range_is_refused(capsys, tmp_path):
    with pytest.raises(SystemExit):
        dc.main(["--rows", "5", "--out", str(tmp_path)])
    assert "invalid choice: 5" in capsys.readouterr().err
