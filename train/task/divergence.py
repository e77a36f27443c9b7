"""A run whose training loss stays far above where it was has diverged in finite numbers: it stops, non-zero, on
every rank together, before that step's checkpoint is written (composer writes a batch's checkpoint after its
BATCH_END). An evaluation that is not finite stops it too (train/checkpoint/integrity.py: check_eval).
Without this, a run whose loss climbs by orders of magnitude (`optimizer.lr=100` on the tiny model) trains to
its end in finite numbers, evaluates perplexity inf, and exits 0.

The rule is llm-foundry's `kill_loss_spike` callback, configured by its own keys
(`callbacks.kill_loss_spike.<key>=...`, on in every run: conf/train.yaml), decided as follows (common/compat.py:
patch_llmfoundry_kill_loss_spike registers it under that name, adapted):

- the reference is the lowest mean of `window_size` consecutive training losses seen so far (of fewer at the start,
  from the first batch on: a run that diverges in its first window still has where it was);
- a batch is an outlier when its loss is at least `outlier_multiplier` times the reference, or above `loss_cap`
  (when set) once the first window is full (a fresh model's loss is about ln(vocabulary), 10.8 for 50k);
- more than `patience` outliers in a row are a spike that did not come down: the run stops, or rolls back
  (`spike.action`, train/task/spike.py); `log_only: true` warns instead. One bad batch is no such spike: the next
  ordinary loss ends the streak.

The losses are composer's all-reduced `loss/train/total`, the same number on every rank, so every rank decides the
same at the same batch. llm-foundry's own class cannot decide as it is: it reads each rank's own loss (`state.loss`,
before the all-reduce), so ranks can disagree and one rank's raise leaves the others waiting in their next
collective; it compares with the mean of its recent window, which follows a divergence up (a run at 1e7 for a
window has a window mean of 1e7 and no outlier); it waits for a full window of at least 100 batches (a 40-batch run
is never looked at); and it raises its own exception, a traceback rather than the error users read.

Light: no torch (the checks read the settings before anything starts).
"""
import logging
import math
from collections import deque

from common.errors import UserError
from train.checks.core import nearest

log = logging.getLogger(__name__)

KEY = "callbacks.kill_loss_spike"
# the defaults (conf/train.yaml sets them, over llm-foundry's, which are for its own rule): a window of 10
# batches, 3 times its lowest mean, for more than 10 batches in a row. A healthy run's loss stays near its lowest
# window mean; a diverging one rises far past 3 times it
DEFAULTS = {"window_size": 10, "outlier_multiplier": 3.0, "patience": 10, "loss_cap": None, "log_only": False}


def problems(settings) -> list:
    """[(key, problem, fix)] of kill_loss_spike's settings (a mapping, or None for the defaults)."""
    if settings is None:
        return []
    if not hasattr(settings, "keys"):
        return [(KEY, f"{settings!r} is not a mapping of {', '.join(DEFAULTS)}",
                 f"e.g. {KEY}.outlier_multiplier=5")]
    found = []
    for k in settings.keys():
        v = settings[k]
        least = 1 if k == "window_size" else 0  # patience 0: the first outlier stops the run
        if k not in DEFAULTS:
            near = nearest(k, DEFAULTS)
            found.append((f"{KEY}.{k}", f"is not a setting of kill_loss_spike (it takes {', '.join(DEFAULTS)})",
                          f"did you mean `{near}`?" if near else f"remove it (~{KEY}.{k})"))
        elif k in ("window_size", "patience") and not (isinstance(v, int) and not isinstance(v, bool) and v >= least):
            found.append((f"{KEY}.{k}", f"must be a whole number of batches, {least} or more, got {v!r}",
                          f"{KEY}.{k}={DEFAULTS[k]} (the default)"))
        elif k == "outlier_multiplier" and not (_number(v) and v > 1):
            found.append((f"{KEY}.{k}", f"must be a number above 1 (times where the loss was), got {v!r}",
                          f"{KEY}.{k}={DEFAULTS[k]:g} (the default)"))
        elif k == "loss_cap" and v is not None and not (_number(v) and v > 0):
            found.append((f"{KEY}.{k}", f"must be a positive loss or null, got {v!r}", f"{KEY}.{k}=null (none)"))
        elif k == "log_only" and not isinstance(v, bool):
            found.append((f"{KEY}.{k}", f"must be true or false, got {v!r}", f"{KEY}.{k}=true"))
    return found


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


