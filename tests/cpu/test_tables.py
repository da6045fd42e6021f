"""Tuned tables on their own (deepgemm.tables): which kernels an entry may name, which GPU a table
applies to, and what happens without a GPU model. (Loading through dispatch, corrupt files and
stale entries: tests/cpu/test_dispatch.py.)"""
import dataclasses
import json

import pytest

from deepgemm import registry, tables

GPU = {"name": "NVIDIA H200", "cc": 90, "sm_count": 132}


@pytest.fixture
def hidden_kernel():
    """A gemm kernel registered but not public (as the stress builds are): a table must not pick it."""
    spec = registry.register(dataclasses.replace(registry.get("v0"), name="hidden_v0", public=False))
    yield spec
    registry.unregister(spec.name)


def test_an_entry_may_name_public_gemm_kernels_only(hidden_kernel):
    spec, config, why = tables.kernel_config("v0", {})
    assert spec is registry.get("v0") and config == spec.config_defines(None) and why is None
    assert tables.kernel_config("hidden_v0", None) == (None, None, "names kernel 'hidden_v0', which is not a "
                                                                   "registered gemm kernel")
    assert tables.kernel_config("fp16acc_simt", None)[2].startswith("names kernel 'fp16acc_simt'")
    assert tables.kernel_config(None, None)[2] == "'kernel' is None, not a name"


def test_a_table_applies_to_its_model_compute_capability_and_sm_count_only():
    assert tables.mismatch(GPU, dict(GPU, driver="580", clock=1980)) is None   # driver and clocks do not matter
    assert tables.mismatch(dict(GPU, cc="90"), GPU) is None                   # JSON may hold numbers as text
    for key, other in (("name", "NVIDIA H100"), ("cc", 100), ("sm_count", 114)):
        why = tables.mismatch(GPU, dict(GPU, **{key: other}))
        assert why is not None and why.startswith(f"recorded on {key}=")


@pytest.mark.parametrize("identity", [None, {}, {"name": "", "cc": 90, "sm_count": 132},
                                      {"name": None, "cc": 90, "sm_count": 132}])
def test_without_a_gpu_model_no_table_is_read(tmp_path, monkeypatch, identity):
    monkeypatch.setattr(tables, "SHIPPED_DIR", tmp_path)
    monkeypatch.setenv("DEEPGEMM_TUNED_DIR", str(tmp_path))
    # Even a table whose file name an unnamed GPU would map to is not applied.
    (tmp_path / ".json").write_text(json.dumps({"format": 1, "gpu": {}, "entries": {}}))
    loaded = tables.load(identity)
    assert loaded.entries == {} and loaded.notes == ["GPU model unknown: heuristics only"]


def test_an_entry_offers_its_winner_and_every_timed_candidate_fastest_first():
    """Candidates are labelled '<kernel>[<config>]'; ones the tuner could not time ('error: ...')
    or never timed are not offered, and a malformed entry offers its winner only (never a crash)."""
    entry = {"kernel": "v4", "config": {"DG_STAGES": 3}, "us": 10.0,
             "candidates": {"v4[s3]": 10.0, "v5[bn128]": 8.5, "small_m[w16]": "error: refused", "v3[x]": None},
             "configs": {"v4[s3]": {"DG_STAGES": 3}, "v5[bn128]": {"DG_BN": 128}, "small_m[w16]": {"W": 16},
                         "v3[x]": {}, "v2[never timed]": {}}}
    assert tables.options(entry) == [(8.5, "v5", {"DG_BN": 128}), (10.0, "v4", {"DG_STAGES": 3}),
                                     (10.0, "v4", {"DG_STAGES": 3})]
    # A winner without a time (an older table) goes after every timed candidate.
    assert tables.options({"kernel": "v4", "candidates": {"v5[a]": 3.0}, "configs": {"v5[a]": {"DG_BN": 128}}}) \
        == [(3.0, "v5", {"DG_BN": 128}), (None, "v4", None)]
    winner_only = [(None, "v4", None)]
    assert tables.options({"kernel": "v4", "us": "fast", "config": {}}) == winner_only
    assert tables.options({"kernel": "v4", "configs": {"v5[a]": {}}, "candidates": [["v5[a]", 1.0]]}) == winner_only
    assert tables.options({"kernel": "v4", "configs": [["v5[a]", {}]], "candidates": {"v5[a]": 1.0}}) == winner_only


def test_the_user_tables_live_in_the_kernel_cache_unless_a_folder_is_named(monkeypatch, tmp_path):
    """$DEEPGEMM_TUNED_DIR, else the 'tuned' folder of $DEEPGEMM_CACHE_DIR, else of ~/.cache/deepgemm:
    where `tune` writes is where dispatch looks, beside the compiled kernels."""
    from deepgemm import jit
    monkeypatch.delenv("DEEPGEMM_TUNED_DIR", raising=False)
    monkeypatch.setenv("DEEPGEMM_CACHE_DIR", str(tmp_path / "cache"))
    assert tables.user_dir() == tmp_path / "cache" / "tuned" == jit.cache_dir() / "tuned"
    assert tables.paths("NVIDIA H200")[1] == ("user", tmp_path / "cache" / "tuned" / "NVIDIA_H200.json")
    monkeypatch.delenv("DEEPGEMM_CACHE_DIR")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert tables.user_dir() == tmp_path / "home" / ".cache" / "deepgemm" / "tuned"
    assert not (tmp_path / "home").exists()   # looking for a table creates no folder
    monkeypatch.setenv("DEEPGEMM_TUNED_DIR", str(tmp_path / "mine"))
    assert tables.user_dir() == tmp_path / "mine"


def test_a_table_is_written_whole_or_not_at_all(tmp_path):
    """tables.write goes through a temp file and a rename: the new table replaces the old; a write
    that fails (a value JSON cannot hold) raises, leaves the old table as it was and no temp file."""
    path = tmp_path / "configs" / "GPU.json"
    tables.write(path, {"format": 1, "entries": {}})
    assert json.loads(path.read_text()) == {"format": 1, "entries": {}}
    tables.write(path, {"format": 1, "entries": {"k": 1}})
    assert json.loads(path.read_text())["entries"] == {"k": 1}
    with pytest.raises(TypeError):
        tables.write(path, {"format": 1, "entries": {"k": object()}})
    assert json.loads(path.read_text())["entries"] == {"k": 1}
    assert sorted(p.name for p in path.parent.iterdir()) == ["GPU.json"]
