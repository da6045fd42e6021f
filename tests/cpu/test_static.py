"""CPU tier: every registered kernel compiles for every arch it targets, with no spills or local
memory, within the shared-memory limits, and its SASS holds what its ladder step claims.

The quick tier compiles each kernel's default config in the four variants that reach every code
path (static_checks.coverage_variants), and one config per other value of each define that
switches code paths (static_checks.path_variants: V5's ping-pong, split-K, 64-row and no-TMA-store
configs, V4's unswizzled tiles); --sweep=full adds the whole dtype x layout product and every
config_space entry (static_checks.variants(full=True))."""
import pytest

from deepgemm import binary, jit, registry, static_checks
from deepgemm.registry import Epilogue


@pytest.fixture(scope="session")
def full_tier(sweep_tier) -> bool:
    return sweep_tier == "full"


@pytest.fixture(scope="session")
def results(full_tier):
    # The ladder's kernels; test_fp16acc.py checks the accuracy report's.
    return static_checks.run_all(specs=registry.specs(), full=full_tier)


CASES = [(s.name, arch) for s in registry.specs() for arch in s.archs]


@pytest.mark.parametrize("kernel,arch", CASES, ids=[f"{k}-{a}" for k, a in CASES])
def test_kernel_passes_static_checks(results, full_tier, kernel, arch):
    mine = [r for r in results if r.variant.spec.name == kernel and r.variant.arch == arch]
    assert len(mine) == len(static_checks.variants(registry.get(kernel), arch, full_tier))
    problems = [f"{r.variant}: {'; '.join(r.problems)}" for r in mine if not r.ok]
    assert not problems, "\n".join(problems)
    for r in mine:   # the report was really parsed, not silently empty
        assert r.resources["registers"] > 0 and r.resources["spill_stores"] == 0


@pytest.mark.parametrize("spec", registry.specs(purpose=None), ids=lambda s: s.name)
def test_quick_variants_reach_every_dtype_layout_and_the_epilogue(spec):
    for arch in spec.archs:
        vs = static_checks.variants(spec, arch)
        assert {(v.a_row, v.b_row) for v in vs} == {(True, True), (True, False), (False, True), (False, False)}
        assert {v.in_dtype for v in vs} == set(spec.input_dtypes)
        assert {v.out_dtype for v in vs} == set(registry.OUTPUT_DTYPES)
        default = [v.epilogue for v in vs if not v.config and v.epilogue != registry.NO_EPILOGUE]
        assert default == [static_checks.FULL_EPILOGUE]


@pytest.mark.parametrize("spec", registry.specs(purpose=None), ids=lambda s: s.name)
def test_full_tier_builds_every_tuner_config(spec):
    """The tuner may pick any config_space entry on a GPU: --sweep=full (and `python -m deepgemm
    static --all`) builds each on the kernel's newest arch, in every layout it supports, with the
    whole epilogue chain on rc (the most registers)."""
    full = static_checks.variants(spec, spec.archs[-1], full=True)
    for config in spec.config_space:
        built = [v for v in full if spec.config_defines(dict(v.config) or None) == spec.config_defines(config)]
        assert any(v.epilogue == static_checks.FULL_EPILOGUE and (v.a_row, v.b_row) == (True, False)
                   for v in built), config


@pytest.mark.parametrize("spec", registry.specs(purpose=None), ids=lambda s: s.name)
def test_full_tier_builds_every_dtype_and_layout_plain_and_with_the_chain(spec):
    for arch in spec.archs:
        full = [v for v in static_checks.variants(spec, arch, full=True) if not v.config]
        layouts = {(True, True), (True, False), (False, True), (False, False)}
        plain = {(v.in_dtype, v.out_dtype, v.a_row, v.b_row) for v in full if v.epilogue == registry.NO_EPILOGUE}
        assert plain == {(i, o, a, b) for i in spec.input_dtypes for o in registry.OUTPUT_DTYPES for a, b in layouts}
        chained = {(v.in_dtype, v.out_dtype, v.a_row, v.b_row) for v in full if v.epilogue == static_checks.FULL_EPILOGUE}
        assert chained == {(i, i, a, b) for i in spec.input_dtypes for a, b in layouts}


def test_grouped_builds_are_planned_for_the_kernels_that_have_one():
    for spec in registry.specs(purpose=None):
        got = static_checks.grouped_variants(spec, spec.archs[-1])
        if not spec.grouped:
            assert got == []
            continue
        (v,) = got
        assert (v.spec, v.arch, v.grouped, v.epilogue) == (spec, spec.archs[-1], True, static_checks.FULL_EPILOGUE)
        assert (v.in_dtype, v.out_dtype, v.a_row, v.b_row) == ("float16", "float16", True, True)
    assert {s.name for s in registry.specs(purpose=None) if s.grouped} >= {"v4", "v5"}


