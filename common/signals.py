"""Slurm signals every process of a job step, forked workers included, and a worker forked from a submitit job
inherits submitit's handlers: SIGTERM bypassed (a pool could never end its workers) and USR2 answered by
checkpointing and requeueing the job (a second requeue racing the task's own). Only the task answers."""
import os
import signal


def leave_to_the_task() -> None:
    """In a forked worker: SIGTERM ends it, USR2 is the task's business."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGUSR2, signal.SIG_IGN)


def leave_to_the_task_in_every_fork() -> None:
    """In the task: every process it forks from now on (dataloader workers) leaves the signals to it."""
    os.register_at_fork(after_in_child=leave_to_the_task)
