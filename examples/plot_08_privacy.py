"""
Differential privacy: DP-SGD on the Stiefel manifold and its budget
===================================================================

:mod:`skfedspd.privacy` trains SPDnet with sample-level differential privacy: DP-SGD whose
per-sample gradients are Riemannian for the BiMap (Stiefel) weights, clipped jointly,
noised (the noise of a Stiefel weight is projected to its tangent space) and applied by a
retraction. Its accounting uses Google's ``dp-accounting``: the noise multiplier ``σ`` that
meets a target ``(ε, δ)`` for a given number of steps, and, for a federation, one ``σ`` per
site for the whole run.

This example trains the SPDnet module (:class:`skfedspd.nn.SPDNet`) with
:func:`~skfedspd.dp_sgd.dp_train_epochs` at several privacy budgets on synthetic data, and
plans the noise of a federated run with :func:`~skfedspd.privacy.plan_dp`. Then, on the
offline PhysioNet EEG where it is present, it runs the recommended private path: public
pre-training with domain batch norm, then a DP federation that starts from it and keeps
re-centring. Needs ``dp-accounting`` (``pip install dp-accounting``).
"""

# %%
# Data and the DP-SGD schedule
# ----------------------------
import importlib.util
import math

import matplotlib.pyplot as plt
import torch

if importlib.util.find_spec("dp_accounting") is None:
    raise SystemExit("This example needs dp-accounting: pip install dp-accounting")

from skfedspd.datasets import make_spd_classification
from skfedspd.nn import SPDNet
from skfedspd.dp_sgd import dp_train_epochs, steps_per_epoch
from skfedspd.privacy import calibrate_noise, default_delta, epsilon_spent, plan_dp
from skfedspd.training import evaluate

X, y = make_spd_classification(n_matrices=700, n_channels=8, n_classes=2, separation=2.0, seed=0)
X_train, y_train = torch.as_tensor(X[:600]), torch.as_tensor(y[:600])
X_test, y_test = torch.as_tensor(X[600:]), torch.as_tensor(y[600:])

n_train, batch_size, n_epochs = len(X_train), 60, 6
sample_rate = batch_size / n_train  # Poisson sampling: each sample joins a step with this rate
steps = n_epochs * steps_per_epoch(sample_rate)
delta = default_delta([n_train])
print(f"{steps} DP-SGD steps, sampling rate {sample_rate:.2f}, delta {delta:g}")

# %%
# Privacy against accuracy
# ------------------------
# For each target ε, :func:`~skfedspd.privacy.calibrate_noise` gives the smallest ``σ`` that
# meets it; ``ε = inf`` is clipping without noise. Same initial model and seed every time.
results = []
for target in [math.inf, 4.0, 1.0]:
    sigma = calibrate_noise(target, delta, sample_rate=sample_rate, steps=steps)
    module = SPDNet(8, (4,), 2, eps=1e-2, seed=0)
    generator = torch.Generator().manual_seed(0)
    dp_train_epochs(module, X_train, y_train, n_epochs=n_epochs, sample_rate=sample_rate, clip_norm=1.0,
                    noise_multiplier=sigma, lr=2e-2, generator=generator, optimizer="adam")
    spent = epsilon_spent(sigma, delta, sample_rate, steps) if sigma > 0 else math.inf
    _, f1 = evaluate(module, X_test, y_test)
    results.append((target, sigma, spent, f1))
    print(f"target eps {target:5}: sigma {sigma:.3f}, eps spent {spent:7.3f}, test macro-F1 {f1:.3f}")

# %%
fig, ax = plt.subplots(figsize=(5, 3.2))
labels = ["no noise" if math.isinf(t) else f"ε = {t:g}" for t, *_ in results]
ax.bar(labels, [f1 for *_, f1 in results])
ax.set(ylabel="test macro-F1", ylim=(0, 1), title=f"SPDnet, DP-SGD, δ = {delta:g}")
fig.tight_layout()

# %%
# Planning a federated run
# ------------------------
# Each site's guarantee covers its own training samples over every round it takes part in.
# With half of 6 sites drawn per round, the plan bounds each site by every round (the worst
# case); smaller sites sample at a higher rate and need more noise.
plan = plan_dp([120, 90, 200, 150, 60, 100], batch_size=16, local_epochs=2, n_rounds=30,
               participation=0.5, target_epsilon=8.0)
for site in plan["sites"]:
    print(f"n_train {site['n_train']:4d}: sample rate {site['sample_rate']:.3f}, {site['steps']:4d} steps, "
          f"sigma {site['noise_multiplier']:.3f}, eps {site['epsilon']:.3f}")

# %%
# The recommended private path on EEG
# -----------------------------------
# The path :doc:`/guide/privacy` recommends: a model fitted on **public** subjects with domain
# batch norm (an ordinary fit, outside the budget), passed as ``init=`` to a federation whose
# sites train it with DP-SGD at ε = 8. Each site subject is a domain (``domains="group"``) and
# each site releases its subjects' means under the same budget, so the private model keeps
# re-centring; a new subject's trials are re-centred by their own mean at no privacy cost.
#
# Left/right hand imagery of the offline PhysioNet EEG (16 sensorimotor channels): subjects 1-4
# public, 5-12 in two sites of four, subject 13 in no site. The sizes (13 subjects, a public
# model of 60 epochs where the default trains 300, 5 rounds where the guide's snippet runs 30)
# are small for speed, and one subject is a demonstration,
# not a measurement (the benchmark: :doc:`/benchmarks/privacy-pretraining`). Needs the offline
# data; elsewhere this part says so and is skipped.
from sklearn.metrics import balanced_accuracy_score

from skfedspd import FederatedSPDnetClassifier, SPDnetClassifier
from skfedspd.clients import ClientPartition
from skfedspd.datasets import SENSORIMOTOR_CHANNELS, find_physionet_root, load_physionet_mi
from skfedspd.privacy import DPSGD

if find_physionet_root() is None:
    print("PhysioNet EEG data not found (set SKFEDSPD_DATA to the folder holding "
          "MNE-eegbci-data): the private path on EEG is skipped here.")
else:
    X, y, subjects = load_physionet_mi(range(1, 14), n_classes=2, channels=SENSORIMOTOR_CHANNELS)[:3]
    public, sites, new = subjects <= 4, (subjects >= 5) & (subjects <= 12), subjects == 13
    public_model = SPDnetClassifier(scaling="trace", batchnorm="domain", max_epochs=60, random_state=0).fit(
        X[public], y[public], groups=subjects[public])
    private = FederatedSPDnetClassifier(
        SPDnetClassifier(batchnorm="domain", batch_size=32, lr=1e-3),
        init=public_model, domains="group",
        clients=ClientPartition(groups_per_client=4), n_rounds=5, local_epochs=1,
        privacy=DPSGD(epsilon=8.0, delta=1e-5, domain_share=0.25, domain_clip=2.0), random_state=0,
    ).fit(X[sites], y[sites], groups=subjects[sites])
    site = private.privacy_["sites"][0]
    print(f"site 0: DP-SGD alone eps {site['training_epsilon']:.2f}, with the release of its means eps "
          f"{site['epsilon']:.2f} (target 8)")
    for name, model in [("public model", public_model), ("private federation", private)]:
        print(f"{name:18s}: balanced accuracy on subject 13 {balanced_accuracy_score(y[new], model.predict(X[new])):.2f}")
