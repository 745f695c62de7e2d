"""Tests for ``skfedspd.aggregation``: ProjAvg, RLAvg, the Karcher mean and their helpers.

Property tests in float64 (pyRiemann style): orthonormality of the output, consensus,
equivariance under ``W ↦ Q W R``, the ``O(δ²)`` agreement of ProjAvg and RLAvg, the
secure-aggregation property (the clients enter only through their weighted sum), the
Euclidean weighted mean, the exclusion of client-local arrays, and argument checking; the
Karcher mean's first-order optimality and its ``O(δ²)`` gap to ProjAvg / RLAvg; the
R-barycenter (RLAvg iterated at its own output) is ProjAvg. The robust rules (geometric
median, trimmed mean, multi-Krum): their fixed cases, resistance to outliers, oracles (scipy's
minimiser and trimmed mean, replicated clients), invariances and argument checking. FLTrust:
the reference's step when the clients agree, its length whatever theirs, no weight against
it, the agreement as a tangent cosine, its threshold, and its arguments.
"""

from collections import OrderedDict

import numpy as np
import pytest

from scipy.optimize import minimize
from scipy.stats import trim_mean
from sklearn.base import clone

from skfedspd.aggregation import (
    AGGREGATIONS,
    FLTrust,
    GeometricMedian,
    Krum,
    RobustAggregation,
    TrimmedMean,
    check_secure_rule,
    client_distances,
    client_weights,
    get_aggregation,
    projavg,
    karcher,
    projavg_from_sum,
    rlavg,
    rlavg_from_sum,
    rule_name,
    tangent_updates,
    weighted_sum,
)
from skfedspd.stiefel import (
    lift,
    orthonormality_error,
    polar,
    random_stiefel,
    retract,
    stiefel_exp,
    stiefel_log,
    tangent_project,
)

SHAPES = [(3, 1), (4, 2), (6, 3), (5, 5), (8, 4), (64, 18)]
RULES = {"projavg": projavg, "rlavg": rlavg}
FROM_SUM = {"projavg": projavg_from_sum, "rlavg": rlavg_from_sum}
ALL_RULES = {**RULES, "karcher": karcher}
ROBUST = {"geomedian": GeometricMedian(), "trimmedmean": TrimmedMean(trim=0.2), "krum": Krum(n_faulty=1)}
EVERY_RULE = {**ALL_RULES, **ROBUST}
N_CLIENTS = [1, 2, 5]

STIEFEL = "bimaps.0.weight"


def _kinds(with_local=True):
    kinds = OrderedDict([(STIEFEL, "stiefel"), ("head.weight", "euclidean"), ("head.bias", "euclidean")])
    if with_local:
        kinds["bn.running_mean"] = "local"
    return kinds


def _orthogonal(n, rng):
    Q, R = np.linalg.qr(rng.standard_normal((n, n)))
    return Q * np.sign(np.diag(R))


def _random_weights(n, rng):
    w = rng.uniform(0.2, 1.0, n)
    return w / w.sum()


def _clients(p, k, n_clients, spread, seed, with_local=True):
    """A previous global model and ``n_clients`` client models whose Stiefel weight is the
    polar retraction of ``spread`` times a unit tangent vector at the previous weight
    (``spread=None``: independent Haar points, i.e. far apart)."""
    rng = np.random.default_rng(seed)
    W = random_stiefel(p, k, rng)
    n_head = k * (k + 1) // 2
    previous = {STIEFEL: W, "head.weight": rng.standard_normal((3, n_head)), "head.bias": rng.standard_normal(3)}
    clients = []
    for _ in range(n_clients):
        if spread is None:
            Wi = random_stiefel(p, k, rng)
        else:
            Z = tangent_project(W, rng.standard_normal((p, k)))
            Wi = retract(W, spread * Z / np.linalg.norm(Z))
        params = {STIEFEL: Wi, "head.weight": rng.standard_normal((3, n_head)), "head.bias": rng.standard_normal(3)}
        if with_local:
            params["bn.running_mean"] = rng.standard_normal(k)
        clients.append(params)
    return previous, clients, _random_weights(n_clients, rng)


def _slopes(gaps, ratio=2.0):
    """log-log slopes of a sequence of errors for steps divided by ``ratio`` each time."""
    gaps = np.asarray(gaps)
    return np.log(gaps[:-1] / gaps[1:]) / np.log(ratio)


# ---------------------------------------------------------------------------------------------
# Orthonormality, shapes, dtypes
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("rule", ALL_RULES)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("n_clients", N_CLIENTS)
@pytest.mark.parametrize("spread", [0.05, 0.5])
def test_output_is_orthonormal(rule, shape, n_clients, spread):
    p, k = shape
    previous, clients, w = _clients(p, k, n_clients, spread, seed=p * 100 + k)
    out = ALL_RULES[rule](clients, w, previous, _kinds())
    assert out[STIEFEL].shape == (p, k)
    assert out[STIEFEL].dtype == np.float64
    assert orthonormality_error(out[STIEFEL]) <= 1e-12


@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_output_is_orthonormal_for_far_apart_clients(rule, shape, seed):
    """Independent Haar points (no common neighbourhood): still exactly on the manifold."""
    p, k = shape
    previous, clients, w = _clients(p, k, 4, None, seed=seed)
    out = RULES[rule](clients, w, previous, _kinds())
    assert orthonormality_error(out[STIEFEL]) <= 1e-12


@pytest.mark.parametrize("rule", ALL_RULES)
def test_output_names_and_shapes(rule):
    previous, clients, w = _clients(6, 3, 3, 0.1, seed=0)
    out = ALL_RULES[rule](clients, w, previous, _kinds())
    assert list(out) == [STIEFEL, "head.weight", "head.bias"]
    for name, value in out.items():
        assert value.shape == previous[name].shape
        assert value.dtype == np.float64


@pytest.mark.parametrize("rule", EVERY_RULE)
def test_inputs_not_modified(rule):
    previous, clients, w = _clients(6, 3, 5, 0.1, seed=0)
    before = [{n: a.copy() for n, a in c.items()} for c in clients], {n: a.copy() for n, a in previous.items()}
    w_before = w.copy()
    EVERY_RULE[rule](clients, w, previous, _kinds())
    for c, c0 in zip(clients, before[0]):
        for name in c:
            np.testing.assert_array_equal(c[name], c0[name])
    for name in previous:
        np.testing.assert_array_equal(previous[name], before[1][name])
    np.testing.assert_array_equal(w, w_before)


# ---------------------------------------------------------------------------------------------
# Consensus: all clients equal → unchanged
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("rule", ALL_RULES)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("n_clients", N_CLIENTS)
def test_all_clients_equal_previous_unchanged(rule, shape, n_clients):
    """Clients that all return the broadcast: the global model does not move."""
    p, k = shape
    previous, _, w = _clients(p, k, n_clients, 0.1, seed=k)
    clients = [{**{n: a.copy() for n, a in previous.items()}, "bn.running_mean": np.ones(k)} for _ in range(n_clients)]
    out = ALL_RULES[rule](clients, w, previous, _kinds())
    for name, value in previous.items():
        np.testing.assert_allclose(out[name], value, rtol=0, atol=1e-12)


@pytest.mark.parametrize("rule", ["projavg", "karcher"])
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("n_clients", N_CLIENTS)
def test_all_clients_equal_returns_that_model(rule, shape, n_clients):
    """ProjAvg and the Karcher mean of identical clients is that client, whatever the
    previous model (``uf(W) = W`` on the manifold; ``Log_W(W) = 0``)."""
    p, k = shape
    previous, (client,), _ = _clients(p, k, 1, 0.7, seed=k + 7)
    clients = [{n: a.copy() for n, a in client.items()} for _ in range(n_clients)]
    w = _random_weights(n_clients, np.random.default_rng(0))
    out = ALL_RULES[rule](clients, w, previous, _kinds())
    np.testing.assert_allclose(out[STIEFEL], client[STIEFEL], rtol=0, atol=1e-12)
    np.testing.assert_allclose(out["head.weight"], client["head.weight"], rtol=1e-14, atol=1e-14)
    np.testing.assert_allclose(out["head.bias"], client["head.bias"], rtol=1e-14, atol=1e-14)


