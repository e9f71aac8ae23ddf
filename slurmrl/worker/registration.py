"""How a service announces itself: an address file, and optionally the controller.

Registration is one signed `POST` of `{job_id, role, address, pid, step_id}` (JSON) to
the URL the controller put on the service's command line, retried a few times with
backoff while the controller restarts. The signature is made with the job's secret
(`slurmrl.auth.tokens.sign`), the same one the data plane uses. What the controller does
with it is the controller's business; this module only sends it.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path
from urllib.parse import urlsplit

from slurmrl.auth.tokens import sign


class RegistrationError(Exception):
    """The controller could not be reached or refused the registration."""


@dataclass(frozen=True)
class Registration:
    job_id: str
    role: str
    address: str  #: host:port the service listens on
    pid: int
    step_id: str | None


def write_address_file(path: Path, address: str) -> None:
    """Write `host:port` atomically, so a reader never sees half an address."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(address + "\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def register(
    url: str,
    secret: str,
    reg: Registration,
    attempts: int = 5,
    timeout_s: float = 5.0,
    backoff_s: float = 0.2,
) -> None:
    """POST the registration; raises RegistrationError after the last failed attempt."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise RegistrationError(f"--register-url {url!r} is not an http(s) URL")
    path = parts.path or "/"
    if parts.query:
        path += "?" + parts.query
    body = json.dumps(asdict(reg)).encode()
    headers = {"Content-Type": "application/json", **sign(secret, "POST", path, body)}
    last = ""
    for attempt in range(attempts):
        req = urllib.request.Request(url, data=body, headers=headers, method="POST")
        try:
            with urllib.request.urlopen(req, timeout=timeout_s) as resp:
                resp.read()
                return
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace")[:500]
            if 400 <= exc.code < 500:
                raise RegistrationError(
                    f"controller refused the registration ({exc.code}): {detail}"
                ) from exc
            last = f"HTTP {exc.code}: {detail}"
        except (urllib.error.URLError, OSError) as exc:
            last = str(exc)
        time.sleep(backoff_s * 2**attempt)
    raise RegistrationError(f"could not register with {url} after {attempts} attempts: {last}")
