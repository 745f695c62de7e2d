"""Tests for ``skfedspd.validation``: the one validator per kind of value, each error naming
the field and what was expected."""

import warnings

import numpy as np
import pytest

from skfedspd.validation import (MIN_VALIDATION_SAMPLES, check_class_weight, check_count, check_domain_sizes,
                                 check_groups, check_label_values, check_positive, check_sample_weight, is_count,
                                 is_positive, resolve_groups, training_weights, uses_validation)


@pytest.mark.parametrize("value, minimum, expected", [
    (0, 0, True), (np.int32(3), 1, True), (-1, None, True), (-1, 0, False), (True, 0, False), (np.bool_(True), 0, False),
    (1.0, 0, False), ("1", 0, False), (None, 0, False)])
def test_is_count(value, minimum, expected):
    assert is_count(value, minimum) is expected


def test_check_count_names_the_field_and_returns_an_int():
    assert type(check_count(np.int64(4), "n_rounds", 1)) is int
    with pytest.raises(ValueError, match=r"n_rounds must be an int >= 1 \(not a bool\), got 0"):
        check_count(0, "n_rounds", 1)


@pytest.mark.parametrize("value, allow_zero, expected", [
    (0.5, False, True), (0, False, False), (0, True, True), (float("inf"), False, False), (float("nan"), True, False),
    (True, False, False), ("2", False, False), (-1e-300, True, False)])
def test_is_positive(value, allow_zero, expected):
    assert is_positive(value, allow_zero) is expected


def test_check_positive_names_the_field():
    assert check_positive(3, "timeout") == 3.0
    with pytest.raises(ValueError, match="timeout must be a finite non-negative number"):
        check_positive(-1.0, "timeout", allow_zero=True)


@pytest.mark.parametrize("weights, message", [
    ([1.0, np.nan, 1.0], "contains NaN or infinity \\(first at sample 1\\)"),
    ([1.0, 1.0, -2.0], "contains negative weights \\(first at sample 2\\)"),
    ([0.0, 0.0, 0.0], "sums to 0"),
    ([1e308, 1e308, 1e308], "sums to inf, beyond the normal float64 range"),
    ([1e-320, 1e-320, 1e-320], "sums to 3e-320, below the normal float64 range"),
    ([[1.0, 1.0, 1.0]], "must be a 1-D array of 3 weights"),
    (["a", "b", "c"], "must be numbers"),
])
def test_sample_weights_that_would_train_nothing_are_refused(weights, message):
    with pytest.raises(ValueError, match="sample_weight " + message):
        check_sample_weight(weights, 3)


def test_a_scalar_sample_weight_is_every_samples():
    np.testing.assert_array_equal(check_sample_weight(2, 3), [2.0, 2.0, 2.0])
    with pytest.raises(ValueError, match="1-D array"):
        check_sample_weight(2, 3, scalar=False)


@pytest.mark.parametrize("class_weight", [{0: -1.0, 1: 1.0}, {0: float("nan"), 1: 1.0}, {0: True, 1: 1.0},
                                          {0: "1", 1: 1.0}])
def test_class_weights_are_named_as_such(class_weight):
    with pytest.raises(ValueError, match="class_weight of class 0 must be a finite number >= 0"):
        check_class_weight(class_weight)


def test_training_weights_combine_class_and_sample_weights():
    y = np.array([0, 0, 1, 1])
    np.testing.assert_allclose(training_weights({0: 2.0, 1: 1.0}, y, [1.0, 0.5, 1.0, 2.0]), [2.0, 1.0, 1.0, 2.0])
    assert training_weights(None, y, None) is None
    with pytest.raises(ValueError, match="class_weight × sample_weight sums to 0"):
        training_weights({0: 0.0, 1: 1.0}, y, [1.0, 1.0, 0.0, 0.0])
    with pytest.raises(ValueError, match=r"class_weight leaves a positive weight to one class only \(\[1\]\)"):
        training_weights({0: 0.0, 1: 1.0}, y, None)
    assert training_weights({0: 0.0, 1: 1.0}, y, None, all_data=False) is not None


@pytest.mark.parametrize("labels, message", [
    ([1.0, np.nan, np.nan], r"groups contains NaN at samples \[1, 2\]"),
    (["a", None, "b"], r"groups contains None at samples \[1\]"),
    (["s1", 2, "s3"], "groups mixes label types: str .* and number"),
])
def test_label_values_without_a_label_or_of_mixed_types_are_refused(labels, message):
    with pytest.raises(ValueError, match=message):
        check_label_values(labels, "groups")


def test_groups_are_one_label_per_sample():
    assert check_groups(None, 3) is None
    with pytest.raises(ValueError, match="groups has 2 entries but X has 3 samples"):
        check_groups([1, 2], 3)
    with pytest.raises(ValueError, match="groups must be a 1-D array"):
        check_groups([[1, 2, 3]], 3)


def test_domain_sizes_refuse_all_single_trials_and_warn_about_some():
    with pytest.raises(ValueError, match="each of the 4 domains a single trial: Recenter"):
        check_domain_sizes(np.arange(4), "Recenter")
    with pytest.warns(UserWarning, match=r"1 of the 2 domains of groups hold a single trial \(3\)"):
        check_domain_sizes(np.array([1, 1, 3]), "domain batch norm")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_domain_sizes(np.array([1, 1, 2, 2]), "Recenter")


def test_subjects_is_an_alias_of_groups():
    assert resolve_groups(None, [1, 2]) == [1, 2]
    assert resolve_groups([1, 2], None) == [1, 2]
    assert resolve_groups([1, 2], np.array([1, 2])) == [1, 2]
    with pytest.raises(ValueError, match="groups and subjects \\(its alias\\) differ"):
        resolve_groups([1, 2], [2, 1])


@pytest.mark.parametrize("n_samples, fraction, early_stopping, expected", [
    (10 * MIN_VALIDATION_SAMPLES, 0.1, "auto", True), (10 * MIN_VALIDATION_SAMPLES - 10, 0.1, "auto", False),
    (100, 0.1, True, True), (10_000, 0.1, False, False), (10_000, 0.0, True, False)])
def test_uses_validation(n_samples, fraction, early_stopping, expected):
    assert uses_validation(n_samples, 4, fraction, early_stopping) is expected
