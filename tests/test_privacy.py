"""Tests for ``skfedspd.privacy``: the accounting of Riemannian DP-SGD and of the released domain means.

Oracle: the accountant's own ε (``dp_accounting`` called directly).
"""

import json
import math

import pytest

import skfedspd.privacy as privacy
from skfedspd.privacy import calibrate_noise, default_delta, epsilon_spent, plan_dp

pytestmark = pytest.mark.usefixtures("torch_single_thread")


# ---------------------------------------------------------------------------------------------
# (a) accounting: the budget holds by the accountant's own computation
# ---------------------------------------------------------------------------------------------


def _accountant_epsilon(sigma, q, steps, delta):
    """ε straight from dp_accounting (independent of skfedspd.privacy's wrappers)."""
    import dp_accounting

    event = dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma)), steps)
    return dp_accounting.rdp.RdpAccountant().compose(event).get_epsilon(delta)


@pytest.mark.usefixtures("accounting")
@pytest.mark.parametrize("target", [1.0, 8.0])
def test_calibrate_noise_meets_target_tightly(target):
    q, steps, delta = 0.05, 400, 1e-5
    sigma = calibrate_noise(target, delta, sample_rate=q, steps=steps)
    assert _accountant_epsilon(sigma, q, steps, delta) <= target
    assert _accountant_epsilon(sigma * 0.99, q, steps, delta) > target  # not wastefully large
    assert epsilon_spent(sigma, delta, q, steps) == pytest.approx(_accountant_epsilon(sigma, q, steps, delta))


@pytest.mark.usefixtures("accounting")
def test_accounting_limits():
    assert calibrate_noise(math.inf, 1e-5, sample_rate=0.1, steps=100) == 0.0
    assert epsilon_spent(0.0, 1e-5, 0.1, 100) == math.inf
    assert epsilon_spent(1.0, 1e-5, 0.1, 0) == 0.0
    # PLD is tighter than RDP on the same mechanism
    assert epsilon_spent(1.0, 1e-5, 0.1, 50, accountant="pld") < epsilon_spent(1.0, 1e-5, 0.1, 50)
    for bad in (dict(delta=0.0), dict(delta=1.0), dict(sample_rate=0.0), dict(steps=-1), dict(steps=2.5)):
        args = {**dict(delta=1e-5, sample_rate=0.1, steps=10), **bad}
        with pytest.raises(ValueError):
            epsilon_spent(1.0, args["delta"], args["sample_rate"], args["steps"])
    with pytest.raises(ValueError, match="accountant"):
        epsilon_spent(1.0, 1e-5, 0.1, 10, accountant="gdp")
    with pytest.raises(ValueError, match="target_epsilon"):
        calibrate_noise(0.0, 1e-5, sample_rate=0.1, steps=10)


@pytest.mark.usefixtures("accounting")
@pytest.mark.parametrize("participation, per_site_noise", [
    (1.0, True), (0.5, False), ([40, 25, 0], True),
])
def test_plan_dp_budget_holds_for_every_site(participation, per_site_noise):
    sizes, target = [150, 60, 300], 3.0
    plan = plan_dp(sizes, 16, 2, 40, participation, target, per_site_noise=per_site_noise)
    json.dumps(plan)  # JSON-able
    assert plan["delta"] == default_delta(sizes) < 1 / min(sizes)
    assert plan["accountant"]["name"] == "rdp"
    expected_rounds = [40, 40, 40] if not isinstance(participation, list) else participation
    for site, n, rounds in zip(plan["sites"], sizes, expected_rounds):
        q = min(1.0, 16 / n)
        assert site["n_train"] == n and site["sample_rate"] == q and site["rounds"] == rounds
        assert site["steps"] == rounds * 2 * math.ceil(n / 16)
        if site["steps"]:
            assert _accountant_epsilon(site["noise_multiplier"], q, site["steps"], plan["delta"]) <= target
        assert site["epsilon"] <= target
    sigmas = [site["noise_multiplier"] for site in plan["sites"]]
    if per_site_noise:
        if participation == 1.0:
            assert sigmas[1] > sigmas[0] > sigmas[2]  # the smallest site (largest q) needs most noise
    else:
        assert len(set(sigmas)) == 1
    if isinstance(participation, list):
        assert sigmas[2] == 0.0 and plan["sites"][2]["epsilon"] == 0.0  # never trains: no release
        assert plan["rounds_bound"].startswith("exact")
    else:
        assert plan["rounds_bound"] in ("all rounds", "worst case: a site may be drawn in every round")


