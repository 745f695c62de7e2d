"""One quick start everywhere: the README's, shown unchanged on the front page, in the guides
and in the first example, and run on the offline EEG where it is present."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
#: Where each of the README's two snippets (centralized, federated) must appear unchanged.
PLACES = {
    "centralized": ("docs/index.rst", "docs/guide/model.md", "examples/plot_01_quickstart.py"),
    "federated": ("docs/index.rst", "docs/guide/federation.md"),
}
#: The only changes the run makes to the snippets: their training sizes, for a test's time.
SIZES = {
    "centralized": {"SPDnetClassifier(random_state=0)": "SPDnetClassifier(random_state=0, max_epochs=3)"},
    "federated": {'client_optimizer_state="reset", random_state=0,':
                  'client_optimizer_state="reset", random_state=0, n_rounds=2,'},
}


def readme_snippets(text=None):
    """``{"centralized": code, "federated": code}``: the first two Python blocks of the
    README's "Quick start" section."""
    text = (ROOT / "README.md").read_text() if text is None else text
    section = text[text.index("## Quick start"):]
    section = section[:section.index("\n## ", 1)]
    blocks = re.findall(r"```python\n(.*?)```", section, re.DOTALL)
    assert len(blocks) >= 2, "the README's quick start has a centralized and a federated snippet"
    return {"centralized": blocks[0], "federated": blocks[1]}


def contains_block(text, code):
    """Whether ``text`` holds the lines of ``code`` in one piece, at one indentation (the
    reStructuredText code blocks indent them)."""
    lines = code.rstrip("\n").split("\n")
    for indent in {re.match(r"[ \t]*", line).group(0) for line in text.split("\n")}:
        if "\n".join(indent + line if line else "" for line in lines) in text:
            return True
    return False


def sized(snippet, code):
    """The snippet with its training sizes made small (:data:`SIZES`)."""
    for shown, small in SIZES[snippet].items():
        assert shown in code, f"the {snippet} quick start no longer contains {shown!r}: update SIZES"
        code = code.replace(shown, small)
    return code


@pytest.mark.parametrize("snippet, place", [(snippet, place) for snippet, places in PLACES.items()
                                            for place in places])
def test_each_place_shows_the_readme_snippet(snippet, place):
    assert contains_block((ROOT / place).read_text(), readme_snippets()[snippet]), (
        f"{place} does not show the README's {snippet} quick start unchanged")


def test_a_changed_copy_is_seen():
    code = readme_snippets()["centralized"]
    indented = "\n".join("   " + line if line else "" for line in code.split("\n"))
    assert contains_block(".. code-block:: python\n\n" + indented, code)
    assert not contains_block(code.replace("GroupKFold(3)", "GroupKFold(5)"), code)


def test_the_federated_snippet_has_the_recommended_settings():
    """The settings the configuration page recommends for a federation are the README's."""
    page = (ROOT / "docs" / "which-configuration.md").read_text()
    section = page[page.index("## Federated sites"):]
    recommended = re.findall(r'(?:server_optimizer=ServerMomentum\([^)]*\)|client_optimizer_state="\w+"'
                             r'|SPDnetClassifier\(batchnorm="domain"\))', section[:section.index("```", section.index("```python") + 9)])
    assert recommended
    federated = readme_snippets()["federated"]
    for setting in recommended:
        assert setting in federated


def test_the_centralized_snippet_is_the_shipped_model():
    """``SPDnetClassifier()`` with its defaults (a seed aside), given the subjects."""
    code = readme_snippets()["centralized"]
    assert "SPDnetClassifier(random_state=0)" in code
    assert 'params={"groups": subjects}' in code


def test_the_quick_start_runs_on_the_offline_eeg():
    pytest.importorskip("moabb")
    import sklearn

    from skfedspd.datasets import find_physionet_root

    if find_physionet_root() is None:
        pytest.skip("offline PhysioNet EEG not found (SKFEDSPD_DATA or <ancestor>/shared/data)")
    snippets = readme_snippets()
    namespace = {}
    with sklearn.config_context():  # the snippet enables metadata routing for the session
        exec(compile(sized("centralized", snippets["centralized"]), "README quick start", "exec"), namespace)
        scores = namespace["scores"]
        assert len(scores) == 3 and all(0.0 <= s <= 1.0 for s in scores)
        assert namespace["clf"].get_params()["spdnetclassifier__batchnorm"] == "auto"
        exec(compile(sized("federated", snippets["federated"]), "README federated snippet", "exec"), namespace)
        fed = namespace["fed"][-1]
        assert fed.n_clients_ == 2 and len(fed.history_) == 2
        assert fed.server_optimizer.momentum == 0.9 and fed.estimator.batchnorm == "domain"
        assert namespace["fed"].predict(namespace["X"][:5]).shape == (5,)
