"""Launching a sweep: W pull workers through submitit, debug (in process), local (subprocesses) or Slurm.

A sweep's cells are rows in the database, not arguments of jobs: each worker (flctl.launch.worker) claims the next
one until none is left. By job: settings (LaunchSettings, Slot), plan (`flctl sweep`'s checks and launch), submit
(submitit), worker (the pull loop), jobs (results/jobs/<sweep>/ and its trust checks), slurm (every Slurm command
flctl runs itself), cancel.
"""

from flctl.launch.cancel import cancel
from flctl.launch.jobs import has_workers, live_controllers, live_workers, private_folder, submitted_jobs
from flctl.launch.plan import Launched, SweepPlan, launch_sweep, plan_sweep
from flctl.launch.settings import LaunchSettings, Slot, SlurmOptions, batch_runs_for, local_slots, slurm_workers
from flctl.launch.submit import submit
from flctl.launch.worker import Worker

__all__ = ["LaunchSettings", "Launched", "Slot", "SlurmOptions", "SweepPlan", "Worker", "batch_runs_for", "cancel",
           "has_workers", "launch_sweep", "live_controllers", "live_workers", "local_slots", "plan_sweep",
           "private_folder", "slurm_workers", "submit", "submitted_jobs"]
