"""MOABB pipeline: covariances -> FedSPDnet with RLAvg, 2 subjects per client.

In CrossSubjectEvaluation MOABB routes the training subjects to ``fit`` (key
``subjects``), which FederatedSPDnetClassifier requests by default: each client holds two
subjects. In Within/CrossSession evaluations no subjects reach ``fit`` and the estimator
falls back to ``n_clients`` stratified clients (recorded in ``client_source_``).
"""

from pyriemann.estimation import Covariances
from sklearn.pipeline import make_pipeline

from skfedspd import FederatedSPDnetClassifier, SPDnetClassifier
from skfedspd.clients import ClientPartition

PIPELINE = {
    "name": "FedSPDnet-RLAvg",
    "paradigms": ["LeftRightImagery", "MotorImagery"],
    "citations": ["https://arxiv.org/abs/2604.22494"],
    "pipeline": make_pipeline(
        Covariances("scm"),
        FederatedSPDnetClassifier(
            SPDnetClassifier(hidden_dims=(18,), eps=1e-2),
            aggregation="rlavg",
            n_rounds=150,
            local_epochs=2,
            clients=ClientPartition(groups_per_client=2),
            random_state=0,
        ),
    ),
}