@pytest.mark.parametrize("shape", SHAPES)
def test_rlavg_identical_clients_at_broadcast(shape):
    """RLAvg with identical clients equal to the previous model returns it; identical
    clients away from it give ``R_W(L_W(W_c))`` — on the manifold, within O(δ²) of W_c."""
    p, k = shape
    previous, (client,), _ = _clients(p, k, 1, 0.01, seed=3)
    out = rlavg([client, client], np.array([0.5, 0.5]), previous, _kinds())
    expected = retract(previous[STIEFEL], lift(previous[STIEFEL], client[STIEFEL]))
    np.testing.assert_allclose(out[STIEFEL], expected, rtol=0, atol=1e-13)
    assert np.linalg.norm(out[STIEFEL] - client[STIEFEL]) <= 1e-3  # δ = 0.01 → gap ≲ δ²


# ---------------------------------------------------------------------------------------------
# Equivariance W_i → Q W_i R
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("rule", ALL_RULES)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("spread", [0.1, 0.6])
def test_equivariance(rule, shape, spread):
    """``W_i → Q W_i R`` (and ``W_prev → Q W_prev R``) maps the result to ``Q W R``;
    Euclidean arrays are untouched."""
    p, k = shape
    previous, clients, w = _clients(p, k, 3, spread, seed=11 * k)
    rng = np.random.default_rng(99)
    Q, R = _orthogonal(p, rng), _orthogonal(k, rng)
    moved = [{**c, STIEFEL: Q @ c[STIEFEL] @ R} for c in clients]
    moved_previous = {**previous, STIEFEL: Q @ previous[STIEFEL] @ R}
    out = ALL_RULES[rule](clients, w, previous, _kinds())
    out_moved = ALL_RULES[rule](moved, w, moved_previous, _kinds())
    np.testing.assert_allclose(out_moved[STIEFEL], Q @ out[STIEFEL] @ R, rtol=0, atol=1e-10)
    for name in ("head.weight", "head.bias"):
        np.testing.assert_array_equal(out_moved[name], out[name])


@pytest.mark.parametrize("shape", SHAPES)
def test_projavg_ignores_previous(shape):
    """ProjAvg does not look at the previous model (so it is equivariant without it)."""
    p, k = shape
    previous, clients, w = _clients(p, k, 3, 0.3, seed=5)
    other = {**previous, STIEFEL: random_stiefel(p, k, 123)}
    a = projavg(clients, w, previous, _kinds())
    b = projavg(clients, w, other, _kinds())
    for name in a:
        np.testing.assert_array_equal(a[name], b[name])


# ---------------------------------------------------------------------------------------------
# ProjAvg − RLAvg = O(δ²)
# ---------------------------------------------------------------------------------------------

DELTAS = [4e-2, 2e-2, 1e-2]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("n_clients", [2, 5])
def test_projavg_rlavg_gap_second_order_off_manifold(shape, n_clients):
    """Clients anywhere within δ of ``W_prev`` (``W_i = W + δ E_i``, e.g. Euclidean local
    steps): ``‖ProjAvg − RLAvg‖ = O(δ²)`` — log-log slope ≈ 2."""
    p, k = shape
    rng = np.random.default_rng(p + k)
    W = random_stiefel(p, k, rng)
    E = [rng.standard_normal((p, k)) for _ in range(n_clients)]
    E = [e / np.linalg.norm(e) for e in E]
    w = _random_weights(n_clients, rng)
    kinds = {STIEFEL: "stiefel"}
    gaps = []
    for delta in DELTAS:
        clients = [{STIEFEL: W + delta * e} for e in E]
        a = projavg(clients, w, {STIEFEL: W}, kinds)[STIEFEL]
        b = rlavg(clients, w, {STIEFEL: W}, kinds)[STIEFEL]
        gaps.append(np.linalg.norm(a - b))
    slopes = _slopes(gaps)
    assert np.all(slopes >= 1.8), (gaps, slopes)
    assert np.all(slopes <= 2.3), (gaps, slopes)
    assert gaps[0] <= 10 * DELTAS[0] ** 2


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("n_clients", [2, 5])
def test_projavg_rlavg_gap_on_manifold(shape, n_clients):
    """Clients on the manifold within δ of ``W_prev`` (``W_i = R_W(δ Z_i)``): the gap is
    O(δ²) as the paper states — and in fact O(δ³), because the second-order part of
    ``W_i − W`` is normal (``−δ²/2 W ZᵀZ``), which both rules remove to first order."""
    p, k = shape
    gaps = []
    for delta in DELTAS:
        previous, clients, w = _clients(p, k, n_clients, delta, seed=p * k)
        a = projavg(clients, w, previous, _kinds())[STIEFEL]
        b = rlavg(clients, w, previous, _kinds())[STIEFEL]
        gaps.append(np.linalg.norm(a - b))
    slopes = _slopes(gaps)
    assert np.all(slopes >= 1.8), (gaps, slopes)
    assert np.all(slopes >= 2.8), (gaps, slopes)
    assert gaps[0] <= 10 * DELTAS[0] ** 2


# ---------------------------------------------------------------------------------------------
# Secure aggregation: the clients enter only through their weighted sum
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("n_clients", N_CLIENTS)
def test_rule_equals_rule_from_sum(rule, shape, n_clients):
    p, k = shape
    previous, clients, w = _clients(p, k, n_clients, 0.3, seed=n_clients)
    kinds = _kinds()
    summed = weighted_sum(clients, w, kinds)
    direct = RULES[rule](clients, w, previous, kinds)
    from_sum = FROM_SUM[rule](summed, previous, kinds)
    assert list(direct) == list(from_sum)
    for name in direct:
        np.testing.assert_array_equal(direct[name], from_sum[name])


@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("shape", SHAPES)
def test_single_client_holding_the_sum(rule, shape):
    """A different client set with exactly the same weighted sum (one client holding it,
    weight 1) gives the identical result."""
    p, k = shape
    previous, clients, w = _clients(p, k, 4, 0.3, seed=21)
    kinds = _kinds()
    summed = weighted_sum(clients, w, kinds)
    single = [{**summed, "bn.running_mean": np.zeros(k)}]
    a = RULES[rule](clients, w, previous, kinds)
    b = RULES[rule](single, np.array([1.0]), previous, kinds)
    for name in a:
        np.testing.assert_array_equal(a[name], b[name])


@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("n_clients", [2, 3, 6])
def test_masked_clients_same_result(rule, shape, n_clients):
    """Secure-aggregation masks ``θ_i + M_i`` with ``Σ w_i M_i = 0`` (the masked arrays are
    far from the manifold) leave the result unchanged up to rounding."""
    p, k = shape
    previous, clients, w = _clients(p, k, n_clients, 0.3, seed=31)
    rng = np.random.default_rng(7)
    kinds = _kinds()
    masked = []
    masks = {name: [rng.standard_normal(previous[name].shape) for _ in range(n_clients - 1)] for name in previous}
    for name in previous:
        masks[name].append(-sum(wi * m for wi, m in zip(w[:-1], masks[name])) / w[-1])
    for i, c in enumerate(clients):
        masked.append({**{name: c[name] + masks[name][i] for name in previous}, "bn.running_mean": c["bn.running_mean"]})
    a = RULES[rule](clients, w, previous, kinds)
    b = RULES[rule](masked, w, previous, kinds)
    for name in a:
        np.testing.assert_allclose(b[name], a[name], rtol=0, atol=1e-10)


@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("shape", SHAPES)
def test_different_client_counts_same_sum(rule, shape):
    """Two clients at ``S ± D`` with weights ½, ½ versus the original clients."""
    p, k = shape
    previous, clients, w = _clients(p, k, 5, 0.2, seed=41)
    kinds = _kinds()
    summed = weighted_sum(clients, w, kinds)
    rng = np.random.default_rng(3)
    D = {name: rng.standard_normal(v.shape) for name, v in summed.items()}
    pair = [{name: summed[name] + D[name] for name in summed}, {name: summed[name] - D[name] for name in summed}]
    pair = [{**c, "bn.running_mean": np.zeros(k)} for c in pair]
    a = RULES[rule](clients, w, previous, kinds)
    b = RULES[rule](pair, np.array([0.5, 0.5]), previous, kinds)
    for name in a:
        np.testing.assert_allclose(b[name], a[name], rtol=0, atol=1e-12)