@pytest.mark.usefixtures("accounting")
def test_plan_dp_errors():
    with pytest.raises(ValueError, match="delta"):
        plan_dp([100, 50], 8, 1, 5, 1.0, 1.0, delta=0.05)
    with pytest.raises(ValueError, match="participation"):
        plan_dp([100, 50], 8, 1, 5, [5], 1.0)
    with pytest.raises(ValueError, match="participation"):
        plan_dp([100, 50], 8, 1, 5, [6, 1], 1.0)
    with pytest.raises(ValueError, match="participation"):
        plan_dp([100, 50], 8, 1, 5, 0.0, 1.0)
    with pytest.raises(ValueError, match="n_train_per_site"):
        plan_dp([100, 0], 8, 1, 5, 1.0, 1.0)
    with pytest.raises(ValueError, match="batch_size"):
        plan_dp([100, 50], 0, 1, 5, 1.0, 1.0)


# ---------------------------------------------------------------------------------------------
# Re-centring under DP: the release's share of the budget
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("share", [0.1, 0.25, 0.5])
@pytest.mark.parametrize("layers", [1, 2])
@pytest.mark.parametrize("target", [1.0, 8.0])
def test_the_release_and_dp_sgd_compose_within_the_budget(share, layers, target):
    """Every site's total (release + DP-SGD, by the accountant) is within the target; the
    release alone spends its share, DP-SGD alone what the composition leaves, and the
    composition costs more than either."""
    plan = plan_dp([90, 150], batch_size=16, local_epochs=1, n_rounds=10, participation=1.0, target_epsilon=target,
                   domain_release=dict(layers=layers, share=share, clip=2.0))
    release = plan["domain_release"]
    assert release["epsilon"] <= share * target * (1 + 1e-6)
    assert release["epsilon"] == pytest.approx(share * target, rel=0.02)
    domain = {"noise_multiplier": release["noise_multiplier"], "layers": layers}
    for site in plan["sites"]:
        total = epsilon_spent(site["noise_multiplier"], plan["delta"], site["sample_rate"], site["steps"], domain=domain)
        assert site["epsilon"] == pytest.approx(total)
        assert total <= target
        assert max(release["epsilon"], site["training_epsilon"]) < total
    assert json.loads(json.dumps(plan)) == plan


def test_without_domain_release_the_plan_is_the_plain_dp_sgd_plan():
    plain = plan_dp([90, 150], batch_size=16, local_epochs=1, n_rounds=10, participation=1.0, target_epsilon=3.0)
    assert plain["domain_release"] is None
    assert [s["epsilon"] for s in plain["sites"]] == [s["training_epsilon"] for s in plain["sites"]]


def test_a_release_that_spends_the_whole_budget_is_refused():
    domain = {"noise_multiplier": 0.05, "layers": 1}
    with pytest.raises(ValueError, match="release of the domain means alone spends the whole"):
        calibrate_noise(1.0, 1e-5, sample_rate=0.1, steps=10, domain=domain)


def test_group_epsilon_bounds_one_sample_and_grows_with_the_group():
    sigma, steps = 1.5, 100
    one = epsilon_spent(sigma, 1e-5, sample_rate=0.2, steps=steps)
    bounds = [privacy.group_epsilon(sigma, 1e-5, steps, k) for k in (1, 2, 10, 36)]
    assert one <= bounds[0]  # the bound forgoes amplification by sampling
    assert bounds == sorted(bounds) and bounds[-1] > 100 * one
    domain = {"noise_multiplier": 2.0, "layers": 1}
    assert privacy.group_epsilon(sigma, 1e-5, steps, 10, domain=domain) > bounds[2]
    with pytest.raises(ValueError, match="group_size must be an int >= 1"):
        privacy.group_epsilon(sigma, 1e-5, steps, 0)
