"""The one error type users see: each problem names the key, what is wrong and the fix; never a stack trace.
Secrets recognised by their form (a URL's password, the tokens of the usual clouds and hubs) are masked in every
message."""
import re
from dataclasses import dataclass, replace

ERROR, WARNING = "error", "warning"

# A URL with a password in it (scheme://user:password@host), anywhere in a text.
URL_PASSWORD = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*://[^/@\s:'\"]*):([^/@\s'\"]+)@")
# Credentials known by their form: (what it is, pattern). Kept to forms that cannot be something else.
TOKEN_FORMS = (
    ("a Hugging Face token", re.compile(r"\bhf_[A-Za-z0-9]{30,}")),
    ("an AWS access key id", re.compile(r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b")),
    ("a GitHub token", re.compile(r"\b(?:gh[pousr]_[A-Za-z0-9]{36,}|github_pat_[A-Za-z0-9_]{40,})")),
    ("a Slack token", re.compile(r"\bxox[abpr]-[A-Za-z0-9-]{10,}")),
    ("an API secret key (sk-...)", re.compile(r"\bsk-[A-Za-z0-9_-]{20,}")),
    ("a GitLab token", re.compile(r"\bglpat-[A-Za-z0-9_-]{20,}")),
    ("a PyPI token", re.compile(r"\bpypi-AgE[A-Za-z0-9_-]{40,}")),
    ("an npm token", re.compile(r"\bnpm_[A-Za-z0-9]{36,}")),
    ("a Google API key", re.compile(r"\bAIza[0-9A-Za-z_-]{35}")),
    ("a Databricks token", re.compile(r"\bdapi[0-9a-f]{32}(?:-\d+)?\b")),
    ("a JSON web token", re.compile(r"\beyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]+")),
    ("an Azure storage account key", re.compile(r"(?i)(?<=AccountKey=)[^;\s'\"]+")),
    ("an Azure SAS signature", re.compile(r"(?i)(?<=[?&]sig=)[^&\s'\"]+")),
    ("a private key", re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----")),
)
MASK = "****"


def mask(text: str, secrets=()) -> str:
    """text with every secret recognised by its form, and each of `secrets`, replaced by ****."""
    for secret in sorted({str(s) for s in secrets if s and len(str(s)) >= 4}, key=len, reverse=True):
        text = text.replace(secret, MASK)
    text = URL_PASSWORD.sub(lambda m: f"{m.group(1)}:{MASK}@", text)
    for _, pattern in TOKEN_FORMS:
        text = pattern.sub(lambda m: m.group(0)[:4] + MASK if len(m.group(0)) > 12 else MASK, text)
    return text


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
        return mask(head + (f"\n  fix: {self.fix}" if self.fix else ""))

    def __str__(self) -> str:
        return self.render()

    def as_warning(self) -> "Problem":
        return replace(self, level=WARNING)

    def masked(self, secrets) -> "Problem":
        """This problem with each of `secrets` (values known to be credentials) replaced by ****."""
        return replace(self, key=mask(self.key, secrets), problem=mask(self.problem, secrets),
                       fix=mask(self.fix, secrets))

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