def test_the_plan_covers_every_registered_kernel_and_arch():
    planned = {(v.spec.name, v.arch) for v in static_checks.plan()}
    assert planned == {(s.name, a) for s in registry.specs(purpose=None) for a in s.archs}
    assert {v.arch for v in static_checks.plan(archs=["sm_80"])} == {"sm_80"}


def test_v3_uses_128_bit_loads_and_v0_does_not(results):
    if "v3" not in registry.names():
        pytest.fail("v3 is not registered")
    v3 = [r for r in results if r.variant.spec.name == "v3"]
    v0 = [r for r in results if r.variant.spec.name == "v0"]
    assert v3 and all(r.features["LDG.128"] > 0 for r in v3)
    assert v0 and all(r.features["LDG.128"] == 0 for r in v0)


def test_sass_patterns_match_real_instructions():
    sass = """
        /*0100*/  LDG.E.128 R4, desc[UR6][R2.64] ;
        /*0110*/  LDG.E.U16.CONSTANT R8, desc[UR6][R2.64] ;
        /*0120*/  HMMA.16816.F32.BF16 R12, R4, R8, R12 ;
        /*0130*/  LDSM.16.MT88.4 R20, [R3] ;
        /*0140*/  LDGSTS.E.BYPASS.LTC128B.128 [R5], desc[UR4][R6.64] ;
        /*0150*/  HGMMA.64x128x16.F32.BF16 R24, gdesc[UR4], R24 ;
        /*0160*/  STL [R1], R2 ;
    """
    f = binary.sass_features(sass)
    assert (f["LDG.128"], f["HMMA"], f["LDSM"], f["LDGSTS"], f["HGMMA"], f["LOCAL"]) == (1, 1, 1, 1, 1, 1)
    assert f["LDS.128"] == 0 and f["UTMALDG"] == 0


def test_the_miscompiled_min_max_form_is_found_and_every_kernel_forbids_it():
    """VIMNMX with a predicate output: nvcc 13.0 lowered a clamp-then-compare into it with the
    test inverted (deepgemm.binary). The form ptxas wrote is caught, the plain min/max is not."""
    sass = """
        /*06e0*/                   VIMNMX R5, R16.reuse, 0x8, PT ;
        /*06f0*/                   VIMNMX.RELU R14, P0, P0, R16, 0x8, PT ;
        /*0700*/                   VIMNMX.RELU R14, R16, 0x8, PT ;
        /*0710*/                   VIMNMX.U32 R3, !P1, P2, R4, R5, !PT ;
    """
    assert binary.sass_features(sass)["VIMNMX.P"] == 2
    assert all("VIMNMX.P" in spec.sass_forbidden for spec in registry.specs(purpose=None))


def test_ptxas_parser():
    log = ("ptxas info    : Function properties for deepgemm_kernel\n"
           "    8 bytes stack frame, 4 bytes spill stores, 12 bytes spill loads\n"
           "ptxas info    : Used 168 registers, used 1 barriers, 8 bytes cumulative stack size, 33280 bytes smem\n")
    assert binary.parse_ptxas(log) == {"stack": 8, "spill_stores": 4, "spill_loads": 12, "registers": 168,
                                       "smem": 33280}
    assert binary.parse_ptxas("nothing") == {}
    assert binary.parse_ptxas(log.splitlines()[1]) == {}     # half a log (no register line): nothing claimed
    assert binary.parse_ptxas(log.splitlines()[2]) == {}     # no frame line
    # a kernel with no static shared memory: ptxas leaves the smem field out
    bare = log.replace(", 33280 bytes smem", "")
    assert binary.parse_ptxas(bare)["smem"] == 0 and binary.parse_ptxas(bare)["registers"] == 168


@pytest.mark.parametrize("rc, stdout", [(1, "\t.text.kernel:\n"), (0, "no code here\n")])
def test_a_failed_or_empty_disassembly_is_an_error(tmp_path, monkeypatch, rc, stdout):
    """nvdisasm exiting non-zero, or printing no .text section, is a ToolchainError naming the
    cubin: never an empty SASS whose missing instructions would read as a real finding."""
    tool = tmp_path / "nvdisasm"
    tool.write_text(f"#!/bin/sh\nprintf '{stdout}'\necho oops >&2\nexit {rc}\n")
    tool.chmod(0o755)
    monkeypatch.setattr(binary.toolchain, "find_nvdisasm", lambda: str(tool))
    with pytest.raises(binary.toolchain.ToolchainError, match=r"nvdisasm failed on .*k\.cubin: oops"):
        binary.dump_sass(tmp_path / "k.cubin")


