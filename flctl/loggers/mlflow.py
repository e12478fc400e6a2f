"""The ``mlflow`` logger: a run per flctl run in the tracking server MLFLOW_TRACKING_URI names (default: a SQLite
store in the results folder, RESULTS/mlflow.db), in the experiment MLFLOW_EXPERIMENT_NAME (default "flctl"). A run is
keyed by its id (the tag flctl.run_id): a resumed run goes on in its MLflow run, and `flctl export` replaces it."""

from __future__ import annotations

import os
from typing import Any

from flctl.loggers import Logger, RunInfo

PARAM_LIMIT = 6000     # MLflow's longest parameter value


def tracking_uri(results_root: Any) -> str:
    """Where MLflow logs: MLFLOW_TRACKING_URI, else a SQLite store in the results folder."""
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{os.path.abspath(results_root)}/mlflow.db"


class MLflow(Logger):
    name = "mlflow"
    needs = "mlflow"
    extra = "mlflow"

    @classmethod
    def prepare(cls, results_root: Any) -> None:
        """The store (its schema) and the experiment made once, before a sweep's workers would race to make them."""
        from mlflow.tracking import MlflowClient

        _experiment(MlflowClient(tracking_uri=tracking_uri(results_root)))

    def start(self, run: RunInfo) -> None:
        from mlflow.entities import Param, RunTag
        from mlflow.tracking import MlflowClient

        self.client = MlflowClient(tracking_uri=tracking_uri(self.results_root))
        experiment_id = _experiment(self.client)
        earlier = self.client.search_runs([experiment_id], f"tags.`flctl.run_id` = '{run.run_id}'")
        if earlier and not run.replay:          # a resumed run: its log goes on
            self.run_id = earlier[0].info.run_id
            self.client.update_run(self.run_id, status="RUNNING")
            return
        for found in earlier:                   # an export replaces an earlier log, never adds to it
            self.client.delete_run(found.info.run_id)
        self.run_id = self.client.create_run(experiment_id, run_name=run.run_id, tags=run.tags).info.run_id
        self.client.log_batch(self.run_id, params=[Param(k, str(v)[:PARAM_LIMIT]) for k, v in run.params.items()],
                              tags=[RunTag("mlflow.runName", run.run_id)])

    def log(self, epoch: int, scalars: dict[str, float], multipliers: Any = None) -> None:
        import time

        from mlflow.entities import Metric

        stamp = int(time.time() * 1000)
        self.client.log_batch(self.run_id, metrics=[Metric(k, v, stamp, epoch) for k, v in scalars.items()])

    def finish(self, status: str) -> None:
        self.client.set_tag(self.run_id, "flctl.status", status)
        from flctl.status import Status

        ended = {Status.COMPLETED: "FINISHED", Status.INTERRUPTED: "KILLED"}.get(Status(status), "FAILED")
        self.client.set_terminated(self.run_id, ended)


def _experiment(client: Any) -> str:
    """The id of the experiment runs are logged to (MLFLOW_EXPERIMENT_NAME, default "flctl"), made if need be (by
    another worker meanwhile, too)."""
    name = os.environ.get("MLFLOW_EXPERIMENT_NAME") or "flctl"
    if (found := client.get_experiment_by_name(name)) is not None:
        return str(found.experiment_id)
    try:
        return str(client.create_experiment(name))
    except Exception:    # noqa: BLE001 - made by another process between the two calls
        if (found := client.get_experiment_by_name(name)) is None:
            raise
        return str(found.experiment_id)