@pytest.mark.parametrize("rule", RULES)
def test_rlavg_formula(rule):
    """RLAvg is ``R_W(Σ w_i L_W(W_i))``, ProjAvg is ``uf(Σ w_i W_i)``."""
    previous, clients, w = _clients(7, 3, 4, 0.4, seed=2)
    W = previous[STIEFEL]
    out = RULES[rule](clients, w, previous, _kinds())[STIEFEL]
    if rule == "rlavg":
        expected = retract(W, sum(wi * lift(W, c[STIEFEL]) for wi, c in zip(w, clients)))
    else:
        U, _, Vh = np.linalg.svd(sum(wi * c[STIEFEL] for wi, c in zip(w, clients)), full_matrices=False)
        expected = U @ Vh
    np.testing.assert_allclose(out, expected, rtol=0, atol=1e-13)


# ---------------------------------------------------------------------------------------------
# Euclidean and local arrays
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("rule", ALL_RULES)
@pytest.mark.parametrize("n_clients", N_CLIENTS)
@pytest.mark.parametrize("shape", [(), (4,), (3, 6), (2, 3, 4)])
def test_euclidean_weighted_mean(rule, n_clients, shape):
    previous, clients, w = _clients(5, 2, n_clients, 0.1, seed=n_clients)
    rng = np.random.default_rng(1)
    kinds = {STIEFEL: "stiefel", "extra": "euclidean"}
    for c in clients:
        c["extra"] = rng.standard_normal(shape)
    previous["extra"] = np.zeros(shape)
    out = ALL_RULES[rule](clients, w, previous, kinds)
    expected = np.einsum("i,i...->...", w, np.stack([c["extra"] for c in clients]))
    np.testing.assert_allclose(out["extra"], expected, rtol=1e-13, atol=1e-14)
    assert set(out) == {STIEFEL, "extra"}


@pytest.mark.parametrize("rule", ALL_RULES)
def test_integer_euclidean_arrays_become_float(rule):
    previous, clients, w = _clients(5, 2, 2, 0.1, seed=0)
    kinds = {STIEFEL: "stiefel", "count": "euclidean"}
    clients[0]["count"], clients[1]["count"] = np.array([1, 2]), np.array([3, 4])
    out = ALL_RULES[rule](clients, np.array([0.5, 0.5]), previous, kinds)
    np.testing.assert_array_equal(out["count"], [2.0, 3.0])
    assert out["count"].dtype == np.float64


@pytest.mark.parametrize("rule", ALL_RULES)
@pytest.mark.parametrize("in_previous", [True, False])
def test_local_names_excluded(rule, in_previous):
    previous, clients, w = _clients(6, 3, 3, 0.1, seed=0)
    kinds = _kinds()
    kinds["bn.running_var"] = "local"
    for c in clients:
        c["bn.running_var"] = np.ones(3)
    if in_previous:
        previous["bn.running_mean"] = np.zeros(3)
    out = ALL_RULES[rule](clients, w, previous, kinds)
    assert "bn.running_mean" not in out and "bn.running_var" not in out
    assert set(out) == {n for n, kind in kinds.items() if kind != "local"}
    assert set(weighted_sum(clients, w, kinds)) == set(out)


@pytest.mark.parametrize("rule", ALL_RULES)
def test_local_names_may_be_missing_from_clients(rule):
    """Local arrays are never read: clients need not send them."""
    previous, clients, w = _clients(6, 3, 3, 0.1, seed=0, with_local=False)
    out = ALL_RULES[rule](clients, w, previous, _kinds(with_local=True))
    assert "bn.running_mean" not in out


@pytest.mark.parametrize("rule", ALL_RULES)
def test_several_stiefel_weights(rule):
    """Each Stiefel weight is aggregated independently of the others."""
    rng = np.random.default_rng(0)
    shapes = {"bimaps.0.weight": (8, 5), "bimaps.1.weight": (5, 3)}
    kinds = {name: "stiefel" for name in shapes}
    prev = {name: random_stiefel(*s, rng) for name, s in shapes.items()}
    clients = [{name: retract(prev[name], 0.1 * tangent_project(prev[name], rng.standard_normal(s)))
                for name, s in shapes.items()} for _ in range(3)]
    w = _random_weights(3, rng)
    out = ALL_RULES[rule](clients, w, prev, kinds)
    for name in shapes:
        single = ALL_RULES[rule]([{name: c[name]} for c in clients], w, {name: prev[name]}, {name: "stiefel"})
        np.testing.assert_allclose(out[name], single[name], rtol=0, atol=1e-14)
        assert orthonormality_error(out[name]) <= 1e-12


# ---------------------------------------------------------------------------------------------
# client_weights, weighted_sum, get_aggregation
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("n_samples", [[10], [10, 20, 30], [1, 1], [0, 5, 5], [3.5, 1.5]])
def test_client_weights_n_samples(n_samples):
    w = client_weights(n_samples, "n_samples")
    np.testing.assert_allclose(w, np.asarray(n_samples, float) / np.sum(n_samples), rtol=1e-15)
    assert w.dtype == np.float64
    np.testing.assert_allclose(w.sum(), 1.0, rtol=1e-15)


@pytest.mark.parametrize("n_samples", [[10], [10, 20, 30], [0, 5, 5]])
def test_client_weights_uniform(n_samples):
    w = client_weights(n_samples, "uniform")
    np.testing.assert_array_equal(w, np.full(len(n_samples), 1.0 / len(n_samples)))


def test_client_weights_default_is_n_samples():
    np.testing.assert_allclose(client_weights([1, 3]), [0.25, 0.75])


@pytest.mark.parametrize("weighting", ["samples", "Uniform", None, "mean"])
def test_client_weights_bad_weighting(weighting):
    with pytest.raises(ValueError, match="weighting"):
        client_weights([1, 2], weighting)


@pytest.mark.parametrize("n_samples", [[], [0, 0], [-1, 2], [[1, 2]]])
@pytest.mark.parametrize("weighting", ["n_samples", "uniform"])
def test_client_weights_bad_counts(n_samples, weighting):
    if weighting == "uniform" and n_samples == [0, 0]:
        np.testing.assert_array_equal(client_weights(n_samples, weighting), [0.5, 0.5])
        return
    with pytest.raises(ValueError, match="non-negative"):
        client_weights(n_samples, weighting)


@pytest.mark.parametrize("n_clients, n_weights", [(3, 2), (2, 3), (1, 0), (0, 1)])
def test_weighted_sum_length_mismatch(n_clients, n_weights):
    previous, clients, _ = _clients(5, 2, max(n_clients, 1), 0.1, seed=0)
    with pytest.raises(ValueError, match="weights"):
        weighted_sum(clients[:n_clients], np.full(n_weights, 1.0), _kinds())


@pytest.mark.parametrize("rule", ALL_RULES)
def test_rules_reject_length_mismatch(rule):
    previous, clients, _ = _clients(5, 2, 3, 0.1, seed=0)
    with pytest.raises(ValueError, match="weights"):
        ALL_RULES[rule](clients, np.array([0.5, 0.5]), previous, _kinds())


def test_weighted_sum_values():
    previous, clients, w = _clients(5, 2, 3, 0.1, seed=0)
    summed = weighted_sum(clients, w, _kinds())
    assert list(summed) == [STIEFEL, "head.weight", "head.bias"]
    for name in summed:
        np.testing.assert_allclose(summed[name], sum(wi * c[name] for wi, c in zip(w, clients)), rtol=1e-15)


@pytest.mark.parametrize("name", ["projavg", "rlavg", "karcher"])
def test_get_aggregation_names(name):
    assert get_aggregation(name) is AGGREGATIONS[name]
    assert get_aggregation(name) is {"projavg": projavg, "rlavg": rlavg, "karcher": karcher}[name]


def test_aggregations_registry():
    assert sorted(AGGREGATIONS) == ["geomedian", "karcher", "krum", "projavg", "rlavg", "trimmedmean"]


@pytest.mark.parametrize("name, cls", [("geomedian", GeometricMedian), ("trimmedmean", TrimmedMean), ("krum", Krum)])
def test_get_aggregation_robust_names_give_fresh_default_instances(name, cls):
    """A robust rule by name is a new default instance: setting its parameters cannot
    change the registry's."""
    rule = get_aggregation(name)
    assert type(rule) is cls and rule.get_params() == cls().get_params()
    assert rule is not AGGREGATIONS[name] and rule is not get_aggregation(name)


def _my_rule(client_params, weights, previous, kinds):
    return dict(previous)