def test_a_missing_disassembler_says_how_to_get_one(tmp_path, monkeypatch):
    monkeypatch.setattr(binary.toolchain, "find_nvdisasm", lambda: None)
    with pytest.raises(binary.toolchain.ToolchainError, match=r"^nvdisasm not found: pip install nvidia-cuda-nvdisasm"):
        binary.dump_sass(tmp_path / "k.cubin")


def test_ptxas_performance_warnings_are_found():
    log = ("ptxas info    : Compiling entry function 'deepgemm_kernel' for 'sm_90a'\n"
           "ptxas info    : (C7520) Potential Performance Loss: wgmma.mma_async instructions are serialized due "
           "to program dependence on compiler-inserted WG.AR in divergent path in the function 'deepgemm_kernel'\n"
           "ptxas info    : Used 168 registers, used 16 barriers\n")
    assert binary.performance_warnings(log) == [
        "wgmma.mma_async instructions are serialized due to program dependence on compiler-inserted WG.AR in "
        "divergent path in the function 'deepgemm_kernel'"]
    assert binary.performance_warnings(log.splitlines()[0] + "\n" + log.splitlines()[2]) == []


def _v0_block(config):
    """V0's block at its default config: what its cubin's __launch_bounds__ declares (fake specs
    reuse that cubin)."""
    v0 = registry.get("v0")
    return v0.block(v0.config_defines(None))


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_kernel_attributes_read_the_launch_bounds_and_the_cluster_shape(arch):
    """The cubin's declared block (__launch_bounds__) is the launcher's block for V0 and V4 at their
    defaults and for V5 at every threads-per-block its configs give; a V5 build sharing B across a
    cluster of two declares that cluster, the others none. Not an ELF file: ValueError."""
    cases = [("v0", None), ("v4", None)]
    if arch == "sm_90a":
        v5 = registry.get("v5")
        cases += [("v5", None), ("v5", {"DG_BM": 64, "DG_BN": 128}), ("v5", {"DG_CLUSTER_M": 2})]
    for name, config in cases:
        spec = registry.get(name)
        if arch not in spec.archs:
            continue
        cfg = spec.config_defines(config)
        variant = static_checks.Variant(spec, arch, "float16", "float16", True, True, config=tuple(sorted(cfg.items())))
        attrs = binary.kernel_attributes(variant.compile().cubin_path)
        assert list(attrs) == [jit.ENTRY_POINT]
        got = attrs[jit.ENTRY_POINT]
        block = spec.block(cfg)
        assert got["max_threads"] == (block[0] * block[1] * block[2], 1, 1), (name, config)
        assert got.get("cluster") == ((2, 1, 1) if cfg.get("DG_CLUSTER_M", 1) == 2 else None), (name, config)


def test_kernel_attributes_refuse_a_file_that_is_not_a_cubin(tmp_path):
    (tmp_path / "x.cubin").write_bytes(b"not an ELF file at all, but long enough" * 4)
    with pytest.raises(ValueError, match="not a 64-bit ELF cubin"):
        binary.kernel_attributes(tmp_path / "x.cubin")
    # A 64-bit ELF header alone (64 bytes, no section headers) is a cubin with nothing in it; a
    # byte shorter, not an ELF header.
    header = b"\x7fELF\x02\x01\x01" + bytes(0x40 - 7)
    (tmp_path / "empty.cubin").write_bytes(header)
    assert binary.kernel_attributes(tmp_path / "empty.cubin") == {}
    (tmp_path / "short.cubin").write_bytes(header[:-1])
    with pytest.raises(ValueError, match="not a 64-bit ELF cubin"):
        binary.kernel_attributes(tmp_path / "short.cubin")
    # Section headers said to lie past the file's end: named as malformed, not an IndexError.
    cut = bytearray(header)
    cut[0x28:0x30] = (4096).to_bytes(8, "little")                   # e_shoff
    cut[0x3A:0x40] = (64).to_bytes(2, "little") + (3).to_bytes(2, "little") + (1).to_bytes(2, "little")
    (tmp_path / "cut.cubin").write_bytes(bytes(cut))
    with pytest.raises(ValueError, match="cut.cubin: a truncated or malformed ELF cubin"):
        binary.kernel_attributes(tmp_path / "cut.cubin")


