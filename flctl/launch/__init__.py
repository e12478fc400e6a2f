"""Launching a sweep: W pull workers through a launcher (flctl.launch.backends: debug in process, local
subprocesses, Slurm job arrays, or an installed one).

A sweep's cells are rows in the database, not arguments of jobs: each worker (flctl.launch.worker) claims the next
one until none is left. By job: settings (LaunchFlags, LaunchSettings), backends (the launchers, Slot), plan
(`flctl sweep`'s checks and launch), flow (fill a planned sweep: launch or search, wait, sync), worker (the pull loop, and
submit: start workers through the launcher), recipe (what a worker is made of), jobs (results/jobs/<sweep>/ and its trust checks),
wait (until a sweep settles), tune (a --tune search), cancel. Each launcher is one file of backends/, its flags,
job-system commands and what its jobs are given included.
"""
