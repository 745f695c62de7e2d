"""``skfedspd.flower._internals``: the installed Flower is checked when ``skfedspd.flower``
is imported, and an unsupported one stops the import with an error that says what to do."""

import os
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest

pytest.importorskip("flwr")

from skfedspd.flower._internals import (  # noqa: E402
    INSTALL_COMMAND,
    SUPPORTED_FLWR,
    check_flower_version,
    unsupported_flower,
)

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("version", ["1.42.0", "1.42.11", "1.42.1rc1", "1.42.0.post1"])
def test_supported_versions_pass(version):
    assert unsupported_flower(version) is None
    check_flower_version(version)


@pytest.mark.parametrize("version", ["1.41.9", "1.42.0rc1", "1.43.0", "1.43.0rc1", "2.0.0", "0.42.0", "unknown"])
def test_unsupported_versions_name_the_version_the_range_and_the_command(version):
    with pytest.raises(ImportError) as error:
        check_flower_version(version)
    message = str(error.value)
    assert f"flwr {version} " in message and SUPPORTED_FLWR in message and INSTALL_COMMAND in message


def test_the_supported_range_is_the_extras_pin():
    """The range checked at import is the one ``pip install 'skfedspd[flower]'`` installs."""
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert extras["flower"] == [f"flwr{SUPPORTED_FLWR}"]
    assert INSTALL_COMMAND == "pip install 'skfedspd[flower]'"


def _import_in_a_fresh_interpreter(setup):
    code = textwrap.dedent(setup) + textwrap.dedent("""
        try:
            import skfedspd.flower
        except ImportError as error:
            print(type(error).__name__, error)
        else:
            print("imported")
    """)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300,
                            env={**os.environ, "FLWR_TELEMETRY_ENABLED": "0",
                                 "FLWR_DISABLE_UPDATE_CHECK": "1"})
    return result.stdout.strip() + result.stderr[-2000:]


@pytest.mark.slow
def test_an_unsupported_flower_stops_the_import_with_a_clear_error():
    out = _import_in_a_fresh_interpreter("""
        import flwr
        flwr.__version__ = "1.43.0"
    """)
    assert out == ("ImportError skfedspd.flower supports Flower (flwr) >=1.42,<1.43, and the installed flwr 1.43.0 "
                   "is outside this range: install a supported Flower with pip install 'skfedspd[flower]'"), out


@pytest.mark.slow
def test_a_flower_without_a_name_used_stops_the_import_with_a_clear_error():
    """A supported version number whose runtime lacks what skfedspd uses (a patched build)."""
    out = _import_in_a_fresh_interpreter("""
        import flwr.server.superlink.fleet.vce.vce_api as vce_api
        del vce_api._register_nodes
    """)
    assert out.startswith("ImportError skfedspd.flower supports Flower (flwr) >=1.42,<1.43, and the installed flwr "), out
    assert "lacks flwr.server.superlink.fleet.vce.vce_api._register_nodes" in out, out
    assert out.endswith("install a supported Flower with pip install 'skfedspd[flower]'"), out
    out = _import_in_a_fresh_interpreter("""
        import flwr.supercore.heartbeat as heartbeat
        del heartbeat.HeartbeatSender
    """)
    assert "lacks what skfedspd.flower uses of it (cannot import name 'HeartbeatSender'" in out, out


@pytest.mark.slow
def test_the_supported_flower_imports():
    assert _import_in_a_fresh_interpreter("") == "imported"


@pytest.mark.slow
def test_backend_flower_on_an_unsupported_flower_says_what_to_install():
    """``backend="flower"`` finds the transport by its entry point: the same error reaches ``fit``."""
    out = _import_in_a_fresh_interpreter("""
        import flwr
        flwr.__version__ = "1.41.0"
        import numpy as np
        from skfedspd import FederatedSPDnetClassifier
        from skfedspd.datasets import make_spd_classification
        X, y = make_spd_classification(n_matrices=12, n_channels=4, n_classes=2, seed=0)
        try:
            FederatedSPDnetClassifier(n_rounds=1, backend="flower").fit(X, y, groups=np.repeat([0, 1, 2], 4))
        except ImportError as error:
            print("fit:", error)
    """)
    assert out.startswith("fit: skfedspd.flower supports Flower (flwr) >=1.42,<1.43, and the installed flwr "
                          "1.41.0 is outside this range: install a supported Flower with pip install "
                          "'skfedspd[flower]'\n"), out
