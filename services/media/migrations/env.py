from services.kit.migrations import run_env
from services.media.tables import SCHEMA, metadata

run_env(SCHEMA, metadata)