@pytest.mark.parametrize("factor", [2, 0.5])
def test_a_launcher_block_unlike_the_kernels_launch_bounds_fails_the_static_checks(results, factor):
    """A spec whose block has twice (the launch would fail) or half (part of each tile left to no
    thread) the threads V0's __launch_bounds__ declares is a problem; the real block is not."""
    real = next(r for r in results if r.variant.spec.name == "v0" and r.variant.arch == "sm_90a")
    x, y, z = _v0_block(None)
    def problems(block):
        spec = registry.KernelSpec(name="fake", file="v0_naive.cu", summary="", min_cc=70, tile=lambda c: (1, 1),
                                   block=lambda c: block, default_config={}, public=False)
        compiled = type("C", (), {"resources": real.resources, "cubin_path": real.variant.compile().cubin_path,
                                  "log": ""})
        return static_checks.check(static_checks.Variant(spec, "sm_90a", "float16", "float16", True, True),
                                   compiled).problems
    assert problems((x, y, z)) == []
    wrong = (int(x * factor), y, z)
    assert problems(wrong) == [f"the launcher's block {wrong} has {wrong[0] * y * z} threads, the kernel's "
                               f"__launch_bounds__ {x * y * z}"]


def test_static_checks_flag_spills_and_missing_instructions(results):
    """The checker itself can fail: feed it a fake compile result with spills, a ptxas performance
    warning and no HMMA."""
    spec = registry.KernelSpec(name="fake", file="v0_naive.cu", summary="", min_cc=70, tile=lambda c: (1, 1),
                               block=_v0_block, default_config={}, sass_required=("HMMA",), public=False)
    real = next(r for r in results if r.variant.spec.name == "v0" and r.variant.arch == "sm_90a")
    fake_compiled = type("C", (), {"resources": dict(real.resources, spill_stores=16, smem=60000),
                                   "cubin_path": real.variant.compile().cubin_path,
                                   "log": "ptxas info    : (C7515) Potential Performance Loss: wgmma.mma_async "
                                          "instructions are serialized due to the presence of Extern calls\n"})
    variant = static_checks.Variant(spec, "sm_90a", "float16", "float16", True, True)
    problems = " | ".join(static_checks.check(variant, fake_compiled).problems)
    assert "spills 16" in problems and "SASS lacks HMMA" in problems and "static smem 60000" in problems
    assert "ptxas: wgmma.mma_async instructions are serialized" in problems


def test_a_compile_log_without_the_resource_report_is_a_problem_not_a_pass(results):
    """No ptxas resource report (a toolchain whose -v output changed, a parser that stopped
    matching) would leave the spill and shared-memory checks nothing to check: that is a problem."""
    real = next(r for r in results if r.variant.spec.name == "v0" and r.variant.arch == "sm_90a")
    compiled = type("C", (), {"resources": {}, "cubin_path": real.variant.compile().cubin_path, "log": ""})
    assert static_checks.check(real.variant, compiled).problems == ["no ptxas resource report in the compile log"]


def test_shared_memory_limits_hold_at_equality_and_the_summary_counts_problems(results, monkeypatch):
    """A kernel at exactly the static (48 KB) or the arch's dynamic limit passes, one byte over
    fails; the summary line says ok or counts the problems, and never lists LOCAL as a feature."""
    real = next(r for r in results if r.variant.spec.name == "v0" and r.variant.arch == "sm_90a")
    limit = static_checks.DYNAMIC_SMEM_LIMIT["sm_90a"]

    def checked(static_smem, dynamic_smem, features=None):
        spec = registry.KernelSpec(name="fake", file="v0_naive.cu", summary="", min_cc=70, tile=lambda c: (1, 1),
                                   block=_v0_block, default_config={}, public=False,
                                   dynamic_smem=lambda c: dynamic_smem)
        compiled = type("C", (), {"resources": dict(real.resources, smem=static_smem),
                                  "cubin_path": real.variant.compile().cubin_path, "log": ""})
        if features is not None:
            monkeypatch.setattr(static_checks.jit, "sass_features", lambda path: features)
        return static_checks.check(static_checks.Variant(spec, "sm_90a", "float16", "float16", True, True), compiled)
    assert checked(static_checks.STATIC_SMEM_LIMIT, 0).problems == []
    assert "static smem 49153 B over 49152" in " | ".join(checked(static_checks.STATIC_SMEM_LIMIT + 1, 0).problems)
    assert checked(1024, limit - 1024).problems == []
    assert checked(1024, limit - 1023).problems == [f"shared memory {limit + 1} B over the sm_90a limit"]
    ok = checked(0, 0)
    bad = checked(0, 0, features=dict.fromkeys(binary.feature_names(), 0) | {"LOCAL": 3, "HMMA": 2})
    lines = static_checks.summary_table([ok, bad]).splitlines()
    assert len(lines) == 2 and lines[1].endswith("1 problem(s)") and "HMMA" in lines[1] and "LOCAL" not in lines[1]
    assert static_checks.summary_table([ok]).splitlines()[1].split()[-2:] == ["-", "ok"]   # v0: no ladder feature
    # One row per kernel and arch: its variants counted, the largest registers and static smem of any.
    more = checked(2048, 0)
    more.resources = dict(more.resources, registers=real.resources["registers"] + 7)
    row = static_checks.summary_table([ok, more, bad]).splitlines()[1].split()
    assert row[:5] == ["fake", "sm_90a", "3", str(real.resources["registers"] + 7), "2048"]


