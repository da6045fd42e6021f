"""The environment for a test's child pytest or script: this process's, minus what pytest-xdist sets
in a worker (a child that believes it is an xdist worker turns pytest-benchmark off and saves
nothing), with the caller's overrides on top."""
import os


def child_env(**overrides) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST") and k != "PYTEST_CURRENT_TEST"}
    env.update({k: str(v) for k, v in overrides.items()})
    return env
