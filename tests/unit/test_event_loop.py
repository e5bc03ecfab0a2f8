import asyncio

import pytest
import uvloop

from services.kit import event_loop
from services.kit.settings import CommonSettings, EnvReader, SettingsError


async def _loop_kind() -> tuple[str, type]:
    return event_loop.running_loop_name(), type(asyncio.get_running_loop())


def test_the_default_loop_is_uvloop() -> None:
    name, kind = event_loop.run(_loop_kind())
    assert name == "uvloop"
    assert issubclass(kind, uvloop.Loop)


def test_the_standard_loop_is_one_setting_away() -> None:
    name, kind = event_loop.run(_loop_kind(), "asyncio")
    assert name == "asyncio"
    assert not issubclass(kind, uvloop.Loop)


def test_an_unknown_loop_is_refused_without_leaving_the_coroutine_unawaited() -> None:
    main = _loop_kind()
    with pytest.raises(ValueError, match="unknown event loop 'trio'"):
        event_loop.run(main, "trio")
    assert main.cr_frame is None  # closed: no "never awaited" warning later


def test_the_setting_defaults_to_uvloop_and_is_checked() -> None:
    assert CommonSettings.read(EnvReader({})).event_loop == "uvloop"
    assert CommonSettings.read(EnvReader({"ATELIER_EVENT_LOOP": "asyncio"})).event_loop == "asyncio"
    reader = EnvReader({"ATELIER_EVENT_LOOP": "gevent"})
    CommonSettings.read(reader)
    with pytest.raises(SettingsError, match="ATELIER_EVENT_LOOP must be one of uvloop, asyncio"):
        reader.finish()