def test_a_programmatic_dependent_without_the_wait_fails_on_sm90_only(results):
    """A kernel launched as a programmatic dependent (KernelSpec.pdl) must wait for the previous
    kernel (griddepcontrol.wait) before its first global access: V0, which has no such wait, fails
    the check when declared pdl, on sm_90a, and not on sm_80, where no launch is a dependent."""
    for arch, problems in (("sm_90a", ["SASS lacks PDL_WAIT (griddepcontrol.wait), yet the kernel is launched with PDL"]),
                           ("sm_80", [])):
        real = next(r for r in results if r.variant.spec.name == "v0" and r.variant.arch == arch)
        spec = registry.KernelSpec(name="fake", file="v0_naive.cu", summary="", min_cc=70, tile=lambda c: (1, 1),
                                   block=_v0_block, default_config={}, public=False, pdl=True)
        compiled = type("C", (), {"resources": real.resources, "cubin_path": real.variant.compile().cubin_path,
                                  "log": ""})
        assert static_checks.check(static_checks.Variant(spec, arch, "float16", "float16", True, True),
                                   compiled).problems == problems


def test_a_variant_names_its_kernel_build_arch_dtypes_layout_epilogue_and_config():
    v5 = registry.get("v5")
    plain = static_checks.Variant(v5, "sm_90a", "float16", "float32", True, False)
    assert str(plain) == "v5-sm_90a-float16-float32-rc-none"
    grouped = static_checks.Variant(v5, "sm_90a", "bfloat16", "bfloat16", False, True, config=(("DG_BM", 64),),
                                    grouped=True)
    assert str(grouped) == "v5.grouped-sm_90a-bfloat16-bfloat16-cr-none-cfg{'DG_BM': 64}"


def test_small_m_claims_the_16_byte_b_loads_its_build_makes():
    """small_m's B arrives in 16-byte loads: LDG.128 into registers, or, with the cp.async ring
    (STAGES >= 2) and a K-contiguous B, LDGSTS into shared memory; a row-major B keeps the register
    loads in a ring config. The claim is read from each build's defines, so it holds where it
    applies, and a register build held to the ring's claim fails."""
    spec = registry.get("small_m")
    ring = dict(spec.config_defines(None), DG_SMALL_M_NT=4, DG_SMALL_M_UNROLL=1, DG_SMALL_M_STAGES=2)
    for b_row, claim in ((False, "LDGSTS"), (True, "LDG.128")):
        v = static_checks.Variant(spec, "sm_90a", "float16", "float16", True, b_row, config=tuple(sorted(ring.items())))
        r = static_checks.check(v, v.compile())
        assert r.ok, r.problems
        assert r.features[claim] > 0 and (r.features["LDGSTS"] == 0) == b_row   # A's loads are LDG.128 in both
    register = static_checks.Variant(spec, "sm_90a", "float16", "float16", True, False)
    held_to_the_ring = static_checks.check(register, register.compile(), ring)
    assert any("LDGSTS" in problem for problem in held_to_the_ring.problems)


def test_small_m_shared_memory_is_the_larger_of_its_ring_and_its_reduction():
    """small_m's ring and its reduction buffer share one allocation: the host's size (registry) and
    the kernel's (SMEM_BYTES, static_asserted equal) agree whichever is larger, including a ring
    smaller than the reduction buffer (four row tiles, one column tile), which no tuned config has."""
    spec = registry.get("small_m")
    for nt, mt, expect in ((4, 1, "ring"), (1, 4, "reduction")):
        config = dict(spec.config_defines(None), DG_SMALL_M_NT=nt, DG_SMALL_M_MT=mt, DG_SMALL_M_UNROLL=1,
                      DG_SMALL_M_STAGES=2)
        ring = 8 * 2 * 1 * nt * 32 * 16
        reduction = 8 * 16 * mt * 8 * nt * 4
        assert (ring > reduction) == (expect == "ring")
        assert spec.dynamic_smem(config) == max(ring, reduction)
        compiled = registry.compile_variant(spec, "sm_80", "float16", "float16", True, False, config=config)
        assert compiled.resources["spill_stores"] == 0


