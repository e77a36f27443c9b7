"""The one error type users see: a message naming the key and the fix, never a stack trace."""


class DataPrepError(Exception):
    """Bad input or settings. __main__ prints it and exits non-zero."""

    def __init__(self, key: str, problem: str, fix: str = ""):
        self.key, self.problem, self.fix = key, problem, fix
        text = f"data_prep: {key}: {problem}"
        if fix:
            text += f"\n  fix: {fix}"
        super().__init__(text)
