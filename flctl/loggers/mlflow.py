"""The ``mlflow`` logger: a run per flctl run in the tracking server MLFLOW_TRACKING_URI names (default: a SQLite
store in the results folder, RESULTS/mlflow.db), in the experiment MLFLOW_EXPERIMENT_NAME (default "flctl"). A run is
keyed by its id (the tag flctl.run_id): a resumed run goes on in its MLflow run, and `flctl export` replaces it."""

from __future__ import annotations

import math
import os
from typing import Any

from flctl.loggers.base import Logger, RunInfo

PARAM_LIMIT = 6000     # MLflow's longest parameter value
SEND_EVERY_S = 5.0     # how often a run's metrics go to the tracking store while it trains


def _quiet() -> None:
    """MLflow's and Alembic's INFO lines (a store's tables made or upgraded) off a run's output: flctl says what
    matters in its own lines."""
    import logging

    for name in ("mlflow", "alembic"):
        logging.getLogger(name).setLevel(logging.WARNING)


_OURS: dict[str, str] = {}     # what _bounded_requests set, which the next FLCTL_TRACKER_TIMEOUT_S may change


def _bounded_requests() -> None:
    """Each HTTP request to the tracking server given FLCTL_TRACKER_TIMEOUT_S and made once: MLflow's own defaults
    (a 120 s timeout, 7 retries with backoff) held a run silent for minutes before one warning. MLflow reads these
    at each request; a value the user set stays (the guard of every tracker call bounds it still)."""
    from flctl.knobs import tracker_timeout_s

    seconds = str(max(1, math.ceil(tracker_timeout_s())))       # MLflow reads a whole number of seconds
    for key, value in (("MLFLOW_HTTP_REQUEST_TIMEOUT", seconds), ("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")):
        if os.environ.get(key) in (None, _OURS.get(key)):
            os.environ[key] = _OURS[key] = value


def tracking_uri(results_root: Any) -> str:
    """Where MLflow logs: MLFLOW_TRACKING_URI, else a SQLite store in the results folder."""
    from flctl.db.urls import file_url
    from flctl.layout import Layout

    return os.environ.get("MLFLOW_TRACKING_URI") or file_url(Layout(results_root).mlflow_db.absolute())


class MLflow(Logger):
    name = "mlflow"
    needs = "mlflow"
    extra = "mlflow"
    imports = ("mlflow.entities", "mlflow.tracking")

    @classmethod
    def where(cls, results_root: Any) -> str:
        return f"{tracking_uri(results_root)}, experiment {experiment_name()}"

    @classmethod
    def prepare(cls, results_root: Any) -> None:
        """The store (its schema) and the experiment made once, before a sweep's workers would race to make them."""
        from mlflow.tracking import MlflowClient

        _quiet()
        _bounded_requests()
        _experiment(MlflowClient(tracking_uri=tracking_uri(results_root)))

    def start(self, run: RunInfo) -> None:
        import time

        from mlflow.entities import Param
        from mlflow.tracking import MlflowClient

        _quiet()
        _bounded_requests()
        self.client = MlflowClient(tracking_uri=tracking_uri(self.results_root))
        self.pending: list[Any] = []
        self.sent = time.time()
        experiment_id = _experiment(self.client)
        earlier = self.client.search_runs([experiment_id], f"tags.`flctl.run_id` = '{run.run_id}'")
        if earlier and not run.replay:          # a resumed run: its log goes on
            self.run_id = earlier[0].info.run_id
            self.client.update_run(self.run_id, status="RUNNING")
            return
        for found in earlier:                   # an export replaces an earlier log, never adds to it
            self.client.delete_run(found.info.run_id)
        self.run_id = self.client.create_run(experiment_id, run_name=run.title or run.run_id, tags=run.tags).info.run_id
        self.client.log_batch(self.run_id, params=[Param(k, str(v)[:PARAM_LIMIT]) for k, v in run.params.items()])

    def log(self, epoch: int, scalars: dict[str, float], multipliers: Any = None) -> None:
        """Kept, and sent every SEND_EVERY_S and at the end: a request to the tracking store costs more than a small
        model's epoch (a two-moons run logged every evaluation took 1.33x as long)."""
        import time

        from mlflow.entities import Metric

        now = time.time()
        self.pending += [Metric(k, v, int(now * 1000), epoch) for k, v in scalars.items()]
        if now - self.sent >= SEND_EVERY_S:
            self._send()

    def _send(self, tags: list[Any] | None = None) -> None:
        import time

        for start in range(0, max(len(self.pending), 1), 1000):        # MLflow takes at most 1000 metrics a batch
            self.client.log_batch(self.run_id, metrics=self.pending[start:start + 1000], tags=tags or [])
            tags = None
        self.pending, self.sent = [], time.time()

    def finish(self, status: str) -> None:
        from mlflow.entities import RunTag

        from flctl.status import Status

        self._send([RunTag("flctl.status", status)])
        ended = {Status.COMPLETED: "FINISHED", Status.INTERRUPTED: "KILLED"}.get(Status(status), "FAILED")
        self.client.set_terminated(self.run_id, ended)


def experiment_name() -> str:
    """MLFLOW_EXPERIMENT_NAME, default "flctl"."""
    return os.environ.get("MLFLOW_EXPERIMENT_NAME") or "flctl"


def _experiment(client: Any) -> str:
    """The id of the experiment runs are logged to (MLFLOW_EXPERIMENT_NAME, default "flctl"), made if need be (by
    another worker meanwhile, too)."""
    name = experiment_name()
    if (found := client.get_experiment_by_name(name)) is not None:
        return str(found.experiment_id)
    try:
        return str(client.create_experiment(name))
    except Exception:    # noqa: BLE001 - made by another process between the two calls
        if (found := client.get_experiment_by_name(name)) is None:
            raise
        return str(found.experiment_id)
