"""Where the project is: jobs run from this checkout, and both apps compose their config from its conf/."""
from pathlib import Path

PROJECT = Path(__file__).resolve().parents[1]
CONF = PROJECT / "conf"