@pytest.mark.parametrize("kernel", ["v4", "v5", "small_m"])
def test_a_host_shared_memory_size_unlike_the_kernels_does_not_compile(kernel, monkeypatch):
    """The host launches with spec.dynamic_smem(config) bytes; each kernel static_asserts that its
    own layout needs exactly that many (DG_HOST_SMEM_BYTES), so a formula that drifts from the
    kernel's fails every build instead of running past the allocation."""
    import dataclasses
    spec = registry.get(kernel)
    assert "DG_HOST_SMEM_BYTES" in registry.variant_defines(spec, {}, "float16", "float16", True, False)
    off = dataclasses.replace(spec, name=f"{kernel}_smem_off", public=False,
                              dynamic_smem=lambda c: spec.dynamic_smem(c) + 16)
    arch = "sm_90a" if kernel == "v5" else "sm_80"
    with pytest.raises(jit.CompileError, match="dynamic shared memory size differs"):
        registry.compile_variant(off, arch, "float16", "float16", True, False)


def test_path_variants_take_each_switch_once_on_the_newest_arch():
    v5 = registry.get("v5")
    got = static_checks.path_variants(v5, "sm_90a")
    full = [v5.config_defines(dict(v.config)) for v in got]
    switched = sorted((name, c[name]) for c in full for name in v5.path_defines
                      if c[name] != v5.config_defines(None)[name])
    assert ("DG_PINGPONG", 1) in switched and ("DG_BM", 64) in switched and ("DG_EPI_TMA", 0) in switched
    assert {value for name, value in switched if name == "DG_SPLIT_K"} == \
        {v5.config_defines(c)["DG_SPLIT_K"] for c in v5.config_space} - {1}
    assert all(v.epilogue == static_checks.FULL_EPILOGUE for v in got)
    assert static_checks.path_variants(registry.get("v4"), "sm_80") == []   # the newest arch only
    assert len(static_checks.path_variants(registry.get("v4"), "sm_90a")) == 1




@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_the_code_digest_ignores_what_only_describes_the_source(tmp_path, arch):
    """V0 built from its own text, from the text with a comment and a blank line added (the line
    tables and their strings change, and with them the cubin's bytes; for sm_80 the line table's
    relocations too, in a `.rel.` section) and from a changed guard: the first two have one code
    digest, the third another, on either arch."""
    spec = registry.get("v0")
    defines = registry.variant_defines(spec, spec.config_defines(None), "float16", "float16", True, True)
    text = (jit.KERNEL_DIR / spec.source.name).read_text()
    guard = "if (row >= p.m || col >= p.n) return;"
    assert guard in text
    sources = {"same": text, "moved": "// a comment\n\n" + text, "changed": text.replace(guard, guard.replace(">=", ">", 1))}
    built = {}
    for name, body in sources.items():
        (tmp_path / name).mkdir()
        path = tmp_path / name / spec.source.name
        path.write_text(body)
        built[name] = jit.compile_kernel(f"v0-{name}", path, arch, defines).cubin_path
    assert built["same"].read_bytes() != built["moved"].read_bytes()
    digest = {name: binary.code_digest(p) for name, p in built.items()}
    assert digest["same"] == digest["moved"] != digest["changed"]
    with pytest.raises(ValueError, match="not a 64-bit ELF cubin"):
        binary.code_digest(tmp_path / "same" / spec.source.name)


def _v5_without(tmp_path, config, line, call) -> list[str]:
    """The static checks' problems with V5 (config's build, rc layout) compiled from its source with
    `call` in `line` (which occurs once) removed; the intact build of the same variant passes them."""
    spec = registry.get("v5")
    cfg = spec.config_defines(config)
    variant = static_checks.Variant(spec, "sm_90a", "float16", "float16", True, False, registry.NO_EPILOGUE,
                                    tuple(sorted(cfg.items())))
    text = (jit.KERNEL_DIR / spec.source.name).read_text()
    assert text.count(line) == 1
    path = tmp_path / spec.source.name
    path.write_text(text.replace(line, line.replace(call, "(void)0;", 1)))
    defines = registry.variant_defines(spec, cfg, "float16", "float16", True, False)
    broken = static_checks.check(variant, jit.compile_kernel("v5-without-a-barrier", path, "sm_90a", defines))
    assert static_checks.check(variant, variant.compile()).ok
    return broken.problems


@pytest.mark.parametrize("line", [
    "if (CLUSTER_M > 1) dg::cluster_sync();   // the other block's barriers exist before anything reaches them",
    "    if (CLUSTER_M > 1) dg::cluster_sync();\n}",
])
def test_a_multicast_build_without_one_of_its_cluster_barriers_fails_the_static_checks(tmp_path, line):
    """V5 with B shared by multicast (DG_CLUSTER_M = 2) must synchronise its cluster at the start and
    as its consumers end (registry's sass_counts): without one, a block may write into the other's
    ring before its barriers exist, or exit while the other still writes into it, a race the GPU tier
    never showed. Built from the source with each barrier removed, the check names the count."""
    problems = _v5_without(tmp_path, {"DG_CLUSTER_M": 2}, line, "dg::cluster_sync();")
    assert any("CLUSTER_BAR, the design needs at least 4" in p for p in problems), problems


