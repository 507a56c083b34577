"""Keys never leave the process: every error text written or printed, and everything
logged to MLflow, passes through here.

Values of secret-looking environment variables (`OPENAI_API_KEY`, `HF_TOKEN`, …) are
replaced by `***` wherever they appear, and so is anything after `Bearer` or an
`Authorization`/`api-key` header (a server that echoes the request). Settings named
like a secret (`api_key`, `password`, `access_token`) are redacted by name; counts
such as `max_tokens` are not secrets.
"""

from __future__ import annotations

import os
import re

_SECRET_ENV = re.compile(r"KEY|TOKEN|SECRET|PASSWORD|CREDENTIAL|AUTH", re.IGNORECASE)
_SECRET_NAME = re.compile(r"(^|[._-])(api[_-]?key|key|secret|password|passwd|token|access[_-]?token|"
                          r"credentials?|authorization)$", re.IGNORECASE)
_BEARER = re.compile(r"(?i)((?:authorization|x-api-key|api[-_]key)[\"']?\s*[:=]\s*[\"']?(?:bearer\s+|basic\s+)?"
                     r"|bearer\s+)(?!bearer\b|basic\b)[A-Za-z0-9._~+/=-]{6,}")


def secret_values() -> list[str]:
    """Values of the environment's secret-looking variables (long enough to be keys)."""
    return [v for k, v in os.environ.items() if _SECRET_ENV.search(k) and v and len(v) >= 8]


def is_secret_name(name: str) -> bool:
    return bool(_SECRET_NAME.search(str(name)))


def scrub(text: str, secrets: list[str] | None = None) -> str:
    """The text with every key it holds replaced by `***`."""
    for value in secret_values() if secrets is None else secrets:
        text = text.replace(value, "***")
    return _BEARER.sub(lambda m: m.group(1) + "***", text)


def redact(value, secrets: list[str] | None = None):
    """A JSON-like value with secrets scrubbed from its text and secret-named keys blanked."""
    secrets = secret_values() if secrets is None else secrets
    if isinstance(value, str):
        return scrub(value, secrets)
    if isinstance(value, dict):
        return {k: ("***" if is_secret_name(k) and v not in (None, "") else redact(v, secrets))
                for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [redact(v, secrets) for v in value]
    return value


def printable(text: object) -> str:
    """Text from a file made safe for one line of stderr: no newlines or control
    characters that could forge another line."""
    return "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in str(text))
