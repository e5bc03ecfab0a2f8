"""creation's object client (services/creation/object_transfer.py) against a real HTTPS
server with a private CA, as the dev overlay's self-signed edge is: refused (the store
unavailable, the job handed back) until ATELIER_OBJECT_CA_FILE names that CA."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.creation.errors import MediaUnavailable
from services.creation.object_transfer import ObjectTransfer
from services.creation.settings import WorkerSettings
from services.kit.settings import EnvReader, SettingsError
from tests.support.https_origin import https_origin

PHOTO = b"\x89PNG\r\n\x1a\n" + b"x" * 64


async def test_a_private_ca_is_trusted_only_when_the_setting_names_it(tmp_path: Path) -> None:
    async with https_origin(tmp_path) as origin:
        url = origin.image("/media-objects/input.png", PHOTO)
        public_only = ObjectTransfer()
        try:
            with pytest.raises(MediaUnavailable):
                await public_only.download(url, 1024, "the input")
        finally:
            await public_only.close()
        reader = EnvReader({"ATELIER_OBJECT_CA_FILE": str(origin.ca_file)})
        settings = WorkerSettings.read(reader)
        reader.finish()
        trusting = ObjectTransfer(ca_file=settings.object_ca_file)
        try:
            assert await trusting.download(url, 1024, "the input") == (PHOTO, "image/png")
        finally:
            await trusting.close()


def test_a_ca_file_that_is_not_there_is_refused_at_start(tmp_path: Path) -> None:
    reader = EnvReader({"ATELIER_OBJECT_CA_FILE": str(tmp_path / "missing.pem")})
    WorkerSettings.read(reader)
    with pytest.raises(SettingsError, match="ATELIER_OBJECT_CA_FILE names no file"):
        reader.finish()
    assert WorkerSettings.read(EnvReader({})).object_ca_file == ""