@pytest.mark.parametrize("rule", [_my_rule, lambda c, w, p, k: p, projavg, np.mean])
def test_get_aggregation_callable(rule):
    assert get_aggregation(rule) is rule


@pytest.mark.parametrize("name", ["fedavg", "ProjAvg", "r_barycenter", "", None, 3])
def test_get_aggregation_unknown(name):
    with pytest.raises(ValueError, match="aggregation"):
        get_aggregation(name)


# ---------------------------------------------------------------------------------------------
# The R-barycenter (RLAvg iterated at its own output) is ProjAvg
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("n_clients", N_CLIENTS)
@pytest.mark.parametrize("spread", [0.05, 0.5, None])
def test_r_barycenter_fixed_point_is_projavg(shape, n_clients, spread):
    """At ``W = uf(S)``, ``Σ w_i L_W(W_i) = P_W(S) = S − W sym(WᵀS) = 0``: RLAvg iterated at
    its own output from ProjAvg does not move (so it is no independent reference)."""
    p, k = shape
    previous, clients, w = _clients(p, k, n_clients, spread, seed=p + n_clients)
    summed = weighted_sum(clients, w, _kinds())[STIEFEL]
    W_proj = projavg(clients, w, previous, _kinds())[STIEFEL]
    balance = sum(wi * lift(W_proj, c[STIEFEL]) for wi, c in zip(w, clients))
    assert np.linalg.norm(balance) <= 1e-13
    np.testing.assert_allclose(tangent_project(W_proj, summed), 0.0, rtol=0, atol=1e-13)
    W = W_proj
    for _ in range(5):
        W = rlavg(clients, w, {**previous, STIEFEL: W}, _kinds())[STIEFEL]
        np.testing.assert_allclose(W, W_proj, rtol=0, atol=1e-13)


# ---------------------------------------------------------------------------------------------
# Karcher mean (canonical metric)
# ---------------------------------------------------------------------------------------------


def _karcher_gradient(K, clients, w):
    return sum(wi * stiefel_log(K, c[STIEFEL]) for wi, c in zip(w, clients))


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("n_clients", N_CLIENTS)
@pytest.mark.parametrize("spread", [0.05, 0.5])
def test_karcher_first_order_optimality(shape, n_clients, spread):
    """``Σ w_i Log_K(W_i) ≈ 0`` at the Karcher mean ``K``, which is on the manifold."""
    p, k = shape
    previous, clients, w = _clients(p, k, n_clients, spread, seed=p + n_clients)
    K = karcher(clients, w, previous, _kinds())[STIEFEL]
    assert np.linalg.norm(_karcher_gradient(K, clients, w)) <= 1e-11
    assert orthonormality_error(K) <= 1e-12


@pytest.mark.parametrize("shape", [(4, 2), (6, 3), (8, 4)])
def test_karcher_minimises_weighted_squared_distance(shape):
    """The weighted sum of squared canonical distances is smallest at ``K``: moving along
    any geodesic from ``K`` increases it (to second order)."""
    p, k = shape
    previous, clients, w = _clients(p, k, 4, 0.4, seed=k)
    K = karcher(clients, w, previous, _kinds())[STIEFEL]

    def cost(X):
        total = 0.0
        for wi, c in zip(w, clients):
            D = stiefel_log(X, c[STIEFEL])
            total += wi * (np.sum(D * D) - 0.5 * np.sum((X.T @ D) ** 2))  # canonical ‖D‖²
        return total

    rng = np.random.default_rng(0)
    f0 = cost(K)
    for _ in range(5):
        Z = tangent_project(K, rng.standard_normal((p, k)))
        Z *= 1e-3 / np.linalg.norm(Z)
        assert cost(stiefel_exp(K, Z)) > f0
        assert cost(stiefel_exp(K, -Z)) > f0


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("spread", [0.1, 0.6])
def test_karcher_equivariance_and_invariance(shape, spread):
    """The canonical metric is invariant under ``W ↦ Q W R`` (``Q ∈ O(p)``, ``R ∈ O(k)``),
    so the Karcher mean of ``Q W_i R`` is ``Q K R`` — also with an improper ``Q`` or ``R``."""
    p, k = shape
    previous, clients, w = _clients(p, k, 4, spread, seed=3 * k)
    rng = np.random.default_rng(5)
    Q, R = _orthogonal(p, rng), _orthogonal(k, rng)
    Q[:, 0] *= -1  # det Q = −det Q: reflections too
    moved = [{**c, STIEFEL: Q @ c[STIEFEL] @ R} for c in clients]
    K = karcher(clients, w, previous, _kinds())[STIEFEL]
    K_moved = karcher(moved, w, previous, _kinds())[STIEFEL]
    np.testing.assert_allclose(K_moved, Q @ K @ R, rtol=0, atol=1e-10)


@pytest.mark.parametrize("shape", SHAPES)
def test_karcher_close_to_projavg_and_rlavg(shape):
    """For clients within δ of each other, the Karcher mean, ProjAvg and RLAvg agree to
    ``O(δ²)``: gap ≤ δ² and a log-log slope ≥ 1.8 (it is 3 for ``k = 1`` and ``k = p``, the
    sphere and the orthogonal group, where the canonical metric is the embedded one)."""
    p, k = shape
    gaps = {"projavg": [], "rlavg": []}
    for delta in DELTAS:
        previous, clients, w = _clients(p, k, 4, delta, seed=k)
        K = karcher(clients, w, previous, _kinds())[STIEFEL]
        for rule in (projavg, rlavg):
            gap = np.linalg.norm(rule(clients, w, previous, _kinds())[STIEFEL] - K)
            assert gap <= delta**2, (rule.__name__, delta, gap)
            gaps[rule.__name__].append(gap)
    for name, g in gaps.items():
        assert np.all(_slopes(g) >= 1.8), (name, g)


@pytest.mark.parametrize("shape", SHAPES)
def test_karcher_ignores_previous(shape):
    p, k = shape
    previous, clients, w = _clients(p, k, 3, 0.2, seed=0)
    other = {**previous, STIEFEL: random_stiefel(p, k, 5)}
    a = karcher(clients, w, previous, _kinds())
    b = karcher(clients, w, other, _kinds())
    for name in a:
        np.testing.assert_array_equal(a[name], b[name])


def test_karcher_starts_from_projavg_and_returns_iterations():
    previous, clients, w = _clients(8, 4, 5, 0.3, seed=1)
    out, iterations = karcher(clients, w, previous, _kinds(), return_iterations=True)
    assert set(iterations) == {STIEFEL}
    assert 1 <= iterations[STIEFEL] <= 20
    np.testing.assert_array_equal(out["head.weight"], projavg(clients, w, previous, _kinds())["head.weight"])
    start = karcher(clients, w, previous, _kinds(), tol=np.inf)[STIEFEL]
    np.testing.assert_array_equal(start, polar(weighted_sum(clients, w, _kinds())[STIEFEL]))


def test_karcher_zero_weight_client_ignored():
    """A client with weight 0 does not enter (not even its logarithm)."""
    previous, clients, w = _clients(6, 3, 3, 0.2, seed=2)
    w = np.array([0.4, 0.6, 0.0])
    far = [*clients[:2], {**clients[2], STIEFEL: -clients[0][STIEFEL]}]
    a = karcher(clients, w, previous, _kinds())
    b = karcher(far, w, previous, _kinds())
    for name in a:
        np.testing.assert_allclose(b[name], a[name], rtol=0, atol=1e-14)


def test_karcher_not_converging_raises():
    previous, clients, w = _clients(6, 3, 4, 0.3, seed=0)
    with pytest.raises(RuntimeError, match="did not converge in 1 iterations"):
        karcher(clients, w, previous, _kinds(), tol=0.0, max_iter=1)


def test_karcher_client_too_far_raises():
    """A client at ``−W`` (a rotation by π away) has no Stiefel logarithm from near ``W``."""
    previous, clients, w = _clients(6, 3, 3, 0.05, seed=0)
    clients[2] = {**clients[2], STIEFEL: -clients[0][STIEFEL]}
    w = np.array([0.45, 0.45, 0.1])
    with pytest.raises(RuntimeError, match="client 2 is too far"):
        karcher(clients, w, previous, _kinds())


# ---------------------------------------------------------------------------------------------
# Robust rules: geometric median, trimmed mean, multi-Krum
# ---------------------------------------------------------------------------------------------