class Divergence:
    """Fed every training loss in order (a resumed run's history first); says when the run has diverged."""

    def __init__(self, settings=None):
        wrong = problems(settings)
        if wrong:
            raise UserError(*wrong[0])
        s = {**DEFAULTS, **dict(settings or {})}
        self.window_size, self.patience = int(s["window_size"]), int(s["patience"])
        self.outlier_multiplier, self.log_only = float(s["outlier_multiplier"]), bool(s["log_only"])
        self.loss_cap = None if s["loss_cap"] is None else float(s["loss_cap"])
        self._window, self._sum, self._seen = deque(), 0.0, 0
        self.reference = self.reference_batch = None  # the lowest window mean so far, and the batch it ended at
        # the outliers in a row up to the newest batch: how many, the batch of the first, the newest (batch, loss)
        self.outliers, self.since, self.last = 0, None, None
        self._warned = False

    def feed(self, batch: int, loss: float) -> bool:
        """True when, with this loss, more than `patience` batches in a row were outliers."""
        if not math.isfinite(loss):
            return False  # integrity.check_loss stops a run at a non-finite loss, with its own words
        self._seen += 1
        high = self.reference is not None and (
            loss >= self.outlier_multiplier * self.reference
            or (self.loss_cap is not None and self._seen > self.window_size and loss > self.loss_cap))
        if high:
            self.outliers, self.since, self.last = self.outliers + 1, self.since or batch, (batch, loss)
        else:
            self.outliers, self.since, self._warned = 0, None, False
        # the window moves on after the judgement: a loss is compared with where the run was before it
        self._window.append(loss)
        self._sum += loss
        if len(self._window) > self.window_size:
            self._sum -= self._window.popleft()
        mean = self._sum / len(self._window)
        if self.reference is None or mean < self.reference:
            self.reference, self.reference_batch = mean, batch
        return self.outliers > self.patience

    def state(self) -> dict:
        """What the rule has seen, as plain values (kept in checkpoints: a resume goes on judging where it was)."""
        return {"window": list(self._window), "seen": self._seen, "reference": self.reference,
                "reference_batch": self.reference_batch, "outliers": self.outliers, "since": self.since,
                "last": list(self.last) if self.last else None}

    def restore(self, saved: dict) -> None:
        self._window = deque(float(x) for x in saved["window"])
        self._sum, self._seen = sum(self._window), int(saved["seen"])
        self.reference, self.reference_batch = saved["reference"], saved["reference_batch"]
        self.outliers, self.since = int(saved["outliers"]), saved["since"]
        self.last, self._warned = tuple(saved["last"]) if saved["last"] else None, False

    def words(self, step: str, since_checkpoints=(), stops: bool = True) -> tuple[str, str, str]:
        """(key, problem, fix) of a divergence just found at `step`. since_checkpoints: the batches of checkpoints
        written during the streak (they hold weights already diverging). stops: False for log_only's warning."""
        loss, start = self.last[1], self.since
        capped = self.loss_cap is not None and loss > self.loss_cap and \
            loss < self.outlier_multiplier * self.reference
        above = (f"above loss_cap={self.loss_cap:g}" if capped else
                 f"{loss / self.reference:,.3g} times {self.reference:.4g}, where the loss was (its lowest "
                 f"{self.window_size}-batch running mean so far, at batch {self.reference_batch})")
        problem = (f"the training loss is {loss:.6g} at {step}, {above}, and has been over "
                   f"{self.outlier_multiplier:g} times that mean{' or loss_cap' if self.loss_cap else ''} for "
                   f"{self.outliers} batches in a row (since batch {start}, patience={self.patience}): the run "
                   + ("diverged; it stopped there, before that step's checkpoint" if stops else
                      "looks diverged; it goes on (log_only=true)"))
        if since_checkpoints:
            many = len(since_checkpoints) > 1
            problem += (f"; the checkpoint{'s' * many} at batch{'es' * many} {', '.join(map(str, since_checkpoints))}, "
                        f"written since the loss rose, hold{'' if many else 's'} diverging weights")
        before = f"before batch {start}" if since_checkpoints else ""
        fix = (f"continue it from its last good checkpoint{' ' * bool(before)}{before} as a new run under a lower "
               "optimizer.lr (or a longer scheduler.t_warmup): continue_from=<this run>@ba<N> (docs/resume.md); "
               + self.expected())
        return "loss/train/total", problem, fix

    def expected(self) -> str:
        """The fix where the rise is no divergence."""
        return (f"if the rise is expected (other data from here on), a larger {KEY}.outlier_multiplier (now "
                f"{self.outlier_multiplier:g}) or {KEY}.patience (now {self.patience}), or {KEY}.log_only=true; "
                "spike.action=rollback goes back and skips the data by itself (docs/resume.md)")

    def warn_once(self, step: str, since_checkpoints=()) -> None:
        """log_only: one warning per streak, then training goes on."""
        if not self._warned:
            self._warned = True
            key, problem, _ = self.words(step, since_checkpoints, stops=False)
            log.warning(f"{key}: {problem}")
