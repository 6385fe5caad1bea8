"""The study tooling's library: sweeps, run folders read back, tables, figures, the Hessian, the
critical batch by branching, the mini study's setting, and the benchmarks' timers and measurements.
Their command lines are scripts/sweep.py, report.py, plot.py, hessian.py, cbs.py, mini_study.py
(and the studies built on it, cbs_study.py and replica_study.py), the benchmarks that time training
or an optimizer's step (bench_train.py, bench_instruments.py, bench_batch.py, bench_gelu.py,
bench_nanogpt.py, bench_data.py, bench_optim.py) and check_cuda.py."""
