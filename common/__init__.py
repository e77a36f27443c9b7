"""What the two apps (train, data_prep) share, one way each: the error users see (errors.py), writing a file or
folder so readers never see half of it (files.py), the signal reset for forked workers (signals.py), where the
project and its conf/ are (paths.py), where a process keeps the GC from walking the libraries' objects
(collector.py). Light: the standard library only."""
