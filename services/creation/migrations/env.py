from services.creation.tables import SCHEMA, metadata
from services.kit.migrations import run_env

run_env(SCHEMA, metadata)
