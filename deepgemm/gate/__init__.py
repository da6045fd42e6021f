"""The benchmark regression gate, in pure modules (no GPU, no pytest):

* ``stats``     Mann-Whitney U (exact, or normal approximation with tie correction) and medians.
* ``runs``      pytest-benchmark runs on disk, the baseline key (GPU model, driver major, CUDA
                major), baseline/history layout under ``regressions/``.
* ``verdict``   the drift-aware verdict per benchmark (same / faster / slower / unsure, plus
                new / missing), its text and Markdown tables.
* ``history``   step changes across stored runs, attributed to the commit where they appeared.
* ``telemetry`` SM clock, temperature and throttle reasons (NVML, else nvidia-smi).
* ``selftest``  planted slowdowns in a copy of kernels/, to prove on a GPU that the gate fails.

``deepgemm.testing.benchplugin`` wires these into ``pytest --benchmark-compare``;
``python -m deepgemm regress`` is the command line. docs/regression-gate.md describes the rule.
"""
