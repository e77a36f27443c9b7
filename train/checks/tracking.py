"""Experiment tracking (conf/logger/): what the tracker would refuse only once the trainer is built, after data
and model set-up, or on the first requeue. Light: reads the config only; neither mlflow nor wandb is imported, and
no tracking server is contacted."""
from train.checks.core import Problem, value

# MLflow's database stores (SqlAlchemyStore): MLflow 2.22 imports `FallbackAsyncAdaptedQueuePool`, which the
# SQLAlchemy 2.1 in requirements.lock lacks, so `sqlite:`/`postgresql:`/... URIs fail at the first call.
DATABASE_SCHEMES = ("sqlite", "postgresql", "mysql", "mssql")
# W&B run ids may not hold these (the id is the run_name and a start time, conf/logger/wandb.yaml); `/` and `\` are
# refused for every run_name (train/checks/safety.py).
WANDB_ID_FORBIDDEN = "#?%:"


def mlflow_store(cfg, ctx):
    uri = value(cfg, "loggers.mlflow.tracking_uri")
    scheme = str(uri).partition(":")[0].split("+")[0].lower() if uri else ""
    if scheme in DATABASE_SCHEMES:
        yield Problem("loggers.mlflow.tracking_uri", f"a {scheme} database store: MLflow 2.22's database store does "
                      "not import with the SQLAlchemy pinned in requirements.lock (2.1), so the run would fail when "
                      "it starts tracking", "a file store, MLFLOW_TRACKING_URI=file:/shared/mlruns (the default: "
                      "<storage outputs>/mlruns), or an MLflow server, MLFLOW_TRACKING_URI=http://host:5000")


def wandb_run_id(cfg, ctx):
    if value(cfg, "loggers.wandb") is None:
        return
    name = value(cfg, "loggers.wandb.init_kwargs.id")
    bad = sorted({c for c in str(name) if c in WANDB_ID_FORBIDDEN})
    if name is not None and bad:
        yield Problem("run_name", f"{name!r} is the W&B run id here (logger=wandb), and W&B refuses ids holding "
                      f"{' '.join(bad)}", "a run_name of letters, digits, `-`, `_` and `.`")


RULES = [mlflow_store, wandb_run_id]
