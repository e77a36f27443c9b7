"""What a run shows on its console, and what goes to its log file alone.

The console holds this tool's own messages (what it does, its progress, its warnings and errors) and any
library's errors: one screen for a default run. Everything else the libraries say (llm-foundry's resolved
config, composer's, streaming's and transformers' notes, Python's warnings) goes to the run's log file,
`<outputs>/<run_name>/__main__.log`, with times and logger names. llm-foundry's own `python_log_level`
(`python_log_level=info`, `debug`) shows the libraries' messages of that level on the console too, and Hydra's
`hydra.verbose` (`true`, or the loggers to show: `hydra.verbose=[composer]`) every message of those loggers."""
import logging

# the loggers of this tool's packages (`logging.getLogger(__name__)`) and the sweep's
OURS = ("train", "common", "data_prep", "hydra_plugins", "__main__", "sweep")


class Console(logging.Filter):
    """The console handler's filter (conf/hydra/job_logging/train.yaml). level: python_log_level, or None;
    verbose: hydra.verbose (false, true, or logger names)."""

    def __init__(self, level=None, verbose=False):
        super().__init__()
        found = logging.getLevelName(str(level).upper()) if level else None
        self.level = found if isinstance(found, int) else None
        names = [verbose] if isinstance(verbose, str) else list(verbose) if not isinstance(verbose, bool) else []
        self.every, self.names = verbose is True, tuple(str(n) for n in names)

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.ERROR or record.name.split(".")[0] in OURS or self.every:
            return True
        if self.names and (record.name in self.names or record.name.startswith(tuple(n + "." for n in self.names))):
            return True
        return self.level is not None and record.levelno >= self.level


def library_levels(level) -> None:
    """What llm-foundry does with python_log_level, without its `logging.basicConfig(force=True)`, which replaces
    the run's handlers (its log file would stop, the console filter would go): the levels of its loggers and
    streaming's."""
    if level:
        for name in ("llmfoundry", "llmfoundry.command_utils.train", "streaming"):
            logging.getLogger(name).setLevel(str(level).upper())


class _Lines:
    """A stream whose writes become messages of one logger (at INFO): what a library prints."""

    def __init__(self, logger: logging.Logger):
        self.logger, self.pending = logger, ""

    def write(self, text: str) -> int:
        self.pending += text
        if self.pending.endswith("\n"):
            self.flush()
        return len(text)

    def flush(self) -> None:
        text, self.pending = self.pending.rstrip("\n"), ""
        if text.strip():
            self.logger.info(text)


def printed_to_the_log(name: str) -> _Lines:
    """For contextlib.redirect_stdout: a library's prints (llm-foundry prints the whole resolved config as it
    starts) go to the run's log through the logger `name`, not to stdout, which holds only the answer."""
    return _Lines(logging.getLogger(name))


def libraries_to_the_log() -> None:
    """Python's warnings and transformers' messages through logging (so the console filter decides): warnings
    would go to stderr, and transformers writes through a handler of its own."""
    logging.captureWarnings(True)
    try:
        from transformers.utils import logging as hf_logging
    except ImportError:
        return
    hf_logging.disable_default_handler()
    hf_logging.enable_propagation()