def _outlier(previous, seed, scale=1e3):
    """A client far from the others: a Haar Stiefel point and Euclidean arrays ``scale`` away."""
    rng = np.random.default_rng(seed)
    p, k = previous[STIEFEL].shape
    return {STIEFEL: random_stiefel(p, k, rng), "head.weight": previous["head.weight"] + scale,
            "head.bias": previous["head.bias"] - scale, "bn.running_mean": np.zeros(k)}


@pytest.mark.parametrize("rule", ROBUST)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("spread", [0.05, 0.5, None])
def test_robust_output_is_orthonormal_float64_and_deterministic(rule, shape, spread):
    p, k = shape
    previous, clients, w = _clients(p, k, 5, spread, seed=k)
    out = ROBUST[rule](clients, w, previous, _kinds())
    assert list(out) == [STIEFEL, "head.weight", "head.bias"]
    assert all(value.dtype == np.float64 and value.shape == previous[name].shape for name, value in out.items())
    assert orthonormality_error(out[STIEFEL]) <= 1e-12
    again = ROBUST[rule](clients, w, previous, _kinds())
    for name in out:
        np.testing.assert_array_equal(again[name], out[name])


@pytest.mark.parametrize("rule", ROBUST)
def test_robust_effective_weights_sum_to_one(rule):
    previous, clients, w = _clients(6, 3, 5, 0.2, seed=0)
    _, effective = ROBUST[rule].aggregate(clients, w, previous, _kinds())
    assert effective.shape == (5,) and (effective >= 0).all() and effective.sum() == pytest.approx(1, abs=1e-12)


@pytest.mark.parametrize("rule", ROBUST)
@pytest.mark.parametrize("shape", SHAPES)
def test_robust_all_clients_equal_previous_unchanged(rule, shape):
    p, k = shape
    previous, _, w = _clients(p, k, 5, 0.1, seed=k)
    clients = [{**{n: a.copy() for n, a in previous.items()}, "bn.running_mean": np.ones(k)} for _ in range(5)]
    out = ROBUST[rule](clients, w, previous, _kinds())
    for name, value in previous.items():
        np.testing.assert_allclose(out[name], value, rtol=0, atol=1e-12)


@pytest.mark.parametrize("rule", ROBUST)
def test_robust_one_far_client_is_left_out_while_projavg_moves(rule):
    """Six clients near the broadcast and one far away: the robust rule stays with the six
    (near their own aggregate, the far client's share ≈ 0), ProjAvg moves far."""
    previous, inliers, _ = _clients(8, 4, 6, 0.05, seed=1)
    clients = inliers[:3] + [_outlier(previous, seed=2)] + inliers[3:]
    w = np.full(7, 1 / 7)
    out, effective = ROBUST[rule].aggregate(clients, w, previous, _kinds())
    honest = ROBUST[rule](inliers, np.full(6, 1 / 6), previous, _kinds())
    moved = client_distances([out], honest, _kinds())[0]
    spread = client_distances(inliers, honest, _kinds()).max()
    projavg_moved = client_distances([projavg(clients, w, previous, _kinds())], projavg(inliers, w[:6] * 7 / 6,
                                                                                         previous, _kinds()), _kinds())[0]
    assert moved < spread and projavg_moved > 100 * spread
    assert effective[3] < 1e-3


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("n_clients", [1, 2, 5])
def test_geomedian_of_identical_clients_is_that_client(shape, n_clients):
    p, k = shape
    previous, (client,), _ = _clients(p, k, 1, 0.7, seed=k + 7)
    w = _random_weights(n_clients, np.random.default_rng(0))
    out, effective = GeometricMedian().aggregate([client] * n_clients, w, previous, _kinds())
    for name in out:
        np.testing.assert_allclose(out[name], client[name], rtol=0, atol=1e-12)
    np.testing.assert_allclose(effective, w, rtol=1e-12)


@pytest.mark.parametrize("n_outliers", [1, 2, 3])
def test_geomedian_breakdown_outliers_arbitrarily_far(n_outliers):
    """``f < n/2`` clients arbitrarily far cannot drag the median away: it stays within a
    bounded distance of the inliers, the same for outliers at 1e2, 1e4 or 1e6."""
    rng = np.random.default_rng(n_outliers)
    inliers = rng.uniform(-1, 1, (7, 3))
    direction = rng.standard_normal(3)
    direction /= np.linalg.norm(direction)
    medians = []
    for distance in (1e2, 1e4, 1e6):
        points = np.vstack([inliers, np.tile(distance * direction, (n_outliers, 1))])
        clients = [{"b": x} for x in points]
        medians.append(GeometricMedian(tol=1e-12, max_iter=1000)(clients, np.full(len(points), 1 / len(points)),
                                                                None, {"b": "euclidean"})["b"])
    radius = np.linalg.norm(inliers, axis=1).max()
    assert all(np.linalg.norm(m) < 3 * radius for m in medians)
    np.testing.assert_allclose(medians[2], medians[1], rtol=0, atol=1e-3)


@pytest.mark.parametrize("seed", range(4))
def test_geomedian_euclidean_matches_scipy_minimiser(seed):
    """Euclidean arrays: the weighted geometric median, checked against scipy's minimiser of
    ``Σ w_i ‖x − x_i‖`` (ours is at least as good, and the same point)."""
    rng = np.random.default_rng(seed)
    points = rng.standard_normal((6, 4)) * [1, 2, 3, 4]
    w = _random_weights(6, rng)

    def objective(x):
        return float(w @ np.linalg.norm(points - x, axis=1))

    oracle = minimize(objective, points.mean(axis=0), method="Nelder-Mead",
                      options=dict(xatol=1e-10, fatol=1e-13, maxiter=20000)).x
    median = GeometricMedian(tol=1e-12, max_iter=2000)([{"b": x} for x in points], w, None, {"b": "euclidean"})["b"]
    assert objective(median) <= objective(oracle) + 1e-10
    np.testing.assert_allclose(median, oracle, rtol=0, atol=1e-5)


def test_geomedian_weights_equal_replicated_clients():
    """Integer weights are replicated clients."""
    previous, clients, _ = _clients(6, 3, 4, 0.3, seed=5)
    counts = [2, 1, 1, 3]
    rule = GeometricMedian(tol=1e-12, max_iter=1000)
    weighted = rule(clients, np.array(counts) / 7, previous, _kinds())
    replicated = rule([c for c, n in zip(clients, counts) for _ in range(n)], np.full(7, 1 / 7), previous, _kinds())
    for name in weighted:
        np.testing.assert_allclose(weighted[name], replicated[name], rtol=0, atol=1e-8)


@pytest.mark.parametrize("shape", SHAPES)
def test_geomedian_stiefel_first_order_optimality_and_minimality(shape):
    """On the manifold: the Riemannian gradient of ``Σ w_i ‖W − W_i‖_F`` vanishes at the
    median, and the objective is lower there than at ProjAvg or at nearby points."""
    p, k = shape
    previous, clients, w = _clients(p, k, 5, 0.4, seed=p)
    kinds = {STIEFEL: "stiefel"}
    clients = [{STIEFEL: c[STIEFEL]} for c in clients]
    median = GeometricMedian(tol=1e-12, max_iter=2000)(clients, w, previous, kinds)

    def objective(W):
        return float(w @ client_distances(clients, {STIEFEL: W}, kinds))

    W = median[STIEFEL]
    gradient = tangent_project(W, sum(wi * (W - c[STIEFEL]) / np.linalg.norm(W - c[STIEFEL])
                                      for wi, c in zip(w, clients)))
    assert np.linalg.norm(gradient) <= 1e-8
    assert objective(W) <= objective(projavg(clients, w, previous, kinds)[STIEFEL]) + 1e-14
    rng = np.random.default_rng(0)
    for _ in range(5):
        assert objective(W) <= objective(retract(W, 1e-3 * tangent_project(W, rng.standard_normal(W.shape))))


