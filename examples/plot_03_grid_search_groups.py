"""
Model selection across subjects: GridSearchCV, GroupKFold and metadata routing
==============================================================================

Two things need the subject of each trial when a federated model is tuned:

- the **splitter**: :class:`~sklearn.model_selection.GroupKFold` keeps each subject's trials
  in one fold, so the score measures generalisation to unseen subjects;
- the **estimator**: :class:`~skfedspd.FederatedSPDnetClassifier` makes one client per
  subject (or per ``k`` subjects with ``clients=ClientPartition(groups_per_client=k)``) from
  ``groups``.

With scikit-learn's metadata routing enabled, one ``groups=`` argument reaches both, through
:class:`~sklearn.model_selection.GridSearchCV` and a :class:`~sklearn.pipeline.Pipeline`.
``FederatedSPDnetClassifier`` requests ``groups`` by default: no ``set_fit_request`` call is
needed.
"""

# %%
# Data: 6 simulated subjects
# --------------------------
import numpy as np
import pandas as pd
import sklearn
from pyriemann.estimation import Shrinkage
from sklearn.model_selection import GridSearchCV, GroupKFold
from sklearn.pipeline import make_pipeline

from skfedspd import FederatedSPDnetClassifier, SPDnetClassifier
from skfedspd.datasets import make_spd_classification

n_subjects, per_subject = 6, 40
X, y = make_spd_classification(n_matrices=n_subjects * per_subject, n_channels=8, n_classes=2,
                               separation=1.5, seed=0)
subjects = np.repeat(np.arange(n_subjects), per_subject)

# %%
# A pipeline and a grid
# ---------------------
# :class:`~pyriemann.estimation.Shrinkage` regularises each covariance matrix, then the
# federated model trains with one client per subject of the training folds.
sklearn.set_config(enable_metadata_routing=True)

pipeline = make_pipeline(
    Shrinkage(shrinkage=0.01),
    FederatedSPDnetClassifier(SPDnetClassifier(hidden_dims=(4,), lr=2e-2), n_rounds=10,
                              local_epochs=2, random_state=0),
)
grid = {
    "federatedspdnetclassifier__aggregation": ["projavg", "rlavg"],
    "federatedspdnetclassifier__estimator__lr": [2e-3, 2e-2],
}
search = GridSearchCV(pipeline, grid, cv=GroupKFold(n_splits=3), scoring="balanced_accuracy")
search.fit(X, y, groups=subjects)

# %%
# Every fold held out 2 whole subjects; each candidate was trained with one client per
# remaining subject.
results = pd.DataFrame(search.cv_results_)
columns = ["param_federatedspdnetclassifier__aggregation",
           "param_federatedspdnetclassifier__estimator__lr", "mean_test_score", "std_test_score"]
print(results[columns].rename(columns=lambda c: c.split("__")[-1]).to_string(index=False))
print("best:", search.best_params_)

# %%
# The refitted best model used the subjects as clients (``client_source_``):
best = search.best_estimator_[-1]
print(best.client_source_, best.n_clients_, "clients:", best.client_groups_)

# %%
# Without routing
# ---------------
# With metadata routing off (scikit-learn's default), ``GridSearchCV`` gives ``groups`` to
# the splitter only, and the federated model falls back to ``n_clients`` partitions of the
# samples that ignore the subjects (``client_source_`` says so). Enable routing whenever
# ``groups`` should define the clients.
sklearn.set_config(enable_metadata_routing=False)
plain = GridSearchCV(pipeline, {"federatedspdnetclassifier__aggregation": ["projavg"]},
                     cv=GroupKFold(n_splits=2)).fit(X, y, groups=subjects)
print(plain.best_estimator_[-1].client_source_)