def test_v5_without_the_block_barrier_after_the_mbarrier_init_fails_the_static_checks(tmp_path):
    """Thread 0 initialises V5's mbarriers; every warp waits for that at the block's one barrier of
    every thread before any mbarrier is used. Without it a warp may poll an mbarrier that does not
    exist yet, a race the GPU tier passed on the H200 (a mutation run), so registry's sass_counts
    counts the block barrier. Built from the source without it, the check names the count."""
    problems = _v5_without(tmp_path, None, "    __syncthreads();\n    if (CLUSTER_M > 1) dg::cluster_sync();",
                           "__syncthreads();")
    assert any("BLOCK_BAR, the design needs at least 1" in p for p in problems), problems


def test_tma_issue_moves_counts_the_r2ur_before_each_operand_load():
    """R2UR moves since the last TMA load or mbarrier wait, summed over the operand loads; a load
    with a cache-policy descriptor (C's, from the loader warp) and moves after the last load are
    not counted."""
    sass = """
        /*0100*/  SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [UR4+0x32060], R2 ;
        /*0110*/  @P3 R2UR UR15, R19 ;
        /*0120*/  R2UR UR14, R27 ;
        /*0130*/  UTMALDG.2D [UR12], [UR6] ;
        /*0140*/  R2UR UR14, R27 ;
        /*0150*/  UTMALDG.2D [UR12], [UR6], desc[UR8] ;
        /*0160*/  UIADD3 UR4, UR4, 0x1, URZ ;
        /*0170*/  UTMALDG.3D [UR8], [UR16] ;
        /*0180*/  R2UR UR9, R3 ;
    """
    assert binary.tma_issue_moves(sass) == 2
    assert binary.sass_features(sass)["TMA_ISSUE_R2UR"] == 2
    assert binary.tma_issue_moves(sass.replace("R2UR", "UMOV")) == 0
    assert binary.tma_issue_moves("/*0000*/  UTMALDG.2D [UR12], [UR6] ;") == 0   # a first load, nothing before it


def _v5_built_with(tmp_path, epilogue, replacements, config=None) -> list[str]:
    """The static checks' problems with V5 (`config`'s build, rc layout, `epilogue`) compiled from
    its source with each (text, new) of `replacements` made (each text occurs once); the intact build
    of the same variant passes them."""
    spec = registry.get("v5")
    cfg = spec.config_defines(config)
    variant = static_checks.Variant(spec, "sm_90a", "float16", "float16", True, False, epilogue,
                                    tuple(sorted(cfg.items())))
    text = (jit.KERNEL_DIR / spec.source.name).read_text()
    for old, new in replacements:
        assert text.count(old) == 1, old
        text = text.replace(old, new)
    path = tmp_path / spec.source.name
    path.write_text(text)
    defines = registry.variant_defines(spec, cfg, "float16", "float16", True, False, epilogue)
    broken = static_checks.check(variant, jit.compile_kernel("v5-replanted", path, "sm_90a", defines))
    assert static_checks.check(variant, variant.compile()).ok
    return broken.problems


@pytest.mark.parametrize("config", [{"DG_CLUSTER_M": 2}, {"DG_BN": 64, "DG_STAGES": 8, "DG_SPLIT_K": 2}])
def test_a_cluster_build_whose_producer_waits_at_a_cluster_barrier_fails_the_static_checks(tmp_path, config):
    """V5's producer warpgroup leaves without the consumers' cluster barriers. Made to wait at one
    (as the split-K and multicast builds once did), warp 0's other lanes stay alive beside the
    producer's thread and ptxas compiles its k-loop for divergence: no test fails and ptxas warns of
    nothing, but every TMA load then waits on R2UR moves. Built that way, the check counts them."""
    exit_ = "        // (vector registers, an R2UR before every TMA load).\n        return;\n"
    problems = _v5_built_with(tmp_path, registry.NO_EPILOGUE,
                              [(exit_, exit_.replace("return;", "dg::cluster_sync();\n        return;"))], config)
    assert any("TMA_ISSUE_R2UR, the design allows at most 0" in p for p in problems), problems