@pytest.mark.parametrize("rule", ["geomedian", "krum"])
@pytest.mark.parametrize("shape", SHAPES)
def test_geomedian_and_krum_equivariance(rule, shape):
    """Their distances are invariant and their steps equivariant under ``W ↦ Q W R``."""
    p, k = shape
    previous, clients, w = _clients(p, k, 5, 0.3, seed=3 * k)
    rng = np.random.default_rng(7)
    Q, R = _orthogonal(p, rng), _orthogonal(k, rng)
    moved = [{**c, STIEFEL: Q @ c[STIEFEL] @ R} for c in clients]
    out = ROBUST[rule](clients, w, previous, _kinds())
    out_moved = ROBUST[rule](moved, w, {**previous, STIEFEL: Q @ previous[STIEFEL] @ R}, _kinds())
    np.testing.assert_allclose(out_moved[STIEFEL], Q @ out[STIEFEL] @ R, rtol=0, atol=1e-8)
    np.testing.assert_allclose(out_moved["head.bias"], out["head.bias"], rtol=0, atol=1e-8)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("n_clients", [1, 3, 6])
def test_trimmedmean_trim_zero_is_rlavg(shape, n_clients):
    p, k = shape
    previous, clients, w = _clients(p, k, n_clients, 0.4, seed=k)
    out = TrimmedMean(trim=0)(clients, w, previous, _kinds())
    expected = rlavg(clients, w, previous, _kinds())
    for name in out:
        np.testing.assert_allclose(out[name], expected[name], rtol=0, atol=1e-13)


@pytest.mark.parametrize("trim", [0.1, 0.2, 0.3, 0.45])
@pytest.mark.parametrize("n_clients", [5, 8, 11])
def test_trimmedmean_equal_weights_is_scipy_trim_mean(trim, n_clients):
    """Equal weights, Euclidean arrays: scipy's trimmed mean, coordinate by coordinate."""
    rng = np.random.default_rng(n_clients)
    values = rng.standard_normal((n_clients, 3, 4)) * rng.uniform(0.1, 100, (n_clients, 1, 1))
    out = TrimmedMean(trim=trim)([{"a": v} for v in values], np.full(n_clients, 1 / n_clients), None,
                                 {"a": "euclidean"})
    np.testing.assert_allclose(out["a"], trim_mean(values, trim, axis=0), rtol=1e-13, atol=1e-13)


def test_trimmedmean_weighted_matches_coordinate_loop():
    """Weighted: count-based trimming, then the kept clients' weights renormalised."""
    rng = np.random.default_rng(0)
    values, w = rng.standard_normal((7, 5)), _random_weights(7, rng)
    out, effective = TrimmedMean(trim=0.3).aggregate([{"a": v} for v in values], w, None, {"a": "euclidean"})
    shares = np.zeros(7)
    for j in range(5):
        kept = np.argsort(values[:, j])[2:5]
        np.testing.assert_allclose(out["a"][j], w[kept] @ values[kept, j] / w[kept].sum(), rtol=1e-14)
        shares[kept] += w[kept] / w[kept].sum() / 5
    np.testing.assert_allclose(effective, shares, rtol=1e-14)


def test_trimmedmean_trims_the_extreme_coordinates():
    """A client highest in some coordinates and lowest in others is trimmed in each."""
    values = np.array([[0.0, 1.0], [1.0, 2.0], [2.0, 3.0], [100.0, -100.0]])
    out, effective = TrimmedMean(trim=0.25).aggregate([{"a": v} for v in values], np.full(4, 0.25), None,
                                                      {"a": "euclidean"})
    np.testing.assert_array_equal(out["a"], [1.5, 1.5])
    assert effective[3] == 0


@pytest.mark.parametrize("shape", SHAPES)
def test_trimmedmean_invariances(shape):
    """The clients' order does not matter; Stiefel arrays are equivariant under signed
    permutations ``W ↦ Q W R`` (coordinate-wise trimming commutes with them); Euclidean
    arrays under ``θ ↦ aθ + b``, ``a > 0``."""
    p, k = shape
    previous, clients, w = _clients(p, k, 6, 0.3, seed=k)
    rule = TrimmedMean(trim=0.2)
    out = rule(clients, w, previous, _kinds())
    order = [3, 0, 5, 1, 4, 2]
    shuffled = rule([clients[i] for i in order], w[order], previous, _kinds())
    for name in out:
        np.testing.assert_allclose(shuffled[name], out[name], rtol=0, atol=1e-13)
    rng = np.random.default_rng(1)
    Q = np.eye(p)[rng.permutation(p)] * rng.choice([-1, 1], p)
    R = np.eye(k)[rng.permutation(k)] * rng.choice([-1, 1], k)
    moved = [{**c, STIEFEL: Q @ c[STIEFEL] @ R, "head.bias": 3 * c["head.bias"] + 2} for c in clients]
    out_moved = rule(moved, w, {**previous, STIEFEL: Q @ previous[STIEFEL] @ R}, _kinds())
    np.testing.assert_allclose(out_moved[STIEFEL], Q @ out[STIEFEL] @ R, rtol=0, atol=1e-12)
    np.testing.assert_allclose(out_moved["head.bias"], 3 * out["head.bias"] + 2, rtol=1e-13, atol=1e-13)


def test_krum_selects_the_clients_nearest_the_others():
    """Multi-Krum drops the two far clients; Krum (``n_selected=1``) keeps the most central
    one, exactly (in the tangent space at the broadcast)."""
    points = np.array([0.0, 0.1, -0.1, 0.05, 0.2, 50.0, -80.0])
    clients = [{"b": np.array([x])} for x in points]
    kinds, w = {"b": "euclidean"}, np.full(7, 1 / 7)
    out, effective = Krum(n_faulty=2).aggregate(clients, w, {"b": np.zeros(1)}, kinds)
    np.testing.assert_allclose(effective, [0.2] * 5 + [0, 0])
    np.testing.assert_allclose(out["b"], points[:5].mean(), rtol=1e-14)
    single, effective = Krum(n_faulty=2, n_selected=1).aggregate(clients, w, {"b": np.zeros(1)}, kinds)
    # scores (3 nearest): 0.0 → 0.0025 + 0.01 + 0.01, 0.05 → 0.0025 + 0.0025 + 0.0225, ...
    assert effective.tolist() == [1, 0, 0, 0, 0, 0, 0] and single["b"].tolist() == [0.0]


@pytest.mark.parametrize("rule", ROBUST)
@pytest.mark.parametrize("weights, match", [
    (np.zeros(5), "positive sum"), (np.array([1, 1, 1, -1, 1.0]), "non-negative"),
    (np.array([1, 1, np.nan, 1, 1.0]), "finite"), (np.full(4, 0.25), "weights of shape"),
])
def test_robust_rules_reject_bad_weights(rule, weights, match):
    previous, clients, _ = _clients(5, 2, 5, 0.1, seed=0)
    with pytest.raises(ValueError, match=match):
        ROBUST[rule](clients, weights, previous, _kinds())


@pytest.mark.parametrize("rule", ["trimmedmean", "krum"])
def test_tangent_rules_need_previous(rule):
    _, clients, w = _clients(5, 2, 5, 0.1, seed=0)
    with pytest.raises(ValueError, match="previous must be given"):
        ROBUST[rule](clients, w, None, _kinds())


@pytest.mark.parametrize("rule, n_clients, match", [
    (TrimmedMean(trim=0.6), 8, "'trim' parameter of TrimmedMean"),
    (TrimmedMean(trim=-0.1), 8, "'trim' parameter of TrimmedMean"),
    (TrimmedMean(trim=0.1), 8, r"trims no client of 8 per round \(⌊trim · 8⌋ = 0\)"),
    (Krum(n_faulty=2), 6, r"Krum\(n_faulty=2\) needs more than 2·n_faulty \+ 2 = 6 clients per round, got 6"),
    (Krum(n_faulty=1, n_selected=5), 5, "may select at most n − n_faulty = 4 of 5"),
    (Krum(n_faulty=-1), 5, "'n_faulty' parameter of Krum"),
    (GeometricMedian(tol=0), 5, "'tol' parameter of GeometricMedian"),
    (GeometricMedian(max_iter=0), 5, "'max_iter' parameter of GeometricMedian"),
])
def test_robust_rule_settings_refused(rule, n_clients, match):
    with pytest.raises(ValueError, match=match):
        rule.check_n_clients(n_clients)


def test_krum_with_too_few_replies_raises_in_the_round():
    previous, clients, w = _clients(5, 2, 4, 0.1, seed=0)
    with pytest.raises(ValueError, match="needs more than 2·n_faulty"):
        Krum(n_faulty=1)(clients, w, previous, _kinds())


