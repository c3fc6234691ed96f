"""Shared fixtures."""

import pytest


@pytest.fixture(scope="session")
def smoke_runs(tmp_path_factory):
    """One smoke-profile runs folder for the whole session, made through the CLI:
    ``python -m minimind_lib pretrain`` then ``... sft`` (which reuses that pretrain run).
    Read-only for tests: copy it before changing anything."""
    from minimind_lib.__main__ import main

    root = tmp_path_factory.mktemp("runs")
    for stage in ("pretrain", "sft"):
        assert main([stage, "--profile", "smoke", "--out", str(root), "--no-progress"]) == 0
    return root
