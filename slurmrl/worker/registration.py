"""How a service announces itself: the address file.

The worker writes `host:port/launch` to the file the controller named on its command
line (`--address-file`), in a directory of the job's user; the controller reads it, as
root, with the care `slurmrl.controller.services.read_address_file` takes. `launch` is
the worker process's random id (`ServiceServer.launch_id`): calls are made out to it
too, so a later launch of the service on the same `host:port` is another service.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def write_address_file(path: Path, address: str) -> None:
    """Write `host:port/launch` atomically, so a reader never sees half an address."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(address + "\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
