"""The one error type users see: each problem names the key, what is wrong and the fix; never a stack trace."""
from dataclasses import dataclass, replace

ERROR, WARNING = "error", "warning"


@dataclass(frozen=True)
class Problem:
    """One thing wrong: the key to change, what is wrong (and who would refuse it), the fix. An error stops the
    command before anything starts; a warning is printed and the command goes on."""

    key: str
    problem: str
    fix: str = ""
    level: str = ERROR

    def render(self, prefix: str | None = None) -> str:
        head = f"{prefix or self.level}: {self.key}: {self.problem}"
        return head + (f"\n  fix: {self.fix}" if self.fix else "")

    def __str__(self) -> str:
        return self.render()

    def as_warning(self) -> "Problem":
        return replace(self, level=WARNING)

    def at_point(self, num: int) -> "Problem":
        return replace(self, key=f"[sweep point #{num}] {self.key}")


class UserError(Exception):
    """Problems that stop a command; `problems` holds every one found. Each app prints it and exits 2.
    `prefix`: how its lines start (the app's name, or `error`)."""

    prefix = ERROR

    def __init__(self, key: str = "", problem: str = "", fix: str = "", problems: list | None = None):
        self.problems = list(problems) if problems else [Problem(key, problem, fix)]
        first = self.problems[0]
        self.key, self.problem, self.fix = first.key, first.problem, first.fix
        super().__init__("\n".join(p.render(self.prefix if p.level == ERROR else None) for p in self.problems))

    def __reduce__(self):  # pickled into a job's result file, and rebuilt with every problem
        return type(self), ("", "", "", self.problems)
