"""The address file a worker announces itself with: written whole, or not at all."""

from __future__ import annotations

from pathlib import Path

from slurmrl.worker.registration import write_address_file


def test_address_file_is_written_whole(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "addr"
    write_address_file(path, "h:1")
    write_address_file(path, "h:2")
    assert path.read_text() == "h:2\n"
    assert [p.name for p in path.parent.iterdir()] == ["addr"]  # no temp files left
