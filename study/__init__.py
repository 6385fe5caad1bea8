"""The study tooling's library: sweeps, run folders read back, tables, figures, the Hessian.
Their command lines are scripts/sweep.py, report.py, plot.py, hessian.py and mini_study.py."""
