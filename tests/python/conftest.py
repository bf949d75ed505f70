"""A real pod for the Python tests: `podemu up` from the build ($PODEMU_BIN) in a temporary
state directory, always stopped."""

import os
import subprocess
import tempfile

import pytest

BIN = os.environ.get("PODEMU_BIN", "build/bin")


class LocalPod:
    def __init__(self, *args):
        self.state = tempfile.mkdtemp(prefix="podemu-py-")
        # Should pytest be killed outright, the pod goes with it (PODEMU_EXIT_WITH).
        self.env = dict(os.environ, PODEMU_STATE_DIR=self.state,
                        PODEMU_EXIT_WITH=str(os.getpid()))
        self.cli("up", "--port", "0", *args)

    def cli(self, *args, check=True):
        return subprocess.run([os.path.join(BIN, "podemu"), *args], env=self.env, check=check,
                              capture_output=True, text=True, timeout=120)

    def connect(self):
        import podemu
        os.environ["PODEMU_STATE_DIR"] = self.state
        return podemu.Pod()

    def down(self):
        self.cli("down", check=False)
        subprocess.run(["rm", "-rf", self.state], check=False)


@pytest.fixture(scope="module")
def host_pod():
    """2 hosts x 4 cores with real bytes."""
    p = LocalPod("--hosts", "2", "--cores-per-host", "4", "--hbm", "256M", "--backing", "host")
    yield p
    p.down()


@pytest.fixture(scope="module")
def v3_8():
    """A v3-8 without bytes: full-size memory figures."""
    p = LocalPod("--topology", "v3-8", "--backing", "none")
    yield p
    p.down()
