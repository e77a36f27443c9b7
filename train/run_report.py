"""A Composer callback that keeps the loss history and writes the run's report at the end of fit:
`metrics.json` (final losses, tokens/s) and `loss_curve.png`, in the run's output folder.

The history travels inside checkpoints (state_dict), so a resumed run still reports its whole curve. It is
kept there as one JSON string: torch's distributed checkpoint flattens nested lists and dicts into one key per
leaf, and a fresh callback offering the nested shape would miss those keys at load (the state after an
evaluation could not be resumed from a sharded checkpoint). One string is one key in every format and world size.
Registered with llm-foundry's callback registry as `run_report`, so it is configured like any other callback.
"""
import json
import time
from pathlib import Path

from composer.core import Callback, State
from composer.loggers import Logger
from composer.utils import dist

from common import files


class RunReport(Callback):
    def __init__(self, folder: str):
        self.folder = Path(folder)
        self.train = []  # [batch, loss] (loss averaged over ranks)
        self.evals = []  # [batch, {metric: value}]
        self._t0 = self._tok0 = None
        self.tokens_per_sec = None

    def batch_end(self, state: State, logger: Logger) -> None:
        loss = (state.total_loss_dict or {}).get("loss/train/total")
        if loss is not None:
            self.train.append([int(state.timestamp.batch), float(loss)])
        now, tokens = time.perf_counter(), int(state.timestamp.token)
        if self._t0 is None:  # the first batch carries start-up costs; measure from its end
            self._t0, self._tok0 = now, tokens
        elif now > self._t0:
            self.tokens_per_sec = (tokens - self._tok0) / (now - self._t0)

    def eval_end(self, state: State, logger: Logger) -> None:
        for label, metrics in state.eval_metrics.items():
            values = {f"{label}/{name}": float(m.compute()) for name, m in metrics.items()}
            self.evals.append([int(state.timestamp.batch), values])

    def fit_end(self, state: State, logger: Logger) -> None:
        if dist.get_global_rank() != 0:
            return
        self.folder.mkdir(parents=True, exist_ok=True)
        summary = {
            "run_name": state.run_name,
            "batches": int(state.timestamp.batch),
            "tokens": int(state.timestamp.token),
            "world_size": dist.get_world_size(),
            "final_train_loss": self.train[-1][1] if self.train else None,
            "final_eval": self.evals[-1][1] if self.evals else {},
            "tokens_per_sec": self.tokens_per_sec,
            "train_loss": self.train,
            "eval": self.evals,
        }
        files.atomic_write(self.folder / "metrics.json", json.dumps(summary, indent=1).encode())  # read by summaries
        self._plot()

    def _plot(self) -> None:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(7, 4))
        if self.train:
            ax.plot(*zip(*self.train), label="train loss")
        points = [(b, v) for b, m in self.evals for k, v in m.items() if k.endswith("LanguageCrossEntropy")]
        if points:
            ax.plot(*zip(*points), "o-", label="eval cross-entropy")
        ax.set_xlabel("batch")
        ax.set_ylabel("loss")
        ax.legend()
        ax.grid(alpha=0.3)
        fig.tight_layout()
        fig.savefig(self.folder / "loss_curve.png", dpi=100)
        plt.close(fig)

    def state_dict(self) -> dict:
        return {"history": json.dumps({"train": self.train, "evals": self.evals})}

    def load_state_dict(self, state: dict) -> None:
        history = state["history"]
        history = json.loads(history.decode() if isinstance(history, bytes) else history)
        self.train, self.evals = history["train"], history["evals"]


def register() -> None:
    from llmfoundry.registry import callbacks

    if "run_report" not in callbacks:
        callbacks.register("run_report", func=RunReport)
