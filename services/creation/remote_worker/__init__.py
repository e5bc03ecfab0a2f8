"""The reference remote worker (`atelier worker --remote ADDRESS`): runs provider adapters
through WorkerService, with no database; see docs/remote-workers.md."""
