"""Stage 3a, plan (`plan=true` / `plan=json`): model arithmetic and the run's forecast from the config alone,
printed for people or programs. Writes nothing; light: no torch, no llm-foundry.
"""