def test_v5_whose_producer_branch_is_divergent_to_the_compiler_fails_the_static_checks(tmp_path):
    """V5's producer thread and its C/bias loader warp take their branches by dg::warp_id_uniform()
    first. With the branches on threadIdx.x alone (as they once were), ptxas compiled the producer's
    k-loop for divergence, in vector registers, and on the H200 it fell behind 64x64 tiles' wgmmas
    with a staged bias; no test failed and ptxas warned of nothing. Built from the source that way,
    with a bias (so the loader exists), the check counts the moves."""
    problems = _v5_built_with(tmp_path, Epilogue(bias="float16"), [
        ("if (dg::warp_id_uniform() == 0) { if (threadIdx.x == 0) {", "if (threadIdx.x == 0) {"),
        ("} } else if (LOADER && dg::warp_id_uniform() == 1) {", "} else if (LOADER && threadIdx.x / 32 == 1) {"),
    ])
    assert any("TMA_ISSUE_R2UR, the design allows at most 0" in p for p in problems), problems


def _elf(sections: dict) -> bytes:
    """A minimal 64-bit little-endian ELF holding `sections` (name -> bytes) and its name table."""
    import struct
    names = b"\0" + b"".join(n.encode() + b"\0" for n in [*sections, ".shstrtab"])
    bodies = [*sections.values(), names]
    offsets, data = [], b""
    for body in bodies:
        offsets.append(0x40 + len(data))
        data += body
    shoff = 0x40 + len(data)
    header = b"\x7fELF\x02\x01\x01" + b"\0" * 9 + struct.pack("<HHIQQQIHHHHHH", 1, 190, 1, 0, 0, shoff, 0, 64, 0, 0, 64,
                                                                len(bodies) + 1, len(bodies))
    table, at = [b"\0" * 64], 1
    for offset, body in zip(offsets, bodies):
        table.append(struct.pack("<IIQQQQIIQQ", at, 1, 0, 0, offset, len(body), 0, 0, 1, 0))
        at = names.index(b"\0", at) + 1
    return header + data + b"".join(table)


def test_the_code_digest_sees_a_sections_bytes_and_its_header_and_skips_the_debug_ones(tmp_path):
    """Same-size code with one byte changed, and the same bytes with other section flags, each
    change the digest (a mutant whose code differs must not pass as the same code); a change in a
    debug section does not, nor in what a no-bits section (shared memory: a size only) points at."""
    import struct

    def digest(sections, text_flags=0):
        data = bytearray(_elf(sections))
        shoff, = struct.unpack_from("<Q", data, 0x28)
        struct.pack_into("<Q", data, shoff + 64 + 8, text_flags)    # the first section's sh_flags
        struct.pack_into("<I", data, shoff + 3 * 64 + 4, 8)         # the third: SHT_NOBITS (a size, no bytes)
        path = tmp_path / "k.cubin"
        path.write_bytes(bytes(data))
        return binary.code_digest(path)
    code = bytes(range(32))
    base = digest({".text.k": code, ".debug_line": b"line 1", ".nv.shared.k": b"x" * 16})
    assert digest({".text.k": code, ".debug_line": b"line 2 moved", ".nv.shared.k": b"x" * 16}) == base
    assert digest({".text.k": code, ".debug_line": b"line 1", ".nv.shared.k": b"y" * 16}) == base  # not its bytes
    assert digest({".text.k": code, ".debug_line": b"line 1", ".nv.shared.k": b"x" * 32}) != base  # its size
    assert digest({".text.k": code[:-1] + b"\xff", ".debug_line": b"line 1", ".nv.shared.k": b"x" * 16}) != base
    assert digest({".text.k": code, ".debug_line": b"line 1", ".nv.shared.k": b"x" * 16}, text_flags=6) != base


def test_kernel_attributes_step_over_every_record_format_and_read_one_that_ends_the_section(tmp_path):
    """Records of each format (no value, a byte, two bytes, a sized value) before the block shape,
    which ends its section; a kernel without the attributes has none; other sections are ignored."""
    import struct
    sval = lambda attr, payload: bytes([4, attr]) + struct.pack("<H", len(payload)) + payload
    info = (bytes([1, 0x3E, 0, 0]) + bytes([2, 0x4C, 16, 0]) + bytes([3, 0x1B, 0xA8, 0])
            + sval(0x17, b"\0" * 12) + sval(0x3D, struct.pack("<3I", 4, 1, 1)) + sval(0x05, struct.pack("<3I", 96, 2, 1)))
    path = tmp_path / "k.cubin"
    path.write_bytes(_elf({".text.k": b"\0" * 16, ".nv.info.k": info, ".nv.info.plain": bytes([1, 0x3E, 0, 0])}))
    assert binary.kernel_attributes(path) == {"k": {"cluster": (4, 1, 1), "max_threads": (96, 2, 1)}, "plain": {}}