def test_trimmedmean_trimming_nobody_in_a_smaller_round_is_the_mean():
    """A round with fewer replies than planned may trim none: the weighted mean, no error."""
    previous, clients, w = _clients(5, 2, 4, 0.1, seed=0)
    out = TrimmedMean(trim=0.2)(clients, w, previous, _kinds())
    np.testing.assert_allclose(out["head.bias"], sum(wi * c["head.bias"] for wi, c in zip(w, clients)), rtol=1e-13)


def test_robust_rules_are_cloneable_estimators():
    for rule in ROBUST.values():
        assert isinstance(rule, RobustAggregation) and callable(rule)
        copy = clone(rule)
        assert copy is not rule and copy.get_params() == rule.get_params()


def test_client_distances_is_the_frobenius_distance_over_non_local_arrays():
    previous, clients, _ = _clients(6, 3, 3, 0.3, seed=0)
    expected = [np.sqrt(sum(np.sum((c[n] - previous[n]) ** 2) for n in (STIEFEL, "head.weight", "head.bias")))
                for c in clients]
    np.testing.assert_allclose(client_distances(clients, previous, _kinds()), expected, rtol=1e-14)


@pytest.mark.parametrize("name", ["karcher", "geomedian", "trimmedmean", "krum", "skfedspd.aggregation.TrimmedMean()"])
def test_check_secure_rule_refuses_rules_of_individual_updates(name):
    with pytest.raises(ValueError, match="needs each client's update"):
        check_secure_rule(name)
    check_secure_rule("projavg")


# ---------------------------------------------------------------------------------------------
# FLTrust: trust by agreement with the server's reference update
# ---------------------------------------------------------------------------------------------

ROOT = (np.stack([np.eye(3)] * 4), [0, 1, 0, 1])
EUCLIDEAN = {"head.weight": "euclidean", "head.bias": "euclidean", "bn.running_mean": "local"}


def _euclidean(previous, step):
    return {"head.weight": previous["head.weight"] + step[:-3].reshape(previous["head.weight"].shape),
            "head.bias": previous["head.bias"] + step[-3:], "bn.running_mean": np.zeros(2)}


