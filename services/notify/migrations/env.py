from services.kit.migrations import run_env
from services.notify.tables import SCHEMA, metadata

run_env(SCHEMA, metadata)
