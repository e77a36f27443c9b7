"""Checkpoints as the task meets them: where a run resumes from (decided by content, before the trainer starts)
and whether a checkpoint is what was written.
"""