@pytest.mark.parametrize("sizes", [(1.0, 1.0, 1.0), (0.1, 1.0, 100.0), (1e-3, 5.0, 1e4)])
@pytest.mark.parametrize("seed", [0, 1])
def test_fltrust_takes_the_reference_step_when_clients_agree_whatever_their_size(sizes, seed):
    """Clients along the reference's direction, of any size, and one against it: the step is
    the reference's (direction and length), the opposing client has no weight."""
    rng = np.random.default_rng(seed)
    previous = {"head.weight": rng.standard_normal((3, 3)), "head.bias": rng.standard_normal(3)}
    direction = rng.standard_normal(12)
    reference = _euclidean(previous, 0.3 * direction)
    clients = [_euclidean(previous, s * direction) for s in sizes] + [_euclidean(previous, -2.0 * direction)]
    weights = _random_weights(4, rng)
    out, effective = FLTrust(*ROOT).aggregate(clients, weights, previous, EUCLIDEAN, reference=reference)
    for name in previous:
        np.testing.assert_allclose(out[name], reference[name], rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(effective, np.append(weights[:3] / weights[:3].sum(), 0.0), rtol=1e-12)


@pytest.mark.parametrize("shape", SHAPES)
def test_fltrust_clients_at_the_reference_give_its_retracted_step(shape):
    p, k = shape
    previous, clients, w = _clients(p, k, 1, 0.1, seed=k)
    reference = clients[0]
    out, effective = FLTrust(*ROOT).aggregate(clients * 3, np.full(3, 1 / 3), previous, _kinds(),
                                              reference=reference)
    W = previous[STIEFEL]
    np.testing.assert_allclose(out[STIEFEL], retract(W, lift(W, reference[STIEFEL])), atol=1e-12)
    assert orthonormality_error(out[STIEFEL]) <= 1e-12
    np.testing.assert_allclose(out["head.bias"], reference["head.bias"], atol=1e-12)
    np.testing.assert_allclose(effective, np.full(3, 1 / 3))


@pytest.mark.parametrize("shape", SHAPES[:4])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_fltrust_agreement_is_the_cosine_of_the_tangent_updates(shape, seed):
    p, k = shape
    previous, clients, w = _clients(p, k, 4, 0.2, seed=seed)
    reference = clients.pop()
    rule = FLTrust(*ROOT)
    updates = tangent_updates(clients, previous, _kinds())
    ref = tangent_updates([reference], previous, _kinds())[0]
    W = previous[STIEFEL]
    np.testing.assert_allclose(updates[0, :p * k].reshape(p, k), lift(W, clients[0][STIEFEL]), atol=1e-14)
    expected = updates @ ref / np.linalg.norm(updates, axis=1) / np.linalg.norm(ref)
    agreement = rule.agreement(clients, reference, previous, _kinds())
    np.testing.assert_allclose(agreement, expected, rtol=1e-12)
    out, effective = rule.aggregate(clients, w[:3], previous, _kinds(), reference=reference)
    trust = np.maximum(agreement, 0) * w[:3]
    np.testing.assert_allclose(effective, trust / trust.sum() if trust.sum() > 0 else 0, rtol=1e-12)


@pytest.mark.parametrize("reference_step", [1.0, 0.0])
def test_fltrust_trusting_nobody_keeps_the_previous_model(reference_step):
    """Every client against the reference, or a reference that did not move: no step."""
    rng = np.random.default_rng(0)
    previous = {"head.weight": rng.standard_normal((3, 3)), "head.bias": rng.standard_normal(3)}
    direction = rng.standard_normal(12)
    clients = [_euclidean(previous, -s * direction) for s in (0.5, 1.0)]
    out, effective = FLTrust(*ROOT).aggregate(clients, [0.5, 0.5], previous, EUCLIDEAN,
                                              reference=_euclidean(previous, reference_step * direction))
    for name in previous:
        np.testing.assert_array_equal(out[name], previous[name])
    np.testing.assert_array_equal(effective, [0.0, 0.0])


@pytest.mark.parametrize("threshold, kept", [(0.0, [1, 1, 0]), (0.5, [1, 1, 0]), (0.7, [1, 0, 0]), (0.99, [1, 0, 0])])
def test_fltrust_threshold_drops_clients_at_or_below_it(threshold, kept):
    previous = {"head.weight": np.zeros((3, 3)), "head.bias": np.zeros(3)}
    reference = _euclidean(previous, np.eye(12)[0])
    steps = [np.eye(12)[0], 0.6 * np.eye(12)[0] + 0.8 * np.eye(12)[1], np.eye(12)[1]]  # agreements 1, 0.6, 0
    clients = [_euclidean(previous, step) for step in steps]
    _, effective = FLTrust(*ROOT, threshold=threshold).aggregate(clients, np.full(3, 1 / 3), previous, EUCLIDEAN,
                                                                 reference=reference)
    assert (effective > 0).astype(int).tolist() == kept


@pytest.mark.parametrize("rule, match", [
    (FLTrust(*ROOT, threshold=1.0), "'threshold' parameter of FLTrust"),
    (FLTrust(*ROOT, threshold=-0.1), "'threshold' parameter of FLTrust"),
    (FLTrust(np.ones((3, 3)), [0, 1, 0]), r"FLTrust: X must be a non-empty root set .* got shape \(3, 3\)"),
    (FLTrust(np.ones((0, 3, 3)), []), "FLTrust: X must be a non-empty root set"),
    (FLTrust(ROOT[0], [0, 1]), r"FLTrust: y must hold one label per root matrix \(4\), got shape \(2,\)"),
    (FLTrust(ROOT[0], "a string"), "'y' parameter of FLTrust"),
])
def test_fltrust_bad_parameters_refused_naming_them(rule, match):
    with pytest.raises(ValueError, match=match):
        get_aggregation(rule)


def test_fltrust_needs_the_reference_and_the_previous_model():
    previous, clients, w = _clients(4, 2, 3, 0.1, seed=0)
    with pytest.raises(ValueError, match="FLTrust needs the server's reference update"):
        FLTrust(*ROOT)(clients, w, previous, _kinds())  # as a plain rule: no reference
    with pytest.raises(ValueError, match="FLTrust works in the tangent space at the previous global model"):
        FLTrust(*ROOT).aggregate(clients, w, None, _kinds(), reference=clients[0])


def test_fltrust_is_a_cloneable_rule_named_by_its_root_set():
    rule = FLTrust(*ROOT, threshold=0.2)
    copy = clone(rule)
    assert copy.X is not rule.X and np.array_equal(copy.X, rule.X) and copy.get_params()["threshold"] == 0.2
    assert rule.needs_reference and not any(r.needs_reference for r in ROBUST.values())
    assert rule_name(rule) == rule_name(copy) == rule_name(FLTrust(ROOT[0].copy(), list(ROOT[1]), threshold=0.2))
    assert rule_name(rule).startswith("skfedspd.aggregation.FLTrust(X=<root set (4, 3, 3) ")
    assert rule_name(FLTrust(ROOT[0] * 2, ROOT[1])) != rule_name(FLTrust(*ROOT))
    assert rule_name(FLTrust(ROOT[0], [1, 0, 1, 0])) != rule_name(FLTrust(*ROOT))
    with pytest.raises(ValueError, match="needs each client's update"):
        get_aggregation(rule, secure=True)


# FLTrust per layer (agreement_scope="layer")


def _two_layers(previous, head, bias, other):
    """Clients of a model with two layers: ``head`` (weight and bias) and ``other``."""
    return {"head.weight": previous["head.weight"] + head, "head.bias": previous["head.bias"] + bias,
            "other.weight": previous["other.weight"] + other}


TWO_LAYERS = {"head.weight": "euclidean", "head.bias": "euclidean", "other.weight": "euclidean",
              "bn.running_mean": "local"}


def test_fltrust_per_layer_sees_a_client_that_disagrees_on_one_small_layer():
    """A client whose large layer agrees and whose small layer (the head) points against the
    reference: the whole-vector cosine trusts it, the per-layer agreement (the mean of its
    per-layer cosines, each layer counting the same) does not. Weight and bias of a module form
    one layer."""
    rng = np.random.default_rng(0)
    previous = {"head.weight": rng.standard_normal((2, 3)), "head.bias": rng.standard_normal(2),
                "other.weight": rng.standard_normal((10, 10))}
    head, bias, other = rng.standard_normal((2, 3)), rng.standard_normal(2), rng.standard_normal((10, 10))
    reference = _two_layers(previous, head, bias, other)
    honest = _two_layers(previous, 2 * head, 2 * bias, other)
    swapped = _two_layers(previous, -head, -bias, other)  # the head reversed, the large layer the same
    clients = [honest, swapped]
    whole = FLTrust(*ROOT).agreement(clients, reference, previous, TWO_LAYERS)
    layer = FLTrust(*ROOT, agreement_scope="layer").agreement(clients, reference, previous, TWO_LAYERS)
    assert whole[1] > 0.5  # the large layer dominates the whole vector
    np.testing.assert_allclose(layer, [1.0, 0.0], atol=1e-12)  # (1 + 1) / 2 and (−1 + 1) / 2
    out, effective = FLTrust(*ROOT, agreement_scope="layer").aggregate(clients, [0.5, 0.5], previous, TWO_LAYERS,
                                                                       reference=reference)
    np.testing.assert_allclose(effective, [1.0, 0.0])
    for name in previous:  # the honest client at the reference's length, layer by layer: the reference
        np.testing.assert_allclose(out[name], reference[name], atol=1e-12)


def test_fltrust_per_layer_scales_each_layer_to_the_reference_length():
    rng = np.random.default_rng(1)
    previous = {"head.weight": np.zeros((2, 3)), "head.bias": np.zeros(2), "other.weight": np.zeros((10, 10))}
    head, bias, other = rng.standard_normal((2, 3)), rng.standard_normal(2), rng.standard_normal((10, 10))
    reference = _two_layers(previous, head, bias, other)
    client = _two_layers(previous, 10 * head, 10 * bias, 0.01 * other)  # right directions, wrong sizes
    out, _ = FLTrust(*ROOT, agreement_scope="layer").aggregate([client], [1.0], previous, TWO_LAYERS,
                                                               reference=reference)
    for name in previous:
        np.testing.assert_allclose(out[name], reference[name], atol=1e-12)
    whole, _ = FLTrust(*ROOT).aggregate([client], [1.0], previous, TWO_LAYERS, reference=reference)
    assert not np.allclose(whole["other.weight"], reference["other.weight"])  # one scale for the whole vector


@pytest.mark.parametrize("shape", SHAPES[:3])
def test_fltrust_per_layer_on_a_stiefel_model_is_the_whole_rule_on_one_layer(shape):
    """With one non-local layer the two scopes agree; with the Stiefel weight and the head they
    take each layer's cosine (the Stiefel one in the tangent space at the broadcast)."""
    p, k = shape
    previous, clients, w = _clients(p, k, 4, 0.2, seed=p)
    reference = clients.pop()
    kinds = _kinds()
    layer = FLTrust(*ROOT, agreement_scope="layer")
    updates = tangent_updates(clients, previous, kinds)
    ref = tangent_updates([reference], previous, kinds)[0]
    n_w = p * k
    cos = [updates[:, s] @ ref[s] / np.linalg.norm(updates[:, s], axis=1) / np.linalg.norm(ref[s])
           for s in (slice(0, n_w), slice(n_w, None))]
    np.testing.assert_allclose(layer.agreement(clients, reference, previous, kinds), (cos[0] + cos[1]) / 2,
                               rtol=1e-12)
    out, effective = layer.aggregate(clients, w[:3], previous, kinds, reference=reference)
    assert orthonormality_error(out[STIEFEL]) <= 1e-12 and effective.sum() in (0.0, pytest.approx(1.0))
    one = {STIEFEL: "stiefel"}
    only_w = [{STIEFEL: c[STIEFEL]} for c in clients]
    a, ea = layer.aggregate(only_w, w[:3], previous, one, reference={STIEFEL: reference[STIEFEL]})
    b, eb = FLTrust(*ROOT).aggregate(only_w, w[:3], previous, one, reference={STIEFEL: reference[STIEFEL]})
    np.testing.assert_allclose(a[STIEFEL], b[STIEFEL], atol=1e-14)
    np.testing.assert_allclose(ea, eb)


def test_fltrust_accept_gives_every_agreeing_client_its_weight_and_bounded_keeps_short_updates():
    previous = {"head.weight": np.zeros((3, 3)), "head.bias": np.zeros(3)}
    e = np.eye(12)
    reference = _euclidean(previous, 2.0 * e[0])
    # agreements 1, 0.6, 0.2, -1
    steps = [e[0], 0.6 * e[0] + 0.8 * e[1], 5.0 * (0.2 * e[0] + np.sqrt(0.96) * e[2]), -e[0]]
    clients = [_euclidean(previous, step) for step in steps]
    w = np.array([0.1, 0.2, 0.3, 0.4])
    out, effective = FLTrust(*ROOT, trust="accept", magnitude="bounded").aggregate(clients, w, previous, EUCLIDEAN,
                                                                                   reference=reference)
    np.testing.assert_allclose(effective, [1 / 6, 2 / 6, 3 / 6, 0.0])  # the weights of the agreeing clients
    # unit and 1-long updates kept as they are (shorter than the reference's 2), the 5-long one cut to 2
    expected = (1 * steps[0] + 2 * steps[1] + 3 * steps[2] * 2 / 5) / 6
    np.testing.assert_allclose(np.concatenate([out["head.weight"].ravel(), out["head.bias"]]), expected, atol=1e-12)
    _, cosine = FLTrust(*ROOT).aggregate(clients, w, previous, EUCLIDEAN, reference=reference)
    np.testing.assert_allclose(cosine, np.array([0.1, 0.12, 0.06, 0.0]) / 0.28)


@pytest.mark.parametrize("name, value", [("agreement_scope", "array"), ("trust", "relu"), ("magnitude", "clip")])
def test_fltrust_options_are_checked_parameters(name, value):
    with pytest.raises(ValueError, match=f"'{name}' parameter of FLTrust"):
        get_aggregation(FLTrust(*ROOT, **{name: value}))


def test_fltrust_scope_is_a_checked_parameter_in_its_name():
    assert rule_name(FLTrust(*ROOT, agreement_scope="layer")).endswith(", agreement_scope='layer')")
    assert rule_name(FLTrust(*ROOT, agreement_scope="layer")) != rule_name(FLTrust(*ROOT))
    assert "agreement_scope" not in rule_name(FLTrust(*ROOT))
    with pytest.raises(ValueError, match="needs each client's update"):
        get_aggregation(FLTrust(*ROOT, agreement_scope="layer"), secure=True)
