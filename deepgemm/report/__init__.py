"""Reports: the accuracy report (FP32 vs FP16 accumulation, emulated on the CPU or measured
on the GPU), built on the exact accumulation emulation in :mod:`deepgemm.report.emulate`."""
