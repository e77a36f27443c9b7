"""Stage 3b, launch (`-m`): training's side of the sweep launcher in common/sweep/ -- each
point's resources, requeue with bad nodes excluded, and what counts as a finished run. Light: no torch.
"""
