"""Where a process of ours keeps Python's cyclic GC from walking objects that live as long as the process.

A process that imports composer and llm-foundry (a training task, export, sample, evaluate) creates hundreds of
thousands of objects on the way, nearly all of them module state kept to the end. The GC would walk them again and
again, for nothing it could free:
- while they are imported (each collection of the oldest generation walks all made so far): with the GC paused
  and the result frozen, each later full collection walks what the run itself made, not the libraries
  (`imported_without_collections`);
- while Python tears its modules down at exit, after the run's answer is printed (`without_teardown_collections`).
Freezing keeps objects out of collections; it never frees or keeps anything else: a frozen object still goes
when its last reference does."""
import atexit
import gc
import importlib


def imported_without_collections(*modules: str) -> None:
    """Import `modules` with the cyclic GC paused, then freeze what exists (the GC's own advice before forking:
    dataloader workers share those pages instead of copying them as a collection touches each object). What
    cyclic garbage the imports left (a few MB) is kept: collecting it would walk everything once more."""
    paused = gc.isenabled()
    gc.disable()
    try:
        for name in modules:
            importlib.import_module(name)
    finally:
        gc.freeze()
        if paused:
            gc.enable()


def without_teardown_collections() -> None:
    """Register at import, before the libraries' own handlers: exit handlers run last-registered first. The last
    handler collects what is garbage then (its finalizers run, as at exit) and freezes the rest; every other exit
    handler (logging's flush, the trackers') runs before it as it would."""
    atexit.register(_collect_then_freeze)


def _collect_then_freeze() -> None:
    gc.collect()
    gc.freeze()
